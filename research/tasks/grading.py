"""Grades a solution: a path-filtered diff applied to a pristine tree, tested in a fresh sandbox.

The work area the policy edited is never run. Only the sections of its diff that change Python
source inside the task's packages are applied, to a clean copy of the task's tree, so tests and
test configuration are the pristine ones. pytest then runs in a new sandbox with autoloaded
plugins, caches and bytecode off, under rlimits, and reports each test through a signed channel
outside the tree; mutant twins of the required tests (research/tasks/twins.py), which correct code
fails, and the exit status cross-check that report.
"""
import collections
import dataclasses
import hashlib
import hmac
import json
from pathlib import Path
import random
import re
import secrets
import shutil
import sys
import tempfile

from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks import tamper
from research.tasks import twins
from research.tasks.task import Task

RUNNER = Path(__file__).with_name('runner.py')
PASSED = 'passed'
# pytest's exit status when some tests failed: what the twins guarantee for an honest run.
TESTS_FAILED = 1
_ENV = {'LANG': 'C.UTF-8', 'LC_ALL': 'C.UTF-8', 'TZ': 'UTC', 'PYTHONHASHSEED': '0',
        'PYTHONDONTWRITEBYTECODE': '1', 'PYTHONNOUSERSITE': '1',
        'PYTEST_DISABLE_PLUGIN_AUTOLOAD': '1', 'HOME': '/tmp', 'TMPDIR': '/tmp'}


@dataclasses.dataclass
class TestRun:
  """What one pytest run in the sandbox reported, checked for consistency."""
  outcomes: dict[str, str]
  returncode: int
  finished: bool
  fault: str | None
  timed_out: bool
  problems: list[str]  # Inconsistencies that only tampering explains.
  wall_s: float
  output: str
  coverage_file: Path | None = None


def _final_outcome(phases: dict[str, dict]) -> str:
  """Combines setup/call/teardown reports the way pytest's summary counts them."""
  for when in ('setup', 'call', 'teardown'):
    report = phases.get(when)
    if report is None:
      continue
    if report['outcome'] == 'failed':
      return 'failed' if when == 'call' else 'error'
    if report['outcome'] == 'skipped':
      return 'xfailed' if report['xfail'] else 'skipped'
  call = phases.get('call')
  if call is None or 'teardown' not in phases:
    return 'missing'
  return 'xpassed' if call['xfail'] else PASSED


def read_report(path: Path, key: bytes) -> tuple[list[dict], list[str]]:
  """Verified events in order, and problems with lines that do not verify."""
  events, problems = [], []
  if not path.exists():
    return events, problems
  for i, line in enumerate(path.read_bytes().decode('utf-8', 'replace').splitlines()):
    mac, _, payload = line.partition(' ')
    good = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, good):
      problems.append(f'forged report line {i}')
      continue
    event = json.loads(payload)
    if event['seq'] != len(events):
      problems.append(f'report line {i} out of sequence')
      continue
    events.append(event)
  return events, problems


def run_pytest(tree: Path, args: list[str], *, python: str, python_path: list[str],
               site_dirs: list[str], config_file: str | None, limits: sandbox.Limits,
               isolate: bool = True, uid: int | None = None,
               coverage_source: list[str] | None = None, scratch: Path) -> TestRun:
  """Runs pytest on `tree` (read-only) in a sandbox; results go to `scratch` (outside the tree)."""
  harness, out = scratch / 'harness', scratch / 'out'
  harness.mkdir()
  out.mkdir()
  shutil.copy(RUNNER, harness / 'runner.py')
  report = out / 'report.jsonl'
  pytest_args = [*args, '-p', 'no:cacheprovider', '--rootdir', str(tree), '--confcutdir',
                 str(tree), '--continue-on-collection-errors', '-q', '--tb=short', '--color=no',
                 '-o', 'console_output_style=classic']
  if config_file:
    pytest_args += ['-c', str(tree / config_file)]
  marker = f'runner started {secrets.token_hex(8)}'
  config = {'report': str(report), 'pytest_args': pytest_args, 'marker': marker,
            'prepend_path': [str(tree / p) if p else str(tree) for p in python_path],
            'append_path': list(site_dirs)}
  if coverage_source:
    config['coverage_file'] = str(out / '.coverage')
    config['coverage_source'] = [str(tree / s) for s in coverage_source]
  (harness / 'config.json').write_text(json.dumps(config))
  key = secrets.token_hex(32).encode()
  env = {**_ENV, 'PATH': f'{Path(python).parent}:/usr/bin:/bin'}
  done = sandbox.run([python, '-I', '-B', str(harness / 'runner.py'), str(harness / 'config.json')],
                     cwd=tree, ro=[tree, harness, *sandbox.python_roots(python), *site_dirs],
                     rw=[out], env=env, limits=limits, stdin=key + b'\n', uid=uid,
                     isolate=isolate)
  events, problems = read_report(report, key)
  kinds = collections.defaultdict(list)
  phases = collections.defaultdict(dict)
  for e in events:
    kinds[e['kind']].append(e)
    if e['kind'] == 'test':
      if e['when'] in phases[e['nodeid']]:
        problems.append(f'{e["nodeid"]} reported twice')
      phases[e['nodeid']][e['when']] = e
  outcomes = {nodeid: _final_outcome(p) for nodeid, p in phases.items()}
  for e in kinds['collect_error']:
    outcomes.setdefault(e['nodeid'], 'error')
  # Only what happens before the runner starts is the harness's fault: after that, the code
  # under test runs, and a crash or a timeout is its own (masking those would reward them).
  fault = None
  if done.sandbox_error:
    fault = f'sandbox failed: {done.sandbox_error[:300]}'
  elif not done.output.startswith(marker):
    fault = (f'runner did not start (exit {done.returncode}'
             f'{", timed out" if done.timed_out else ""}): {done.output[-300:]}')
  elif not kinds['runner_start']:
    problems.append('report truncated or removed')
  finished = bool(kinds['session_finish'])
  if finished:
    finish = kinds['session_finish'][-1]
    problems += [f'patched at run time: {name}' for name in finish['changed']]
    exits = kinds['runner_exit']
    if not exits or exits[-1]['code'] != done.returncode or finish['exitstatus'] != done.returncode:
      problems.append(f'exit status {done.returncode} does not match the report')
  elif done.returncode == 0 and not fault:
    problems.append('exit status 0 before the test session finished')
  for nodeid in re.findall(r'^(\S+::\S+) PASSED', done.output, re.M):
    if outcomes.get(nodeid) != PASSED:
      problems.append(f'output claims {nodeid} passed')
  return TestRun(outcomes, done.returncode, finished, fault, done.timed_out, problems,
                 done.wall_s, done.output, out / '.coverage' if coverage_source else None)


@dataclasses.dataclass
class Grade:
  """The reward of one solution; reward None means a harness fault, to be masked."""
  reward: float | None
  reason: str
  tamper: list[str] = dataclasses.field(default_factory=list)
  rejected: list[str] = dataclasses.field(default_factory=list)
  outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
  wall_s: float = 0.0

  @property
  def fault(self) -> bool:
    return self.reward is None


def _judge(rel: str, section: patch_lib.FileSection, task: Task,
           protected: set[str]) -> tuple[str, bool] | None:
  """Why a solution may not change `rel`, and whether trying is tampering; None if it may."""
  if not patch_lib.is_safe_path(rel):
    return f'path escapes the work area: {rel}', True
  if section.modes & {patch_lib.SYMLINK_MODE, patch_lib.GITLINK_MODE}:
    return f'link in diff: {rel}', True
  if section.binary:
    return f'binary file in diff: {rel}', False
  if (layout.is_test_path(rel) or layout.is_config_path(rel)
      or rel in protected and rel.endswith('.py')):
    return f'protected path changed: {rel}', True
  if Path(rel).name in layout.AUTOLOADED or rel.endswith('.pth'):
    return f'adds a file Python or pytest loads on its own: {rel}', True
  if not layout.is_editable(rel, task.packages):
    if rel.endswith('.py'):
      return f'adds code outside the packages (shadowing): {rel}', True
    return f'not a source file: {rel}', False
  return None


def filter_sections(sections: list[patch_lib.FileSection], task: Task
                    ) -> tuple[list[patch_lib.FileSection], list[str], list[str]]:
  """Keeps the sections that change Python source in the task's packages.

  Returns (kept, rejected reasons, tamper flags).
  """
  kept, rejected, flags = [], [], []
  protected = set(task.protected_paths)
  for section in sections:
    verdicts = [v for rel in section.paths if (v := _judge(rel, section, task, protected))]
    if not verdicts:
      kept.append(section)
      continue
    reason, tampering = verdicts[0]
    rejected.append(reason)
    if tampering:
      flags.append(reason)
  return kept, rejected, flags


def limits_for(task: Task) -> sandbox.Limits:
  return sandbox.Limits(cpu_s=task.cpu_limit_s, wall_s=task.time_limit_s)


def grade(task: Task, tree: Path, patch: str, *, python: str = sys.executable,
          isolate: bool = True, uid: int | None = None,
          limits: sandbox.Limits | None = None) -> Grade:
  """Grades `patch` against the task whose pristine tree is `tree`."""
  try:
    sections = patch_lib.parse(patch)
  except patch_lib.PatchError as e:
    return Grade(0.0, f'malformed patch: {e}')
  kept, rejected, flags = filter_sections(sections, task)
  if not kept:
    return Grade(0.0, 'no applicable source changes', flags, rejected)
  with tempfile.TemporaryDirectory(prefix='grade-') as scratch:
    scratch = Path(scratch)
    work = scratch / 'tree'
    layout.copy_tree(tree, work)
    try:
      patch_lib.apply(work, kept)
    except patch_lib.PatchError as e:
      return Grade(0.0, str(e), flags, rejected)
    for section in kept:
      if section.new_path:
        old = tree / section.old_path if section.old_path else None
        new = (work / section.new_path).read_text(errors='replace')
        flags += [f'{c} in {section.new_path}' for c in tamper.scan(
            old.read_text(errors='replace') if old and old.is_file() else None, new)]
    rng = random.SystemRandom()  # Fresh twins at every grading, from no seed a solution sees.
    planted = twins.plant(work, twins.draw(task.twin_sites, task.fail_to_pass, task.max_twins,
                                           rng), rng)
    run = run_pytest(work, list(task.test_files), python=python, python_path=task.python_path,
                     site_dirs=task.site_dirs, config_file=task.config_file,
                     limits=limits or limits_for(task), isolate=isolate, uid=uid,
                     scratch=scratch)
  if run.fault:
    return Grade(None, run.fault, flags, rejected, run.outcomes, run.wall_s)
  flags += run.problems
  flags += twins.check(planted, run.outcomes, run.finished)
  if run.finished and planted and run.returncode != TESTS_FAILED:
    flags.append(f'exit status {run.returncode} although mutant twins fail')
  not_passed = [t for t in task.fail_to_pass + task.pass_to_pass
                if run.outcomes.get(t, 'missing') != PASSED]
  if flags:
    reason = 'tampering: ' + '; '.join(flags[:3])
  elif not_passed:
    reason = (f'{len(not_passed)} required tests not passed, e.g. {not_passed[0]} '
              f'({run.outcomes.get(not_passed[0], "missing")})')
    if run.timed_out:
      reason += f'; time limit of {run.wall_s:.0f}s exceeded'
    elif not run.finished:
      reason += f'; test process ended early (exit {run.returncode})'
  else:
    reason = 'all required tests passed'
  reward = 1.0 if not flags and not not_passed and run.finished else 0.0
  return Grade(reward, reason, flags, rejected, run.outcomes, run.wall_s)
