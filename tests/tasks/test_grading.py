import dataclasses
import json
import signal
import sys
import textwrap

import pytest

from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tasks.grading import pool
from research.tasks.grading import testrun
from research.tasks.redteam.attacks import faults


def _load(task_dir, task_id):
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl') if t.id == task_id)
  return t, task_dir / t.grading_tree, task_lib.read_solutions(task_dir)[t.id].patch


def _neutered_tests(tree):
  """A diff that replaces the tests of tests/test_core.py with one that always passes."""
  return patch_lib.file_diff('tests/test_core.py', patch_lib.read_entry(tree / 'tests/test_core.py'),
                             (b'def test_nothing():\n  pass\n', '100644'))


def test_diff_touching_only_protected_paths_is_rejected(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, _ = _load(task_dir, 'textops.core.title_case.body')
  g = grading.grade(t, tree, _neutered_tests(tree))
  assert g.reward == 0.0 and g.reason == 'no applicable source changes'
  assert g.tamper == ['protected path changed: tests/test_core.py']


def test_binary_file_is_dropped_with_a_reason_and_the_rest_graded(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  binary = patch_lib.file_diff('textops/blob.bin', None, (b'\0\xff', '100644'))
  g = grading.grade(t, tree, reference + binary)
  assert g.reward == 1.0 and g.rejected == ['binary file in diff: textops/blob.bin']


def test_missing_skipped_and_xfailed_tests_count_as_failed():
  phase = lambda outcome, xfail=False: {'outcome': outcome, 'xfail': xfail}
  cases = {
      'passed': {'setup': phase('passed'), 'call': phase('passed'), 'teardown': phase('passed')},
      'skipped': {'setup': phase('skipped'), 'teardown': phase('passed')},
      'xfailed': {'setup': phase('passed'), 'call': phase('skipped', True),
                  'teardown': phase('passed')},
      'error': {'setup': phase('failed'), 'teardown': phase('passed')},
      'missing': {'setup': phase('passed')},
  }
  assert {k: testrun._final_outcome(v) for k, v in cases.items()} == {k: k for k in cases}


def test_a_harness_that_cannot_start_is_a_fault_not_a_zero(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  broken_env = dataclasses.replace(t, site_dirs=[*t.site_dirs, str(task_dir / 'missing')])
  g = grading.grade(broken_env, tree, reference)
  assert g.fault and g.reward is None and g.reason.startswith('sandbox failed: bwrap:')


def test_pool_grades_in_parallel_in_order(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  jobs = []
  for task_id in ('textops.core.title_case.body', 'textops.core.wrap.body'):
    t, tree, reference = _load(task_dir, task_id)
    jobs += [pool.Job(t, tree, reference), pool.Job(t, tree, '')]
  grades = pool.GraderPool(2).grade(jobs)
  assert [g.reward for g in grades] == [1.0, 0.0, 1.0, 0.0]


def test_every_fixture_reference_applies_strictly_and_grades_1(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  tasks = task_lib.read(task_dir / 'tasks.jsonl')
  solutions = task_lib.read_solutions(task_dir)
  assert len(tasks) >= 10
  for t in tasks:
    sections = patch_lib.parse(solutions[t.id].patch)
    assert patch_lib.misreadings(task_dir / t.tree, sections) == []
  jobs = [pool.Job(t, task_dir / t.grading_tree, solutions[t.id].patch) for t in tasks]
  grades = pool.GraderPool(2).grade(jobs)
  assert [(g.reward, g.tamper) for g in grades] == [(1.0, [])] * len(tasks)


def test_a_test_file_smuggled_after_an_allowed_hunk_is_tampering(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  neutered = _neutered_tests(tree)
  smuggled = reference + neutered[neutered.index('--- '):]
  g = grading.grade(t, tree, smuggled)
  assert g.reward == 0.0 and g.tamper[0].startswith('Smuggled file section: line ')


# In-process attacks on the runner, each triggered from test code through the function the
# tests call. None implements the deleted function; the static scanner is switched off so that
# what stops them is the runner's integrity checks and the harness's cross-checks.
# gc's heap walks are stopped (the runner's audit hook): these find pytest's objects in the live
# frames instead, as code under test can.
_LIVE = '''
def _live(name):
  import sys
  frame, found = sys._getframe(), {}
  while frame is not None:
    for v in list(frame.f_locals.values()):
      for o in (v, getattr(v, 'config', None), getattr(v, 'session', None)):
        if type(o).__name__ == name:
          found[id(o)] = o
    frame = frame.f_back
  return list(found.values())
'''
_FORGE_OUTCOME = _LIVE + '''
def _forged(kind, fields):
  return {**fields, 'outcome': 'passed', 'message': ''} if kind == 'test' else fields
'''
ATTACKS = {
    'reporter method overridden on the instance': ('reporter changed: class', _FORGE_OUTCOME + '''
class _Forging:
  __slots__ = ()

  def emit(self, kind, **fields):
    super().emit(kind, **_forged(kind, fields))

def _trick():
  for o in _live('Reporter'):
      try:  # Refused: the reporter has no instance dict.
        o.emit = lambda kind, **fields: type(o).emit(o, kind, **_forged(kind, fields))
      except AttributeError:
        o.__class__ = type('Forging', (_Forging, type(o)), {'__slots__': ()})
'''),
    'test item method shadowed on the instance': ('test item changed', _LIVE + '''
def _trick():
  for o in _live('Session')[0].items:
    if type(o).__name__ == 'Function' and hasattr(o, 'runtest') and 'runtest' not in vars(o):
      o.runtest = lambda: None
'''),
    'json.dumps patched': ('patched at run time: json.dumps', '''
def _trick():
  import json
  real = json.dumps
  if not hasattr(real, 'forged'):
    json.dumps = lambda obj, **kw: real({**obj, 'outcome': 'passed'} if 'when' in obj else obj,
                                        **kw)
    json.dumps.forged = True
'''),
    'os.write patched': ('patched at run time: os.write', '''
def _trick():
  import os
  real = os.write
  if not hasattr(real, 'forged'):
    os.write = lambda fd, data: real(fd, data.replace(b'"failed"', b'"passed"'))
    os.write.forged = True
'''),
    # What the value checks planted in the tests rely on (research/tasks/grading/sandboxed/value_check.py).
    'value checks made predictable': ('patched at run time: os.urandom', '''
def _trick():
  import os
  os.urandom = lambda n: bytes(n)
'''),
    'value checks left without changes': ('patched at run time: Random.choice', '''
def _trick():
  import random
  random.Random.choice = lambda self, seq: 1 / 0
'''),
    'a module the value checks import swapped': ('patched at run time: sys.modules.random', '''
def _trick():
  import sys, types
  sys.modules['random'] = types.ModuleType('random')
'''),
    'value checks replaced in the test module': ('patched at run time: test module', '''
def _trick():
  import sys
  for module in list(sys.modules.values()):
    for name, f in list(vars(module).items()):
      if ' value checks answered wrongly' in getattr(getattr(f, '__code__', None), 'co_consts', ()):
        setattr(module, name, lambda a, b, *rest: a == b)
'''),
    'builtins of a checked test module swapped': ('__builtins__', '''
def _trick():
  import sys
  for module in list(sys.modules.values()):
    if any(' value checks answered wrongly' in getattr(getattr(f, '__code__', None), 'co_consts',
                                                       ()) for f in list(vars(module).values())):
      module.__builtins__ = dict(vars(__import__('builtins')))
'''),
    'hook wrapper registered through the live config': ('pytest plugins or hooks changed', _LIVE + '''
import pytest

class _Rewrite:
  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_makereport(self, item, call):
    report = (yield).get_result()
    report.outcome, report.longrepr = 'passed', None

def _trick():
  for o in _live('Config'):
    if not hasattr(o, 'forged'):
      o.forged = True
      o.pluginmanager.register(_Rewrite())
'''),
    'collected test code swapped': ('test code replaced', _LIVE + '''
def _trick():
  for item in _live('Session')[0].items:
    f = getattr(item.obj, '__func__', item.obj)
    f.__code__ = (lambda *args, **kwargs: None).__code__
'''),
    # In place: the class or function object stays, so identity snapshots alone miss these.
    "pytest's Function.runtest code swapped": (
        'changed in place: _pytest.python.Function.runtest __code__', '''
def _trick():
  import _pytest.python
  _pytest.python.Function.runtest.__code__ = (lambda self: None).__code__
'''),
    "a pytest function's defaults swapped": (
        'changed in place: _pytest.reports.TestReport.__init__ __defaults__', '''
def _trick():
  import _pytest.reports
  f = _pytest.reports.TestReport.__init__
  f.__defaults__ = tuple(list(f.__defaults__))  # Equal, but another tuple.
'''),
    "a closure cell of a pytest function rewritten": (
        'changed in place: _pytest.warnings.catch_warnings_for_item cell 0 cell_contents', '''
def _trick():
  import _pytest.warnings
  cell = _pytest.warnings.catch_warnings_for_item.__closure__[0]
  inner = cell.cell_contents
  if not getattr(inner, 'forged', False):
    def forged(*args, **kwargs):
      return inner(*args, **kwargs)
    forged.forged = True
    cell.cell_contents = forged
'''),
    "a pytest class's entry replaced": ('patched at run time: class _pytest.runner.CallInfo.from_call', '''
def _trick():
  import _pytest.runner
  cls = _pytest.runner.CallInfo
  cls.from_call = classmethod(vars(cls)['from_call'].__func__)
'''),
    "a property of pytest's base report replaced": (
        'patched at run time: class _pytest.reports.BaseReport.passed', '''
def _trick():
  import _pytest.reports
  _pytest.reports.BaseReport.passed = property(lambda self: True)
'''),
    "unittest's assertEqual code swapped": (
        'changed in place: unittest.case.TestCase.assertEqual __code__', '''
def _trick():
  import unittest
  unittest.TestCase.assertEqual.__code__ = (lambda self, first, second, msg=None: None).__code__
'''),
    "a keyword default of a pytest function swapped": (
        'changed in place: _pytest.main.search_pypath keyword default consider_namespace_packages',
        '''
def _trick():
  import _pytest.main
  _pytest.main.search_pypath.__kwdefaults__['consider_namespace_packages'] = 0
'''),
    # The checks of in-place changes compare through functions the runner took at its start.
    "the check's comparisons blinded, then a pytest function's code swapped": (
        'changed in place: _pytest.python.Function.runtest __code__', '''
def _trick():
  import builtins, operator, _pytest.python
  operator.is_not = lambda a, b: False
  builtins.any = lambda values: False
  builtins.map = lambda f, *columns: ()
  _pytest.python.Function.runtest.__code__ = (lambda self: None).__code__
'''),
    "a pytest class's bases swapped": ('changed in place: _pytest.reports.TestReport __bases__', '''
def _trick():
  import _pytest.reports
  cls = _pytest.reports.TestReport
  cls.__bases__ = tuple(list(cls.__bases__))
'''),
    'events forged on the report pipe, then exit 1': ('reported twice', _LIVE + '''
def _trick():
  import os, sys
  reporter, = _live('Reporter')
  session, = _live('Session')
  for item in session.items:
    for when in ('setup', 'call', 'teardown'):
      failed = 'canary' in item.nodeid and when == 'call'
      reporter.emit('test', nodeid=item.nodeid, when=when, xfail=False, message='',
                    outcome='failed' if failed else 'passed')
    reporter.emit('check', nodeid=item.nodeid, problems=[])
  reporter.emit('session_finish', exitstatus=1, problems=[], collected=len(session.items))
  reporter.emit('runner_exit', code=1)
  print('short test summary info')
  for item in session.items:
    print(('FAILED ' if 'canary' in item.nodeid else 'PASSED ') + item.nodeid)
  sys.stdout.flush()
  os._exit(1)
'''),
}


def _attack(tree, t, trick, at_import=False):
  """The unsolved module with `trick` run on every call of the task's function (or at import)."""
  source = (tree / t.file).read_text()
  source += trick + (
      '\n_trick()\n' if at_import else
      f'\n_real = {t.symbol}\n\ndef {t.symbol}(*args, **kwargs):\n  _trick()\n'
      f'  return _real(*args, **kwargs)\n')
  return patch_lib.file_diff(t.file, patch_lib.read_entry(tree / t.file),
                             (source.encode(), '100644'))


@pytest.mark.parametrize('name', ATTACKS)
def test_in_process_forging_is_caught(fixture_tasks, monkeypatch, name):
  monkeypatch.setattr(grading.tamper, 'scan', lambda old, new: [])
  _, task_dir, _ = fixture_tasks
  t, tree, _ = _load(task_dir, 'textops.core.title_case.body')
  flag, trick = ATTACKS[name]
  g = grading.grade(t, tree, _attack(tree, t, trick))
  assert g.reward == 0.0 and any(flag in f for f in g.tamper), g.tamper
  if name.startswith('hook wrapper'):
    g = grading.grade(t, tree, _attack(tree, t, trick, at_import=True))
    assert g.reward == 0.0
    assert 'plugin registered by code under test: ' in ' '.join(g.tamper), g.tamper


def test_cross_check_reads_pytest_summary_and_exit_status():
  outcomes = {'t.py::a': 'passed', 't.py::b': 'failed', 't.py::c': 'error'}
  summary = ('== short test summary info ==\nPASSED t.py::a\nFAILED t.py::b - assert 1 == 2\n'
             'PASSED t.py::c\nERROR t.py::c - teardown\n1 failed, 1 passed, 1 error in 0.1s\n')
  assert grading.cross_check(outcomes, summary, 1) == []
  assert grading.cross_check(outcomes, summary, 0) == [
      'exit status 0 does not match the report (expected 1)']
  forged = {**outcomes, 't.py::b': 'passed'}
  assert grading.cross_check(forged, summary, 1) == [
      "pytest printed other passes than the report: ['t.py::b']"]
  assert grading.cross_check(outcomes, 't.py::b PASSED\n' + summary, 1) == [
      'output claims t.py::b passed']
  assert grading.cross_check(outcomes, 'no summary', 1) == ['pytest printed no test summary']


def test_report_lines_that_do_not_read_or_are_out_of_sequence_are_problems():
  lines = [{'kind': 'runner_start', 'seq': 0}, {'kind': 'runner_exit', 'seq': 1},
           {'kind': 'test', 'seq': 1, 'nodeid': 'a', 'when': 'call', 'outcome': 'passed'},
           {'kind': 'check', 'seq': 1, 'nodeid': 'a', 'problems': [3]}, [1],
           {'kind': 'runner_exit', 'seq': 5, 'code': 0}, {'kind': 'runner_exit', 'seq': 1,
                                                        'code': 0}]
  data = '\n'.join(json.dumps(line) for line in lines).encode() + b'\n{not json\n'
  events, problems = grading.read_report(data)
  assert events == [lines[0], lines[-1]]
  assert problems == [f'report line {i} does not read' for i in (1, 2, 3, 4)] + [
      'report line 5 out of sequence', 'report line 7 does not read']


def test_accounting_flags_duplicates_uncollected_and_unchecked_tests():
  def test(nodeid, when):
    return {'kind': 'test', 'nodeid': nodeid, 'when': when, 'outcome': 'passed', 'xfail': False}
  events = [{'kind': 'collected', 'nodeids': ['a', 'b']},
            *(test('a', w) for w in ('setup', 'call', 'teardown')),
            {'kind': 'check', 'nodeid': 'a', 'problems': ['test code replaced: a']},
            *(test('b', w) for w in ('setup', 'call', 'call', 'teardown')),
            *(test('x', w) for w in ('setup', 'call', 'teardown')),
            {'kind': 'check', 'nodeid': 'x', 'problems': []},
            {'kind': 'check', 'nodeid': 'x', 'problems': []}]
  outcomes, _, problems = testrun._account(events)
  assert outcomes == {'a': 'passed', 'b': 'passed', 'x': 'passed'}
  assert problems == ['b reported twice', 'no integrity check after b', 'test code replaced: a',
                      'x checked 2 times', 'x reported but never collected']


def _run_one(tmp_path, name, text):
  """pytest through the runner on a tree holding one test file."""
  tree = tmp_path / 'tree'
  tree.mkdir()
  (tree / name).write_text(text)
  (tmp_path / 'scratch').mkdir()
  return grading.run_pytest(tree, [name], python=sys.executable, python_path=[''], site_dirs=[],
                            config_file=None, limits=sandbox.Limits(),
                            scratch=tmp_path / 'scratch')


def test_unittest_subtests_count_toward_their_test(tmp_path):
  run = _run_one(
      tmp_path, 'test_sub.py',
      'import unittest\n\n\nclass T(unittest.TestCase):\n\n'
      '  def test_ok(self):\n    for i in range(3):\n      with self.subTest(i=i):\n'
      '        self.assertEqual(i, i)\n\n'
      '  def test_bad(self):\n    for i in range(3):\n      with self.subTest(i=i):\n'
      '        self.assertNotEqual(i, 1)\n\n'
      '  def test_message(self):\n    for i, j in [(1, 2), (3, 3)]:\n'
      '      with self.subTest("pairs", i=i, j=j):\n        self.assertLess(i, j)\n')
  # Three subtest reports per test share its node id: none is a duplicate, a failed one fails it.
  assert run.outcomes == {'test_sub.py::T::test_ok': 'passed', 'test_sub.py::T::test_bad': 'failed',
                          'test_sub.py::T::test_message': 'failed'}
  assert run.problems == [] and run.finished


def test_the_running_test_is_not_named_to_code_under_test(tmp_path):
  run = _run_one(
      tmp_path, 'test_env.py',
      'import os\n\nimport _pytest.runner\n\n\n'
      'def test_unnamed():\n  assert "PYTEST_CURRENT_TEST" not in os.environ\n\n\n'
      'def test_restore():\n  _pytest.runner._update_current_test_var = lambda item, when: None\n')
  assert run.outcomes['test_env.py::test_unnamed'] == 'passed'
  # Putting a setter back is a patch like any other.
  assert 'patched at run time: _pytest.runner._update_current_test_var' in run.problems


def test_a_run_the_cpu_limit_ends_is_unfinished_not_tampering(tmp_path):
  # Killed while pytest prints its summary, after the session finished: slow honest code must get
  # reward 0, not tamper flags from a summary and exit status cut short.
  tree = tmp_path / 'tree'
  tree.mkdir()
  (tree / 'conftest.py').write_text(
      'def pytest_terminal_summary():\n  while True:\n    pass\n')
  (tree / 'test_a.py').write_text('def test_a():\n  assert True\n')
  (tmp_path / 'scratch').mkdir()
  run = grading.run_pytest(tree, ['test_a.py'], python=sys.executable, python_path=[''],
                           site_dirs=[], config_file=None, limits=sandbox.Limits(cpu_s=2),
                           scratch=tmp_path / 'scratch')
  assert run.outcomes == {'test_a.py::test_a': 'passed'}
  assert run.returncode == 128 + signal.SIGXCPU
  assert not run.finished and run.problems == [] and run.fault is None


def test_report_events_of_the_wrong_shape_do_not_read():
  """Code under test can write to the report pipe: a line whose fields have the wrong shape
  (which the accounting would choke on) is a problem, never an exception."""
  good = [{'kind': 'runner_start', 'seq': 0}, {'kind': 'collected', 'seq': 1, 'nodeids': ['a']}]
  bad = [{'kind': 'collected', 'nodeids': [['a']]}, {'kind': 'collected', 'nodeids': 'a'},
         {'kind': 'check', 'nodeid': 'a', 'problems': 'x'}, {'kind': 'check', 'nodeid': 'a'},
         {'kind': 'test', 'nodeid': 'a', 'when': 'later', 'outcome': 'passed', 'xfail': False,
          'message': ''},
         {'kind': 'test', 'nodeid': 'a', 'when': 'call', 'outcome': ['passed'], 'xfail': False,
          'message': ''},
         {'kind': 'test', 'nodeid': 'a', 'when': 'call', 'outcome': 'passed', 'xfail': 0,
          'message': ''},
         {'kind': 'session_finish', 'exitstatus': True, 'problems': []},
         {'kind': 'runner_exit', 'code': 0.0}]
  lines = good + [{**b, 'seq': 2} for b in bad] + [{'kind': 'runner_exit', 'seq': True, 'code': 0}]
  events, problems = grading.read_report('\n'.join(json.dumps(x) for x in lines).encode())
  assert events == good
  assert problems == [f'report line {i} does not read' for i in range(2, len(lines))]
  testrun._account(events)  # What reads is what the accounting takes.


def test_seal_records_join_the_next_check_and_audit_lines_are_problems():
  """A sealed assert's record line belongs to the test whose check comes next (each distinct one
  once); a check event's own `seals` are not read; an unreadable record, a record without the
  runner's nonce (before it, or with another), a second nonce and the audit hook's lines are
  problems."""
  lines = [b'S n1 t0 ["b", true]', b'N n1', b'{"kind": "runner_start", "seq": 0}',
           b'S n1 t1 ["b", true]', b'S n1 t1 ["b", true]', b'S n1 t2 ["i",  "3"]',
           b'S t1 ["b", true]', b'{"kind": "check", "seq": 1, "nodeid": "a", "problems": []}',
           b'S n1 t3 ["N"]', b'S n1 t4 [[', b'A grading code changed at run time', b'N n2',
           b'S n2 t3 ["b", false]',
           b'{"kind": "check", "seq": 2, "nodeid": "b", "problems": [], "seals": [["t9", "x"]]}',
           b'S n1 t5 ["N"]']
  events, problems = grading.read_report(b'\n'.join(lines))
  assert [e.get('seals') for e in events] == [
      None, [['t1', '["b", true]'], ['t2', '["i", "3"]']], [['t3', '["N"]']]]
  assert problems == ['report line 0: a seal record not written by the runner',
                      'report line 6: a seal record not written by the runner',
                      'report line 9 does not read',
                      'stopped at run time: grading code changed at run time',
                      'report line 11: a second nonce',
                      'report line 12: a seal record not written by the runner']


# A wrong body that floods the report pipe with readable-looking events shaped to break the
# accounting, after a frame read the scanner flags: before round three this made grading raise,
# which the pool masked with the flag lost.
_REPORT_FLOOD = '  import sys\n  sys._getframe(0)\n' + textwrap.indent(
    faults.FAULTS['flood_collected'][0], '  ')


def _body_patch(tree, t, body):
  """A diff that puts `body` where the task's tree stubs the deleted body out."""
  source = (tree / t.file).read_text()
  assert source.count('  raise NotImplementedError\n') == 1
  new = source.replace('  raise NotImplementedError\n', body)
  return patch_lib.file_diff(t.file, patch_lib.read_entry(tree / t.file), (new.encode(), '100644'))


def test_a_report_channel_fault_is_a_zero_with_its_flags_kept(fixture_tasks, monkeypatch):
  _, task_dir, _ = fixture_tasks
  t, tree, _ = _load(task_dir, 'textops.core.slugify.body')
  diff = _body_patch(tree, t, _REPORT_FLOOD)
  g = grading.grade(t, tree, diff)
  assert g.reward == 0.0 and g.fault is None and g.error is None, g
  assert 'frame inspection (_getframe) in textops/core.py' in g.tamper
  assert any('does not read' in f or 'out of sequence' in f for f in g.tamper), g.tamper
  # Whatever still breaks grading on what the run reported is the solution's failure too.
  def choke(events):
    raise TypeError("unhashable type: 'list'")
  monkeypatch.setattr(testrun, '_account', choke)
  for job_grade in (grading.grade(t, tree, diff), pool.GraderPool(1).grade([pool.Job(t, tree, diff)])[0]):
    assert job_grade.reward == 0.0 and job_grade.fault is None
    assert job_grade.error == "TypeError: unhashable type: 'list'"
    assert 'frame inspection (_getframe) in textops/core.py' in job_grade.tamper


def test_only_the_pool_s_own_failure_is_masked(fixture_tasks, monkeypatch):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  def broken(*args, **kwargs):
    raise RuntimeError('no slot')
  monkeypatch.setattr(pool.grader, 'grade', broken)
  g = pool.GraderPool(1).grade([pool.Job(t, tree, reference)])[0]
  assert g.reward is None and 'no slot' in g.fault


def test_a_sandbox_that_cannot_be_launched_is_a_fault(tmp_path, monkeypatch):
  monkeypatch.setattr(sandbox, 'BWRAP', str(tmp_path / 'no-bwrap'))
  monkeypatch.setattr(sandbox.shutil, 'which', lambda tool: tool)
  done = sandbox.run(['true'], cwd=tmp_path)
  assert done.sandbox_error.startswith('could not start: ') and done.returncode == -1
