"""The repository RL learning table: per seed a warm start, then RL with and without targeted feedback.

python -m experiments.repo_rl_table --workdir=/tmp/repo_rl_table --json=/tmp/repo_rl_table.json \
    [--seeds=3] [--arms=feedback,outcome] [--tasks=TASKS.jsonl|DIR] [--config.sft.steps=N] \
    [--config.rl.steps=N] [--config.sampler.max_turn_tokens=N ...]

Config: experiments/repo_rl.py (`--config=` another; `--config.<field>=` overrides any field as
launch.rl's do). RL's environment renames `view` to `open` (drift). Per seed k: a
warm start (SFT seed k, WORKDIR/seed<k>/warmstart_run), then `feedback` (PG + distillation of the
critics' hints) and `outcome` (PG alone) run RL from it on the train split. The warm start and each
arm's final policy are evaluated with sampled rollouts of every train and held-out task, each as
often as fills one batch of rows (the RL environment, renamed tool included). Per evaluation:
success, valid-call rate (messages that are one valid call), well-formed rate (messages that parse
as one call, valid or not), critic firings by rule per episode, tests run before submit (of the
episodes that submitted), hack and mask rates, and drift: calls of the renamed tool by its new name
over those by either name, and the share of episodes that call it by its new name. Per RL run,
from its metrics.jsonl: success and adoption of the new name per step (`curves.png`), hack and
mask rates. The JSON's `table` holds mean and std over seeds; the
markdown table is printed.
"""

import collections
import copy
import dataclasses
import json
import os
import time
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags
import jax
import numpy as np

from experiments import repo_rl
from research.rl import loop, report
from research.rl.envs.repo import calls
from research.rl.envs.repo import env as env_repo
from research.rl.rollout.trajectory import Trajectory
from research.tasks import testing

ARMS = {'feedback': 1.0, 'outcome': 0.0}  # name -> loss.distill_coef
# The table's columns: (label, which evaluation, its key).
COLUMNS = (('well-formed', 'train', 'well_formed_rate'),
           ('tests before submit', 'train', 'tested_before_submit'),
           ('train success', 'train', 'success'), ('held-out success', 'held_out', 'success'),
           ('adoption of the new name', 'train', 'drift_share'),
           ('episodes using the new name', 'train', 'adoption_episodes'),
           ('hack rate', 'train', 'hack_rate'),
           ('mask rate', 'train', 'mask_rate'), ('RL hack rate', 'rl', 'hack_rate'),
           ('RL mask rate', 'rl', 'mask_rate'))


def _called(text: str, call_format: str) -> str | None:
  try:
    return calls.FORMATS[call_format].parse(text).name
  except calls.CallError:
    return None


def table_row(trajs: list[Trajectory], critic, settings: env_repo.Settings) -> dict:
  """What the policy did in these evaluation episodes (module docstring)."""
  msgs = [m for t in trajs for m in t.messages]
  old, _ = settings.rename
  new_name = lambda m: m.info.get('kind') == 'call' and m.info.get('tool') == old  # Called as renamed.
  by_new = sum(map(new_name, msgs))
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
          'hack_rate': float(np.mean([any(m.info.get('hack') for m in t.messages) for t in trajs])),
          'mask_rate': float(np.mean([t.fault is not None for t in trajs])),
          'drift_share': by_new / (by_new + by_old) if by_new + by_old else None,
          'adoption_episodes': float(np.mean([any(map(new_name, t.messages)) for t in trajs]))}


def evaluate(runner: loop.Runner, params, seed: int) -> dict:
  """table_row on every train and every held-out task, each as many times as fill one batch of the
  sampler (at least once: the rows are sampled anyway)."""
  out, env = {}, runner.env
  for split in ('train', 'held_out'):
    runner.env = env_repo.RepoEnv(env.task_file, env.pool, dataclasses.replace(env.settings, split=split))
    tasks = runner.env.tasks * max(1, runner.batch_rows // len(runner.env.tasks))
    trajs = runner.evaluate(params, tasks, jax.random.key(seed + 20_011), runner.batch_rows)
    out[split] = table_row(trajs, runner.critic, runner.env.settings)
  runner.env = env
  return out


def training(metrics_path: str, rename: tuple[str, str]) -> dict:
  """An RL run's curves (success and adoption of the new name per step) and its mean hack and mask
  rates, from its metrics.jsonl."""
  rows = [r for r in report.read_metrics(metrics_path) if r.get('step', 0) > 0 and 'success_rate' in r]
  new = [r[f'tool_calls/{rename[0]}'] for r in rows]        # Calls of the renamed tool by its new name,
  old = [r['stale_name_calls'] for r in rows]                # and by its old one, per episode.
  return {'step': [r['step'] for r in rows], 'success': [r['success_rate'] for r in rows],
          'adoption': [a / (a + b) if a + b else float('nan') for a, b in zip(new, old)],
          'hack_rate': float(np.mean([r['hack_rate'] for r in rows])),
          'mask_rate': float(np.mean([r['mask_rate'] for r in rows]))}


def base_config(workdir: str, tasks: str = '', config=None):
  """`config` (None: experiments/repo_rl.py's) on `tasks` (empty: the fixture's, made under
  workdir)."""
  c = copy.deepcopy(config) if config is not None else repo_rl.get_config()
  task_file = Path(tasks or Path(workdir, 'tasks', 'tasks', 'tasks.jsonl'))
  if not tasks and not task_file.exists():
    testing.make_fixture_tasks(task_file.parent.parent, only=testing.TARGETS, log=lambda _: None,
                               modes=('body', 'function', 'feature'), visible_tests=True)
  c.env.repo.tasks = str(task_file)
  return c


def warm_start(base, workdir: str, seed: int) -> tuple[loop.Runner, dict]:
  """Seed's warm start (made once under WORKDIR/seed<k>/warmstart_run) and its runner."""
  c = copy.deepcopy(base)
  c.seed = seed
  wd = os.path.join(workdir, f'seed{seed}', 'warmstart_run')
  runner = loop.Runner(c, wd)
  with open(os.path.join(wd, 'warmstart.jsonl'), 'a') as f:
    return runner, runner.warm_start(lambda i, row: f.write(json.dumps(row) + '\n'))


def run_arm(base, workdir: str, seed: int, arm: str) -> dict:
  """One RL run from the seed's warm start: its final evaluation and its training record."""
  c = copy.deepcopy(base)
  c.seed, c.loss.distill_coef = seed, ARMS[arm]
  c.init_checkpoint = os.path.join(workdir, f'seed{seed}', 'warmstart_run')
  wd = os.path.join(workdir, f'seed{seed}', arm)
  runner = loop.Runner(c, wd)
  runner.run()
  return {**evaluate(runner, runner.state.params, seed),
          'rl': training(os.path.join(wd, 'metrics.jsonl'), tuple(c.env.repo.rename))}


def run(base, workdir: str, seeds: int, arms: list[str], save) -> dict:
  """Each seed's warm start and arms; `save(out)` after every evaluation (a cut run keeps them)."""
  out = {'config': base.to_dict(), 'seconds': {}, 'warm_start': {}, 'arms': {a: {} for a in arms}}
  for seed in range(seeds):
    t0 = time.time()
    runner, params = warm_start(base, workdir, seed)
    out['warm_start'][seed] = evaluate(runner, params, seed)
    out['seconds'][f'warm_start/{seed}'] = time.time() - t0
    save(out)
    for arm in arms:
      t0 = time.time()
      out['arms'][arm][seed] = run_arm(base, workdir, seed, arm)
      out['seconds'][f'{arm}/{seed}'] = time.time() - t0
      save(out)
  return out


def table(out: dict) -> dict:
  """Per row (the warm start, each arm) and column: mean and std over seeds (None where no seed has
  a value: no episode submitted, or a column newer than the run, as in docs/repo_rl's first JSONs)."""
  rows = {'warm start': out['warm_start'], **out['arms']}
  res = {}
  for name, seeds in rows.items():
    res[name] = {}
    for label, split, key in COLUMNS:
      vals = [s[split][key] for s in seeds.values() if s.get(split, {}).get(key) is not None]
      res[name][label] = ({'mean': float(np.mean(vals)), 'std': float(np.std(vals)), 'seeds': len(vals)}
                          if vals else None)
  return res


def markdown(res: dict) -> str:
  labels = [label for label, _, _ in COLUMNS]
  lines = ['| | ' + ' | '.join(labels) + ' |', '|---' * (len(labels) + 1) + '|']
  for name, cols in res.items():
    cells = ['-' if cols[lb] is None else f'{cols[lb]["mean"]:.2f} +- {cols[lb]["std"]:.2f}' for lb in labels]
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def curves_png(out: dict, png: str) -> str:
  """Success and adoption of the renamed tool per RL step, both arms (mean of seeds, seeds faint)."""
  curves = {arm: {s: r['rl'] for s, r in seeds.items()} for arm, seeds in out['arms'].items() if seeds}
  return report.plot_arms(curves, png, {'success': 'training success',
                                        'adoption': 'adoption of the new name'}, 'repository RL', x='step')


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  os.makedirs(f.workdir, exist_ok=True)

  def save(out):
    with open(f.json, 'w') as fp:
      json.dump({**out, 'table': table(out), 'load': os.getloadavg()[0], 'cpus': os.cpu_count(),
                 'devices': [str(d) for d in jax.devices()]}, fp, indent=1)

  out = run(base_config(f.workdir, f.tasks, f.config), f.workdir, f.seeds, f.arms, save)
  if any(out['arms'].values()):
    print('curves:', curves_png(out, f.png or os.path.join(f.workdir, 'curves.png')))
  print(markdown(table(out)))


if __name__ == '__main__':  # Flags here only: a test process imports this module beside others.
  flags.DEFINE_string('workdir', '/tmp/repo_rl_table', 'Runs go to WORKDIR/seed<k>/<arm>.')
  flags.DEFINE_string('json', None, 'Where to write the table.')
  flags.DEFINE_string('png', '', 'Where to draw the curves (empty: WORKDIR/curves.png).')
  flags.DEFINE_string('tasks', '', "A task file of launch.make_tasks, or its output directory "
                      "(empty: the fixture's).")
  flags.DEFINE_integer('seeds', 1, 'Seeds per arm (each with its own warm start).')
  config_flags.DEFINE_config_file('config', 'experiments/repo_rl.py', 'Experiment config file.')
  flags.DEFINE_list('arms', list(ARMS), 'Arms to run (none: the warm starts alone).')
  flags.mark_flags_as_required(['json'])
  app.run(main)
