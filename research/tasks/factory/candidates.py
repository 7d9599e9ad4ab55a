"""A repository's candidates: the repository-level gates (a package, tests, a stable suite, no
installed copy), the suite's coverage, and every (function, mode) pair some stable test executes.
"""
import collections
import dataclasses
import json
import math
from pathlib import Path, PurePosixPath
import re
import shutil
import sys
import tempfile
from typing import Callable, Collection

from research.tasks import grading
from research.tasks import layout
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tasks.factory import deletion


# Limits for the runs of the original, before its own timing is known.
_PROBE_LIMITS = sandbox.Limits(cpu_s=600, wall_s=1200)


class Rejected(Exception):
  """A candidate (or a whole repository) failed a gate."""

  def __init__(self, gate: str, detail: str):
    super().__init__(f'{gate}: {detail}')
    self.gate, self.detail = gate, detail


@dataclasses.dataclass
class Summary:
  repo: str
  candidates: int = 0
  tried: int = 0  # Candidates that reached the per-candidate gates (max_tasks stops early).
  kept: int = 0
  rejected: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  repo_rejected: str | None = None  # Why no candidate was even tried.
  stable_tests: int = 0
  flaky_tests: int = 0
  failing_tests: int = 0
  seconds: float = 0.0

  def table(self) -> str:
    tests = f'{self.stable_tests} / {self.flaky_tests} / {self.failing_tests}'
    rows = [('repo', self.repo), ('stable / flaky / failing tests', tests),
            ('candidates', self.candidates), ('tried', self.tried), ('kept', self.kept)]
    rows += [(f'rejected: {gate}', n) for gate, n in sorted(self.rejected.items())]
    if self.repo_rejected:
      rows.append(('repository rejected', self.repo_rejected))
    rows.append(('seconds', f'{self.seconds:.1f}'))
    width = max(len(k) for k, _ in rows)
    return '\n'.join(f'{k:<{width}}  {v}' for k, v in rows)


@dataclasses.dataclass(frozen=True)
class Candidate:
  file: str
  module: str
  symbol: deletion.Symbol
  mode: str
  removed: tuple[deletion.Symbol, ...]  # What goes: the symbol, plus helpers in feature mode.
  tests: frozenset[str]  # Stable tests that execute the removed code.
  prefix: str = ''  # The repository's key when one task set holds several repositories.

  @property
  def id(self) -> str:
    local = re.sub(r'[^A-Za-z0-9_.-]', '_', f'{self.module}.{self.symbol.qualname}.{self.mode}')
    return f'{self.prefix}/{local}' if self.prefix else local

  @property
  def test_files(self) -> list[str]:
    return sorted({t.split('::')[0] for t in self.tests})


def stable_tests(runs: list[dict[str, str]]) -> tuple[set[str], set[str], set[str]]:
  """(passed in every run, flaky, failed in every run) from per-run outcomes."""
  names = set().union(*runs)
  passing = {n for n in names if all(r.get(n) == grading.PASSED for r in runs)}
  flaky = {n for n in names - passing if any(r.get(n) == grading.PASSED for r in runs)}
  return passing, flaky, names - passing - flaky


def tests_by_line(coverage_file: Path, tree: Path) -> dict[str, dict[int, set[str]]]:
  """file -> line -> test node ids that executed it."""
  import coverage  # The factory's only use of it; grading never needs it.
  data = coverage.CoverageData(basename=str(coverage_file))
  data.read()
  out = {}
  for measured in data.measured_files():
    rel = Path(measured).relative_to(tree).as_posix()
    out[rel] = {line: {c for c in contexts if c}
                for line, contexts in data.contexts_by_lineno(measured).items()}
  return out


@dataclasses.dataclass
class RepoHarness:
  """How tests of this repository run."""
  python: str
  site_dirs: list[str]
  python_path: list[str]
  config_file: str | None
  isolate: bool

  def run(self, tree: Path, files: list[str], limits: sandbox.Limits,
          coverage_source: list[str] | None = None) -> grading.TestRun:
    with tempfile.TemporaryDirectory(prefix='factory-run-') as scratch:
      run = grading.run_pytest(tree, files, python=self.python, python_path=self.python_path,
                               site_dirs=self.site_dirs, config_file=self.config_file,
                               limits=limits, isolate=self.isolate,
                               coverage_source=coverage_source, scratch=Path(scratch))
      if run.coverage_file is not None and not run.fault:
        if not run.coverage_file.exists():
          raise Rejected('harness_fault', f'coverage wrote no data: {run.output[-500:]}')
        keep = Path(tempfile.mkdtemp(prefix='factory-cov-')) / '.coverage'
        shutil.copy(run.coverage_file, keep)
        run.coverage_file = keep
    if run.fault:
      raise Rejected('harness_fault', run.fault)
    return run

  def python_check(self, code: str, args: list[str], tree: Path | None = None) -> str:
    """Runs `code` in the sandbox, sys.path led by the tree's source root (if any)."""
    paths = [str(tree / p) if p else str(tree) for p in self.python_path] if tree else []
    prelude = (f'import sys; sys.path[:0] = {paths!r}; sys.path += {self.site_dirs!r}; '
               'sys.argv[1:] = ' + repr(args) + '\n')
    done = sandbox.run([self.python, '-I', '-B', '-c', prelude + code], cwd='/',
                       ro=[*([tree] if tree else []), *sandbox.python_roots(self.python),
                           *self.site_dirs],
                       env={'PATH': '/usr/bin:/bin', 'HOME': '/tmp', 'LANG': 'C.UTF-8'},
                       limits=sandbox.Limits(cpu_s=60, wall_s=120), isolate=self.isolate,
                       hide=sandbox.python_hidden(self.python))
    if done.returncode:
      raise Rejected('not_importable', done.output.strip().splitlines()[-1][:300]
                     if done.output.strip() else f'exit {done.returncode}')
    return done.output


_FIND_INSTALLED = '''
import importlib.util, json
print(json.dumps({name: getattr(importlib.util.find_spec(name), 'origin', None)
                  for name in sys.argv[1:]}))
'''


def list_candidates(tree: Path, packages: list[str], covered: dict[str, dict[int, set[str]]],
                settings: 'Settings', summary: Summary, reject) -> list[Candidate]:
  """Every (function, mode) pair; those no test exercises are rejected here."""
  out = []
  root = layout.source_root(tree)
  for rel in layout.iter_files(tree):
    if not layout.is_editable(rel, packages):
      continue
    module = PurePosixPath(rel).relative_to(root or '.').with_suffix('').as_posix()
    module = module.removesuffix('/__init__').replace('/', '.')
    source = (tree / rel).read_text()
    try:
      syms = deletion.symbols(source)
    except SyntaxError:
      continue
    lines = covered.get(rel, {})
    for sym in syms:
      if settings.only is not None and sym.qualname not in settings.only:
        continue
      for mode in settings.modes:
        removed = [sym]
        if mode == 'feature':
          if sym.private or sym.in_class:
            continue
          removed += deletion.helpers(source, sym)
          if len(removed) == 1:
            continue  # Without helpers this is the function mode.
        tests = set()
        for r in removed:
          first = r.body_start or r.start
          for line in range(first, r.end + 1):
            tests |= lines.get(line, set())
        cand = Candidate(rel, module, sym, mode, tuple(removed), frozenset(tests),
                         settings.id_prefix)
        summary.candidates += 1
        if not tests:
          reject(cand, 'no_covering_test', 'no test executes this code')
        else:
          out.append(cand)
  return out


def delete(tree: Path, cand: Candidate) -> str:
  """Applies the deletion to tree in place; returns the deleted text."""
  path = tree / cand.file
  source = path.read_text()
  try:
    if cand.mode == 'body':
      new, removed = deletion.delete_body(source, cand.symbol)
    else:
      new, removed = deletion.delete_symbols(source, list(cand.removed))
  except (ValueError, SyntaxError) as e:
    raise Rejected('not_deletable', str(e)) from e
  path.write_text(new)
  return removed


@dataclasses.dataclass(frozen=True)
class Settings:
  """What make_tasks does with a repository (its keyword arguments)."""
  modes: tuple[str, ...] = task_lib.MODES
  max_tasks: int | None = None
  only: Collection[str] | None = None  # Qualified names ('slugify', 'Histogram.render').
  seed: int = 0
  runs: int = 3
  site_dirs: tuple[str, ...] = ()
  python: str = sys.executable
  isolate: bool = True
  visible_tests: bool = False  # Keep the task's test files in the policy's tree.
  max_twins: int = 4  # Mutant twins per grading, at most.
  id_prefix: str = ''  # Prepended to task ids (and tree paths) as '<prefix>/'.
  venv: str | None = None  # The id of the venv `python` belongs to.

  def __post_init__(self):
    if self.max_twins < 1:
      raise ValueError(f'max_twins must be at least 1, got {self.max_twins}')


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What the repository-level gates leave for the candidates."""
  repo: str
  harness: RepoHarness
  candidates: list[Candidate]
  stable: set[str]
  wall: float  # Wall seconds of one run of the original suite.


Reject = Callable[[Candidate, str, str], None]


def prepare(base: Path, settings: Settings, summary: Summary, reject: Reject) -> Prepared:
  """Repository-level gates; returns the test harness, candidates, stable tests and timing."""
  packages = layout.source_packages(base)
  tests = layout.test_files(base)
  if not packages:
    raise Rejected('no_packages', 'no importable package found')
  if not tests:
    raise Rejected('no_tests', 'no test files (test_*.py, *_test.py or under tests/)')
  env = RepoHarness(settings.python, list(settings.site_dirs), [layout.source_root(base)],
             layout.pytest_config(base), settings.isolate)
  tops = sorted({PurePosixPath(p).name for p in packages})
  installed = {k: v for k, v in json.loads(env.python_check(_FIND_INSTALLED, tops)).items() if v}
  if installed:
    raise Rejected('leak', f'installed copies importable outside the tree: {installed}')
  results = [env.run(base, tests, _PROBE_LIMITS, packages if i == 0 else None)
             for i in range(settings.runs)]
  stable, flaky, failing = stable_tests([r.outcomes for r in results])
  summary.stable_tests, summary.flaky_tests, summary.failing_tests = map(
      len, (stable, flaky, failing))
  if not stable:
    raise Rejected('original_fails', f'no test passes on the original ({len(failing)} fail); '
                   f'last output: {results[-1].output[-300:]}')
  covered = tests_by_line(results[0].coverage_file, base)
  shutil.rmtree(results[0].coverage_file.parent)
  covered = {f: {line: ts & stable for line, ts in lines.items()} for f, lines in covered.items()}
  # Rounded up to a power of two seconds, so that a rerun writes the same limits.
  wall = 2.0 ** math.ceil(math.log2(max(1.0, *(r.wall_s for r in results[1:] or results))))
  cands = list_candidates(base, packages, covered, settings, summary, reject)
  return Prepared(base.name, env, cands, stable, wall)
