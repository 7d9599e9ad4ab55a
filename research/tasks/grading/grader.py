"""Grades a solution: a path-filtered diff applied to a pristine tree, tested in a fresh sandbox.

The work area the policy edited is never run. Only the sections of its diff that change Python
source inside the task's packages are applied, to a clean copy of the task's tree, so tests and
test configuration are the pristine ones. pytest then runs in a new sandbox with autoloaded
plugins, caches and bytecode off, under rlimits, and reports each test through a pipe to the
harness; mutant twins of the required tests (research/tasks/grading/twins.py), which correct code fails,
pytest's own summary and the exit status cross-check that report, and the runner's integrity
checks look for in-process tampering after each test. A required test one of whose sealed answers
another test holds runs alone, in a run of its own (research/tasks/grading/isolation.py). Where
every required test passed, twin runs follow, in which function twins stand in their tests'
places (same names, files, lines, order): the real run and a twin run differ only there.
"""
import dataclasses
import os
from pathlib import Path
import random
import shutil
import tempfile

from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks.grading import differential
from research.tasks.grading import isolation
from research.tasks.grading import policy
from research.tasks.grading import seal
from research.tasks.grading import tamper
from research.tasks.grading import testrun
from research.tasks.grading import twins
from research.tasks.grading.reward import Grade
from research.tasks.grading.sandboxed import value_check
from research.tasks.task import Task

# pytest's exit status when some tests failed: what the twins guarantee for an honest run.
TESTS_FAILED = 1

# Twin runs per run of a grading (each a pytest run of the whole suite): one puts a twin in the
# place of every test that has an in-place twin; a test's further twins stay beside it.
MOST_TWIN_RUNS = 1


@dataclasses.dataclass
class Planted:
  """What step 4 planted into one grading's tree."""
  checked: list[twins.Site]         # The checked tests' value sites.
  twins: list[twins.Twin]
  sealing: seal.Sealing


def restored(run: testrun.TestRun, sealing: seal.Sealing) -> testrun.TestRun:
  """The run with its tests named as the task names them (sealing renames parametrize cases)."""
  return dataclasses.replace(run, outcomes=sealing.restore(run.outcomes),
                             failures=sealing.restore(run.failures),
                             seals=sealing.restore(run.seals))


def plant_checks(task: Task, work: Path, rng: random.Random) -> Planted:
  """Step 4 on the tree `work`: checked tests, mutant twins and sealed asserts."""
  checked = twins.value_checks(task.twin_sites, rng)
  planted = twins.plant_twins(work, twins.draw(task.twin_sites, task.fail_to_pass, task.max_twins,
                                               rng), rng, checked)
  return Planted(checked, planted, seal.seal_asserts(work, seal.functions(task.sealed), planted, rng))


def limits_for(task: Task) -> sandbox.Limits:
  return sandbox.Limits(cpu_s=task.cpu_limit_s, wall_s=task.time_limit_s)


def _applied(task: Task, tree: Path, patch: str, work: Path, flags: list[str],
             rejected: list[str]) -> Grade | None:
  """Steps 1-3: the diff parsed, filtered by the policy, applied to a copy of `tree` at `work` and
  scanned; tamper flags and rejected sections added to `flags` and `rejected` as they are found.
  Returns a final grade where nothing can run, else None."""
  try:
    sections = patch_lib.parse(patch)
  except patch_lib.PatchError as e:
    flags += e.flags
    return Grade(f'malformed patch: {e}', flags)
  kept, rejected[:], flags[:] = policy.filter_sections(sections, task)
  if not kept:
    return Grade('no applicable source changes', flags, rejected)
  layout.copy_tree(tree, work)
  error, applied_flags = policy.apply_checked(work, kept, task)
  flags += applied_flags
  if error:
    return Grade(error, flags, rejected)
  for section in kept:
    if section.new_path:
      old = tree / section.old_path if section.old_path else None
      new = (work / section.new_path).read_text(errors='replace')
      flags += [f'{c} in {section.new_path}' for c in tamper.scan(
          old.read_text(errors='replace') if old and old.is_file() else None, new)]
  return None


def _run_flags(run: testrun.TestRun, runs: list[testrun.TestRun], held: list[frozenset[str]],
               judged: list[twins.Twin], planted: Planted, task: Task, known: dict[str, str]
               ) -> tuple[list[str], dict[str, str], dict[str, str]]:
  """Step 6's checks of the finished runs (run.problems aside) whose twins are `judged` (`held`:
  the twins each run holds; `known`: outcomes of the tests they copy from earlier runs): (flags,
  outcomes after the seals, unmet seals)."""
  flags = []
  # A test pytest passed fails here when its sealed asserts' records miss their literals.
  unmet, seal_flags = seal.judge(run.seals, planted.sealing, task.sealed)
  flags += seal_flags
  outcomes = {n: 'failed' if n in unmet and o == testrun.PASSED else o
              for n, o in run.outcomes.items()}
  flags += twins.check(judged, {**known, **outcomes}, run.finished or run.stopped)
  flags += [f'value checks answered wrongly where `a == b` held: {s.test}' for s in planted.checked
            if value_check.FAILED.search(run.failures.get(s.test, ''))]
  in_pytest = {t.nodeid for t in judged if t.nodeid not in planted.sealing.sealed_twins}
  flags += [f'exit status {r.returncode} although mutant twins fail' for h, r in zip(held, runs)
            if r.finished and h & in_pytest and r.returncode != TESTS_FAILED]
  return flags, outcomes, unmet


def _reason(flags: list[str], not_passed: list[str], outcomes: dict[str, str],
            unmet: dict[str, str], run: testrun.TestRun) -> str:
  if flags:
    return 'tampering: ' + '; '.join(flags[:3])
  if not not_passed:
    return 'all required tests passed'
  reason = (f'{len(not_passed)} required tests not passed, e.g. {not_passed[0]} '
            f'({unmet.get(not_passed[0]) or outcomes.get(not_passed[0], "missing")})')
  if run.timed_out:
    reason += f'; time limit of {run.wall_s:.0f}s exceeded'
  elif not run.finished:
    reason += f'; test process ended early (exit {run.returncode})'
  return reason


def grade(task: Task, tree: Path, patch: str, *, python: str | None = None,
          isolate: bool = True, uid: int | None = None,
          limits: sandbox.Limits | None = None, alone: bool = True,
          seed: int | None = None, twin_runs: bool = True) -> Grade:
  """Grades `patch` against the task whose pristine tree is `tree` (its reward: `reward(grade)`).

  Tests run with `python`, by default the task's own interpreter. `alone=False` runs every test
  in one run, as graders before isolation.py did (for comparison). `seed` draws the differential
  check's fresh inputs (default: a fresh one; either way the grade records it). `twin_runs=False`
  plants every twin beside its test under a fresh name, in the real run, as graders before issue
  39 did (for comparison): by default each in-place twin stands in its test's place, in a run
  of its own.

  Everything grading reads is shaped by the candidate (its diff, then what its code printed and
  reported), so an exception while grading is the candidate's failure, not a harness fault: the
  grade is 0 with every flag raised until then (`Grade.error` names it). Only the faults the run
  proves the harness's own (testrun: the sandbox failed, the runner never started) are masked.
  """
  flags, rejected = [], []
  seed = random.SystemRandom().getrandbits(63) if seed is None else seed
  try:
    return _graded(task, tree, patch, flags, rejected, python=python or task.python,
                   isolate=isolate, uid=uid, limits=limits or limits_for(task), alone=alone,
                   seed=seed, twin_runs=twin_runs)
  except Exception as e:  # noqa: BLE001 - see the docstring: a failure, never a masked fault.
    error = f'{type(e).__name__}: {e}'[:300]
    return Grade(f'grading failed on what the solution shaped: {error}', flags, rejected,
                 error=error)


@dataclasses.dataclass
class _Runs:
  """The pytest runs of one grading. Each runs a part (isolation.py) on a fresh copy of its
  planted tree, with some test files' texts written in: in a root of its own made like every
  other run's (`/tmp/grade-*`, the part's paths below it), its files' times those of the copy,
  under the same uid and environment. The real run and the twin runs of a part then differ only
  in the texts, which differ only where a twin stands in its test's place, up to where a twin run
  is stopped: once the tests of `until` (the task's node ids) have reported."""
  task: Task
  scratch: Path  # The grading's: the parts' trees lie below it.
  sealing: seal.Sealing
  kwargs: dict  # run_pytest's python, limits, isolate, uid.

  def __call__(self, part: isolation.Part, texts: dict[str, str],
               until: frozenset[str] = frozenset()) -> testrun.TestRun:
    root = Path(tempfile.mkdtemp(prefix='grade-', dir=self.scratch.parent))
    try:
      tree = root / part.tree.relative_to(self.scratch)
      shutil.copytree(part.tree, tree, symlinks=True, copy_function=shutil.copy)
      for rel, text in texts.items():
        (tree / rel).write_text(text)
      for path in [tree, *tree.rglob('*')]:  # copytree gives directories their source's times.
        os.utime(path, follow_symlinks=False)
      return restored(testrun.run_pytest(
          tree, part.files, python_path=self.task.python_path, site_dirs=self.task.site_dirs,
          config_file=self.task.config_file, scratch=root / part.scratch.relative_to(self.scratch),
          until=frozenset(self.sealing.run_ids(until)), **self.kwargs), self.sealing)
    finally:
      shutil.rmtree(root, ignore_errors=True)


def _as_twins(run: testrun.TestRun, held: list[twins.Twin]) -> testrun.TestRun:
  """A twin run's report on its twins alone, each under its own node id (it ran under its
  test's), with their modules' and classes' outcomes (collection errors)."""
  names = {t.site.test: t.nodeid for t in held}
  parents = {p for t in held for p in twins.parents(t.nodeid)}
  keep = lambda found: {names.get(n, n): v for n, v in found.items() if n in names or n in parents}
  return dataclasses.replace(run, outcomes=keep(run.outcomes), failures=keep(run.failures),
                             seals=keep(run.seals))


def _judged(runs: list[testrun.TestRun], held: list[frozenset[str]], judged: list[twins.Twin],
            planted: Planted, task: Task, known: dict[str, str] | None = None
            ) -> tuple[testrun.TestRun, list[str], dict, dict]:
  """The runs merged, with their problems and step 6's flags, outcomes and unmet seals."""
  run = testrun.merged(runs)
  if run.fault:
    return run, [], {}, {}
  flags, outcomes, unmet = _run_flags(run, runs, held, judged, planted, task, known or {})
  return run, run.problems + flags, outcomes, unmet


def _twin_runs(runs: _Runs, separated: list, planted: Planted, task: Task,
               known: dict[str, str]) -> tuple[testrun.TestRun, list[str], dict[str, str]]:
  """Each part's twin runs, in which its in-place twins stand in their tests' places (`known`:
  the real runs' outcomes), each stopped once its twins have reported (what follows cannot change
  their verdicts): the run merged (faults and all), its problems and flags, and the twins'
  outcomes."""
  done, held = [], []
  for part, rounds, texts in separated:
    for r, round_twins in enumerate(rounds):
      done.append(_as_twins(runs(part, {rel: t[r + 1] for rel, t in texts.items()},
                                 frozenset(t.site.test for t in round_twins)), round_twins))
      held.append(frozenset(t.nodeid for t in round_twins))
  judged = [t for _, rounds, _ in separated for r in rounds for t in r]
  run, flags, outcomes, _ = _judged(done, held, judged, planted, task, known)
  return run, flags, outcomes


def _graded(task: Task, tree: Path, patch: str, flags: list[str], rejected: list[str], *,
            python: str, isolate: bool, uid: int | None, limits: sandbox.Limits, alone: bool,
            seed: int, twin_runs: bool) -> Grade:
  with tempfile.TemporaryDirectory(prefix='grade-') as scratch:
    scratch = Path(scratch)
    final = _applied(task, tree, patch, scratch / 'tree', flags, rejected)
    if final is not None:
      return final
    # Fresh twins at every grading, from no seed a solution sees.
    planted = plant_checks(task, scratch / 'tree', random.SystemRandom())
    parts = isolation.split(task.fail_to_pass if alone else [], task.test_files, scratch / 'tree',
                            planted.sealing, planted.twins, scratch)
    runs = _Runs(task, scratch, planted.sealing, dict(python=python, limits=limits,
                                                      isolate=isolate, uid=uid))
    separated = []  # (part, its twin runs' twins, its files' texts: real, then per twin run).
    for p in parts:
      rounds = twins.rounds([t for t in planted.twins if t.nodeid in p.twins],
                            MOST_TWIN_RUNS) if twin_runs else []
      separated.append((p, rounds, twins.separated(p.tree, rounds)))
    away = {t.nodeid for _, rounds, _ in separated for r in rounds for t in r}
    run, run_flags, outcomes, unmet = _judged(
        [runs(p, {rel: t[0] for rel, t in texts.items()}) for p, _, texts in separated],
        [p.twins - away for p in parts], [t for t in planted.twins if t.nodeid not in away],
        planted, task)
    if run.fault:
      return Grade(run.fault, flags, rejected, run.outcomes, run.wall_s, fault=run.fault)
    flags += run_flags
    not_passed = [t for t in task.fail_to_pass + task.pass_to_pass
                  if outcomes.get(t, 'missing') != testrun.PASSED]
    solved = not not_passed and run.finished
    if solved and away:  # Where a test failed, the twins change nothing: 0 in any case.
      twin_run, twin_flags, twin_outcomes = _twin_runs(runs, separated, planted, task, outcomes)
      if twin_run.fault:
        return Grade(twin_run.fault, flags, rejected, outcomes, run.wall_s, fault=twin_run.fault)
      flags += twin_flags
      outcomes.update(twin_outcomes)
      solved = twin_run.finished or twin_run.stopped
      run = dataclasses.replace(run, wall_s=run.wall_s + twin_run.wall_s)
    reason = _reason(flags, not_passed, outcomes, unmet, run) if solved or flags or not_passed else (
        f'a twin run ended early (exit {twin_run.returncode}'
        f'{", time limit exceeded" if twin_run.timed_out else ""})')
    return _checked(task, tree, scratch, Grade(reason, flags, rejected, outcomes, run.wall_s,
                                               solved=solved), python, isolate, uid, limits, seed)


def _checked(task: Task, tree: Path, scratch: Path, grade: Grade, python: str, isolate: bool,
             uid: int | None, limits: sandbox.Limits, seed: int) -> Grade:
  """Step 9: the differential check of a grade that would earn 1, on a task with calls."""
  if not (grade.solved and not grade.tamper and task.calls):  # Only what would earn 1.
    return grade
  (scratch / 'differential').mkdir()
  check = differential.check(task, scratch / 'tree', tree, scratch / 'differential', limits,
                             python=python, seed=seed, uid=uid, isolate=isolate)
  grade = dataclasses.replace(grade, differential=dataclasses.asdict(check))
  if check.fault:
    return dataclasses.replace(grade, reason=check.fault, solved=False, fault=check.fault)
  if not check.passed:
    return dataclasses.replace(grade, solved=False, reason=(
        f'differential check: {check.wrong} of {check.compared} fresh inputs '
        f'answered otherwise than the original, e.g. {check.disagreed[0][:200]}'))
  return grade
