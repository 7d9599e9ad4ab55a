import dataclasses
import json
import subprocess
import sys

from research.tasks import factory
from research.tasks import testing
from research.tasks import grading
from research.tasks import layout
from research.tasks.factory import scrub
from research.tasks import task as task_lib
from research.tasks.factory import taskset


def test_fixture_tasks_pass_every_gate(fixture_tasks):
  origin, task_dir, summary = fixture_tasks
  tasks = task_lib.read(task_dir / 'tasks.jsonl')
  solutions = task_lib.read_solutions(task_dir)
  assert summary.kept == len(tasks) >= 12 and summary.stable_tests == 15
  assert {t.mode for t in tasks} == {'body', 'function', 'feature'}
  public = (task_dir / 'tasks.jsonl').read_text()
  for t in tasks:
    assert t.fail_to_pass and t.pass_to_pass and not set(t.fail_to_pass) & set(t.pass_to_pass)
    assert 'tests/test_core.py' in t.protected_paths and t.packages == ['textops']
    tree = task_dir / t.tree
    assert scrub.scan_tree(tree, solutions[t.id].fingerprints) == []
    log = subprocess.run(['git', 'log', '--oneline'], cwd=tree, capture_output=True, text=True)
    assert len(log.stdout.splitlines()) == 1
    # The deleted code never reaches what the policy is given.
    assert not any(line in public for line in solutions[t.id].fingerprints)
  feature = next(t for t in tasks if t.id == 'textops.core.slugify.feature')
  source = (task_dir / feature.tree / feature.file).read_text()
  assert 'def slugify' not in source and 'def _fold' not in source and 'def _squash' not in source


def test_rejections_are_counted_with_their_gate(fixture_tasks):
  _, task_dir, summary = fixture_tasks
  with open(task_dir / 'rejected.jsonl') as f:
    rejected = {r['candidate']: r for r in map(json.loads, f)}
  assert rejected['textops.core.reverse_words.body']['gate'] == 'no_covering_test'
  assert rejected['textops.core.wrap.function']['gate'] == 'not_importable'
  assert "name 'wrap' is not defined" in rejected['textops.core.wrap.function']['detail']
  assert rejected['textops.core._remember.body']['gate'] == 'no_fail_to_pass'
  # Without max_tasks every candidate is tried; those without tests never reach the gates.
  assert summary.candidates == summary.kept + sum(summary.rejected.values())
  assert summary.tried == summary.candidates - summary.rejected['no_covering_test']
  saved = json.loads((task_dir / 'summary.json').read_text())
  assert saved['kept'] == summary.kept and saved['rejected'] == dict(summary.rejected)
  assert (task_dir / 'summary.png').read_bytes().startswith(b'\x89PNG')


def test_reference_passes_and_the_deleted_state_fails(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl') if t.id == 'textops.core.wrap.body')
  solution = task_lib.read_solutions(task_dir)[t.id]
  assert grading.grade(t, task_dir / t.grading_tree, solution.patch).reward == 1.0
  noop = grading.grade(t, task_dir / t.grading_tree, '')
  assert noop.reward == 0.0 and noop.reason == 'no applicable source changes'


def test_flaky_and_failing_tests_are_dropped():
  runs = [{'a': 'passed', 'b': 'passed', 'c': 'failed'}, {'a': 'passed', 'b': 'failed'},
          {'a': 'passed', 'b': 'passed', 'c': 'failed'}]
  assert factory.stable_tests(runs) == ({'a'}, {'b'}, {'c'})


def test_bad_repositories_are_rejected_with_the_reason(tmp_path):
  no_tests = testing.write_repo(tmp_path / 'no_tests',
                                 {'pkg/__init__.py': 'def f():\n  return 1\n'})
  broken = testing.write_repo(tmp_path / 'broken', {
      'pkg/__init__.py': 'def f():\n  return 1\n',
      'tests/test_pkg.py': 'import pkg\n\ndef test_f():\n  assert pkg.f() == 2\n'})
  results = {repo.name: factory.make_tasks(repo, tmp_path / 'out' / repo.name, progress=False,
                                           log=lambda _: None)
             for repo in (no_tests, broken)}
  assert results['no_tests'].repo_rejected.startswith('no_tests:')
  assert results['broken'].repo_rejected.startswith('original_fails: no test passes')
  assert results['broken'].failing_tests == 1 and results['broken'].kept == 0
  assert task_lib.read(tmp_path / 'out/broken/tasks.jsonl') == []


def test_an_installed_copy_of_the_original_is_a_leak(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  installed = tmp_path / 'installed'
  testing.install_copy(fx, installed)
  summary = factory.make_tasks(fx.repo, tmp_path / 'out',
                               site_dirs=(str(fx.site), str(installed)), progress=False,
                               log=lambda _: None)
  assert summary.repo_rejected.startswith('leak: installed copies importable outside the tree')
  assert str(installed / 'textops') in summary.repo_rejected


def test_cli_writes_array_records_that_grain_reads(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  out = tmp_path / 'out'
  subprocess.run([sys.executable, '-m', 'launch.make_tasks', f'--repo={fx.repo}', f'--out={out}',
                  '--format=arrayrecord', '--modes=body', '--only=title_case', '--runs=1',
                  f'--site_dir={fx.site}'], check=True, capture_output=True)
  import grain  # Only here: grain imports JAX.
  source = grain.sources.ArrayRecordDataSource([str(out / 'tasks.array_record')])
  records = [task_lib.decode(source[i]) for i in range(len(source))]
  assert [(t.symbol, t.mode) for t in records] == [('title_case', 'body')]
  assert records == task_lib.read(out / 'tasks.array_record')
  # The tests that decide the reward are hidden from the policy, kept in the grading tree.
  assert records[0].test_files == ['tests/test_core.py'] and not records[0].visible_tests
  assert layout.test_files(out / records[0].tree) == ['tests/test_stats.py']
  assert layout.test_files(out / records[0].grading_tree) == ['tests/test_core.py',
                                                             'tests/test_stats.py']


def test_near_duplicates_are_dropped_by_code_or_by_hole(fixture_tasks, tmp_path):
  _, task_dir, _ = fixture_tasks
  tasks = {t.id: t for t in task_lib.read(task_dir / 'tasks.jsonl')}
  solutions = task_lib.read_solutions(task_dir)
  a, b, c = (tasks[i] for i in ('textops.core.title_case.body', 'textops.core.wrap.body',
                                'textops.stats.top_words.body'))
  # The same code deleted in another repository, reformatted: a duplicate of `a`.
  moved = dataclasses.replace(a, id='z/textops.core.title_case.body', repo='z')
  reformatted = dataclasses.replace(solutions[a.id], deleted=solutions[a.id].deleted.replace(
      '(', '(  ', 1) + '  # a comment\n')
  holes = {a.id: 'h1', b.id: 'h2', c.id: 'h2', moved.id: 'h3'}
  made = [(t, solutions[t.id]) for t in (c, b, a)] + [(moved, reformatted)]
  kept, dropped = taskset.dedupe(made, holes, tmp_path)
  assert [t.id for t, _ in kept] == [a.id, b.id]
  assert dropped == [
      {'candidate': c.id, 'gate': 'duplicate', 'detail': f'same hole as {b.id}'},
      {'candidate': moved.id, 'gate': 'duplicate', 'detail': f'same deleted code as {a.id}'}]


def test_tasks_that_a_trivial_body_solves_are_rejected(tmp_path):
  repo = testing.write_repo(tmp_path / 'weak', {
      'pkg/__init__.py': '''\
          class Tag:

            def __init__(self, tag_label):
              self.tag_label = tag_label

            def __eq__(self, other):
              return self.tag_label.casefold() == other.tag_label.casefold()


          def clean(text):
            return text.strip(' -~')


          def double(x):
            return x + x + 0 * len(str(x))


          def log(message, sink):
            sink.append(message.upper().lower())


          def grade_of(score):
            if score >= 90:
              return 'excellent'
            return 'fair' if score >= 50 else 'poor'


          SEPARATOR = ', '


          def separator(style):
            if style == 'tabs':
              return '\\t'
            return SEPARATOR


          def pick(first, fallback):
            return first if first is not None else fallback
          ''',
      'tests/test_pkg.py': '''\
          import pkg


          def test_tags():
            assert pkg.Tag('a') == pkg.Tag('a')


          def test_clean():
            assert pkg.clean('abc') == 'abc'


          def test_double():
            assert pkg.double(3) == 6


          def test_log():
            sink = []
            pkg.log('x', sink)
            assert sink == ['x']


          def test_grade_of():
            assert pkg.grade_of(95) == 'excellent'


          def test_separator():
            assert pkg.separator('plain') == ', '


          def test_pick():
            assert pkg.pick(None, 5) == 5
          '''})
  out = tmp_path / 'out'
  summary = factory.make_tasks(repo, out, modes=('body',),
                               only=('Tag.__eq__', 'clean', 'double', 'log', 'grade_of',
                                     'separator', 'pick'),
                               progress=False, log=lambda _: None)
  with open(out / 'rejected.jsonl') as f:
    rejected = {r['candidate']: r for r in map(json.loads, f)}
  assert rejected['pkg.Tag.__eq__.body']['detail'] == (
      '`return True` passes every FAIL_TO_PASS test')
  assert rejected['pkg.clean.body']['detail'] == '`return text` passes every FAIL_TO_PASS test'
  # The only branch tested returns a constant of the deleted code.
  assert rejected['pkg.grade_of.body']['detail'] == (
      "`return 'excellent'` passes every FAIL_TO_PASS test")
  # A module constant it returns by name; an argument other than the first.
  assert rejected['pkg.separator.body']['detail'] == (
      '`return SEPARATOR` passes every FAIL_TO_PASS test')
  assert rejected['pkg.pick.body']['detail'] == '`return fallback` passes every FAIL_TO_PASS test'
  assert summary.rejected == {'weak_tests': 5}
  # Where the tests pin the function down (a value, an effect), the task is kept.
  assert {t.id for t in task_lib.read(out / 'tasks.jsonl')} == {'pkg.double.body', 'pkg.log.body'}


def test_parametrize_lists_are_sealed_unless_rewriting_them_breaks_a_test(tmp_path):
  tests = '''\
      import pytest

      import pkg

      PAIRS = [('cat', 'cats'), ('box', 'boxes'), ('fly', 'flies')]


      @pytest.mark.parametrize(('word', 'plural'), PAIRS)
      def test_plural(word, plural, {fixture}):
        assert pkg.plural({argument}) == plural


      def test_other():
        assert pkg.other() == 1
      '''
  module = '''\
      def plural(word):
        if word.endswith('x'):
          return word + 'es'
        return word[:-1] + 'ies' if word.endswith('y') else word + 's'


      def other():
        return 1
      '''
  sealed = {}
  for name, fixture, argument, conftest in (
      ('plain', 'request', 'word', ''),
      # A fixture of the conftest takes `word`, which the test does not read: the list rewritten
      # with None there breaks every case, and the factory plants again without it.
      ('fixture', 'spelled', 'spelled',
       'import pytest\n\n@pytest.fixture\ndef spelled(word):\n  return word\n')):
    repo = testing.write_repo(tmp_path / name, {
        'pkg/__init__.py': module, 'tests/conftest.py': conftest,
        'tests/test_pkg.py': tests.format(fixture=fixture, argument=argument)})
    summary = factory.make_tasks(repo, tmp_path / 'out' / name, modes=('body',),
                                 only=('plural',), progress=False, log=lambda _: None)
    t, = task_lib.read(tmp_path / 'out' / name / 'tasks.jsonl')
    assert summary.kept == 1
    sealed[name] = t.sealed
  other = 'tests/test_pkg.py::test_other@0'
  assert sealed['plain'] == [other] + [f'tests/test_pkg.py::test_plural[{w}-{p}]@0' for w, p in (
      ('box', 'boxes'), ('cat', 'cats'), ('fly', 'flies'))]
  assert sealed['fixture'] == [other]
