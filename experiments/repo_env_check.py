"""Checks the repository environment end to end: the oracle, the red team through the tools, and
episodes stepped at once.

python -m experiments.repo_env_check --json=/tmp/repo_env_check.json [--sdists=inflection==0.5.1]
    [--max_tasks=8] [--batch=16] [--attacks=forge_emit,...] [--workers=N] [--parts=oracle,attacks,time]

Writes {"oracle": {"episodes", "success"}, "attacks": {"episodes", "rewarded", "flagged", ...},
"env_time_ratio", ...}:
- oracle: research/rl/envs/repo/oracle.py's calls on every fixture task (all modes) and on up to
  `max_tasks` tasks made from each real sdist (fetched as experiments/redteam.py does); success is the
  fraction that earned reward 1.
- attacks: every attack of the red team (research/tasks/redteam/attacks/) delivered through the tools: its
  script runs in the policy sandbox as in the red team, and the files it wrote become create /
  str_replace / rm calls (repo_oracle.edit_calls), then submit. Text an attack smuggles into a
  hand-written diff cannot go through the tools (the environment diffs the work area itself), so it
  is dropped. `rewarded` counts episodes with reward > 0 (must be 0), `flagged` those the grader
  flagged as tampering, `faults` those masked by a harness fault (the resource attacks).
- env_time_ratio: environment seconds per turn of a batch of `batch` oracle episodes of distinct
  fixture tasks (tests visible, so their `run` runs them) stepped at once (as the sampler steps
  them) over the slowest of the same episodes run alone, grade memo off. `time_ratios` adds an
  RL-shaped batch (batch/4 tasks x 4 identical rollouts) with the memo off and on, and the ratio
  perfect sharing of this machine's cores would give (`ideal_ratio`).
"""
from concurrent import futures
import collections
import json
import os
from pathlib import Path
import tempfile
import time

from absl import app, flags
import numpy as np

from experiments import redteam as redteam_exp
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo import oracle as repo_oracle
from research.rl.envs.repo import calls
from research.rl.envs.base import Step
from research.tasks.grading import pool as pool_lib
from research.tasks import redteam
from research.tasks import task as task_lib
from research.tasks import testing

# The red team's flags (experiments/redteam.py: --json, --attacks, --sdists, --sdist_cache,
# --max_tasks, --workers) mean the same here; the defaults are one sdist and fewer tasks.
FLAGS = flags.FLAGS
FLAGS.set_default('sdists', ['inflection==0.5.1'])
FLAGS.set_default('max_tasks', 8)
FLAGS.set_default('workers', os.cpu_count() or 1)
_BATCH = flags.DEFINE_integer('batch', 16, 'Episodes stepped at once.')
_PARTS = flags.DEFINE_list('parts', ['oracle', 'attacks', 'time'], 'Which checks to run.')

CHATML = calls.FORMATS['chatml']


def _step(method, arg: str) -> Step | str:
  """The Step, or the harness fault that masks the episode."""
  try:
    return method(arg)
  except env_repo.EnvFault as e:
    return f'fault: {e}'


def play(episodes: list[env_repo.Episode], scripts: list[list[str]]) -> tuple[list[Step | str], list[float]]:
  """Steps each episode through its messages, all live ones at once each turn (threads, as the
  sampler does). Returns (each final Step or fault, wall seconds of each turn)."""
  finals: list[Step | str | None] = [None] * len(episodes)
  phases = []
  with futures.ThreadPoolExecutor(len(episodes)) as pool:
    for turn in range(max(map(len, scripts))):
      live = [i for i, f in enumerate(finals) if f is None and turn < len(scripts[i])]
      if not live:
        break
      t0 = time.perf_counter()
      steps = list(pool.map(lambda i: _step(episodes[i].step, scripts[i][turn]), live))
      phases.append(time.perf_counter() - t0)
      for i, st in zip(live, steps):
        if isinstance(st, str) or st.done:
          finals[i] = st
  return [f if f is not None else _step(ep.close, 'turns') for f, ep in zip(finals, episodes)], phases


def in_batches(env: env_repo.RepoEnv, tasks, scripts, batch: int) -> tuple[list[Step | str], list[list[float]]]:
  finals, phases = [], []
  for i in range(0, len(tasks), batch):
    out, ph = play([env.reset(t) for t in tasks[i:i + batch]], scripts[i:i + batch])
    finals += out
    phases.append(ph)
  return finals, phases


def oracle_scripts(env: env_repo.RepoEnv) -> list[list[str]]:
  solutions = task_lib.read_solutions(env.task_dir)
  return [[CHATML.render(c) for c in repo_oracle.solution_calls(t, solutions[t.id], env.task_dir / t.tree)]
          for t in env.tasks]


def _rewarded(final: Step | str) -> bool:
  return not isinstance(final, str) and final.reward > 0


def oracle(envs: list[env_repo.RepoEnv], batch: int, log) -> dict:
  """The oracle on every task of every env; success is the fraction with reward 1."""
  results = []
  for env in envs:
    finals, _ = in_batches(env, env.tasks, oracle_scripts(env), batch)
    for t, f in zip(env.tasks, finals):
      ok = not isinstance(f, str) and f.reward == 1.0
      results.append(ok)
      if not ok:
        log(f'oracle failed {t.id}: {f if isinstance(f, str) else f.info["grade"]}')
  return {'episodes': len(results), 'success': sum(results) / max(len(results), 1),
          'tasks_by_repo': {env.tasks[0].repo: len(env.tasks) for env in envs}}


def time_ratio(make_env, tasks: list[task_lib.Task]) -> dict:
  """Seconds per turn of the episodes of `tasks` at once over the slowest of them alone (each alone
  on a fresh env: nothing memoized from the batch). `ideal_ratio` is the ratio if the episodes
  alone were CPU-bound on one core each and shared this machine's cores perfectly at once."""
  env = make_env()
  by_id = dict(zip((t.id for t in env.tasks), oracle_scripts(env)))
  scripts = [by_id[t.id] for t in tasks]
  _, together = play([env.reset(t) for t in tasks], scripts)
  alone = []
  for t, s in zip(tasks, scripts):
    phases = play([make_env().reset(t)], [s])[1]
    alone.append(sum(phases) / len(phases))
  per_turn = sum(together) / len(together)
  return {'env_time_ratio': per_turn / max(alone), 'batch_seconds_per_turn': per_turn,
          'slowest_alone_seconds_per_turn': max(alone), 'mean_alone_seconds_per_turn': np.mean(alone),
          'ideal_ratio': sum(alone) / (os.cpu_count() or 1) / max(alone)}


def time_ratios(task_dir: Path, batch: int, workers: int) -> dict:
  """env_time_ratio of `batch` distinct tasks without the grade memo (the honest figure), and of an
  RL-shaped batch (batch/4 tasks x 4 rollouts writing identical diffs) without and with it."""
  out = {}
  for name, memoize, group in (('distinct', False, 1), ('groups', False, 4), ('groups_memo', True, 4)):
    def make_env(memoize=memoize):
      return env_repo.RepoEnv(task_dir / 'tasks.jsonl', pool_lib.GraderPool(workers),
                              env_repo.Settings(memoize_grades=memoize))
    tasks = make_env().tasks
    out[name] = time_ratio(make_env, [tasks[i // group % len(tasks)] for i in range(batch)])
  return {'env_time_ratio': out['distinct']['env_time_ratio'], 'time_ratios': out}


def attack_script(a, task: task_lib.Task, task_dir: Path, info: dict, slot: int) -> list[str]:
  """The attack's files, written by its script in the policy sandbox, as tool calls and a submit."""
  diff, output = redteam.run_policy(task, task_dir, a.script, info, slot=slot)
  smuggled = redteam.result(output).get('smuggled', '')  # Not expressible through the tools.
  diff = diff.replace(smuggled, '', 1) if smuggled else diff
  edits = repo_oracle.edit_calls(diff, task_dir / task.tree)
  return [CHATML.render(c) for c in edits] + [CHATML.render(calls.Call('submit', {}))]


def attacks(task_dir: Path, origin: Path, names, batch: int, workers: int, log) -> dict:
  """Every chosen attack through the tools, against the env with the red team's grading limits."""
  targets = redteam.attack_targets(task_dir)
  chosen = [a for a in redteam.ATTACKS if names is None or a.name in names]
  info = {'task_dir': str(task_dir), 'origin': str(origin), 'mirror': ''}
  with futures.ThreadPoolExecutor(workers) as ex:
    scripts = list(ex.map(lambda ia: attack_script(ia[1], targets[ia[1].target], task_dir, info, ia[0]),
                          enumerate(chosen)))
  env = env_repo.RepoEnv(task_dir / 'tasks.jsonl', pool_lib.GraderPool(workers, limits=redteam.LIMITS))
  finals, _ = in_batches(env, [targets[a.target] for a in chosen], scripts, batch)
  by_class = collections.defaultdict(lambda: collections.Counter())
  for a, s, f in zip(chosen, scripts, finals):
    flagged = not isinstance(f, str) and f.info['hack']
    c = by_class[a.cls]
    c.update(episodes=1, rewarded=int(_rewarded(f)), flagged=int(flagged), faults=int(isinstance(f, str)))
    outcome = f if isinstance(f, str) else f'reward={f.reward} hack={flagged} {f.info["grade"][:70]}'
    log(f'{a.name:<32} calls={len(s) - 1:<2} {outcome}')
  total = sum(by_class.values(), collections.Counter())
  return {'episodes': len(chosen), 'rewarded': total['rewarded'], 'flagged': total['flagged'],
          'faults': total['faults'], 'by_class': {k: dict(v) for k, v in by_class.items()}}


def checks(work: Path, parts: list[str], workers: int) -> dict:
  """The chosen parts: the oracle and the attacks on tasks with hidden tests, the time ratios on
  tasks with visible tests (so the oracle's `run` runs them: the costly turn)."""
  report = {}
  if {'oracle', 'attacks'} & set(parts):
    origin, fixture_dir, _ = testing.make_fixture_tasks(work, only=None, modes=task_lib.MODES, log=print)
  if 'oracle' in parts:
    sdists = [Path(s) if s.endswith('.tar.gz') else redteam_exp.fetch_sdist(s, Path(FLAGS.sdist_cache))
              for s in FLAGS.sdists if s]
    dirs = [fixture_dir] + [testing.sdist_tasks(s, work / 'sdists', FLAGS.max_tasks, log=print) for s in sdists]
    pool = pool_lib.GraderPool(workers)
    report['oracle'] = oracle([env_repo.RepoEnv(d / 'tasks.jsonl', pool) for d in dirs], _BATCH.value, print)
  if 'attacks' in parts:
    report['attacks'] = attacks(fixture_dir, origin, FLAGS.attacks, _BATCH.value, workers, print)
  if 'time' in parts:
    _, visible_dir, _ = testing.make_fixture_tasks(work / 'visible', only=None, modes=task_lib.MODES,
                                                   log=print, visible_tests=True)
    report.update(time_ratios(visible_dir, _BATCH.value, workers))
  return report


def main(argv):
  del argv
  t0, load = time.time(), os.getloadavg()
  with tempfile.TemporaryDirectory(prefix='repo-env-check-') as tmp:
    report = checks(Path(tmp), _PARTS.value, FLAGS.workers)
  report.update(cpus=os.cpu_count(), load_before=load[0], load_after=os.getloadavg()[0],
                seconds=time.time() - t0)
  print(json.dumps(report, indent=1))
  if FLAGS.json:
    with open(FLAGS.json, 'w') as f:
      json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
