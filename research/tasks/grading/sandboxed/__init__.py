"""Code that runs beside the candidate's: the trust boundary of grading.

Everything else in research/tasks/grading runs in the harness, outside the sandbox. These modules
run inside it, in the process that also runs the candidate's code: `runner.py` (the pytest
driver and its integrity checks, copied next to the tree) and the run-time halves that grading
copies as source into test modules, `value_check.py` (mutant and checked comparisons) and
`record.py` (sealed asserts). They import only the standard library (the runner also pytest and
coverage), so a module under test cannot stand in for what they use; tests/tasks/test_sandboxed.py
checks that.
"""
import inspect
import re
from typing import Callable


def copied(pieces: tuple[Callable, ...], name: str) -> str:
  """The source of `pieces` (the first a run-time half, the rest its helpers `<first>_*`) as one
  block for a test module, the first renamed `name` and each helper `<name>_*`."""
  prefix = pieces[0].__name__
  if any(not p.__name__.startswith(prefix + '_') for p in pieces[1:]):
    raise ValueError(f'helpers of {prefix} must be named {prefix}_*: {[p.__name__ for p in pieces]}')
  return re.sub(rf'\b{prefix}', name, '\n\n'.join(_source(p) for p in pieces))


_SOURCES: dict[Callable, str] = {}


def _source(piece: Callable) -> str:
  if piece not in _SOURCES:
    _SOURCES[piece] = inspect.getsource(piece)
  return _SOURCES[piece]
