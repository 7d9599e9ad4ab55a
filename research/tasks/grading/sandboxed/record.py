"""Sealed asserts' run-time half (research/tasks/grading/seal.py), copied into test modules.

Standard library only: seal.py copies PIECES as source (`inspect.getsource`, `record` and its
helpers `record_*` renamed by that prefix, sandboxed.copied) into each sealed test module, where
they record what the test computed for the harness to compare. The runner finds `record`'s copy by
MARK, a constant of its code, and watches it and its helpers.
"""

MARK = 'an expectation the grader sealed'


def record(value, token):
  """Appends (token, JSON of `value` as exact builtins) to `record.seen`; returns True.

  The run-time half, copied into test modules (renamed): it uses nothing from this package, and
  takes its builtins from `builtins`. Builtins and their subclasses are read through the
  builtins' own methods (a subclass's overrides are not called), other numbers through their own
  (what they give is the value computed); anything else, or a value over the budget, encodes as
  OPAQUE.
  """
  from builtins import Exception, len
  import json
  mark = 'an expectation the grader sealed'  # MARK, a constant of this function's own code.
  try:
    text = json.dumps(record_encode(value, 0, [1 << 20], mark))  # Budget: nodes and characters.
  except Exception:  # pylint: disable=broad-except
    text = json.dumps(['?'])
  # Once per distinct value: a loop over one sealed assert stays small. Correct code's records of
  # one token are all equal to one literal; past a few distinct ones, one opaque record stands for
  # the rest.
  mine = [entry for entry in record.seen if entry[0] == token]
  if (token, text) not in mine:
    if len(mine) >= 8:
      text = json.dumps(['?'])
    if (token, text) not in mine:
      record.seen.append((token, text))
  return True


def record_spend(budget, n, depth, why):
  """Takes `n` from the budget; past it, or too deep, raises OverflowError."""
  from builtins import OverflowError
  budget[0] -= n
  if depth > 100 or budget[0] < 0:
    raise OverflowError(why)


def record_encode(v, depth, budget, why):
  """`v` as JSON-able lists: [tag, content], read through the builtins' own methods."""
  from builtins import (bool, bytearray, bytes, complex, dict, float, frozenset, int, issubclass,
                        len, list, next, set, sorted, str, tuple, type)
  import json
  record_spend(budget, 1, depth, why)
  if v is None:
    return ['N']
  kinds = ((bool, 'b'), (int, 'i'), (float, 'f'), (complex, 'c'), (str, 's'), (bytes, 'y'),
           (bytearray, 'Y'), (list, 'l'), (tuple, 't'), (set, 'e'), (frozenset, 'z'),
           (dict, 'd'))
  kind, tag = next(((k, t) for k, t in kinds if issubclass(type(v), k)), (None, '?'))
  if kind is None:
    return record_number(v, depth, budget, why)
  if kind is bool:
    return [tag, int.__bool__(v)]
  if kind is int:
    return [tag, int.__repr__(v)]
  if kind is float:
    return [tag, float.hex(v)]
  if kind is complex:
    return [tag, float.hex(complex.real.__get__(v)), float.hex(complex.imag.__get__(v))]
  if kind in (str, bytes, bytearray):
    text = str.__add__('', v) if kind is str else kind.hex(v)
    record_spend(budget, len(text), depth, why)
    return [tag, text]
  if kind is dict:
    items = [[record_encode(k, depth + 1, budget, why), record_encode(x, depth + 1, budget, why)]
             for k, x in dict.items(v)]
  else:
    items = [record_encode(x, depth + 1, budget, why) for x in kind.__iter__(v)]
  if kind in (dict, set, frozenset):  # In one order: equal values, equal records.
    items = sorted(items, key=json.dumps)
  return [tag, items]


def record_number(v, depth, budget, why):
  """Other numbers (numpy's scalars, Fraction) as the builtin value `==` with a literal compares;
  what their methods return is the value computed, as if returned."""
  from builtins import complex, float, getattr, int, isinstance
  import numbers
  import operator
  if isinstance(v, numbers.Integral):
    return record_encode(operator.index(v), depth, budget, why)
  if isinstance(v, numbers.Rational):
    return ['q', int.__repr__(operator.index(v.numerator)),
            int.__repr__(operator.index(v.denominator))]
  if isinstance(v, numbers.Real):
    # numpy compares a half or single with a builtin at its own precision (NEP 50).
    size = getattr(v, 'itemsize', 8)
    return ['F', float.hex(float(v)), size] if size in (2, 4) else ['f', float.hex(float(v))]
  if isinstance(v, numbers.Complex):
    return record_encode(complex(v), depth, budget, why)
  return ['?']


PIECES = (record, record_spend, record_encode, record_number)
