"""Repository episodes on the local executor vs on Ray (env.executor), side by side in one run.

python -m experiments.benchmarks.env_scaling [--rounds=2] [--calls=200] [--json=/tmp/env_scaling.json]

Every fixture task's oracle episode (view, edits, its tests in the sandbox, submit and grading,
research/rl/envs/repo/oracle.py) is played turn by turn, the live episodes of a turn at once on
--env_workers threads as the sampler steps them, by a local RepoEnv and by a RayEnv on the local
Ray it starts (env.ray_address empty: sized to the machine, one worker), in alternating rounds so
both see the same machine load; grades are not memoized, so each episode pays its own grading.
Reports episodes/s of each and their ratio, that both gave the same rewards, and the scheduler's
overhead per tool call: the mean time of a cheap call (`view`) on Ray minus locally, over --calls
sequential calls, and the same for a reset (Ray's from its warm pool).
"""
import functools
import json
import os
from concurrent import futures
from pathlib import Path
import tempfile
import time

from absl import app, flags
import ray

from research.rl.envs import ray_env
from research.rl.envs.repo import calls
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo import oracle
from research.rl.envs.repo.settings import Settings
from research.tasks import task as task_lib
from research.tasks import testing

_ROUNDS = flags.DEFINE_integer('rounds', 2, 'Rounds per executor (alternating).')
_CALLS = flags.DEFINE_integer('calls', 200, 'Sequential calls (and resets) timed per executor.')
_ENV_WORKERS = flags.DEFINE_integer('env_workers', 64, 'Episodes stepped at once (sampler.env_workers).')
_JSON = flags.DEFINE_string('json', None, 'Also write the report here.')

CHATML = calls.FORMATS['chatml']


def _scripts(tasks: list[task_lib.Task], task_dir: Path) -> list[list[str]]:
  solutions = task_lib.read_solutions(task_dir)
  return [[CHATML.render(c) for c in oracle.solution_calls(t, solutions[t.id], task_dir / t.tree)]
          for t in tasks]


def _round(env, tasks, scripts, pool) -> tuple[float, list[float]]:
  """Plays every task's script, a turn at a time. Returns (seconds, rewards)."""
  t0 = time.perf_counter()
  eps = list(pool.map(env.reset, tasks))
  final = [None] * len(eps)
  for turn in range(max(len(s) for s in scripts)):
    live = [i for i in range(len(eps)) if final[i] is None]
    for i, step in zip(live, pool.map(lambda i: eps[i].step(scripts[i][turn]), live)):
      final[i] = step if step.done else None
  return time.perf_counter() - t0, [s.reward for s in final]


def _per_call(env, task, n: int) -> tuple[float, float]:
  """Mean seconds of a `view` call and of a reset (each reset episode closed untimed)."""
  ep = env.reset(task)
  view = CHATML.render(calls.Call('view', {'path': task.file}))
  t0 = time.perf_counter()
  for _ in range(n):
    ep.step(view)
  call_s = (time.perf_counter() - t0) / n
  ep.close('benchmark')
  reset_s = 0.0
  for _ in range(n):
    t0 = time.perf_counter()
    ep = env.reset(task)
    reset_s += time.perf_counter() - t0
    ep.close('benchmark')
  return call_s, reset_s / n


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix='env-scaling-') as tmp:
    task_dir = testing.make_fixture_tasks(Path(tmp) / 'tasks', only=testing.TARGETS,
                                          modes=('body', 'function', 'feature'), log=lambda _: None,
                                          visible_tests=True)[1]
    settings = Settings(memoize_grades=False, max_turns=_CALLS.value + 10)
    make = functools.partial(env_repo.RepoEnv, task_dir / 'tasks.jsonl', settings=settings)
    t0 = time.perf_counter()
    executors = {'local': make(), 'ray': ray_env.RayEnv(make)}
    ray_start_s = time.perf_counter() - t0
    tasks = executors['local'].tasks
    scripts = _scripts(tasks, task_dir)
    seconds, rewards = dict.fromkeys(executors, 0.0), {}
    with futures.ThreadPoolExecutor(_ENV_WORKERS.value) as pool:
      for _ in range(_ROUNDS.value):
        for name, env in executors.items():
          s, rewards[name] = _round(env, tasks, scripts, pool)
          seconds[name] += s
    per_call = {name: _per_call(env, tasks[0], _CALLS.value) for name, env in executors.items()}
    executors['ray'].shutdown()
    ray.shutdown()
  n = len(tasks) * _ROUNDS.value
  rate = {k: n / v for k, v in seconds.items()}
  report = {
      'cpus': os.cpu_count(), 'episodes': n, 'ray_start_s': round(ray_start_s, 2),
      'episodes_per_s': {k: round(v, 3) for k, v in rate.items()},
      'ray_vs_local': round(rate['ray'] / rate['local'], 3),
      'same_rewards': rewards['ray'] == rewards['local'], 'reward_mean': sum(rewards['local']) / len(tasks),
      'view_call_ms': {k: round(v[0] * 1e3, 3) for k, v in per_call.items()},
      'overhead_ms_per_call': round((per_call['ray'][0] - per_call['local'][0]) * 1e3, 3),
      'reset_ms': {k: round(v[1] * 1e3, 3) for k, v in per_call.items()},
  }
  print(json.dumps(report, indent=1))
  if _JSON.value:
    Path(_JSON.value).write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
  app.run(main)
