"""One pytest run in the sandbox: the runner started with a report pipe, its events read and
accounted per test, and cross-checked against pytest's own summary and exit status."""
import collections
import dataclasses
import json
import os
from pathlib import Path
import re
import secrets
import shutil
import signal
import threading

from research.tasks import layout
from research.tasks import sandbox
from research.tasks.grading.sandboxed import record


RUNNER = Path(__file__).parent / 'sandboxed' / 'runner.py'
RECORD = RUNNER.with_name('record.py')  # Beside the runner, which runs it (and calls.py too).


PASSED = 'passed'


# Enough that pytest's summary survives the output cut, and no more than a report ever needs.
_OUTPUT_KB = 1024


_REPORT_BYTES = 64 << 20


# What the zygote of pytest runs imports once (sandbox.Zygote), the most of a run's start-up:
# pytest, its builtin plugins (pytest imports each at every start) and unittest (the runner's).
PRELOAD = ('pytest', '_pytest.config', 'unittest')


# The environment of every sandboxed run of grading (tests and differential calls).
ENV = {'LANG': 'C.UTF-8', 'LC_ALL': 'C.UTF-8', 'TZ': 'UTC', 'PYTHONHASHSEED': '0',
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
  failures: dict[str, str]  # The report's message for each test whose call failed.
  # What each test's sealed asserts recorded ([token, encoding] pairs; research/tasks/grading/seal.py).
  seals: dict[str, list]
  coverage_file: Path | None = None
  # The harness ended it once the tests it awaited had reported (their outcomes then final): its
  # report ends there, and the checks of a finished run do not apply.
  stopped: bool = False


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


# The fields each event kind must have, with their types (`[str]`: a list of strings, `[[str]]`:
# a list of lists of strings), and the values some must take: a line that differs does not read.
# Code under test can write to the pipe, so nothing in a line is trusted to be of the right shape.
_EVENTS = {
    'runner_start': {}, 'session_start': {}, 'collected': {'nodeids': [str]},
    'collect_error': {'nodeid': str},
    'test': {'nodeid': str, 'when': str, 'outcome': str, 'xfail': bool, 'message': str},
    'check': {'nodeid': str, 'problems': [str]},
    'session_finish': {'exitstatus': int, 'problems': [str]}, 'runner_exit': {'code': int}}
_VALUES = {'when': ('setup', 'call', 'teardown', 'subtest'),
           'outcome': ('passed', 'failed', 'skipped')}


def _typed(value, kind) -> bool:
  if isinstance(kind, list):
    return type(value) is list and all(_typed(v, kind[0]) for v in value)
  return type(value) is kind


def _readable(event) -> bool:
  fields = _EVENTS.get(event.get('kind')) if type(event) is dict else None
  return (fields is not None and type(event.get('seq')) is int
          and all(_typed(event.get(k), t) for k, t in fields.items())
          and all(event[k] in _VALUES[k] for k in fields if k in _VALUES))


def _event(line: str) -> dict | None:
  """The event a report line holds, or None where it does not read."""
  try:
    event = json.loads(line)
  except (ValueError, RecursionError):  # RecursionError: a line nested past the parser's depth.
    return None
  return event if _readable(event) else None


def read_report(data: bytes) -> tuple[list[dict], list[str]]:
  """Events in order, and problems with lines that do not read or are out of sequence.

  Three kinds of line are no events: the runner's nonce, `N <nonce>`, written before any code
  under test runs (sandboxed/record.py); a sealed assert's record, `S <nonce> <token>
  <encoding>`, written at the assert, which belongs to the test whose integrity check comes
  next and joins that check event's `seals` ([token, JSON text] pairs, each distinct one once);
  and the audit hook's `A <why>` (sandboxed/runner.py), a problem. A record without the nonce,
  or a second nonce, was written by code under test: a problem.
  """
  events, problems, seals, nonce = [], [], {}, None
  for i, line in enumerate(data.decode('utf-8', 'replace').splitlines()):
    if line.startswith('N '):
      if nonce is None:
        nonce = line[2:]
      else:
        problems.append(f'report line {i}: a second nonce')
      continue
    if line.startswith('S '):
      mark, _, rest = line[2:].partition(' ')
      token, _, encoding = rest.partition(' ')
      if nonce is None or mark != nonce:
        problems.append(f'report line {i}: a seal record not written by the runner')
      elif rest not in seals:
        try:
          seals[rest] = [token, record.text(encoding)]
        except ValueError:
          problems.append(f'report line {i} does not read')
      continue
    if line.startswith('A '):
      problems.append(f'stopped at run time: {line[2:202]}')
      continue
    event = _event(line)
    if event is None:
      problems.append(f'report line {i} does not read')
    elif event.get('seq') != len(events):
      problems.append(f'report line {i} out of sequence')
    else:
      if event['kind'] == 'check':
        event, seals = {**event, 'seals': list(seals.values())}, {}
      events.append(event)
  return events, problems


def _account(events: list[dict]) -> tuple[dict[str, str], dict[str, list[dict]], list[str]]:
  """Per-test outcomes, events by kind, and problems: duplicates, tests left unchecked."""
  kinds = collections.defaultdict(list)
  phases = collections.defaultdict(dict)
  problems = []
  subtests_failed = set()
  for e in events:
    kinds[e['kind']].append(e)
    if e['kind'] == 'test' and e['when'] == 'subtest':
      if e['outcome'] == 'failed':
        subtests_failed.add(e['nodeid'])
    elif e['kind'] == 'test':
      if e['when'] in phases[e['nodeid']]:
        problems.append(f'{e["nodeid"]} reported twice')
      phases[e['nodeid']][e['when']] = e
  outcomes = {nodeid: _final_outcome(p) for nodeid, p in phases.items()}
  for nodeid in subtests_failed:
    if outcomes.get(nodeid) == PASSED:
      outcomes[nodeid] = 'failed'
  for e in kinds['collect_error']:
    outcomes.setdefault(e['nodeid'], 'error')
  collected = {n for e in kinds['collected'] for n in e['nodeids']}
  problems += [f'{n} reported but never collected' for n in phases if kinds['collected']
               and n not in collected]
  checked = collections.Counter(e['nodeid'] for e in kinds['check'])
  problems += [f'no integrity check after {n}' for n, p in phases.items()
               if 'teardown' in p and n not in checked]
  problems += [f'{n} checked {count} times' for n, count in checked.items() if count > 1]
  for e in kinds['check'] + kinds['session_finish']:
    problems += e['problems']
  return outcomes, kinds, sorted(set(problems))


_SUMMARY = re.compile(r'^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$', re.M)


# A failed subtest (pytest 9: `SUBFAILED[msg] (i=1, j=2) nodeid - ...`) fails its test, which
# pytest may still list as PASSED.
_SUBFAILED = re.compile(r'^SUBFAILED.*? (\S+::\S+)(?: - .*)?$', re.M)


_VERBOSE_PASS = re.compile(r'^(\S+::\S+) PASSED', re.M)


def _claims(output: str) -> dict[str, set[str]]:
  """Nodeids per word of pytest's summary lines (PASSED, FAILED, ...) in `output`."""
  lines = collections.defaultdict(set)
  for word, nodeid in _SUMMARY.findall(output):
    lines[word].add(nodeid)
  lines['FAILED'].update(_SUBFAILED.findall(output))
  return lines


def cross_check(outcomes: dict[str, str], output: str, returncode: int) -> list[str]:
  """Problems between the report of a finished run and what pytest printed and returned."""
  failed = any(o in ('failed', 'error') for o in outcomes.values())
  expected = 1 if failed else 0 if outcomes else 5
  problems = [] if returncode == expected else [
      f'exit status {returncode} does not match the report (expected {expected})']
  reported = {n for n, o in outcomes.items() if o == PASSED}
  anywhere = _claims(output)
  claimed = anywhere['PASSED'] - anywhere['FAILED'] - anywhere['ERROR']
  problems += [f'output claims {n} passed' for n in sorted(
      (claimed | set(_VERBOSE_PASS.findall(output))) - reported)[:3]]
  _, marker, summary = output.rpartition('short test summary info')
  if not marker:
    return problems + (['pytest printed no test summary'] if outcomes else [])
  printed = _claims(summary)
  passes = printed['PASSED'] - printed['FAILED'] - printed['ERROR']
  if passes != reported:
    problems.append(f'pytest printed other passes than the report: {sorted(passes ^ reported)[:3]}')
  return problems


def _sandboxed(command: list[str], config: dict, *, tree: Path, harness: Path, out: Path,
               python: str, site_dirs: list[str], limits: sandbox.Limits, uid: int | None,
               isolate: bool, until: frozenset[str]
               ) -> tuple[sandbox.Completed, bytes, list[str], bool]:
  """Runs the runner with a report pipe; (how it ended, the report, problems with the pipe,
  whether it was stopped once every test of `until` had reported)."""
  read_fd, write_fd = os.pipe()
  report = _Report()
  stop = threading.Event()
  reader = threading.Thread(target=_drain, args=(read_fd, report, until, stop), daemon=True)
  reader.start()
  try:
    (harness / 'config.json').write_text(json.dumps({**config, 'report_fd': write_fd}))
    env = {**ENV, 'PATH': f'{Path(python).parent}:/usr/bin:/bin'}
    done = sandbox.run(command, cwd=tree,
                       ro=[tree, harness, *sandbox.python_roots(python), *site_dirs],
                       rw=[out], env=env, limits=limits, uid=uid, isolate=isolate,
                       pass_fds=(write_fd,), hide=sandbox.python_hidden(python),
                       stop=stop if until else None,
                       zygote=sandbox.zygote_for(python, env, PRELOAD) if isolate else None)
  finally:
    os.close(write_fd)
  reader.join(timeout=10)
  problems = ['report pipe held open after the run'] if reader.is_alive() else []
  if len(report.data) >= _REPORT_BYTES:
    problems.append(f'report larger than {_REPORT_BYTES} bytes')
  return done, bytes(report.data), problems, report.stopped


@dataclasses.dataclass
class _Report:
  """What the report pipe brought, and whether the harness stopped the run there."""
  data: bytearray = dataclasses.field(default_factory=bytearray)
  stopped: bool = False


def _drain(fd: int, report: _Report, until: frozenset[str], stop: threading.Event) -> None:
  """Reads the pipe to its end into `report`. With `until`, the report ends after the line where
  the last of those tests has reported its teardown and its integrity check, and `stop` is set:
  their outcomes are final there (lines and events read as read_report reads them)."""
  into = report.data
  left = {(n, step) for n in until for step in ('teardown', 'check')}
  start, seq = 0, 0
  with open(fd, 'rb', buffering=0) as f:
    while chunk := f.read(1 << 16):
      if len(into) >= _REPORT_BYTES or report.stopped:
        continue
      into += chunk
      while left and (end := into.find(b'\n', start)) >= 0:
        for line in into[start:end + 1].decode('utf-8', 'replace').splitlines():
          event = _event(line)
          if event is not None and event['seq'] == seq:
            seq += 1
            left.discard((event.get('nodeid'), 'check' if event['kind'] == 'check' else
                          event['when'] if event['kind'] == 'test' else None))
        start = end + 1
      if until and not left:
        del into[start:]
        report.stopped = True
        stop.set()


def pytest_args(tree: Path, args: list[str], config_file: str | None) -> list[str]:
  """pytest's command line for `args` (tests, options) on `tree`, as every sandboxed run uses it."""
  # `-rA` would add a section of passes with their output, which costs pytest quadratic time.
  out = [*args, '-p', 'no:cacheprovider', '--rootdir', str(tree), '--confcutdir', str(tree),
         '--continue-on-collection-errors', '-q', '--tb=short', '--color=no',
         '-o', 'console_output_style=classic', '-rfEsxXp']
  return out + (['-c', str(tree / config_file)] if config_file else [])


def _runner_config(tree: Path, args: list[str], config_file: str | None, python_path: list[str],
                   site_dirs: list[str], out: Path, coverage_source: list[str] | None) -> dict:
  """The runner's config.json (sandboxed/runner.py reads it): pytest's arguments, paths, marker."""
  return {'pytest_args': pytest_args(tree, args, config_file),
          'marker': f'runner started {secrets.token_hex(8)}',
          'tree': str(tree), 'test_dirs': sorted(layout.TEST_DIRS),
          'prepend_path': [str(tree / p) if p else str(tree) for p in python_path],
          'append_path': list(site_dirs),
          'coverage_file': str(out / '.coverage') if coverage_source else None,
          'coverage_source': [str(tree / s) for s in coverage_source or ()],
          'sealed': _sealed_files(tree, args)}


def _sealed_files(tree: Path, args: list[str]) -> list[str]:
  """The test files of `args` (paths or node ids) that hold a sealed assert's record function:
  the runner lets their code run only through their module's import."""
  files = sorted({a.split('::', 1)[0] for a in args if not a.startswith('-')})
  return [rel for rel in files if (tree / rel).is_file() and record.MARK in (tree / rel).read_text()]


def _verdict(done: sandbox.Completed, marker: str, kinds: dict, outcomes: dict[str, str],
             stopped: bool) -> tuple[str | None, bool, list[str]]:
  """(the harness's fault or None, whether the session finished, problems) of a finished sandbox
  (`stopped`: by the harness, its report cut where the tests it awaited had reported)."""
  # Only what happens before the runner starts is the harness's fault: after that, the code
  # under test runs, and a crash or a timeout is its own (masking those would reward them).
  fault, problems = None, []
  if done.sandbox_error:
    fault = f'sandbox failed: {done.sandbox_error[:300]}'
  elif not done.output.startswith(marker) and not kinds['runner_start']:
    # The runner writes both before any code under test runs: neither means it never started.
    fault = (f'runner did not start (exit {done.returncode}'
             f'{", timed out" if done.timed_out else ""}): {done.output[-300:]}')
  elif not done.output.startswith(marker):
    problems.append('output lost the runner\'s first line')
  elif not kinds['runner_start']:
    problems.append('report truncated or removed')
  # A run the limits ended (CPU time: SIGXCPU; wall time, memory: SIGKILL) did not finish,
  # whatever it reported first: reward 0, and the checks of a finished run do not apply (slow
  # honest code, killed while pytest printed its summary, was flagged as tampering).
  killed = done.timed_out or done.signal in (signal.SIGXCPU, signal.SIGKILL)
  finished = bool(kinds['session_finish']) and not killed
  if finished:
    exits = kinds['runner_exit']
    if not exits or exits[-1]['code'] != done.returncode or (
        kinds['session_finish'][-1]['exitstatus'] != done.returncode):
      problems.append(f'exit status {done.returncode} does not match the report')
    problems += cross_check(outcomes, done.output, done.returncode)
  elif done.returncode == 0 and not fault and not stopped:
    problems.append('exit status 0 before the test session finished')
  return fault, finished, problems


def run_pytest(tree: Path, args: list[str], *, python: str, python_path: list[str],
               site_dirs: list[str], config_file: str | None, limits: sandbox.Limits,
               isolate: bool = True, uid: int | None = None,
               coverage_source: list[str] | None = None, scratch: Path,
               until: frozenset[str] = frozenset()) -> TestRun:
  """Runs pytest on `tree` (read-only) in a sandbox; results go to `scratch` (outside the tree).
  With `until` (node ids), the run is stopped once each of those tests has reported its teardown
  and its integrity check, unless it ended before."""
  harness, out = scratch / 'harness', scratch / 'out'
  harness.mkdir()
  out.mkdir()
  shutil.copy(RUNNER, harness / 'runner.py')
  shutil.copy(RECORD, harness / 'record.py')
  config = _runner_config(tree, args, config_file, python_path, site_dirs, out, coverage_source)
  # pytest's own summary, printed last, must survive the output cut for the cross-check.
  limits = dataclasses.replace(limits, output_kb=max(limits.output_kb, _OUTPUT_KB))
  done, report, problems, stopped = _sandboxed(
      [python, '-I', '-B', str(harness / 'runner.py'), str(harness / 'config.json')], config,
      tree=tree, harness=harness, out=out, python=python, site_dirs=site_dirs, limits=limits,
      uid=uid, isolate=isolate, until=until)
  events, unread = read_report(report)
  outcomes, kinds, inconsistent = _account(events)
  fault, finished, verdict_problems = _verdict(done, config['marker'], kinds, outcomes, stopped)
  problems += unread + inconsistent + verdict_problems
  failures = {e['nodeid']: e['message'] for e in kinds['test']
              if e['when'] == 'call' and e['outcome'] == 'failed'}
  seals = collections.defaultdict(list)
  for e in kinds['check']:
    seals[e['nodeid']] += e['seals']
  return TestRun(outcomes, done.returncode, finished, fault, done.timed_out, problems,
                 done.wall_s, done.output, failures, dict(seals),
                 out / '.coverage' if coverage_source else None, stopped)


def merged(runs: list[TestRun]) -> TestRun:
  """The runs of one grading (isolation.py) as one: each test's outcome, records and failure
  from the run that held it, every run's problems, finished when all finished (stopped when the
  others were stopped), the first fault, and the exit status of the first run that did not
  finish (else the main run's)."""
  if len(runs) == 1:
    return runs[0]
  unfinished = [r for r in runs if not r.finished]
  return TestRun(
      outcomes={n: o for r in runs for n, o in r.outcomes.items()},
      returncode=(unfinished or runs)[0].returncode, finished=not unfinished,
      fault=next((r.fault for r in runs if r.fault), None),
      timed_out=any(r.timed_out for r in runs), problems=[p for r in runs for p in r.problems],
      wall_s=sum(r.wall_s for r in runs), output='\n'.join(r.output for r in runs),
      failures={n: m for r in runs for n, m in r.failures.items()},
      seals={n: s for r in runs for n, s in r.seals.items()}, coverage_file=runs[0].coverage_file,
      stopped=bool(unfinished) and all(r.stopped for r in unfinished))
