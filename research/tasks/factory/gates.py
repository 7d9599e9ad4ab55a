"""The gates of one candidate: deleted, scrubbed, tested without the code, twins and seals
verified on the original, the original graded as a solution; a task and its solution, or the gate
that rejected it."""
import collections
import dataclasses
import itertools
import math
from pathlib import Path
import random
import shutil
import tempfile
import traceback

from research.tasks import grading
from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks.factory import deletion
from research.tasks.factory import scrub
from research.tasks.factory.candidates import Candidate, Prepared, Rejected, Settings, delete
from research.tasks.grading import differential
from research.tasks.grading import seal
from research.tasks.grading import tamper
from research.tasks.grading import testsource
from research.tasks.grading import twins
from research.tasks.task import Solution, Task


GATES = ('not_deletable', 'no_covering_test', 'original_flagged', 'not_importable',
         'no_fail_to_pass', 'no_pass_to_pass', 'leak', 'weak_tests', 'no_twin', 'reference_fails',
         'harness_fault', 'error')


# Twin sites verified per task: enough variety for gradings that plant a few at a time.
_TWIN_SITES = 16


_IMPORT = 'import importlib\nfor name in sys.argv[1:]: importlib.import_module(name)\n'


def try_candidate(base: Path, out: Path, cand: Candidate, prepared: Prepared,
                  settings: Settings, env_leaks: list[str]) -> tuple[Task, Solution] | Rejected:
  """The task and solution, or why the candidate was rejected (never raises for it)."""
  try:
    return _make_one(base, out, cand, prepared, settings, env_leaks)
  except Rejected as e:
    return e
  except Exception:  # The factory never stops on one bad candidate.
    return Rejected('error', traceback.format_exc(limit=3)[-500:])


def _hidden(cand: Candidate, visible_tests: bool) -> list[str]:
  """Test files kept out of the policy's tree: every file that holds a required test."""
  return [] if visible_tests else cand.test_files


def venv_leaks(base: Path, cands: list[Candidate], settings: Settings
                      ) -> dict[str, list[str]]:
  """Candidate id -> files of the venv (all it mounts) that hold its deleted code."""
  if not cands:
    return {}
  return scrub.scan_venv([*sandbox.python_roots(settings.python), *settings.site_dirs],
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
  prepared.harness.python_check(_IMPORT, [cand.module], deleted_tree)
  files = cand.test_files
  wall = prepared.wall
  limits = sandbox.Limits(cpu_s=max(10, math.ceil(4 * wall)), wall_s=max(30.0, 10 * wall))
  run = prepared.harness.run(deleted_tree, files, limits)
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
    run = prepared.harness.run(tree, [*outcome.fail_to_pass, '--maxfail=1'], outcome.limits)
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
      planted = twins.plant_twins(tree, sites + sites, rng, proofs=True)
    except testsource.Unplantable as e:
      raise Rejected('no_twin', f'twins cannot be planted together: {e}') from e
    proofs = [t for t in planted if t.kind == twins.PROOF]
    planted = [t for t in planted if t.kind != twins.PROOF]
    sealing = seal.seal_asserts(tree, sealable, planted, rng)  # As grading seals them.
    run = grading.restored(prepared.harness.run(tree, cand.test_files, outcome.limits), sealing)
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
      removed = delete(deleted_tree, cand)
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
    task = _with_calls(task, base, out, outcome, prepared, settings)
    solution = Solution(cand.id, patch_lib.file_diff(
        cand.file, patch_lib.read_entry(tree / cand.file), patch_lib.read_entry(base / cand.file)),
        removed, prints)
    result = grading.grade(task, graded, solution.patch, python=prepared.harness.python,
                           isolate=prepared.harness.isolate)
    if result.reward != 1.0:
      raise Rejected('reference_fails', f'original graded {result.reward}: {result.reason}')
  except Rejected:
    for path in (tree, graded, out / 'originals' / cand.id):
      if path.exists():
        shutil.rmtree(path)
    raise
  return task, solution


def _with_calls(task: Task, base: Path, out: Path, outcome: _Outcome, prepared: Prepared,
                settings: Settings) -> Task:
  """The task with its differential calls (grading/differential.py) and, where it has some, its
  original file under `originals/<id>/`, out of the policy's tree."""
  with tempfile.TemporaryDirectory(prefix='calls-') as scratch:
    calls, _ = differential.record_calls(task, base, Path(scratch), outcome.limits,
                                         seed=settings.seed, isolate=prepared.harness.isolate)
  if not calls:
    return task
  original = out / 'originals' / task.id
  (original / task.file).parent.mkdir(parents=True, exist_ok=True)
  shutil.copy(base / task.file, original / task.file)
  return dataclasses.replace(task, calls=calls, original=original.relative_to(out).as_posix())


def _task(cand: Candidate, out: Path, tree: Path, graded: Path, outcome: _Outcome,
          prepared: Prepared, settings: Settings, sites: list[str], sealed: list[str],
          removed: str) -> Task:
  harness, files = prepared.harness, cand.test_files
  packages = layout.source_packages(graded)
  return Task(
      id=cand.id, repo=prepared.repo, file=cand.file,
      symbol=cand.symbol.qualname, mode=cand.mode, fail_to_pass=outcome.fail_to_pass,
      pass_to_pass=outcome.pass_to_pass, test_files=files,
      test_command=['python', '-m', 'pytest', '-p', 'no:cacheprovider', *files],
      protected_paths=layout.protected_paths(graded, packages), packages=packages,
      python_path=harness.python_path, site_dirs=harness.site_dirs, config_file=harness.config_file,
      time_limit_s=outcome.limits.wall_s, cpu_limit_s=outcome.limits.cpu_s,
      tree=tree.relative_to(out).as_posix(), grading_tree=graded.relative_to(out).as_posix(),
      visible_tests=settings.visible_tests, twin_sites=sites, max_twins=settings.max_twins,
      python=harness.python, venv=settings.venv,
      lines_deleted=sum(1 for line in removed.splitlines() if line.strip()),
      covering_tests=len(cand.tests), cyclomatic=deletion.cyclomatic(removed), sealed=sealed,
      calls=[], original=None)
