import ast

import pytest

from research.tasks.factory import deletion

SOURCE = '''\
import functools


def _helper(x):
  """Doubles."""
  return 2 * x


def _shared(x):
  return x + 1


@functools.lru_cache
def feature(x):
  """Uses the helpers."""
  return _helper(x) + _shared(x)


def other(x):
  return _shared(x)


def doc_only():
  """Nothing else."""


class Box:
  """A box."""

  def get(self):
    return 1
'''


def _sym(name):
  return next(s for s in deletion.symbols(SOURCE) if s.qualname == name)


def test_symbols_lists_functions_and_methods():
  assert [s.qualname for s in deletion.symbols(SOURCE)] == [
      '_helper', '_shared', 'feature', 'other', 'doc_only', 'Box.get']


def test_body_deletion_keeps_decorator_signature_and_docstring():
  new, removed = deletion.delete_body(SOURCE, _sym('feature'))
  assert ('@functools.lru_cache\ndef feature(x):\n  """Uses the helpers."""\n'
          '  raise NotImplementedError\n') in new
  assert removed == '  return _helper(x) + _shared(x)\n'
  with pytest.raises(ValueError, match='no body'):
    deletion.delete_body(SOURCE, _sym('doc_only'))


def test_feature_takes_only_helpers_nobody_else_uses():
  assert [h.qualname for h in deletion.helpers(SOURCE, _sym('feature'))] == ['_helper']
  new, _ = deletion.delete_symbols(SOURCE, [_sym('feature'), _sym('_helper')])
  assert 'def _helper' not in new and 'lru_cache\n' not in new.split('import functools')[1]
  assert 'def _shared' in new and 'def other' in new
  ast.parse(new)


def test_deleting_the_only_method_leaves_a_valid_class():
  source = 'class A:\n  def f(self):\n    return 1\n'
  new, _ = deletion.delete_symbols(source, deletion.symbols(source))
  assert new == 'class A:\n  pass\n'


def test_cyclomatic_size_of_deleted_code():
  function = 'def f(x):\n  if x and x > 1:\n    return [i for i in x]\n  return 0\n'
  assert deletion.cyclomatic(function) == 4  # if, and, one comprehension.
  method = '    def m(self):\n        for i in self:\n            pass\n'
  assert deletion.cyclomatic(method) == 2
  body = '    try:\n        return 1\n    except ValueError:\n        return 2\n'
  assert deletion.cyclomatic(body) == 2  # Parsed inside an `if`, which does not count.
  assert deletion.cyclomatic('    return 2\n') == 1


TRIVIAL_SOURCE = '''\
class Pair:

  def __eq__(self, other):
    """Equal parts."""
    return self.parts == other.parts

  @staticmethod
  def make(a, b):
    return Pair(a, b)

  @property
  def first(self):
    return self.parts[0]

  @first.setter
  def first(self, value):
    self.parts = (value, self.parts[1])


def chunks(items, size):
  def inner():
    yield 0
  for i in range(0, len(items), size):
    yield items[i:i + size]


async def stream(n):
  for i in range(n):
    yield i


def collect(items):
  return [(lambda: (yield))() for _ in items]


def noargs():
  return 1


def speed(mode):
  if mode == 'fast':
    return 'quick'
  if mode == 'off':
    return None
  return ('slow', -1) if mode else noargs()


DEFAULT = 'medium'


def level(name, *, fallback=None):
  import os
  total = 0
  for part in name.split():
    total += len(part)
  if not name:
    return NotImplemented
  if total > 3:
    return total
  if name == 'env':
    return os
  return DEFAULT
'''


def _trivial(qualname, start=None):
  sym = next(s for s in deletion.symbols(TRIVIAL_SOURCE)
             if s.qualname == qualname and start in (None, s.start))
  return sym, deletion.trivial_bodies(TRIVIAL_SOURCE, sym)


def test_trivial_bodies_echo_inputs_and_yield_nothing_from_generators():
  constants = list(deletion.TRIVIAL)
  assert _trivial('Pair.__eq__')[1] == constants + ['return self', 'return other']
  assert _trivial('Pair.make')[1] == constants + ['return a', 'return b']  # A staticmethod.
  setter = max(s.start for s in deletion.symbols(TRIVIAL_SOURCE) if s.qualname == 'Pair.first')
  assert _trivial('Pair.first', setter)[1] == constants + ['return self', 'return value']
  assert _trivial('chunks')[1] == _trivial('stream')[1] == ['if False: yield']
  # A yield inside a nested function or lambda does not make the outer one a generator.
  assert _trivial('collect')[1] == constants + ['return items']
  # The constants the function returns itself: tests may check only the branches that do.
  assert _trivial('noargs')[1] == constants + ['return 1']
  assert _trivial('speed')[1] == constants + ['return mode', "return 'quick'"]
  # ...and the names it returns that are not its own: a module constant, a builtin one.
  assert _trivial('level')[1] == constants + [
      'return name', 'return fallback', 'return NotImplemented', 'return DEFAULT']


def test_every_trivial_body_replaces_the_body_and_behaves_as_written():
  for sym in deletion.symbols(TRIVIAL_SOURCE):
    for body in deletion.trivial_bodies(TRIVIAL_SOURCE, sym):
      new, replaced = deletion.replace_body(TRIVIAL_SOURCE, sym, body)
      assert ' ' * sym.body_indent + body + '\n' in new and replaced.strip()
      assert new.count('\n') == TRIVIAL_SOURCE.count('\n') - replaced.count('\n') + 1
      namespace = {}
      exec(compile(new, 'm.py', 'exec'), namespace)
      if sym.qualname == 'chunks':
        assert list(namespace['chunks']([1, 2, 3], 2)) == []
  new, _ = deletion.replace_body(TRIVIAL_SOURCE, _trivial('Pair.__eq__')[0], 'return True')
  namespace = {}
  exec(compile(new, 'm.py', 'exec'), namespace)
  assert namespace['Pair']() == object() and namespace['Pair'].__eq__.__doc__ == 'Equal parts.'
  with pytest.raises(ValueError, match='no body'):
    deletion.replace_body(SOURCE, next(s for s in deletion.symbols(SOURCE)
                                       if s.qualname == 'doc_only'), 'return 1')
