"""Grading throughput, sandboxed vs plain subprocess, and the start-up cost of one sandbox.

python -m experiments.benchmarks.sandbox_throughput [--workers=2] [--repeats=3]

Grades the original of every fixture task (reward 1 each) with a pool of graders, alternating
sandboxed and plain rounds so both see the same machine load, then times empty commands.
"""
import statistics
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

from research.tasks import factory
from research.tasks import testing
from research.tasks.grading import pool
from research.tasks import sandbox
from research.tasks import task as task_lib

_WORKERS = flags.DEFINE_integer('workers', 2, 'Graders running at once.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Rounds per mode (alternating).')
_STARTS = flags.DEFINE_integer('starts', 30, 'Timed start-ups per command and mode.')


def _startup(argv: list[str], isolate: bool, n: int) -> float:
  """Median wall seconds of one run of argv."""
  roots = sandbox.python_roots(sys.executable)
  times = []
  for _ in range(n):
    t = time.perf_counter()
    done = sandbox.run(argv, cwd='/', ro=roots, isolate=isolate)
    times.append(time.perf_counter() - t)
    if done.returncode:
      raise RuntimeError(f'{argv} failed: {done.output}')
  return statistics.median(times)


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix='throughput-') as tmp:
    fx = testing.write_fixture(Path(tmp) / 'fixture')
    out = Path(tmp) / 'tasks'
    factory.make_tasks(fx.repo, out, site_dirs=(str(fx.site),), progress=False)
    tasks = task_lib.read(out / 'tasks.jsonl')
    solutions = task_lib.read_solutions(out)
    jobs = [pool.Job(t, out / t.grading_tree, solutions[t.id].patch) for t in tasks]
    seconds = {True: 0.0, False: 0.0}
    for _ in range(_REPEATS.value):
      for isolate in (True, False):
        graders = pool.GraderPool(_WORKERS.value, isolate=isolate)
        t = time.perf_counter()
        grades = graders.grade(jobs)
        seconds[isolate] += time.perf_counter() - t
        bad = [g.reason for g in grades if g.reward != 1.0]
        if bad:
          raise RuntimeError(f'an original did not grade 1 (isolate={isolate}): {bad[:3]}')
  n = len(jobs) * _REPEATS.value
  rate = {k: n / v for k, v in seconds.items()}
  starts = {(name, isolate): _startup(cmd, isolate, _STARTS.value)
            for name, cmd in (('true', ['/bin/true']),
                              ('python -c pass', [sys.executable, '-I', '-c', 'pass']))
            for isolate in (True, False)}
  print(f'| mode | graded tasks/s ({_WORKERS.value} workers, {n} gradings) |')
  print('| --- | --- |')
  print(f'| plain subprocess | {rate[False]:.2f} |')
  print(f'| bubblewrap sandbox | {rate[True]:.2f} |')
  print(f'\nsandbox cost: {rate[False] / rate[True]:.3f}x the time per graded task\n')
  print('| start-up (median) | sandboxed ms | plain ms |')
  print('| --- | --- | --- |')
  for name in ('true', 'python -c pass'):
    print(f'| {name} | {starts[name, True] * 1e3:.1f} | {starts[name, False] * 1e3:.1f} |')


if __name__ == '__main__':
  app.run(main)
