"""Governed feedback on toolcalc (issue 15): a harmful rule suspended, drift flagged, a new rule helping.

python -m experiments.governance --json=docs/governance.json --workdir=/tmp/governance

One warm start (seed 0, experiments/toolcalc_rl.py's; `--warm=DIR` reuses a workdir holding
warmstart/) is shared by every arm and seed. Every arm: add renamed to plus from the start, the rule
library written for it (`renamed_add`, `wrong_tool`), then `mul` renamed to `times` at RENAME_STEP
(drift no rule explains) and a rule for the new name registered by config at NEW_RULE_STEP (a
person's response). Arms: `governed` also enables `repeated_call` (known to hurt, docs/rl.md) under
governance; `without_rule` leaves it out. Writes the numbers the issue asks for, per seed and as
means, plus each run's governance table, PNG and rollout viewer under its workdir.
"""

import copy
import json
import os
import shutil

from absl import app, flags, logging
import numpy as np

from experiments import toolcalc_rl
from research.rl import governance_report, loop, probe, report

RENAME_STEP = 4                     # mul -> times from this RL step on.
NEW_RULE_STEP = 8                   # renamed_mul registered (the evaluation at 7 is the "before").
STEPS = 16
NEW_RULE = {'at': NEW_RULE_STEP, 'id': 'renamed_mul', 'version': 1,
            'when': {'error': 'unknown_tool', 'name': 'mul'}, 'hint': 'Reminder: available tools are {tools}'}
ARMS = {
    'governed': ('renamed_add', 'wrong_tool', 'repeated_call'),
    'without_rule': ('renamed_add', 'wrong_tool'),
}
HARMFUL = 'repeated_call@1'
# A hint known to hurt, registered by config from step 1: on every call of `mul` (right ones too), a
# reminder listing a wrong name for it. Its own arm (--arms=stale_hint, no rename: after `mul` is
# renamed neither continuation can call it, and the probes read 0), on the seeds it was run for.
STALE_RULE = {'at': 1, 'id': 'stale_mul', 'version': 1, 'when': {'kind': 'call', 'name': 'mul'},
              'hint': 'Reminder: available tools are +:plus -:sub *:prod'}
EXTRA_ARMS = {'stale_hint': ARMS['without_rule']}

_SEEDS = flags.DEFINE_integer('seeds', 3, 'Seeds per arm.')
_JSON = flags.DEFINE_string('json', None, 'Where to write the results.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/governance', 'Runs go to WORKDIR/seed<k>/<arm>.')
_WARM = flags.DEFINE_string('warm', '', 'A workdir holding warmstart/ (default: make one in WORKDIR).')
_STEPS = flags.DEFINE_integer('steps', STEPS, 'RL steps per run.')
_ONLY_SEED = flags.DEFINE_integer('only_seed', -1, 'Train only this seed (>= 0; to run seeds in parallel).')
_ARMS = flags.DEFINE_list('arms', list(ARMS), 'Arms to train (empty: only collect the finished runs).')
flags.mark_flags_as_required(['json'])


def get_config(arm: str, steps: int = STEPS):
  c = toolcalc_rl.get_config()
  c.rl.steps = steps
  c.rl.tasks_per_step = 8           # 32 rollouts a step (and 18 probe rows): minutes a run on 2 cores.
  c.eval.every, c.eval.num_tasks = NEW_RULE_STEP - 1, 64  # Evaluations at 7 (before the new rule), 14, end.
  c.tensorboard = False
  c.critic.rules = {**ARMS, **EXTRA_ARMS}[arm]
  c.env.renames = () if arm == 'stale_hint' else (f'{RENAME_STEP}:*:times',)
  g = c.governance
  g.enabled = True
  g.probes_per_step, g.k = 3, 3
  g.new_rules = (json.dumps(NEW_RULE),) + ((json.dumps(STALE_RULE),) if arm == 'stale_hint' else ())
  return c


def _run(arm: str, seed: int, workdir: str, warm: str, steps: int):
  c = get_config(arm, steps)
  c.seed, c.init_checkpoint = seed, warm
  wd = os.path.join(workdir, f'seed{seed}', arm)
  before = os.path.join(workdir, f'seed{seed}', 'eval_before.json')
  os.makedirs(wd, exist_ok=True)
  if os.path.exists(before) and not os.path.exists(os.path.join(wd, 'eval_before.json')):
    shutil.copy(before, wd)  # The same warm start on the same eval tasks: evaluate it once per seed.
  runner = loop.Runner(c, wd)
  runner.run()
  if not os.path.exists(before):
    shutil.copy(os.path.join(wd, 'eval_before.json'), before)
  governance_report.write(wd, report.read_metrics(os.path.join(wd, 'metrics.jsonl')),
                          governance_report.read_log(os.path.join(wd, 'governance.jsonl')))
  _viewer(runner, wd, steps)


def _collect(wd: str, harmful: str = HARMFUL) -> dict:
  """The numbers of one finished run."""
  rows = report.read_metrics(os.path.join(wd, 'metrics.jsonl'))
  log = governance_report.read_log(os.path.join(wd, 'governance.jsonl'))
  with open(os.path.join(wd, 'summary.json')) as f:
    summary = json.load(f)
  evals = {int(r['step']): r['eval_success'] for r in rows if 'eval_success' in r}
  suspended = [d['step'] for d in log if d.get('decision') == 'suspended' and d['rule'] == harmful]
  drift = [e['step'] for e in log if e['kind'] == 'drift' and e['signature'].startswith('unknown_tool|mul|')]
  before_rule = max(s for s in evals if s < NEW_RULE_STEP)
  return {'final_success': summary['after'], 'eval_success': evals,
          'suspended_at_step': suspended[0] if suspended else None,
          'drift_flagged_at_step': min((s for s in drift if s >= RENAME_STEP), default=None),
          'success_before_new_rule': evals[before_rule], 'success_after_new_rule': summary['after'],
          'train_success': [r['success_rate'] for r in rows if r['step'] > 0],
          'decisions': [d for d in log if d['kind'] == 'decision']}


def _viewer(runner: loop.Runner, wd: str, step: int):
  """workdir/rollouts.html: a fresh batch of the final policy's rollouts, hinted ones first."""
  ro = runner._rollouts(step, runner.params)
  records = probe.viewer_records(runner.sampler, runner.params, runner.teacher.params(runner.params), ro.trajs,
                                 ro.feedback, 12)
  with open(os.path.join(wd, 'rollouts.html'), 'w') as f:
    f.write(governance_report.viewer_html(records, f'toolcalc after {step} RL steps ({wd})'))


def _warm(workdir: str, warm: str) -> str:
  if warm:
    return warm
  warm = os.path.join(workdir, 'warmstart_run')
  if not os.path.exists(os.path.join(warm, 'warmstart')):
    c = get_config('without_rule')
    loop.Runner(c, warm).warm_start(lambda i, row: None)
  return warm


def run(seeds: int, workdir: str, warm: str = '', steps: int = STEPS, arms: tuple[str, ...] = tuple(ARMS),
        only_seed: int = -1) -> dict:
  """Trains `arms` (none: only collect) for every seed (or `only_seed`), then collects every run."""
  if arms:
    warm = _warm(workdir, warm)
  for s in range(seeds) if only_seed < 0 else [only_seed]:
    for arm in arms:
      _run(arm, s, workdir, warm, steps)
  runs = {arm: {s: _collect(os.path.join(workdir, f'seed{s}', arm)) for s in range(seeds)} for arm in ARMS}
  stale = {s: _collect(os.path.join(workdir, f'seed{s}', 'stale_hint'), 'stale_mul@1') for s in range(seeds)
           if os.path.exists(os.path.join(workdir, f'seed{s}', 'stale_hint', 'summary.json'))}
  g, w = runs['governed'], runs['without_rule']
  finals = {arm: [r['final_success'] for r in v.values()] for arm, v in runs.items()}
  flagged = [r['drift_flagged_at_step'] for v in runs.values() for r in v.values()]
  suspended = [r['suspended_at_step'] for r in g.values()]
  out = {
      'harmful_rule': HARMFUL, 'drift_step': RENAME_STEP, 'new_rule_step': NEW_RULE_STEP, 'steps': steps,
      'seeds': seeds, 'new_rule': NEW_RULE,
      'suspended_at_step': max(suspended) if None not in suspended else None,
      'suspended_at_step_per_seed': suspended,
      'final_success_governed': float(np.mean(finals['governed'])),
      'final_success_governed_std': float(np.std(finals['governed'])),
      'final_success_without_rule': float(np.mean(finals['without_rule'])),
      'final_success_without_rule_std': float(np.std(finals['without_rule'])),
      'drift_flagged_at_step': max(flagged) if None not in flagged else None,
      'drift_flagged_at_step_per_run': flagged,
      'success_before_new_rule': float(np.mean([r['success_before_new_rule'] for v in runs.values() for r in v.values()])),
      'success_after_new_rule': float(np.mean([r['success_after_new_rule'] for v in runs.values() for r in v.values()])),
      'runs': runs,
      'stale_hint': {'rule': STALE_RULE, 'runs': stale,
                     'suspended_at_step_per_seed': {s: r['suspended_at_step'] for s, r in stale.items()}},
  }
  out['governed_within_one_std'] = bool(abs(out['final_success_governed'] - out['final_success_without_rule'])
                                        <= out['final_success_without_rule_std'])
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  res = run(_SEEDS.value, _WORKDIR.value, _WARM.value, _STEPS.value, tuple(_ARMS.value), _ONLY_SEED.value)
  with open(_JSON.value, 'w') as f:
    json.dump(res, f, indent=1)
  for k in ('suspended_at_step', 'final_success_governed', 'final_success_governed_std',
            'final_success_without_rule', 'final_success_without_rule_std', 'governed_within_one_std',
            'drift_step', 'drift_flagged_at_step', 'success_before_new_rule', 'success_after_new_rule'):
    print(f'{k:32s} {res[k]}')
  print(f'json: {_JSON.value}')


if __name__ == '__main__':
  app.run(main)
