"""Ablation at equal rollouts: outcome reward alone, RL + targeted feedback, feedback distillation alone.

python -m experiments.toolcalc_ablation --seeds=3 --json=/tmp/ablation.json --workdir=/tmp/ablation

One warm start (seed 0) is shared by every arm and seed; per seed, each arm runs RL from it with the
same tasks, steps, tasks per step and group size (so the same number of rollouts); seeds vary the
RL tasks, the sampling and the eval tasks. Writes the eval success
curves per arm and seed, the rollouts each needs to reach the target (the outcome-only arm's final
success, mean over seeds), and a PNG next to the JSON.
"""

import copy
import json
import os
import shutil

from absl import app, flags, logging
import numpy as np

from experiments import toolcalc_rl
from research.rl import loop
from research.rl import report

ARMS = {  # name -> (pg_coef, distill_coef)
    'outcome_only': (1.0, 0.0),
    'rl_plus_feedback': (1.0, 1.0),
    'feedback_distill_only': (0.0, 1.0),
}

_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per arm.')
_JSON = flags.DEFINE_string('json', None, 'Where to write the results.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/toolcalc_ablation', 'Runs go to WORKDIR/seed<k>/<arm>.')
_STEPS = flags.DEFINE_integer('steps', 0, 'RL steps per arm (0: the config\'s).')
_COLLECT = flags.DEFINE_bool('collect_only', False, 'Only read the finished runs in WORKDIR.')
flags.mark_flags_as_required(['json'])


def get_config():
  """The shared config of every arm: experiments/toolcalc_rl.py with evaluation on more tasks."""
  c = toolcalc_rl.get_config()
  c.eval.num_tasks = 128            # A finer success curve.
  c.tensorboard = False             # Many runs: metrics.jsonl is enough.
  return c


def rollouts_to_reach(rollouts, success, target):
  """The first evaluation after RL started (rollouts > 0) with success >= target, or None.

  The warm start itself is not counted: where the outcome-only arm does not improve, its final
  success is about the starting point, and every arm would "reach" it at 0 rollouts.
  """
  hit = [r for r, s in zip(rollouts, success) if r > 0 and s >= target - 1e-9]
  return hit[0] if hit else None


def _curve(wd: str) -> dict:
  """Eval success per rollouts of one run (the evaluation before RL at 0 rollouts)."""
  rows = report.read_metrics(os.path.join(wd, 'metrics.jsonl'))
  with open(os.path.join(wd, 'eval_before.json')) as f:
    before = json.load(f)['row']['eval_success']
  ev = {0: before, **{int(r['rollouts']): float(r['eval_success']) for r in rows if 'eval_success' in r}}
  with open(os.path.join(wd, 'summary.json')) as f:
    summary = json.load(f)
  return {'rollouts': sorted(ev), 'success': [ev[k] for k in sorted(ev)], 'final': summary['after'],
          'by_rule': summary['by_rule']}


def run(seeds: int, workdir: str, steps: int = 0, train: bool = True) -> dict:
  base = get_config()
  if steps:
    base.rl.steps = steps
  warm = os.path.join(workdir, 'warmstart_run')
  for seed in range(seeds if train else 0):
    for arm, (pg, dl) in ARMS.items():
      c = copy.deepcopy(base)
      c.seed, c.init_checkpoint = seed, warm
      c.loss.pg_coef, c.loss.distill_coef = pg, dl
      wd = os.path.join(workdir, f'seed{seed}', arm)
      if not os.path.exists(os.path.join(warm, 'warmstart')):
        cw = copy.deepcopy(c)
        cw.init_checkpoint, cw.seed = '', 0
        loop.Runner(cw, warm).warm_start(lambda i, row: None)
      before = os.path.join(workdir, f'seed{seed}', 'eval_before.json')
      os.makedirs(wd, exist_ok=True)
      if os.path.exists(before) and not os.path.exists(os.path.join(wd, 'eval_before.json')):
        shutil.copy(before, wd)  # The same warm start on the same tasks: evaluate it once.
      loop.run(c, wd)
      if not os.path.exists(before):
        shutil.copy(os.path.join(wd, 'eval_before.json'), before)
  curves = {arm: {s: _curve(os.path.join(workdir, f'seed{s}', arm)) for s in range(seeds)} for arm in ARMS}
  target = float(np.mean([s['success'][-1] for s in curves['outcome_only'].values()]))
  total = curves['outcome_only'][0]['rollouts'][-1]
  out = {'config': base.to_dict(), 'arms': {a: {'pg_coef': p, 'distill_coef': d} for a, (p, d) in ARMS.items()},
         'curves': curves, 'target': target, 'total_rollouts': total, 'steps_to_target': {}}
  for arm, seeds_ in curves.items():
    per_seed = {s: rollouts_to_reach(v['rollouts'], v['success'], target) for s, v in seeds_.items()}
    n = min(len(v['success']) for v in seeds_.values())
    mean = np.mean([v['success'][:n] for v in seeds_.values()], 0)
    out['steps_to_target'][arm] = {
        'per_seed_rollouts': per_seed,
        'mean_curve_rollouts': rollouts_to_reach(list(seeds_.values())[0]['rollouts'][:n], mean, target),
        'mean_curve': [float(x) for x in mean],
        'final_mean': float(mean[-1]), 'final_std': float(np.std([v['success'][n - 1] for v in seeds_.values()])),
        'by_rule_after_mean': {rule: float(np.mean([v['by_rule'][rule]['after'] or 0.0 for v in seeds_.values()]))
                               for rule in next(iter(seeds_.values()))['by_rule']}}
  fb = out['steps_to_target']['rl_plus_feedback']['mean_curve_rollouts']
  out['feedback_within_half'] = fb is not None and fb <= total / 2
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  res = run(_SEEDS.value, _WORKDIR.value, _STEPS.value, train=not _COLLECT.value)
  with open(_JSON.value, 'w') as f:
    json.dump(res, f, indent=1)
  png = os.path.splitext(_JSON.value)[0] + '.png'
  report.plot_ablation({a: v for a, v in res['curves'].items()}, png, target=res['target'])
  print(f'target (outcome-only final eval success, mean of seeds) = {res["target"]:.3f} '
        f'of {res["total_rollouts"]} rollouts')
  for arm, s in res['steps_to_target'].items():
    print(f'{arm:24s} final {s["final_mean"]:.3f} +- {s["final_std"]:.3f}  rollouts to target: '
          f'mean curve {s["mean_curve_rollouts"]}, per seed {s["per_seed_rollouts"]}')
  print(f'targeted feedback reaches it within half the rollouts: {res["feedback_within_half"]}')
  print(f'json: {_JSON.value}  plot: {png}')


if __name__ == '__main__':
  app.run(main)
