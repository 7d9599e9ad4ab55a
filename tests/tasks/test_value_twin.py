import collections
import copy
import enum

import numpy as np

from research.tasks.grading import sandboxed
from research.tasks.grading.sandboxed import value_check

Point = collections.namedtuple('Point', 'x y')


class Color(enum.IntEnum):
  RED = 1


class Tag(str):
  pass


# Values correct code may compare: builtin scalars and containers, nested, empty, and subclasses.
VALUES = [0, -7, 2**70, True, False, None, 0.0, -2.5, 1e300, '', 'a', 'Hello, World', b'', b'\x00z',
          [], (), {}, set(), frozenset(), [1, 'two', 3.0], ('a', ('b', ['c', {'d': 4}])),
          {'the': 3, 'cat': 1}, {1, 2, 3}, frozenset({'x'}), [[[[1]]]], [None, True],
          collections.Counter('hello'), collections.OrderedDict(a=1), Point(1, 2), Color.RED,
          Tag('red'), np.float64(1.5), [(1, 2), (2, 3)]]


class Same:
  """A forger's result: equal to whatever it is compared with, reading the other object."""

  def __eq__(self, other):
    return isinstance(other, object)


class SameList(list):
  """The same, as a list (so the twin can change it)."""

  def __eq__(self, other):
    return isinstance(other, object)


class Opaque:
  """A value of a type nothing changes, equal by content."""

  def __init__(self, v):
    self.v = v

  def __eq__(self, other):
    return isinstance(other, Opaque) and self.v == other.v


class Caseless(str):
  """A string that compares without case: a changed copy must still differ from it."""

  def __eq__(self, other):
    return isinstance(other, str) and self.lower() == other.lower()

  __hash__ = str.__hash__


def _counted(check, a, b, seed, copies=True):
  """A value twin's call: (what the assert sees, the wrong answers counted)."""
  check.forged = 0
  return check(a, b, seed, True, copies), check.forged


def _checked(a, b, seed):
  """A checked original's call: what the assert sees, or 'raised' for a wrong answer."""
  try:
    return bool(value_check.changed_equal(a, b, seed, False, True))
  except AssertionError as e:
    assert value_check.FAILED.search(f'AssertionError: {e}')
    return 'raised'


def test_correct_values_are_compared_as_before_and_answer_every_check():
  for value in VALUES:
    for seed in range(40):
      assert _checked(value, copy.deepcopy(value), seed) is True
      assert _counted(value_check.changed_equal, value, copy.deepcopy(value), seed) == (True, 0)
  assert _checked([1, 2], [1, 3], 0) is False
  for seed in range(200):
    for text in ('Abc', 'Q', 'hello world'):  # Changes are never of case only.
      assert _checked(Caseless(text), text, seed) is True


def test_an_object_equal_to_everything_is_caught_for_every_seed():
  for value in VALUES:
    for seed in range(40):
      for forger in (Same(), SameList()):
        assert _checked(forger, value, seed) == 'raised', (value, seed)
        assert _counted(value_check.changed_equal, forger, value, seed)[1] > 0
        if isinstance(value, np.generic) and isinstance(forger, list):
          continue  # numpy compares it elementwise: the original assert fails already.
        assert _checked(value, forger, seed) == 'raised', (value, seed)


class Knows(list):
  """A list that holds nothing but claims equality with exactly the right value: it answers the
  copies and the changes as correct code does."""

  def __eq__(self, other):
    return [(1, 2), (2, 3)] == other


def test_a_builtin_subclass_is_compared_by_what_it_holds():
  for seed in range(40):
    assert _checked(Knows(), [(1, 2), (2, 3)], seed) == 'raised'
    assert _checked([(1, 2), (2, 3)], Knows(), seed) == 'raised'
    assert _checked(Knows([(1, 2), (2, 3)]), [(1, 2), (2, 3)], seed) is True


class Guess:
  """Not a builtin: says yes to the first value it is shown, then only to values equal to it."""

  def __init__(self):
    self.seen = []

  def __eq__(self, other):
    if not self.seen:
      self.seen.append(other)
    return other == self.seen[0]


def test_an_object_that_guesses_which_value_is_the_copy_fails_half_the_time():
  truth = [(1, 2), (2, 3)]
  outcomes = collections.Counter()
  first = collections.Counter()
  for _ in range(2000):
    forger = Guess()
    outcomes[_checked(forger, truth, 7)] += 1
    first[forger.seen[0] == truth] += 1
  # It passes when the faithful copy came first (the order is drawn at every call), and its
  # wrong answer is otherwise seen at once or at the final `a == b`.
  assert outcomes.keys() <= {True, False, 'raised'}
  assert 800 < outcomes[True] == first[True] < 1200


class Cyclic(list):

  def __eq__(self, other):
    return isinstance(other, object)


class Disguised:
  """Equal to everything, and claiming to be a list through `__class__`."""

  @property
  def __class__(self):
    return list

  def __eq__(self, other):
    return isinstance(other, object)


def test_forgers_that_resist_copying_are_caught():
  cyclic = Cyclic()
  cyclic.append(cyclic)
  assert _checked(cyclic, [1], 0) == 'raised'
  assert isinstance(Disguised(), list)
  assert _checked(Disguised(), [1], 0) == 'raised'


def test_values_nothing_changes():
  assert _checked(Opaque(1), Opaque(1), 0) is True
  assert _checked(Opaque(1), Opaque(2), 0) is False
  # An object equal to everything, compared with a value nothing copies or changes, is not
  # caught (left to the point twins and the scanner there).
  assert _checked(Same(), Opaque(1), 0) is True
  # A comparison that raises counts as unequal.
  array = np.arange(3)
  assert _counted(value_check.changed_equal, [0, 1, 2], [0, 1, 2], 0) == (True, 0)
  assert _counted(value_check.changed_equal, array, array, 0)[1] == 0


class FirstOnly(list):
  """Says yes to the first value it is compared with."""

  def __eq__(self, other):
    self.append(other)
    return len(self) == 1


def test_value_twins_of_old_task_records_compare_changes_only():
  # Their seeds were verified without the copies: a subclass whose equality is looser than its
  # builtin's (Caseless) may differ from a copy of the other side, so copies are left out.
  for seed in range(40):
    assert _counted(value_check.changed_equal, Caseless('ABC'), 'abc', seed, copies=False) == (
        True, 0)
    assert _counted(value_check.changed_equal, Same(), 'the', seed, copies=False) == (True, 1)
  assert _counted(value_check.changed_equal, FirstOnly(), 'the', 5, copies=False)[1] == 1
  assert _counted(value_check.changed_equal, Caseless('ABC'), 'abc', 5) == (True, 1)


def test_the_planted_source_needs_nothing_from_its_module():
  # Not even builtins from the module's globals: a module under test could shadow them there.
  shadows = {name: (lambda *a, **k: True) for name in ('isinstance', 'type', 'len', 'bool',
                                                        'issubclass', 'list')}
  namespace = {'__builtins__': __builtins__, **shadows}
  exec(sandboxed.copied(value_check.PIECES, '_same_words'), namespace)  # pylint: disable=exec-used
  planted = namespace['_same_words']
  helpers = {p.__name__.replace('changed_equal', '_same_words') for p in value_check.PIECES}
  assert set(namespace) == {'__builtins__', *helpers, *shadows} and len(helpers) > 1
  for value in VALUES[:20]:
    assert _counted(planted, value, copy.deepcopy(value), 3) == (True, 0)
    assert _counted(planted, Same(), value, 3)[1] > 0
    assert planted(value, copy.deepcopy(value), 3, False, True) is True
