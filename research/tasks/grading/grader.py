"""Grades a solution: a path-filtered diff applied to a pristine tree, tested in a fresh sandbox.

The work area the policy edited is never run. Only the sections of its diff that change Python
source inside the task's packages are applied, to a clean copy of the task's tree, so tests and
test configuration are the pristine ones. pytest then runs in a new sandbox with autoloaded
plugins, caches and bytecode off, under rlimits, and reports each test through a pipe to the
harness; mutant twins of the required tests (research/tasks/grading/twins.py), which correct code fails,
pytest's own summary and the exit status cross-check that report, and the runner's integrity
checks look for in-process tampering after each test. A required test one of whose sealed answers
another test holds runs alone, in a run of its own (research/tasks/grading/isolation.py).
"""
import dataclasses
from pathlib import Path
import random
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


def _run_flags(run: testrun.TestRun, runs: list[testrun.TestRun], parts: list[isolation.Part],
               planted: Planted, task: Task) -> tuple[list[str], dict[str, str], dict[str, str]]:
  """Step 6's checks of the finished runs (run.problems aside): (flags, outcomes after the seals,
  unmet seals)."""
  flags = []
  # A test pytest passed fails here when its sealed asserts' records miss their literals.
  unmet, seal_flags = seal.judge(run.seals, planted.sealing, task.sealed)
  flags += seal_flags
  outcomes = {n: 'failed' if n in unmet and o == testrun.PASSED else o
              for n, o in run.outcomes.items()}
  flags += twins.check(planted.twins, outcomes, run.finished)
  flags += [f'value checks answered wrongly where `a == b` held: {s.test}' for s in planted.checked
            if value_check.FAILED.search(run.failures.get(s.test, ''))]
  in_pytest = [t for t in planted.twins if t.nodeid not in planted.sealing.sealed_twins]
  flags += [f'exit status {r.returncode} although mutant twins fail' for p, r in zip(parts, runs)
            if r.finished and any(t.nodeid in p.twins for t in in_pytest)
            and r.returncode != TESTS_FAILED]
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
          seed: int | None = None) -> Grade:
  """Grades `patch` against the task whose pristine tree is `tree` (its reward: `reward(grade)`).

  Tests run with `python`, by default the task's own interpreter. `alone=False` runs every test
  in one run, as graders before isolation.py did (for comparison). `seed` draws the differential
  check's fresh inputs (default: a fresh one; either way the grade records it).

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
                   seed=seed)
  except Exception as e:  # noqa: BLE001 - see the docstring: a failure, never a masked fault.
    error = f'{type(e).__name__}: {e}'[:300]
    return Grade(f'grading failed on what the solution shaped: {error}', flags, rejected,
                 error=error)


def _graded(task: Task, tree: Path, patch: str, flags: list[str], rejected: list[str], *,
            python: str, isolate: bool, uid: int | None, limits: sandbox.Limits, alone: bool,
            seed: int) -> Grade:
  with tempfile.TemporaryDirectory(prefix='grade-') as scratch:
    scratch = Path(scratch)
    final = _applied(task, tree, patch, scratch / 'tree', flags, rejected)
    if final is not None:
      return final
    # Fresh twins at every grading, from no seed a solution sees.
    planted = plant_checks(task, scratch / 'tree', random.SystemRandom())
    parts = isolation.split(task.fail_to_pass if alone else [], task.test_files, scratch / 'tree',
                            planted.sealing, planted.twins, scratch)
    runs = [restored(testrun.run_pytest(
        p.tree, p.files, python=python, python_path=task.python_path, site_dirs=task.site_dirs,
        config_file=task.config_file, limits=limits, isolate=isolate, uid=uid, scratch=p.scratch),
        planted.sealing) for p in parts]
    run = testrun.merged(runs)
    if run.fault:
      return Grade(run.fault, flags, rejected, run.outcomes, run.wall_s, fault=run.fault)
    flags += run.problems  # Before the checks below, which read what the runs reported.
    run_flags, outcomes, unmet = _run_flags(run, runs, parts, planted, task)
    flags += run_flags
    not_passed = [t for t in task.fail_to_pass + task.pass_to_pass
                  if outcomes.get(t, 'missing') != testrun.PASSED]
    reason = _reason(flags, not_passed, outcomes, unmet, run)
    solved = not not_passed and run.finished
    check = None
    if solved and not flags and task.calls:  # Only what would earn 1 is worth the calls.
      (scratch / 'differential').mkdir()
      check = differential.check(task, scratch / 'tree', tree, scratch / 'differential', limits,
                                 python=python, seed=seed, uid=uid, isolate=isolate)
      if check.fault:
        return Grade(check.fault, flags, rejected, outcomes, run.wall_s, fault=check.fault,
                     differential=dataclasses.asdict(check))
      if not check.passed:
        solved = False
        reason = (f'differential check: {check.wrong} of {check.compared} fresh inputs '
                  f'answered otherwise than the original, e.g. {check.disagreed[0][:200]}')
  return Grade(reason, flags, rejected, outcomes, run.wall_s, solved=solved,
               differential=dataclasses.asdict(check) if check else None)
