"""Task factory: deletes code that tests exercise and keeps the deletions that pass every gate.

Per repository: the suite runs three times in the sandbox (the first under coverage, which maps
functions to the tests that execute them); tests that do not pass all three times are dropped.
Per candidate (a function and a deletion mode), the gates are: the package still imports; at
least one test fails (FAIL_TO_PASS) and one still passes (PASS_TO_PASS); the rebuilt policy tree
and the environment hold no copy of the deleted code; no trivial body (`return True`, the first
argument, ...) passes every FAIL_TO_PASS test; twins of the tests fail on the original; and the
original, graded as a solution in the grading sandbox, gets reward 1. A failing candidate is
recorded with its gate, never fatal.
"""
import collections
import dataclasses
import itertools
import json
import math
from pathlib import Path, PurePosixPath
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from typing import Callable, Collection

import tqdm

from research.tasks import deletion
from research.tasks import grading
from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks import scrub
from research.tasks import seal
from research.tasks import tamper
from research.tasks import task as task_lib
from research.tasks import taskset
from research.tasks import twins
from research.tasks.task import Solution, Task

GATES = ('not_deletable', 'no_covering_test', 'original_flagged', 'not_importable',
         'no_fail_to_pass', 'no_pass_to_pass', 'leak', 'weak_tests', 'no_twin', 'reference_fails',
         'harness_fault', 'error')
# Twin sites verified per task: enough variety for gradings that plant a few at a time.
_TWIN_SITES = 16
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
class _Env:
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
_IMPORT = 'import importlib\nfor name in sys.argv[1:]: importlib.import_module(name)\n'


def _candidates(tree: Path, packages: list[str], covered: dict[str, dict[int, set[str]]],
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


def _delete(tree: Path, cand: Candidate) -> str:
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
  environment: str | None = None  # The id of the environment `python` belongs to.

  def __post_init__(self):
    if self.max_twins < 1:
      raise ValueError(f'max_twins must be at least 1, got {self.max_twins}')


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What the repository-level gates leave for the candidates."""
  repo: str
  env: _Env
  candidates: list[Candidate]
  stable: set[str]
  wall: float  # Wall seconds of one run of the original suite.


Reject = Callable[[Candidate, str, str], None]


def make_tasks(repo: Path, out: Path, *, fmt: str = 'jsonl', progress: bool = True,
               log: Callable[[str], None] = print, **settings) -> Summary:
  """Writes validated tasks for `repo` into `out` and returns the summary.

  `settings` are the fields of Settings.
  """
  start = time.perf_counter()
  settings = Settings(**settings)
  repo, out = Path(repo).resolve(), Path(out).resolve()
  summary = Summary(repo.name)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'trees').mkdir(exist_ok=True)
  rejections = []

  def reject(cand: Candidate, gate: str, detail: str) -> None:
    summary.rejected[gate] += 1
    rejections.append({'candidate': cand.id, 'gate': gate, 'detail': detail})

  with tempfile.TemporaryDirectory(prefix='factory-') as tmp:
    base = Path(tmp) / repo.name
    layout.copy_tree(repo, base)
    try:
      prepared = prepare(base, settings, summary, reject)
    except Rejected as e:
      summary.repo_rejected = str(e)
      prepared = None
    made = _make_all(base, out, prepared, settings, summary, reject, progress) if prepared else []
  task_lib.write(out, [m[0] for m in made], [m[1] for m in made], fmt)
  summary.seconds = time.perf_counter() - start
  with open(out / 'rejected.jsonl', 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rejections)
  with open(out / 'summary.json', 'w') as f:
    json.dump({**dataclasses.asdict(summary), 'rejected': dict(summary.rejected)}, f, indent=1)
  report = taskset.RepoReport(summary.repo, settings.environment, summary.candidates,
                              summary.tried, summary.stable_tests, summary.repo_rejected, [])
  taskset.plot(taskset.statistics([m[0] for m in made], rejections, [report]),
               out / 'summary.png')
  log(summary.table())
  return summary


def _make_all(base: Path, out: Path, prepared: Prepared, settings: Settings, summary: Summary,
              reject: Reject, progress: bool) -> list[tuple[Task, Solution]]:
  """Tries the candidates in a seeded order, until max_tasks are kept."""
  cands = list(prepared.candidates)
  random.Random(settings.seed).shuffle(cands)
  leaks = environment_leaks(base, cands, settings)
  made = []
  bar = tqdm.tqdm(cands, desc=f'tasks from {summary.repo}', unit='candidate',
                  disable=not progress)
  for cand in bar:
    if settings.max_tasks is not None and summary.kept >= settings.max_tasks:
      break
    summary.tried += 1
    result = try_candidate(base, out, cand, prepared, settings, leaks.get(cand.id, []))
    if isinstance(result, Rejected):
      reject(cand, result.gate, result.detail)
    else:
      made.append(result)
      summary.kept += 1
    bar.set_postfix(kept=summary.kept, rejected=sum(summary.rejected.values()))
  return made


def try_candidate(base: Path, out: Path, cand: Candidate, prepared: Prepared,
                  settings: Settings, env_leaks: list[str]) -> tuple[Task, Solution] | Rejected:
  """The task and solution, or why the candidate was rejected (never raises for it)."""
  try:
    return _make_one(base, out, cand, prepared, settings, env_leaks)
  except Rejected as e:
    return e
  except Exception:  # The factory never stops on one bad candidate.
    return Rejected('error', traceback.format_exc(limit=3)[-500:])


def prepare(base: Path, settings: Settings, summary: Summary, reject: Reject) -> Prepared:
  """Repository-level gates; returns the environment, candidates, stable tests and timing."""
  packages = layout.source_packages(base)
  tests = layout.test_files(base)
  if not packages:
    raise Rejected('no_packages', 'no importable package found')
  if not tests:
    raise Rejected('no_tests', 'no test files (test_*.py, *_test.py or under tests/)')
  env = _Env(settings.python, list(settings.site_dirs), [layout.source_root(base)],
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
  cands = _candidates(base, packages, covered, settings, summary, reject)
  return Prepared(base.name, env, cands, stable, wall)


def _hidden(cand: Candidate, visible_tests: bool) -> list[str]:
  """Test files kept out of the policy's tree: every file that holds a required test."""
  return [] if visible_tests else cand.test_files


def environment_leaks(base: Path, cands: list[Candidate], settings: Settings
                      ) -> dict[str, list[str]]:
  """Candidate id -> files of the environment (all it mounts) that hold its deleted code."""
  if not cands:
    return {}
  return scrub.scan_environment([*sandbox.python_roots(settings.python), *settings.site_dirs],
                                _fingerprint_all(base, cands, settings.visible_tests),
                                skip=sandbox.python_hidden(settings.python))


def _fingerprint_all(base: Path, cands: list[Candidate], visible_tests: bool
                     ) -> dict[str, list[str]]:
  out = {}
  for cand in cands:
    source = (base / cand.file).read_text()
    lines = source.splitlines(keepends=True)
    deleted = ''.join(''.join(lines[s.start - 1:s.end]) for s in cand.removed)
    out[cand.id] = scrub.fingerprints(
        deleted, _remaining_sources(base, cand, _hidden(cand, visible_tests)))
  return out


def _remaining_sources(tree: Path, cand: Candidate, hidden: list[str]) -> list[str]:
  """Source text that stays visible to the policy (after the deletion of cand)."""
  texts = []
  for rel in layout.iter_files(tree):
    if rel.endswith('.py') and rel != cand.file and rel not in hidden:
      texts.append((tree / rel).read_text(errors='replace'))
  source = (tree / cand.file).read_text()
  lines = source.splitlines(keepends=True)
  gone = {i for s in cand.removed for i in range((s.body_start or s.start) - 1, s.end)}
  texts.append(''.join(l for i, l in enumerate(lines) if i not in gone))
  return texts


def _check_original(deleted_tree: Path, base: Path, cand: Candidate) -> None:
  """The honest solution restores the original: a task it would be flagged on is unusable."""
  flags = tamper.scan((deleted_tree / cand.file).read_text(), (base / cand.file).read_text())
  if flags:
    raise Rejected('original_flagged', f'the tamper scan flags the original: {flags[:3]}')


@dataclasses.dataclass(frozen=True)
class _Outcome:
  """The deleted state's test results for one candidate."""
  fail_to_pass: list[str]
  pass_to_pass: list[str]
  limits: sandbox.Limits


def _run_deleted(deleted_tree: Path, cand: Candidate, prepared: Prepared) -> _Outcome:
  prepared.env.python_check(_IMPORT, [cand.module], deleted_tree)
  files = cand.test_files
  wall = prepared.wall
  limits = sandbox.Limits(cpu_s=max(10, math.ceil(4 * wall)), wall_s=max(30.0, 10 * wall))
  run = prepared.env.run(deleted_tree, files, limits)
  relevant = sorted(t for t in prepared.stable if t.split('::')[0] in files)
  f2p = [t for t in relevant if run.outcomes.get(t) != grading.PASSED]
  p2p = [t for t in relevant if run.outcomes.get(t) == grading.PASSED]
  if not f2p:
    raise Rejected('no_fail_to_pass', 'every test still passes without the code')
  if not p2p:
    raise Rejected('no_pass_to_pass', 'no test passes without the code')
  return _Outcome(f2p, p2p, limits)


def _weak_tests(tree: Path, base: Path, cand: Candidate, outcome: _Outcome,
                prepared: Prepared) -> None:
  """Rejects the candidate when a trivial body (`return True`, ...) passes every F2P test.

  Tests like these reward a solver that does not do the work, and twins cannot tell: an honest
  wrong body behaves on them as the original does. One run per body, which stops at the first
  failing test. `tree` (the deleted state) is left with the last body in cand.file.
  """
  original = (base / cand.file).read_text()
  if not cand.symbol.body_start:
    return  # Only a docstring: no body to make trivial.
  for body in deletion.trivial_bodies(original, cand.symbol):
    (tree / cand.file).write_text(deletion.replace_body(original, cand.symbol, body)[0])
    run = prepared.env.run(tree, [*outcome.fail_to_pass, '--maxfail=1'], outcome.limits)
    if all(run.outcomes.get(t) == grading.PASSED for t in outcome.fail_to_pass):
      raise Rejected('weak_tests', f'`{body}` passes every FAIL_TO_PASS test')


def _verify_twins(tree: Path, base: Path, cand: Candidate, outcome: _Outcome,
                  prepared: Prepared, seed: int) -> tuple[list[str], list[str]]:
  """Sites where twins fail on the original: two twins per candidate site, in one run; and,
  from the same run, the asserts of the required tests that grading seals (seal.py).

  Up to _TWIN_SITES sites, from F2P and P2P tests alternately in a seeded order. `tree` (the
  deleted state) gets the original file back, the twins and the seals; it is used up.
  """
  rng = random.Random(f'{seed}:{cand.id}')
  f2p, p2p = list(outcome.fail_to_pass), list(outcome.pass_to_pass)
  rng.shuffle(f2p)
  rng.shuffle(p2p)
  order = [t for pair in itertools.zip_longest(f2p, p2p) for t in pair if t is not None]
  sites = twins.candidate_sites(tree, order, _TWIN_SITES)
  sealable = seal.candidates(tree, order)  # On the pristine test files, as grading sees them.
  if not sites:
    raise Rejected('no_twin', 'no assert or pytest.raises block of a required test can be '
                   'mutated (literal expectations, negatable asserts)')
  shutil.copy(base / cand.file, tree / cand.file)
  pristine = {rel: (tree / rel).read_text() for rel in {s.file for s in sites} | {
      key.split('::', 1)[0] for key in sealable}}
  while True:
    try:
      planted = twins.plant(tree, sites + sites, rng, proofs=True)
    except twins.TwinError as e:
      raise Rejected('no_twin', f'twins cannot be planted together: {e}') from e
    proofs = [t for t in planted if t.kind == twins.PROOF]
    planted = [t for t in planted if t.kind != twins.PROOF]
    sealing = seal.plant(tree, sealable, planted, rng)  # As grading seals them.
    run = grading.restored(prepared.env.run(tree, cand.test_files, outcome.limits), sealing)
    broken = [t for t in order if run.outcomes.get(t) != grading.PASSED]
    if not broken or not sealing.names:
      break
    # Rewritten parametrize lists broke a test (a fixture that reads an argument the test does
    # not): planted again without them.
    for rel, text in pristine.items():
      (tree / rel).write_text(text)
    sealable = seal.candidates(tree, order, cases=False)
  if broken:
    raise Rejected('no_twin', f'planting twins and seals changed the outcome of {broken[0]}: '
                   f'{run.outcomes.get(broken[0], "missing")}')
  unmet, _ = seal.judge(run.seals, sealing, [])  # A twin changed in a sealed assert fails here.
  failed = collections.Counter(str(t.site) for t in planted if run.outcomes.get(t.nodeid) == (
      twins.FAILED) or t.nodeid in unmet and run.outcomes.get(t.nodeid) == grading.PASSED)
  # A value site whose checked copy did not pass would fail correct code once grading checks
  # the test with its seed.
  unproven = {str(t.site) for t in proofs if run.outcomes.get(t.nodeid) != grading.PASSED}
  verified = twins.strongest(
      planted, {site for site, n in failed.items() if n == 2 and site not in unproven})
  if not verified:
    raise Rejected('no_twin', f'none of {len(sites)} candidate twins failed on the original '
                   'twice')
  return verified, seal.verified(run.seals, sealing, order)


def _make_one(base: Path, out: Path, cand: Candidate, prepared: Prepared, settings: Settings,
              env_leaks: list[str]) -> tuple[Task, Solution]:
  hidden = _hidden(cand, settings.visible_tests)
  tree = out / 'trees' / cand.id
  graded = out / 'graded' / cand.id if hidden else tree  # What grading starts from.
  try:
    with tempfile.TemporaryDirectory(prefix='candidate-') as tmp:
      deleted_tree = Path(tmp) / 'tree'
      layout.copy_tree(base, deleted_tree)
      removed = _delete(deleted_tree, cand)
      _check_original(deleted_tree, base, cand)
      outcome = _run_deleted(deleted_tree, cand, prepared)
      for path in (tree, graded):
        if path.exists():
          shutil.rmtree(path)
      scrub.build_policy_tree(deleted_tree, tree, hidden)
      if hidden:
        layout.copy_tree(deleted_tree, graded)
      prints = scrub.fingerprints(removed, _remaining_sources(base, cand, hidden))
      leaks = scrub.scan_tree(tree, prints) + env_leaks
      if leaks:
        raise Rejected('leak', f'deleted code readable by the policy: {leaks[:3]}')
      _weak_tests(deleted_tree, base, cand, outcome, prepared)
      sites, sealed = _verify_twins(deleted_tree, base, cand, outcome, prepared, settings.seed)
    task = _task(cand, out, tree, graded, outcome, prepared, settings, sites, sealed, removed)
    solution = Solution(cand.id, patch_lib.file_diff(
        cand.file, patch_lib.read_entry(tree / cand.file), patch_lib.read_entry(base / cand.file)),
        removed, prints)
    result = grading.grade(task, graded, solution.patch, python=prepared.env.python,
                           isolate=prepared.env.isolate)
    if result.reward != 1.0:
      raise Rejected('reference_fails', f'original graded {result.reward}: {result.reason}')
  except Rejected:
    for path in (tree, graded):
      if path.exists():
        shutil.rmtree(path)
    raise
  return task, solution


def _task(cand: Candidate, out: Path, tree: Path, graded: Path, outcome: _Outcome,
          prepared: Prepared, settings: Settings, sites: list[str], sealed: list[str],
          removed: str) -> Task:
  env, files = prepared.env, cand.test_files
  packages = layout.source_packages(graded)
  return Task(
      id=cand.id, repo=prepared.repo, file=cand.file,
      symbol=cand.symbol.qualname, mode=cand.mode, fail_to_pass=outcome.fail_to_pass,
      pass_to_pass=outcome.pass_to_pass, test_files=files,
      test_command=['python', '-m', 'pytest', '-p', 'no:cacheprovider', *files],
      protected_paths=layout.protected_paths(graded, packages), packages=packages,
      python_path=env.python_path, site_dirs=env.site_dirs, config_file=env.config_file,
      time_limit_s=outcome.limits.wall_s, cpu_limit_s=outcome.limits.cpu_s,
      tree=tree.relative_to(out).as_posix(), grading_tree=graded.relative_to(out).as_posix(),
      visible_tests=settings.visible_tests, twin_sites=sites, max_twins=settings.max_twins,
      python=env.python, environment=settings.environment,
      lines_deleted=sum(1 for line in removed.splitlines() if line.strip()),
      covering_tests=len(cand.tests), cyclomatic=deletion.cyclomatic(removed), sealed=sealed)
