"""Grading throughput, sandboxed vs plain subprocess, and the start-up cost of one sandbox.

python -m experiments.benchmarks.sandbox_throughput [--workers=2] [--repeats=3] [--twin_runs]
    [--against=f93206f]

Grades the original of every fixture task (reward 1 each) with a pool of graders, alternating
sandboxed and plain rounds so both see the same machine load, then times empty commands. With
--twin_runs, a third mode alternates with them: sandboxed with every twin beside its test in the
real run, as before twin runs (grading.grade's `twin_runs=False`). With --against=REV (a git
revision of this repository), the grader as it was at REV alternates with them too, in a process
of its own (its `research/` from `git archive`), on the tasks its factory and today's make alike
(the same fixture functions): every mode then grades only those.
"""
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
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
_AGAINST = flags.DEFINE_string('against', '', 'Also grade with the grader at this git revision '
                               '(sandboxed; f93206f: the grader issue 39 was filed against).')
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


# Run in the tree of an earlier revision: makes its fixture's tasks, prints their ids, then per
# line of ids read grades their originals with its GraderPool and prints the seconds.
_EARLIER = """
import contextlib, json, sys, time
from pathlib import Path
from research.tasks import factory, task as task_lib
try:
  from research.tasks import testing as fixtures
except ImportError:
  from research.tasks import fixtures
try:
  from research.tasks.grading import pool
except ImportError:
  from research.tasks import pool
workers, tmp = int(sys.argv[1]), Path(sys.argv[2])
fx = fixtures.write_fixture(tmp / 'fixture')
with contextlib.redirect_stdout(sys.stderr):  # Its summary: stdout is for the answers.
  factory.make_tasks(fx.repo, tmp / 'tasks', site_dirs=(str(fx.site),), progress=False)
solutions = task_lib.read_solutions(tmp / 'tasks')
jobs = {t.id: pool.Job(t, tmp / 'tasks' / t.grading_tree, solutions[t.id].patch)
        for t in task_lib.read(tmp / 'tasks' / 'tasks.jsonl')}
print(json.dumps(sorted(jobs)), flush=True)
for line in sys.stdin:
  start = time.perf_counter()
  grades = pool.GraderPool(workers, isolate=True).grade([jobs[i] for i in json.loads(line)])
  print(json.dumps([time.perf_counter() - start, [g.reason for g in grades if g.reward != 1.0]]),
        flush=True)
"""


class _Earlier:
  """The grader at a git revision, in a process of its own (tasks made by its own factory)."""

  def __init__(self, rev: str, tmp: Path):
    tree = tmp / f'at-{rev}'
    tree.mkdir()
    archive = subprocess.run(['git', 'archive', rev, 'research'], check=True,
                             capture_output=True, cwd=Path(__file__).parents[2]).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
      tar.extractall(tree, filter='data')
    (tmp / 'earlier').mkdir()
    self.proc = subprocess.Popen(
        [sys.executable, '-c', _EARLIER, str(_WORKERS.value), str(tmp / 'earlier')], cwd=tree,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, 'PYTHONPATH': str(tree)})
    self.ids = json.loads(self.proc.stdout.readline())

  def grade(self, ids: list[str]) -> float:
    self.proc.stdin.write(json.dumps(ids) + '\n')
    self.proc.stdin.flush()
    seconds, bad = json.loads(self.proc.stdout.readline())
    if bad:
      raise RuntimeError(f'an original did not grade 1 at {_AGAINST.value}: {bad[:3]}')
    return seconds


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
    earlier = _Earlier(_AGAINST.value, Path(tmp)) if _AGAINST.value else None
    if earlier:
      jobs = [j for j in jobs if j.task.id in earlier.ids]
      modes.append(_AGAINST.value)
    ids = [j.task.id for j in jobs]
    seconds = dict.fromkeys(modes, 0.0)
    for _ in range(_REPEATS.value):
      for mode in modes:
        if mode == _AGAINST.value:
          seconds[mode] += earlier.grade(ids)
          continue
        isolate, twin_runs = mode
        graders = pool.GraderPool(_WORKERS.value, isolate=isolate, twin_runs=twin_runs)
        t = time.perf_counter()
        grades = graders.grade(jobs)
        seconds[mode] += time.perf_counter() - t
        bad = [g.reason for g in grades if g.reward != 1.0]
        if bad:
          raise RuntimeError(f'an original did not grade 1 ({_MODES[mode]}): {bad[:3]}')
    if earlier:
      earlier.proc.stdin.close()
      earlier.proc.wait()
  n = len(jobs) * _REPEATS.value
  rate = {k: n / v for k, v in seconds.items()}
  starts = {(name, isolate): _startup(cmd, isolate, _STARTS.value)
            for name, cmd in (('true', ['/bin/true']),
                              ('python -c pass', [sys.executable, '-I', '-c', 'pass']))
            for isolate in (True, False)}
  print(f'| mode | graded tasks/s ({_WORKERS.value} workers, {n} gradings) |')
  print('| --- | --- |')
  for mode in modes:
    name = f'bubblewrap sandbox, the grader at {mode}' if mode == _AGAINST.value else _MODES[mode]
    print(f'| {name} | {rate[mode]:.2f} |')
  print(f'\nsandbox cost: {rate[False, True] / rate[True, True]:.3f}x the time per graded task')
  if _TWIN_RUNS.value:
    print(f'twin runs cost: {rate[True, False] / rate[True, True]:.3f}x the time per graded task')
  if _AGAINST.value:
    print(f'against the grader at {_AGAINST.value}: '
          f'{rate[_AGAINST.value] / rate[True, True]:.3f}x the time per graded task '
          f'({len(jobs)} tasks both make)')
  print()
  print('| start-up (median) | sandboxed ms | plain ms |')
  print('| --- | --- | --- |')
  for name in ('true', 'python -c pass'):
    print(f'| {name} | {starts[name, True] * 1e3:.1f} | {starts[name, False] * 1e3:.1f} |')


if __name__ == '__main__':
  app.run(main)
