"""Grading throughput, sandboxed vs plain subprocess, and the start-up cost of one sandbox.

python -m experiments.benchmarks.sandbox_throughput [--workers=2] [--repeats=3] [--twin_runs]

Grades the original of every fixture task (reward 1 each) with a pool of graders, alternating
sandboxed and plain rounds so both see the same machine load, then times empty commands. With
--twin_runs, a third mode alternates with them: sandboxed with every twin beside its test in the
real run, as before twin runs (grading.grade's `twin_runs=False`).
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
_TWIN_RUNS = flags.DEFINE_bool('twin_runs', False, 'Also grade without twin runs (sandboxed).')
# (sandboxed, twin runs) -> the mode's name.
_MODES = {(False, True): 'plain subprocess', (True, True): 'bubblewrap sandbox',
          (True, False): 'bubblewrap sandbox, twins beside their tests (no twin runs)'}


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
    modes = [m for m in _MODES if m[1] or _TWIN_RUNS.value]
    seconds = dict.fromkeys(modes, 0.0)
    for _ in range(_REPEATS.value):
      for isolate, twin_runs in modes:
        graders = pool.GraderPool(_WORKERS.value, isolate=isolate, twin_runs=twin_runs)
        t = time.perf_counter()
        grades = graders.grade(jobs)
        seconds[isolate, twin_runs] += time.perf_counter() - t
        bad = [g.reason for g in grades if g.reward != 1.0]
        if bad:
          raise RuntimeError(f'an original did not grade 1 ({_MODES[isolate, twin_runs]}): {bad[:3]}')
  n = len(jobs) * _REPEATS.value
  rate = {k: n / v for k, v in seconds.items()}
  starts = {(name, isolate): _startup(cmd, isolate, _STARTS.value)
            for name, cmd in (('true', ['/bin/true']),
                              ('python -c pass', [sys.executable, '-I', '-c', 'pass']))
            for isolate in (True, False)}
  print(f'| mode | graded tasks/s ({_WORKERS.value} workers, {n} gradings) |')
  print('| --- | --- |')
  for mode in modes:
    print(f'| {_MODES[mode]} | {rate[mode]:.2f} |')
  print(f'\nsandbox cost: {rate[False, True] / rate[True, True]:.3f}x the time per graded task')
  if _TWIN_RUNS.value:
    print(f'twin runs cost: {rate[True, False] / rate[True, True]:.3f}x the time per graded task')
  print()
  print('| start-up (median) | sandboxed ms | plain ms |')
  print('| --- | --- | --- |')
  for name in ('true', 'python -c pass'):
    print(f'| {name} | {starts[name, True] * 1e3:.1f} | {starts[name, False] * 1e3:.1f} |')


if __name__ == '__main__':
  app.run(main)
