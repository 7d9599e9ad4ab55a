"""The code that runs beside the candidate's (research/tasks/grading/sandboxed) stands alone."""
import ast
import inspect
import sys

import pytest

from research.tasks.grading import sandboxed
from research.tasks.grading.sandboxed import calls, record, runner, value_check

# The runner drives pytest (and coverage, for the factory's coverage run), calls.py pytest (the
# factory's trace) and record.py (copied beside it); nothing else may be imported beside the
# candidate's code, where a module under test could stand in for it.
ALLOWED = {runner: {'pytest', '_pytest', 'coverage'}, record: set(), value_check: set(),
           calls: {'pytest', 'record'}}


@pytest.mark.parametrize('module', list(ALLOWED), ids=lambda m: m.__name__.rsplit('.', 1)[1])
def test_imports_only_the_standard_library(module):
  tree = ast.parse(inspect.getsource(module))
  names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
  assert all(not isinstance(n, ast.ImportFrom) or n.level == 0 for n in ast.walk(tree))
  outside = {n for n in names if n.split('.')[0] not in sys.stdlib_module_names | ALLOWED[module]}
  assert not outside, f'{module.__name__} imports {outside}'


@pytest.mark.parametrize('module', [record, value_check], ids=['record', 'value_check'])
def test_pieces_are_the_whole_module_and_run_alone(module):
  """Every function of the module is copied; the copy needs nothing from the module's globals,
  not even builtins (a module under test could shadow those in the test module)."""
  defined = {n.name for n in ast.parse(inspect.getsource(module)).body if isinstance(n, ast.FunctionDef)}
  assert defined == {p.__name__ for p in module.PIECES}
  assert module.MARK in module.PIECES[0].__code__.co_consts  # How the runner finds the copy.
  shadows = {name: (lambda *a, **k: True) for name in ('isinstance', 'type', 'len', 'bool',
                                                        'issubclass', 'list', 'int', 'str')}
  namespace = {'__builtins__': __builtins__, **shadows}
  exec(sandboxed.copied(module.PIECES, '_fresh'), namespace)  # pylint: disable=exec-used
  main = namespace['_fresh']
  assert {k for k in namespace if k.startswith('_fresh')} == {
      p.__name__.replace(module.PIECES[0].__name__, '_fresh') for p in module.PIECES}
  if module is record:
    main.seen = []
    assert main([1, 'a', {2: 3.5}], 'tok') is True
    record.record.seen = []
    record.record([1, 'a', {2: 3.5}], 'tok')
    assert main.seen == record.record.seen and main.seen[0][0] == 'tok'
  else:
    assert main([1, 2], [1, 2], 3, False, True) is True and main('ab', 'ac', 3, False, True) is False


def test_helpers_must_share_the_prefix():
  with pytest.raises(ValueError, match='must be named record_'):
    sandboxed.copied((record.record, value_check.changed_equal_copy), 'x')
