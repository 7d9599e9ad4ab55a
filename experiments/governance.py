"""Governed feedback on toolcalc (issue 15): a harmful rule suspended, drift flagged, a new rule helping.

python -m experiments.governance --json=docs/governance.json --workdir=/tmp/governance --warm=/tmp/demo_check

One warm start (seed 0, experiments/toolcalc_rl.py's; `--warm=DIR` reuses a workdir holding
warmstart/, e.g. `make demo`'s) is shared by every arm and seed. Every arm: `add` renamed to `plus`
from the start with the rule library written for it (`renamed_add`, `wrong_tool`), then `mul`
renamed to `times` at RENAME_STEP (drift no rule explains) and a rule for the new name registered by
config at NEW_RULE_STEP (a person's response). Arms (ARMS): `governed` also enables a rule known to
hurt (HARMFUL_RULE) and `repeated_call`, under governance; `without_rule` leaves both out;
`ungoverned` gives every hint of `governed`'s rules (what the harmful rule costs unchecked);
`no_new_rule` never registers the new rule (the control for `success_after_new_rule`). Writes the
numbers the issue asks for, per seed and as means, plus each run's governance table, PNG and
rollout viewer under its workdir. `--arms=` (empty) only collects finished runs.
"""

import argparse
import json
import os
import shutil

from absl import logging
import numpy as np

from experiments import toolcalc_rl
from research.rl import loop
from research.rl import report
from research.rl.feedback import probe
from research.rl.feedback import report as gov_report

RENAME_STEP = 4                     # mul -> times from this RL step on.
NEW_RULE_STEP = 6                   # renamed_mul registered (the evaluation at 5 is the "before").
STEPS = 60
EVAL_EVERY = 5                      # Evaluations at 0, 5 (after the rename, before the new rule), ..., 60.
NEW_RULE = {'at': NEW_RULE_STEP, 'id': 'renamed_mul', 'version': 1,
            'when': {'error': 'unknown_tool', 'name': 'mul'}, 'hint': 'Reminder: available tools are {tools}'}
# A hint known to hurt, registered by config from step 1: a reminder written for a rename of `sub` to
# `minus` that never happened (its tool list is literal, not the environment's), on every call of
# `sub`, right ones too. The teacher follows a reminder, so with it the policy calls a tool that does
# not exist; distilled, it teaches that (the `ungoverned` arm measures what that costs).
HARMFUL_RULE = {'at': 1, 'id': 'stale_sub', 'version': 1, 'when': {'kind': 'call', 'name': 'sub'},
                'hint': 'Reminder: available tools are +:plus -:minus *:mul'}
HARMFUL = f"{HARMFUL_RULE['id']}@{HARMFUL_RULE['version']}"  # Its tag in the governance log.
BASE_RULES = ('renamed_add', 'wrong_tool')
# arm -> (critic rules, governance on, new rules by config). `repeated_call` (docs/rl.md found it
# hurt through distillation when it was demonstrated with the warm-start names) is enabled on purpose
# beside the harmful rule; `without_rule` is the library without both; `ungoverned` gives every hint.
ARMS = {
    'governed': (BASE_RULES + ('repeated_call',), True, (NEW_RULE, HARMFUL_RULE)),
    'without_rule': (BASE_RULES, True, (NEW_RULE,)),
    'ungoverned': (BASE_RULES + ('repeated_call',), False, (NEW_RULE, HARMFUL_RULE)),
    'no_new_rule': (BASE_RULES, True, ()),  # The control for success_after_new_rule.
}


def get_config(arm: str = 'governed', steps: int = STEPS):
  rules, governed, new_rules = ARMS[arm]
  c = toolcalc_rl.get_config()
  c.rl.steps = steps
  c.rl.tasks_per_step = 16          # 64 rollouts a step: 1-3 s a step on 2 cores.
  c.eval.every, c.eval.num_tasks = EVAL_EVERY, 128
  c.tensorboard = False
  # Two renames to learn: at the toolcalc default (10) the anchor to the warm start holds the policy
  # so close that distilling the second name only slows the first (docs/results.md).
  c.loss.anchor_coef = 3.0
  c.critic.rules = rules
  c.env.toolcalc.renames = (f'{RENAME_STEP}:*:times',)
  g = c.governance
  g.enabled = governed
  g.probes_per_step, g.k = 4, 3
  g.new_rules = tuple(json.dumps(r) for r in new_rules)
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
  gov_report.write(wd, report.read_metrics(os.path.join(wd, 'metrics.jsonl')),
                          gov_report.read_log(os.path.join(wd, 'governance.jsonl')))
  _viewer(runner, wd, steps)


def _collect(wd: str) -> dict:
  """The numbers of one finished run."""
  rows = report.read_metrics(os.path.join(wd, 'metrics.jsonl'))
  log = gov_report.read_log(os.path.join(wd, 'governance.jsonl'))
  with open(os.path.join(wd, 'summary.json')) as f:
    summary = json.load(f)
  evals = {int(r['step']): r['eval_success'] for r in rows if 'eval_success' in r}
  suspended = [d['step'] for d in log if d.get('decision') == 'suspended' and d['rule'] == HARMFUL]
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
  ro = runner.rollouts(step, runner.state.params)
  records = probe.viewer_records(runner.sampler, runner.state.params, runner.state.teacher.params(runner.state.params), ro.trajs,
                                 ro.feedback, 12)
  with open(os.path.join(wd, 'rollouts.html'), 'w') as f:
    f.write(gov_report.viewer_html(records, f'toolcalc after {step} RL steps ({wd})'))


def _warm(workdir: str, warm: str) -> str:
  if warm:
    return warm
  warm = os.path.join(workdir, 'warmstart_run')
  if not os.path.exists(os.path.join(warm, 'warmstart')):
    c = get_config('without_rule')
    loop.Runner(c, warm).warm_start(lambda i, row: None)
  return warm


def _mean_std(xs: list[float]) -> tuple[float, float]:
  return float(np.mean(xs)), float(np.std(xs))


def run(seeds: int, workdir: str, warm: str = '', steps: int = STEPS, arms: tuple[str, ...] = tuple(ARMS),
        only_seed: int = -1) -> dict:
  """Trains `arms` (none: only collect) for every seed (or `only_seed`), then collects every run."""
  if arms:
    warm = _warm(workdir, warm)
  for s in range(seeds) if only_seed < 0 else [only_seed]:
    for arm in arms:
      _run(arm, s, workdir, warm, steps)
  runs = {arm: {s: _collect(os.path.join(workdir, f'seed{s}', arm)) for s in range(seeds)} for arm in ARMS}
  final = {arm: _mean_std([r['final_success'] for r in v.values()]) for arm, v in runs.items()}
  suspended = [r['suspended_at_step'] for r in runs['governed'].values()]
  flagged = [r['drift_flagged_at_step'] for arm in ('governed', 'without_rule', 'no_new_rule')
             for r in runs[arm].values()]
  with_rule = [r for arm in ('governed', 'without_rule') for r in runs[arm].values()]
  out = {
      'harmful_rule': HARMFUL_RULE, 'drift_step': RENAME_STEP, 'new_rule_step': NEW_RULE_STEP, 'steps': steps,
      'seeds': seeds, 'new_rule': NEW_RULE,
      'suspended_at_step': max(suspended) if None not in suspended else None,
      'suspended_at_step_per_seed': suspended,
      'drift_flagged_at_step': max(flagged) if None not in flagged else None,
      'drift_flagged_at_step_per_run': flagged,
      'success_before_new_rule': float(np.mean([r['success_before_new_rule'] for r in with_rule])),
      'success_after_new_rule': float(np.mean([r['success_after_new_rule'] for r in with_rule])),
      'success_after_without_new_rule': final['no_new_rule'][0],
      'runs': runs,
  }
  for arm, (mean, std) in final.items():
    out[f'final_success_{arm}'], out[f'final_success_{arm}_std'] = mean, std
  out['governed_within_one_std'] = bool(abs(final['governed'][0] - final['without_rule'][0]) <= final['without_rule'][1])
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--json', required=True, help='Where to write the results.')
  ap.add_argument('--seeds', type=int, default=3, help='Seeds per arm.')
  ap.add_argument('--workdir', default='/tmp/governance', help='Runs go to WORKDIR/seed<k>/<arm>.')
  ap.add_argument('--warm', default='', help='A workdir holding warmstart/ (default: make one in WORKDIR).')
  ap.add_argument('--steps', type=int, default=STEPS, help='RL steps per run.')
  ap.add_argument('--only_seed', type=int, default=-1, help='Train only this seed (>= 0; to run seeds in parallel).')
  ap.add_argument('--arms', default=','.join(ARMS),
                  help='Comma-separated arms to train (empty: only collect the finished runs).')
  args = ap.parse_args()
  arms = tuple(a for a in args.arms.split(',') if a)
  unknown = sorted(set(arms) - set(ARMS))
  if unknown:
    ap.error(f'--arms: unknown arm(s) {unknown}; known: {list(ARMS)}')
  logging.set_verbosity(logging.WARNING)
  res = run(args.seeds, args.workdir, args.warm, args.steps, arms, args.only_seed)
  with open(args.json, 'w') as f:
    json.dump(res, f, indent=1)
  for k in ('suspended_at_step', 'final_success_governed', 'final_success_governed_std',
            'final_success_without_rule', 'final_success_without_rule_std', 'governed_within_one_std',
            'final_success_ungoverned', 'drift_step', 'drift_flagged_at_step', 'success_before_new_rule',
            'success_after_new_rule', 'success_after_without_new_rule'):
    print(f'{k:32s} {res[k]}')
  print(f'json: {args.json}')


if __name__ == '__main__':
  main()
