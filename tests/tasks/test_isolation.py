import ast
import dataclasses
import textwrap

import pytest

from experiments.benchmarks import twin_kinds
from research.tasks import factory
from research.tasks import testing
from research.tasks import grading
from research.tasks.grading import isolation
from research.tasks.grading import seal
from research.tasks.grading import tamper
from research.tasks import task as task_lib
from research.tasks.redteam.attacks import readers

_TESTS = '''\
    import pytest

    import pkg

    WORDS = ['HELLO!', 'WORLD!']
    SAID = 'said by a helper'
    UNREAD = 'HELLO! nobody reads me'


    def _helper():
      return SAID


    @pytest.fixture
    def test_word():
      return 'hello'


    def test_shout(test_word):
      assert pkg.shout(test_word) == 'HELLO!'
      assert _helper() == 'said by a helper'


    @pytest.mark.parametrize('word', WORDS)
    def test_unshout(word):
      assert pkg.unshout(word) == word[:-1].lower()


    class TestMore:
      LOUD = ['HELLO!']

      def test_loud(self):
        assert self.LOUD


    if pytest:  # A gate: the test inside goes, the gate stays.
      def test_gated():
        assert pkg.unshout('HELLO!') == 'hello'
    '''
_SHOUT = 'tests/test_pkg.py::test_shout'


def _strings(module):
  return {n.value for n in ast.walk(module) if isinstance(n, ast.Constant)
          and isinstance(n.value, str)}


def _sealed(tree, answer):
  """The test file sealed by hand: its first assert's literal is a token, its answer `answer`."""
  path = tree / 'tests' / 'test_pkg.py'
  path.write_text(path.read_text().replace("== 'HELLO!'\n", '== TOKEN\n', 1))
  return seal.Sealing(expect={'t': seal.Expectation(_SHOUT, 0, answer)})


def test_a_test_whose_answer_another_test_holds_runs_alone(tmp_path):
  tree = testing.write_repo(tmp_path / 'repo', {
      'pkg/__init__.py': '', 'tests/test_pkg.py': textwrap.dedent(_TESTS),
      'tests/conftest.py': "LOUDER = 'HELLO!'\n",
      'tests/test_other.py': "def test_other():\n  assert 'HELLO!'\n"})
  sealing = _sealed(tree, 'hello!')  # Case is ignored: a forger changes case itself.
  (tmp_path / 'scratch').mkdir()
  main, alone = isolation.split([_SHOUT, 'tests/test_pkg.py::test_unshout[x]'],
                                ['tests/test_pkg.py'], tree, sealing, [], tmp_path / 'scratch')
  assert (main.tree, main.functions) == (tree, frozenset())
  assert alone.functions == {_SHOUT} and alone.files == ['tests/test_pkg.py']
  kept = ast.parse((alone.tree / 'tests/test_pkg.py').read_text())
  names = {n.name for n in ast.walk(kept) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
  # Helpers, fixtures (even one named like a test), what they read and classes stay; other tests
  # and the constants only they read go, here and in every other test file.
  assert names == {'_helper', 'test_word', 'test_shout', 'TestMore'}
  assert _strings(kept) == {'said by a helper', 'hello'}
  assert sum(isinstance(n, ast.If) for n in kept.body) == 1
  for rel in ('tests/conftest.py', 'tests/test_other.py'):
    assert 'HELLO!' not in (alone.tree / rel).read_text()
  assert (alone.tree / 'pkg/__init__.py').is_file()
  # The main run keeps the rest as it was, and no longer holds the test.
  rest = ast.parse((tree / 'tests/test_pkg.py').read_text())
  assert {n.name for n in ast.walk(rest) if isinstance(n, ast.FunctionDef)} == {
      '_helper', 'test_word', 'test_unshout', 'test_loud', 'test_gated'}
  assert 'HELLO! nobody reads me' in _strings(rest)


def test_a_test_is_not_isolated_where_that_hides_nothing(tmp_path):
  files = {'pkg/__init__.py': '', 'tests/test_pkg.py': textwrap.dedent(_TESTS)}
  for answer in ('said by a helper', 'not in any file'):
    tree = testing.write_repo(tmp_path / answer.replace(' ', '_'), files)
    sealing = _sealed(tree, answer)
    modules = isolation._parse(tree)
    assert isolation.plan([_SHOUT], modules, sealing, []) == {}


_MODULE = '''\
    def shout(text):
      return text.upper() + '!'


    def unshout(text):
      return text[:-1].lower()
    '''
_ROUND_TRIP = '''\
    import pkg


    def test_shout_makes_words_loud():
      greeting, phrase = 'hello', 'quiet word'
      assert pkg.shout(greeting) == 'HELLO!'
      assert pkg.shout(phrase) == 'QUIET WORD!'


    def test_unshout_makes_loud_words_quiet_again():
      assert pkg.unshout('HELLO!') == 'hello'
      assert pkg.unshout('QUIET WORD!') == 'quiet word'
    '''
# The round trip, with a test of the main run that calls `shout` too: there a forger harvests.
_ROUND_TRIP_AND_LOUDNESS = _ROUND_TRIP + '''

    def test_shouting_is_loud():
      assert pkg.shout('hello').isupper()
    '''


@pytest.fixture(scope='module')
def round_trip(tmp_path_factory):
  """The factory's `shout` task of the round trip: (task, grading tree, reference, out dir)."""
  root = tmp_path_factory.mktemp('round_trip')
  repo = testing.write_repo(root / 'repo', {
      'pkg/__init__.py': textwrap.dedent(_MODULE),
      'tests/test_pkg.py': textwrap.dedent(_ROUND_TRIP_AND_LOUDNESS)})
  out = root / 'out'
  summary = factory.make_tasks(repo, out, modes=('body',), only=('shout',), progress=False,
                               log=lambda _: None)
  assert summary.kept == 1
  t, = task_lib.read(out / 'tasks.jsonl')
  assert t.calls  # The differential check would stop the forgers too: these tests are about
  t = dataclasses.replace(t, calls=[])  # the isolated runs, so it is off (test_differential.py).
  return t, out / t.grading_tree, task_lib.read_solutions(out)[t.id].patch, out


def test_an_answer_another_test_holds_cannot_be_read_back(round_trip):
  t, tree, reference, out = round_trip
  assert f'{t.fail_to_pass[0]}@0' in t.sealed
  # It maps unshout(c) -> c over the test files' strings.
  forged = twin_kinds.forged_patch(out, t, reference, readers.INVERSE, with_args=True)
  assert grading.grade(t, tree, reference).reward == 1.0
  result = grading.grade(t, tree, forged)
  assert result.reward == 0.0 and result.tamper == []
  assert result.outcomes[t.fail_to_pass[0]] == 'failed'  # At its sealed assert, run alone.
  # The same grading with every test in one run rewards the forger.
  assert grading.grade(t, tree, forged, alone=False).reward == 1.0


def test_a_run_alone_gets_no_answers_from_another_run_through_the_keyring(round_trip,
                                                                          monkeypatch):
  t, tree, reference, out = round_trip
  forged = twin_kinds.forged_patch(out, t, reference, readers.KEYRING, with_args=True)
  stub = (out / t.tree / t.file).read_text()
  source = twin_kinds.forged_source(out, t, reference, readers.KEYRING, with_args=True)
  assert tamper.scan(stub, source) == ['pokes memory (ctypes)']
  # The static scanner flags ctypes; this is about the sandbox, so it is off for both arms.
  monkeypatch.setattr(tamper, 'scan', lambda old, new: [])
  result = grading.grade(t, tree, forged)
  assert result.reward == 0.0 and result.tamper == []
  assert result.outcomes['tests/test_pkg.py::test_shouting_is_loud'] == 'passed'
  assert result.outcomes[t.fail_to_pass[0]] == 'failed'
  # Without the seccomp filter the main run's strings reach the run alone, and the forger wins.
  with twin_kinds.without_seccomp():
    assert grading.grade(t, tree, forged).reward == 1.0
