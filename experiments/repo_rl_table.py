"""The repository RL learning table: one warm start, then RL with and without targeted feedback.

python -m experiments.repo_rl_table --workdir=/tmp/repo_rl_table --json=/tmp/repo_rl_table.json \
    [--seeds=1] [--sft_steps=N] [--rl_steps=N] [--arms=feedback,outcome]

Arms may run in parallel processes once the warm start exists (each with its own --json; the
warm start is reused from WORKDIR/warmstart_run).

Config: experiments/repo_rl.py (RL's environment renames `view` to `open`: drift). The warm start
(seed 0) is shared; per seed, `feedback` (PG + distillation of the critics' hints) and `outcome`
(PG alone) run RL from it on the train split. The warm start and each arm's final policy are
evaluated with one sampled rollout per task on every train and held-out task (the RL environment,
renamed tool included). Per evaluation: success, valid-call rate (messages that are one valid
call), well-formed rate (messages that parse as one call, valid or not), critic firings by rule
per episode, tests run before submit (of the episodes that
submitted), and drift: calls of the renamed tool by its new name over those by either name.
"""

import collections
import copy
import dataclasses
import json
import os
import time
from pathlib import Path

from absl import app, flags, logging
import jax
import numpy as np

from experiments import repo_rl
from research.rl.envs.repo import env as env_repo
from research.rl import loop
from research.rl.envs.repo import calls
from research.rl.rollout.trajectory import Trajectory
from research.tasks import testing

ARMS = {'feedback': 1.0, 'outcome': 0.0}  # name -> loss.distill_coef


def _called(text: str, call_format: str) -> str | None:
  try:
    return calls.FORMATS[call_format].parse(text).name
  except calls.CallError:
    return None


def table_row(trajs: list[Trajectory], critic, settings: env_repo.Settings) -> dict:
  """What the policy did in these evaluation episodes (module docstring)."""
  msgs = [m for t in trajs for m in t.messages]
  old, new = settings.rename
  by_new = sum(m.info.get('kind') == 'call' and m.info.get('tool') == old for m in msgs)
  by_old = sum(m.info.get('call_error') == 'unknown_tool' and _called(m.text, settings.call_format) == old
               for m in msgs)
  submits = [m.info['tested'] for m in msgs if m.info.get('tool') == 'submit']
  fires = collections.Counter(fb.rule for t in trajs for fb in critic(t))
  return {'episodes': len(trajs), 'success': float(np.mean([t.success for t in trajs])),
          'valid_call_rate': float(np.mean([m.info.get('kind') == 'call' for m in msgs])) if msgs else 0.0,
          # One call in the syntax, whatever its tool and arguments (a renamed tool's old name too).
          'well_formed_rate': float(np.mean([_called(m.text, settings.call_format) is not None
                                             for m in msgs])) if msgs else 0.0,
          'fires_per_episode': {r: fires[r] / len(trajs) for r in critic.names},
          'tested_before_submit': float(np.mean(submits)) if submits else None, 'submits': len(submits),
          f'drift_{new}_share': by_new / (by_new + by_old) if by_new + by_old else None}


def evaluate(runner: loop.Runner, params, seed: int) -> dict:
  """table_row on every train and every held-out task, one sampled rollout each."""
  out, env = {}, runner.env
  for split in ('train', 'held_out'):
    runner.env = env_repo.RepoEnv(env.task_file, env.pool, dataclasses.replace(env.settings, split=split))
    trajs = runner.evaluate(params, runner.env.tasks, jax.random.key(seed + 20_011), runner.batch_rows)
    out[split] = table_row(trajs, runner.critic, runner.env.settings)
  runner.env = env
  return out


def base_config(workdir: str, sft_steps: int, rl_steps: int):
  """experiments/repo_rl.py with these steps (0: the config's) on the fixture's tasks under workdir."""
  c = repo_rl.get_config()
  c.sft.steps = sft_steps or c.sft.steps
  c.rl.steps = rl_steps or c.rl.steps
  task_file = Path(workdir, 'tasks', 'tasks', 'tasks.jsonl')
  if not task_file.exists():
    testing.make_fixture_tasks(task_file.parent.parent, only=testing.TARGETS, log=lambda _: None,
                               modes=('body', 'function', 'feature'), visible_tests=True)
  c.env.repo.tasks = str(task_file)
  return c


def run(base, workdir: str, seeds: int, arms: list[str], eval_warm: bool, save) -> dict:
  """The warm start, then each seed's arms; `save(out)` after every evaluation (a cut run keeps them)."""
  warm = os.path.join(workdir, 'warmstart_run')
  t0 = time.time()
  with open(os.path.join(workdir, 'warmstart.jsonl'), 'a') as f:
    runner = loop.Runner(base, warm)
    params = runner.warm_start(lambda i, row: f.write(json.dumps(row) + '\n'))
  out = {'config': base.to_dict(), 'seconds': {'warm_start': time.time() - t0}, 'arms': {}}
  if eval_warm:
    out['warm_start'] = evaluate(runner, params, 0)
    save(out)
  for seed in range(seeds):
    for arm in arms:
      t0 = time.time()
      c = copy.deepcopy(base)
      c.seed, c.init_checkpoint, c.loss.distill_coef = seed, warm, ARMS[arm]
      runner = loop.Runner(c, os.path.join(workdir, f'seed{seed}', arm))
      runner.run()
      out['arms'].setdefault(arm, {})[seed] = evaluate(runner, runner.state.params, seed)
      out['seconds'][f'{arm}/{seed}'] = time.time() - t0
      save(out)
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  os.makedirs(f.workdir, exist_ok=True)

  def save(out):
    with open(f.json, 'w') as fp:
      json.dump({**out, 'load': os.getloadavg()[0], 'cpus': os.cpu_count(),
                 'devices': [str(d) for d in jax.devices()]}, fp, indent=1)

  base = base_config(f.workdir, f.sft_steps, f.rl_steps)
  out = run(base, f.workdir, f.seeds, f.arms, f.eval_warm, save)
  print(json.dumps({k: v for k, v in out.items() if k != 'config'}, indent=1))


if __name__ == '__main__':  # Flags here only: a test process imports this module beside others.
  flags.DEFINE_string('workdir', '/tmp/repo_rl_table', 'Runs go to WORKDIR/seed<k>/<arm>.')
  flags.DEFINE_string('json', None, 'Where to write the table.')
  flags.DEFINE_integer('seeds', 1, 'Seeds per arm.')
  flags.DEFINE_integer('sft_steps', 0, "Warm-start steps (0: the config's).")
  flags.DEFINE_integer('rl_steps', 0, "RL steps per arm (0: the config's).")
  flags.DEFINE_bool('eval_warm', True, 'Evaluate the warm start.')
  flags.DEFINE_list('arms', list(ARMS), 'Arms to run (none: the warm start alone).')
  flags.mark_flags_as_required(['json'])
  app.run(main)
