"""Twin runs: each in-place twin stands in its test's place (same name, file, lines, order), in a
run of its own, so that code that reads its caller cannot tell the twin from the test."""
import dataclasses
import json
import re
import sys
import time

import pytest

from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tasks.grading import testrun

# Where a body finds its caller (file, line, function) through the standard library: none is a
# frame API the scanner flags.
CALLERS = {
    'logging': "import logging\n"
               "  site = logging.getLogger('x').findCaller(stacklevel=2)[:3]\n",
    'warning': "import warnings\n"
               "  with warnings.catch_warnings(record=True) as caught:\n"
               "    warnings.simplefilter('always')\n"
               "    warnings.warn('where', stacklevel=2)\n"
               "  site = (caught[0].filename, caught[0].lineno, None)\n",
    'extract_stack': "import traceback\n"
                     "  s = traceback.extract_stack(limit=2)[0]\n"
                     "  site = (s.filename, s.lineno, s.name)\n",
    'walk_stack': "import traceback\n"
                  "  s = traceback.StackSummary.extract(traceback.walk_stack(None), limit=2)[1]\n"
                  "  site = (s.filename, s.lineno, s.name)\n",
}

# The literal beside the call on the caller's line (in an `==` or a checked test's call), but
# only where the caller is one of the real tests by name; else the wrong, naive answer.
READER = '''\
  import ast, linecache
  path, line, function = site
  tree = ast.parse(''.join(linecache.getlines(path)))
  if function is None:
    function = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.lineno <= line <= n.end_lineno][-1]
  if function not in REAL:
    return 0
  for node in ast.walk(tree):
    if getattr(node, 'lineno', None) == line and isinstance(node, (ast.Compare, ast.Call)):
      for side in ([node.left, *node.comparators] if isinstance(node, ast.Compare)
                   else node.args[:2]):  # A checked test's sides, not the checks' arguments.
        try:
          return ast.literal_eval(side)
        except ValueError:
          continue
  return 0
'''

TASK = 'textops.core.count_vowels.body'


def _load(task_dir, task_id=TASK):
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl') if t.id == task_id)
  return t, task_dir / t.tree, task_dir / t.grading_tree


def _solution(t, tree, body):
  """The task's file with its stub's body replaced by `body`."""
  source = (tree / t.file).read_text().replace('  raise NotImplementedError\n', body, 1)
  return patch_lib.file_diff(t.file, patch_lib.read_entry(tree / t.file),
                             (source.encode(), '100644'))


@pytest.mark.parametrize('api', CALLERS)
def test_a_caller_reader_is_caught_by_twins_in_their_tests_places(fixture_tasks, api):
  _, task_dir, _ = fixture_tasks
  t, tree, graded = _load(task_dir)
  # The twins alone: no sealed literal, no differential check (what each of those stops is
  # tested on its own).
  t = dataclasses.replace(t, sealed=[], calls=[])
  real = sorted({n.split('::')[-1] for n in t.fail_to_pass + t.pass_to_pass})
  diff = _solution(t, tree, f'  REAL = {real!r}\n  {CALLERS[api]}{READER}')
  # Twins beside their tests, under fresh names (graders before issue 39): it spares them.
  before = grading.grade(t, graded, diff, twin_runs=False)
  assert before.reward == 1.0, before.reason
  # In their tests' places it cannot tell them, returns the twin's literal and passes it.
  after = grading.grade(t, graded, diff)
  assert after.reward == 0.0
  assert any(f.startswith('mutant twin passed') for f in after.tamper), after.reason


def test_honest_originals_pass_and_their_in_place_twins_fail(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  for task_id in (TASK, 'textops.core.title_case.body', 'textops.core.slugify.body'):
    t, _, graded = _load(task_dir, task_id)
    g = grading.grade(t, graded, task_lib.read_solutions(task_dir)[t.id].patch)
    assert g.reward == 1.0 and not g.tamper, g.reason
    # Every twin failed, the in-place ones in their twin runs (reported under their own ids).
    twin_ids = [n for n in g.outcomes if n not in t.fail_to_pass + t.pass_to_pass]
    assert twin_ids and {g.outcomes[n] for n in twin_ids} == {'failed'}


# Records what the body can see at each call into the run's output directory (the config's
# sibling), which the test reads back after each run.
OBSERVER = '''\
  import json, os, sys, traceback
  caller = traceback.extract_stack(limit=2)[0]
  root = os.getcwd()
  files = {}
  for d, _, names in os.walk(root):
    for n in sorted(names):
      st = os.stat(os.path.join(d, n))
      files[os.path.relpath(os.path.join(d, n), root)] = [st.st_size, st.st_mtime]
  seen = {'caller': [caller.name, os.path.relpath(caller.filename, root), caller.lineno],
          'cwd': root, 'argv': sys.argv, 'env': dict(os.environ), 'uid': os.getuid(),
          'gid': os.getgid(), 'pid': os.getpid(), 'ppid': os.getppid(), 'files': files,
          'lines': {f: open(os.path.join(root, f)).read().count(chr(10)) for f in files
                    if f.endswith('.py')}}
  out = os.path.join(os.path.dirname(os.path.dirname(sys.argv[1])), 'out', 'seen.jsonl')
  with open(out, 'a') as f:
    f.write(json.dumps(seen) + chr(10))
'''


def test_a_twin_run_shows_the_body_what_the_real_run_shows(fixture_tasks, monkeypatch):
  _, task_dir, _ = fixture_tasks
  t, tree, graded = _load(task_dir)
  source = (task_dir / t.original / t.file).read_text()
  t = dataclasses.replace(t, calls=[])  # The body records in test runs only.
  body = source.split('"""Number of vowels (aeiou, any case)."""\n', 1)[1].split('\n\n', 1)[0]
  runs = []
  run_pytest = testrun.run_pytest

  def observed(tree, files, *, scratch, until=frozenset(), **kwargs):
    run = run_pytest(tree, files, scratch=scratch, until=until, **kwargs)
    seen = [json.loads(line) for line in (scratch / 'out' / 'seen.jsonl').read_text().splitlines()]
    runs.append((str(scratch), list(run.outcomes), seen, time.time(), until))
    return run

  monkeypatch.setattr(testrun, 'run_pytest', observed)
  g = grading.grade(t, graded, _solution(t, tree, OBSERVER + body + '\n'))
  assert g.reward == 1.0, g.reason
  assert len(runs) >= 2  # The real run, then the twin runs.
  (root, nodeids, seen, ended, _), *twin_runs = runs
  assert re.fullmatch(r'/tmp/grade-\w+', root) and seen

  def same(text, root):  # Each run's root is a fresh directory of one form.
    return json.loads(json.dumps(text).replace(root, '<root>'))

  for other, other_nodeids, other_seen, other_ended, until in twin_runs:
    assert re.fullmatch(r'/tmp/grade-\w+', other) and other != root
    # The same tests, collected and run in the same order under the same node ids, up to where
    # the twin run was stopped: after its twins.
    assert other_nodeids == nodeids[:len(other_nodeids)] and until <= set(other_nodeids)
    # Called from the same test names, files and lines, in the same order.
    assert [s['caller'] for s in other_seen] == [s['caller'] for s in seen][:len(other_seen)]
    for key in ('cwd', 'argv', 'env', 'uid', 'gid', 'pid', 'ppid', 'lines'):
      assert same(other_seen[0][key], other) == same(seen[0][key], root), key
    files, other_files = seen[0]['files'], other_seen[0]['files']
    assert other_files.keys() == files.keys()
    # Only a test file's size may differ (an unsealed twin's constant).
    assert {f for f in files if files[f][0] != other_files[f][0]} <= {
        f for f in files if f.startswith('tests/test_')}
    # Every file is as old as its own run, not as the grading: written after the run before.
    assert min(mtime for _, mtime in other_files.values()) > ended
    ended = other_ended


# The first test passes, the second (after it in order) leaves a marker in the run's output
# directory, then sleeps 8 s; the third passes.
STOPPED_SUITE = '''\
import os, sys, time


def test_first():
  assert True


def test_after():
  out = os.path.join(os.path.dirname(os.path.dirname(sys.argv[1])), 'out', 'after')
  open(out, 'w').close()
  time.sleep(8)


def test_last():
  assert True
'''


def _suite_run(tmp_path, until, text=STOPPED_SUITE, wall_s=20):
  tree, scratch = tmp_path / 'tree', tmp_path / 'scratch'
  tree.mkdir(parents=True)
  scratch.mkdir()
  (tree / 'test_s.py').write_text(text)
  run = testrun.run_pytest(tree, ['test_s.py'], python=sys.executable, python_path=[''],
                           site_dirs=[], config_file=None, limits=sandbox.Limits(wall_s=wall_s),
                           scratch=scratch, until=frozenset(until))
  return run, (scratch / 'out' / 'after').exists()


def test_a_run_is_stopped_once_the_tests_it_awaits_have_reported(tmp_path):
  run, _ = _suite_run(tmp_path / 'a', ['test_s.py::test_first'])
  assert run.stopped and not run.finished and not run.timed_out and not run.problems
  # The test after it may start before the kill (after the verdict), but never ends.
  assert run.outcomes == {'test_s.py::test_first': 'passed'} and run.wall_s < 6
  # Without `until`, the same run reaches the tests after it.
  run, after_ran = _suite_run(tmp_path / 'b', [])
  assert after_ran and run.finished and not run.stopped and len(run.outcomes) == 3


def test_a_run_that_ends_before_the_awaited_tests_report_is_not_stopped(tmp_path):
  crash = STOPPED_SUITE.replace('  time.sleep(8)\n', '  os._exit(0)\n')
  run, after_ran = _suite_run(tmp_path, ['test_s.py::test_last'], crash)
  assert after_ran and not run.stopped and not run.finished
  assert 'exit status 0 before the test session finished' in run.problems
  run, _ = _suite_run(tmp_path / 'hang', ['test_s.py::test_last'], wall_s=4)
  assert run.timed_out and not run.stopped and not run.finished


def test_twin_runs_stop_after_their_last_twin(fixture_tasks, monkeypatch):
  """A twin run reports the real run's tests in order, up to its last twin and no further."""
  _, task_dir, _ = fixture_tasks
  runs = []
  run_pytest = testrun.run_pytest

  def observed(*args, until=frozenset(), **kwargs):
    run = run_pytest(*args, until=until, **kwargs)
    runs.append((until, run))
    return run

  monkeypatch.setattr(testrun, 'run_pytest', observed)
  for task_id in (TASK, 'textops.core.title_case.body', 'textops.core.slugify.body'):
    t, _, graded = _load(task_dir, task_id)
    runs.clear()
    g = grading.grade(t, graded, task_lib.read_solutions(task_dir)[t.id].patch)
    assert g.reward == 1.0 and not g.tamper, g.reason
    (_, real), *twin_runs = runs
    assert twin_runs and not real.stopped and real.finished
    order = list(real.outcomes)
    for until, run in twin_runs:
      last = max(order.index(n) for n in until)
      assert run.stopped and list(run.outcomes) == order[:last + 1], task_id


def _crashing_twin_runs(monkeypatch, uid, wall_s):
  """Twin runs under `uid` + 1 (and a wall limit of `wall_s`): a body can end them alone, as a
  candidate that a twin run makes crash or hang would."""
  run_pytest = testrun.run_pytest

  def twin_uid(*args, until=frozenset(), **kwargs):
    if until:
      kwargs.update(uid=uid + 1, limits=dataclasses.replace(kwargs['limits'], wall_s=wall_s))
    return run_pytest(*args, until=until, **kwargs)

  monkeypatch.setattr(testrun, 'run_pytest', twin_uid)


@pytest.mark.parametrize('end, reason', [
    ('faulthandler._sigsegv()', r'a twin run ended early \(exit \S+\)'),
    ('time.sleep(60)', r'a twin run ended early \(exit \S+, time limit exceeded\)'),
    # The scanner's flag stays.
    ('os._exit(3)', r'tampering: hard exit \(_exit\) in textops/core.py')])
def test_a_twin_run_that_crashes_or_hangs_before_its_twins_report_is_a_zero(
    fixture_tasks, monkeypatch, end, reason):
  _, task_dir, _ = fixture_tasks
  t, tree, graded = _load(task_dir)
  t = dataclasses.replace(t, calls=[], time_limit_s=20)
  source = (task_dir / t.original / t.file).read_text()
  body = source.split('"""Number of vowels (aeiou, any case)."""\n', 1)[1].split('\n\n', 1)[0]
  uid = sandbox.uid_for(7)
  _crashing_twin_runs(monkeypatch, uid, wall_s=10)
  ender = f'  import faulthandler, os, time\n  if os.getuid() == {uid + 1}:\n    {end}\n'
  honest = grading.grade(t, graded, _solution(t, tree, body + '\n'), uid=uid)
  assert honest.reward == 1.0, honest.reason
  g = grading.grade(t, graded, _solution(t, tree, ender + body + '\n'), uid=uid)
  assert g.reward == 0.0 and not g.fault and re.match(reason, g.reason), g.reason
