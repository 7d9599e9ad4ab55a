"""The code that runs beside the candidate's (research/tasks/grading/sandboxed) stands alone."""
import ast
import dis
import inspect
import json
import os
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


def test_value_checks_are_the_whole_module_and_run_alone():
  """Every function of the module is copied; the copy needs nothing from the module's globals,
  not even builtins (a module under test could shadow those in the test module)."""
  defined = {n.name for n in ast.parse(inspect.getsource(value_check)).body
             if isinstance(n, ast.FunctionDef)}
  assert defined == {p.__name__ for p in value_check.PIECES}
  assert value_check.MARK in value_check.PIECES[0].__code__.co_consts  # How the runner finds it.
  namespace = {'__builtins__': __builtins__, **_SHADOWS}
  exec(sandboxed.copied(value_check.PIECES, '_fresh'), namespace)  # pylint: disable=exec-used
  main = namespace['_fresh']
  assert {k for k in namespace if k.startswith('_fresh')} == {
      p.__name__.replace(value_check.PIECES[0].__name__, '_fresh') for p in value_check.PIECES}
  assert main([1, 2], [1, 2], 3, False, True) is True and main('ab', 'ac', 3, False, True) is False


_SHADOWS = {name: (lambda *a, **k: True) for name in ('isinstance', 'type', 'len', 'bool',
                                                      'issubclass', 'list', 'int', 'str', 'repr')}


def _global_loads(fn) -> set[str]:
  return {i.argval for i in dis.get_instructions(fn) if i.opname in ('LOAD_GLOBAL', 'LOAD_NAME')}


def test_the_record_function_and_its_writer_look_up_nothing_at_call_time(tmp_path):
  """A sealed assert's copy of `record` calls only its `put`, and `put`, `send` and `encode` take
  every name they use as a default bound when they were made: shadowing any global or builtin of
  the test module or of record.py after that changes nothing they write."""
  assert [p.__name__ for p in record.PIECES] == ['record']
  assert record.MARK in record.record.__code__.co_consts  # How the runner finds the copy.
  with open(tmp_path / 'report', 'w+b') as out:
    put = record.recorder(out.fileno(), os.write, frozenset({'test_module.py'}))
    send = put.__defaults__[0]
    assert send.__name__ == 'send' and _global_loads(send) == set()
    assert _global_loads(record.record) == set()
    assert _global_loads(put) == set() and _global_loads(record.encode) == set()
    assert _global_loads(record.dump) == set()
    namespace = {'__builtins__': __builtins__, **_SHADOWS}
    source = sandboxed.copied(record.PIECES, '_fresh') + '\n\ndef test(v):\n  return _fresh(v, "tok")\n'
    exec(compile(source, 'test_module.py', 'exec'), namespace)  # pylint: disable=exec-used
    namespace['_fresh'].__defaults__ = (put,)
    saved = {k: getattr(record, k) for k in ('json', 'numbers', 'operator', 'os', 'sys', '_signal',
                                             'BUDGET', 'MARK')}
    try:
      for k in saved:
        setattr(record, k, None)
      assert namespace['test']([1, 'a', {2: 3.5}]) is True
    finally:
      for k, v in saved.items():
        setattr(record, k, v)
    out.seek(0)
    nonce, line = out.read().decode().splitlines()
  mark, token, encoding = line.removeprefix('S ').split(' ', 2)
  assert nonce.startswith('N ') and mark == nonce[2:] and len(mark) == 32 and token == 'tok'
  assert json.loads(record.text(encoding)) == record.encode([1, 'a', {2: 3.5}], 0, [100], '',
                                                            record.encode)


def test_helpers_must_share_the_prefix():
  with pytest.raises(ValueError, match='must be named record_'):
    sandboxed.copied((record.record, value_check.changed_equal_copy), 'x')


@pytest.mark.parametrize('value', [None, True, -2 ** 70, 1.5, float('inf'), 1 + 2j, 'é\n"\\\x00\ud800',
                                   b'\x00', bytearray(b'a'), [1, [2]], (1,), {3, 1}, frozenset(),
                                   {'a': [1, 'b'], 2: None}])
def test_a_record_is_written_as_json_dumps_writes_its_encoding(value):
  encoding = record.encode(value, 0, [record.BUDGET], '', record.encode)
  assert record.dump(encoding, record.dump) == json.dumps(encoding)
  assert record.text(record.dump(encoding, record.dump)) == json.dumps(encoding)
