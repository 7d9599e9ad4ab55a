"""Sealed expectations: the literal a required test expects is compared outside the test process.

An in-process forger can read everything in the process, the graded test files included: it
finds the assert that called it and returns the literal that assert expects. Twins catch it only
if it cannot tell twins from originals, and it can guess well (a twin's string has a stray letter;
its structure pairs it with the test it copies). So at grading each verified comparison of a
required test with a literal, and the same assert in every twin copy of that test, becomes
`assert <name>(<computed>, '<token>')`: the run-time half (sandboxed/record.py) writes an
exact-builtin encoding of the computed value under a fresh token to the report pipe at the assert
and returns True, and the harness, which alone knows which literal each token stands for, fails a
test whose records do not all equal their literals or whose sealed asserts recorded nothing. The
literal is nowhere in the sandbox, so no reading, guessing between pairs or patching helps: a
forger must compute the value.

Sealable (_form): a comparison of a computed value with a literal under any operator (`assert a
== <literal>`, either side, `!=`, `<`, `in <literal>`, `is None/True/False`, `is not None`,
`self.assertEqual(a, <literal>)`, `assertIsNone`, `assertNotIn(a, <literal>)`, ... as
`self.assertTrue(...)`), the literal written there, folded from pure builtins (`sorted([3, 1])`)
or bound once to a local (a local that only sealed asserts read is bound to None instead); the
truth of any other assert but `a == b`/`a != b` of two computed sides (a polarity seal: `assert
x`, `assert not x`, `1 in cache`, `assertFalse(x)` record the value whose truth decides, and only
the harness knows whether it is to hold); and `assert a == <argument>` (either side, or str
methods of it with literal arguments: `plural.capitalize()`) where a parametrize argument's every
use in the test is such an assert. Then each case's value of it is replaced by a token, and the
assert records under its own token joined to the case's. Every test parametrized over the same list gets a list of its own, its
cases named by ids of no meaning (the harness maps them back) and, but in the first, shuffled
(lists of one constant do not line up), the arguments it does not read set to None, and the
module constant goes: no list pairs an input with its answer (where another list of the constant
would, the factory keeps no seal of that argument: _unpaired). A sealed assert loses its message
and its computed side is unparsed; a sealed module loses its comments and the docstrings of the
module, the sealed tests and their classes: any may quote the literal. The factory seals every
such assert of the required tests in its twin-verification run, except in `with` blocks and `try`
bodies, and keeps per test those that recorded and met their expectation (`Task.sealed`,
'<node id>@<ordinal>', the ordinal counting the test function's asserts and unittest assertions
in source order).

The equality is builtin equality on the exact-builtin copy (builtins and their subclasses copied
as the builtin, through the builtins' own methods, as value_twin.py copies): what `==` says in the
test for every value whose type is a builtin. Other numbers (`numbers.Integral`, `Rational`, `Real`,
`Complex`: numpy's scalars, `Fraction`) are copied as the int, exact ratio, float or complex their
own methods give, which is what `==` with a literal compares. A correct solution that returns
another type still fails there (`numpy.bool_` for a bool, a 0-d array, `Decimal`).
"""
import ast
import collections
import dataclasses
import fractions
import io
import json
import operator
from pathlib import Path
import random
import re
import secrets
import struct
import tokenize

from research.tasks import layout
from research.tasks.grading import sandboxed
from research.tasks.grading import testsource
from research.tasks.grading import twins
from research.tasks.grading.sandboxed import record
from research.tasks.grading.sandboxed import value_check

class _Opaque:
  """What a record decodes to when no exact builtin represented the value: equal to no literal."""

  def __repr__(self):
    return 'OPAQUE'


OPAQUE = _Opaque()


_NARROW = {2: 'e', 4: 'f'}  # numpy's half and single precision: their struct formats.


class _Narrow(float):
  """A half or single: equal to a builtin number as numpy compares them, the builtin rounded to
  its precision first."""

  def __new__(cls, value: float, fmt: str):
    self = super().__new__(cls, value)
    self.fmt = fmt
    return self

  def __eq__(self, other):
    if type(other) in (bool, int, float):  # pylint: disable=unidiomatic-typecheck
      try:
        other, = struct.unpack(self.fmt, struct.pack(self.fmt, other))
      except (OverflowError, struct.error):
        return False
    return float(self) == other

  def __ne__(self, other):
    return not self == other

  __hash__ = float.__hash__


def decode(text: str):
  """The value an encoding stands for; OPAQUE where none (ValueError on a malformed one)."""
  return _decode(json.loads(text))


def _decode(node):
  tag, *rest = node
  if tag == 'N':
    return None
  if tag == '?':
    return OPAQUE
  if tag == 'b':
    return bool(rest[0])
  if tag == 'i':
    return int(rest[0])
  if tag == 'f':
    return float.fromhex(rest[0])
  if tag == 'c':
    return complex(float.fromhex(rest[0]), float.fromhex(rest[1]))
  if tag == 'q':
    return fractions.Fraction(int(rest[0]), int(rest[1]))
  if tag == 'F':
    return _Narrow(float.fromhex(rest[0]), _NARROW[rest[1]])
  if tag == 's':
    if not isinstance(rest[0], str):
      raise ValueError('string expected')
    return rest[0]
  if tag in ('y', 'Y'):
    return (bytes if tag == 'y' else bytearray).fromhex(rest[0])
  if tag == 'd':
    return {_decode(k): _decode(v) for k, v in rest[0]}
  kind = {'l': list, 't': tuple, 'e': set, 'z': frozenset}.get(tag)
  if kind is None:
    raise ValueError(f'unknown tag {tag!r}')
  return kind(_decode(x) for x in rest[0])


class SealError(ValueError):
  """A sealed assert that is not where, or not what, the task record says."""


@dataclasses.dataclass(frozen=True)
class Expectation:
  """What the harness compares one token's records with: `<record> <op> <value>` is to hold (or,
  with `holds` False, not to)."""
  function: str  # Node id of the test function (no parametrize id).
  ordinal: int  # Among the function's asserts and unittest assertions (_points).
  value: object  # The literal (its value: a folded expression's too); None for 'truth'.
  # '==', '<', '<=', '>', '>=', 'in' (the record in the literal), 'is' (a singleton), or 'truth'
  # (the record's own truth value: a polarity seal).
  op: str = '=='
  # False for a negation (`!=`, `not in`, `is not`, `not x`, assertFalse, assertNotIn, ...): an
  # assert and its negated twin are sealed alike.
  holds: bool = True
  # For a sealed parametrize argument: the node id of the case whose value this is (as the task
  # names it, not the id grading gave it); None where the literal is in the assert.
  case: str | None = None

  def of(self, nodeid: str) -> bool:
    """Whether the assert is one of the test `nodeid`'s own (not a base class's, or a case's)."""
    return self.function == function_of(nodeid) and self.case in (None, nodeid)

  def met(self, text: str) -> bool:
    try:
      got = decode(text)
      if got is OPAQUE:  # No exact builtin: none of the singletons, and nothing more is known.
        return self.op == 'is' and not self.holds
      return bool(_APPLY[self.op](got, self.value)) is self.holds
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError,
            ZeroDivisionError):
      return False

  def unmet(self) -> str:
    """Why a record that does not meet it fails its test."""
    if self.op == '==' and self.holds:
      return 'unequal to its literal'
    return f'not met ({"" if self.holds else "not "}{self.op})'


# The operators a sealed assert may apply, as the harness applies them to a decoded record.
_APPLY = {'==': operator.eq, '<': operator.lt, '<=': operator.le, '>': operator.gt,
          '>=': operator.ge, 'in': lambda got, value: got in value, 'is': operator.is_,
          'truth': lambda got, _: bool(got)}


_OPS = {ast.Eq: '==', ast.NotEq: '!=', ast.Lt: '<', ast.LtE: '<=', ast.Gt: '>', ast.GtE: '>=',
        ast.In: 'in', ast.NotIn: 'not in', ast.Is: 'is', ast.IsNot: 'is not'}
_AST_OPS = {v: k for k, v in _OPS.items()}
_NEGATIVE = {'!=': '==', 'not in': 'in', 'is not': 'is'}  # Each the negation of its positive.
# `<literal> OP x` is `x _MIRRORED[OP] <literal>` (`in` has none: its container is computed).
_MIRRORED = {'==': '==', '<': '>', '<=': '>=', '>': '<', '>=': '<=', 'is': 'is'}


def function_of(nodeid: str) -> str:
  return nodeid.partition('[')[0]


def _points(func: ast.AST) -> list[ast.Assert | ast.Call]:
  """The test function's asserts and unittest assertions, in source order: the ordinals
  Task.sealed counts. Grading's value checks turn `self.assertEqual(a, b)` into a call of a
  lambda on `a, b` (twins.py); that call is the same point, and the assertion inside the lambda
  none."""
  inside = {id(n) for lam in ast.walk(func) if isinstance(lam, ast.Lambda)
            for n in ast.walk(lam.body)}
  nodes = [n for stmt in func.body for n in ast.walk(stmt)
           if isinstance(n, ast.Assert) or id(n) not in inside and (
               testsource.unittest_assert(n) or _checked_unittest(n))]
  return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _checked_unittest(node: ast.AST) -> bool:
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Lambda)
          and [a.arg for a in node.func.args.args] == ['first', 'second'])


@dataclasses.dataclass(frozen=True)
class _Form:
  """How one assert is sealed: the expression its run records, and what the harness wants of it."""
  recorded: ast.expr
  op: str  # Expectation.op.
  holds: bool  # Expectation.holds.
  value: object = None  # Expectation.value.
  literal: ast.expr | None = None  # The expected side as written (or the literal a local holds).
  name: ast.Name | None = None  # The local the literal was read through.


def _form(node: ast.AST, func: ast.AST, checks: frozenset[str] = frozenset()) -> _Form | None:
  """How an assert or unittest assertion of `func` is sealed; None where it is not.

  A comparison with a literal (either side, any operator; `in` with the literal as container)
  records its computed side, and the literal leaves the module. Any other assert records its
  truth (a polarity seal: `assert x`, `assert not x`, `a in b`, `a is b`, `a < b`, assertTrue,
  assertIsInstance, ...): what it computes stays, whether it is to hold leaves. Negations are the
  positive form expected not to hold, so that an assert and its negated twin look alike. Not
  sealed: an assert of a constant, and `a == b`/`a != b` of two computed sides (the test computes
  `b` in the process, so a record of the pair would hide nothing from a forger that computes it
  too; a parametrize argument may seal them, _columns; the value checks check them). `checks`:
  the names of grading's value checks in the module (twins.py made `a == b` a call of one,
  `self.assertEqual(a, b)` a lambda calling one).
  """
  if isinstance(node, ast.Assert):
    test, holds = node.test, True
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
      test, holds = test.operand, not holds
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id in checks
        and len(test.args) >= 2):
      return _compare_form(test.args[0], '==', test.args[1], holds, func)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
      return _compare_form(test.left, _OPS[type(test.ops[0])], test.comparators[0], holds, func)
    return None if isinstance(test, ast.Constant) else _Form(test, 'truth', holds)
  if not isinstance(node, ast.Call) or any(isinstance(a, ast.Starred) for a in node.args):
    return None
  args = node.args
  if _checked_unittest(node):
    return _compare_form(args[0], '==', args[1], True, func) if len(args) >= 2 else None
  if not testsource.unittest_assert(node):
    return None
  attr = node.func.attr
  holds = 'Not' not in attr and attr != 'assertFalse'
  positive = attr.replace('Not', '').replace('False', 'True')
  if len(args) >= 1 and positive == 'assertTrue':
    return _Form(args[0], 'truth', holds)
  if len(args) >= 1 and positive == 'assertIsNone':
    return _Form(args[0], 'is', holds, None)
  if len(args) < 2:
    return None
  if positive == 'assertIsInstance':
    return _Form(ast.Call(ast.Name('isinstance', ast.Load()), args[:2], []), 'truth', holds)
  op = {'assertEqual': '==', 'assertIs': 'is', 'assertIn': 'in'}[positive]
  return _compare_form(args[0], op, args[1], holds, func)


def _compare_form(left: ast.expr, op: str, right: ast.expr, holds: bool, func: ast.AST
                  ) -> _Form | None:
  if op in _NEGATIVE:
    op, holds = _NEGATIVE[op], not holds
  found = _literal_form(left, op, right, holds, func)
  if found is not None or op == '==' or all(_expected(s, func) for s in (left, right)):
    return found
  return _Form(ast.Compare(left, [_AST_OPS[op]()], [right]), 'truth', holds)


def _literal_form(left: ast.expr, op: str, right: ast.expr, holds: bool, func: ast.AST
                  ) -> _Form | None:
  """The form of `left <op> right` where exactly one side is a literal (or folds to a value, or is
  a local bound once to a literal); None where none is, or where the literal is `in`'s member or
  `is` compares with no singleton."""
  for computed, side, mirrored in ((left, right, False), (right, left, True)):
    found = _expected(side, func)
    if found is None or _plain(computed, func):
      continue
    if mirrored and op not in _MIRRORED:
      return None  # A literal member of a computed container: a polarity seal.
    value, literal, name = found
    if op == 'is' and not (isinstance(literal, ast.Constant)
                           and any(value is v for v in (None, True, False))):
      return None
    return _Form(computed, _MIRRORED[op] if mirrored else op, holds, value, literal, name)
  return None


def _plain(side: ast.expr, func: ast.AST) -> bool:
  """A literal as written, or a local bound once to one: never the computed side (a side that
  only folds may be: `len('abc') == 3` records `len('abc')`, as tasks made before folding do)."""
  return layout.is_literal(side) or (isinstance(side, ast.Name)
                                     and testsource.bound_once(func, side.id) is not None)


def _expected(side: ast.expr, func: ast.AST) -> tuple[object, ast.expr, ast.Name | None] | None:
  """(value, literal, the local read) of a side that is a literal, an expression of literals that
  folds (_fold), or a local bound once to a literal."""
  name = None
  if isinstance(side, ast.Name):
    bound = testsource.bound_once(func, side.id)
    if bound is None:
      return None
    side, name = bound, side
  value = _fold(side)
  return None if value is _UNFOLDED else (value, side, name)


_UNFOLDED = object()
# Builtins an expected side may call on folded values: pure, and bounded by _bounded.
_FOLDABLE = {f.__name__: f for f in (
    abs, bool, bytes, chr, dict, enumerate, float, frozenset, int, len, list, max, min, ord,
    range, reversed, round, set, sorted, str, sum, tuple, zip)}
# Methods of str and bytes likewise: none makes a value longer than its inputs.
_FOLDABLE_METHODS = frozenset({'capitalize', 'casefold', 'endswith', 'join', 'lower', 'lstrip',
                               'rsplit', 'rstrip', 'split', 'splitlines', 'startswith', 'strip',
                               'swapcase', 'title', 'upper'})
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert,
          ast.Not: operator.not_}
_FOLD_LIMIT = 10_000  # Items or characters of any value folding makes; digits of a number.
_EXACT = (type(None), bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset)


def _fold(node: ast.expr) -> object:
  """The value of an expected side built of literals, operators, subscripts and the builtins and
  str methods above (`sorted([3, 1])`, `list('EFG')`, `[0] * 3`, `', '.join(['a', 'b'])`), as
  exact builtins; _UNFOLDED for anything else. Evaluated here, by the harness: the test's own
  module may rebind a builtin, so the factory keeps such a seal only where the original's record
  met the folded value."""
  try:
    value = _evaluate(node)
  except Exception:  # pylint: disable=broad-except
    return _UNFOLDED
  return value if _exact(value) else _UNFOLDED


def _exact(value) -> bool:
  if type(value) in (list, tuple, set, frozenset):  # pylint: disable=unidiomatic-typecheck
    return all(map(_exact, value))
  if type(value) is dict:  # pylint: disable=unidiomatic-typecheck
    return all(map(_exact, value)) and all(map(_exact, value.values()))
  return type(value) in _EXACT


def _evaluate(node: ast.expr):
  if layout.is_literal(node):
    return _bounded(ast.literal_eval(node))
  if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
    items = [_evaluate(e) for e in node.elts]
    return _bounded({ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items))
  if isinstance(node, ast.Dict) and None not in node.keys:
    return _bounded({_evaluate(k): _evaluate(v) for k, v in zip(node.keys, node.values)})
  if isinstance(node, ast.UnaryOp):
    return _bounded(_UNARY[type(node.op)](_evaluate(node.operand)))
  if isinstance(node, ast.BinOp):
    a, b = _evaluate(node.left), _evaluate(node.right)
    if isinstance(node.op, ast.Mod) and isinstance(a, (str, bytes)):
      raise ValueError('%-formatting: its width is unbounded')
    if isinstance(node.op, ast.Mult):
      for seq, n in ((a, b), (b, a)):
        if hasattr(seq, '__len__') and isinstance(n, int) and len(seq) * n > _FOLD_LIMIT:
          raise OverflowError('repeated past the limit')
    if isinstance(node.op, ast.Pow) and isinstance(b, int) and abs(b) > 1 and (
        abs(b) * max(1, int(abs(a)).bit_length()) > 4 * _FOLD_LIMIT):
      raise OverflowError('a power past the limit')
    return _bounded(_BINARY[type(node.op)](a, b))
  if isinstance(node, ast.Subscript):
    index = node.slice
    key = (slice(*(None if p is None else _evaluate(p)
                   for p in (index.lower, index.upper, index.step)))
           if isinstance(index, ast.Slice) else _evaluate(index))
    return _bounded(_evaluate(node.value)[key])
  if isinstance(node, ast.Call) and not any(
      isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords):
    args = [_evaluate(a) for a in node.args]
    kwargs = {k.arg: _evaluate(k.value) for k in node.keywords}
    if isinstance(node.func, ast.Name) and node.func.id in _FOLDABLE:
      function = _FOLDABLE[node.func.id]
      if function is bytes and args and isinstance(args[0], int):
        _bounded(range(args[0]))  # bytes(n) makes n bytes.
      return _bounded(function(*args, **kwargs))
    if isinstance(node.func, ast.Attribute) and node.func.attr in _FOLDABLE_METHODS:
      receiver = _evaluate(node.func.value)
      if type(receiver) in (str, bytes):  # pylint: disable=unidiomatic-typecheck
        if node.func.attr == 'join' and len(receiver) * len(args[0]) + sum(
            len(part) for part in args[0]) > _FOLD_LIMIT:
          raise OverflowError('joined past the limit')  # Before the join makes it.
        return _bounded(getattr(receiver, node.func.attr)(*args, **kwargs))
  raise ValueError(f'not foldable: {type(node).__name__}')


def _bounded(value):
  """`value`, or OverflowError where it holds more than _FOLD_LIMIT items, characters or digits."""
  if isinstance(value, int) and value.bit_length() > 4 * _FOLD_LIMIT:
    raise OverflowError('a number past the limit')
  if hasattr(value, '__len__') and len(value) > _FOLD_LIMIT:
    raise OverflowError('a value past the limit')
  return value


# Methods of str an expected side may call on a parametrize argument, with literal arguments:
# the harness applies them to the case's literal (inflection compares with `plural.capitalize()`
# and `parameterized_string.replace('-', '__sep__')`).
_STR_METHODS = frozenset({'capitalize', 'casefold', 'lower', 'lstrip', 'replace', 'rstrip',
                          'strip', 'swapcase', 'title', 'upper'})


def _argument(node: ast.expr, params: list[str]) -> tuple[str, tuple] | None:
  """(parameter, the str methods called on it in order, each with its arguments) of a side that
  is a parametrize argument, or such methods called on one."""
  methods = []
  while (isinstance(node, ast.Call) and not node.keywords
         and isinstance(node.func, ast.Attribute) and node.func.attr in _STR_METHODS
         and all(isinstance(a, ast.Constant) and isinstance(a.value, (str, int))
                 for a in node.args)):
    methods.append((node.func.attr, tuple(a.value for a in node.args)))
    node = node.func.value
  if isinstance(node, ast.Name) and node.id in params:
    return node.id, tuple(reversed(methods))
  return None


def _case_sides(node: ast.AST, params: list[str]
                ) -> tuple[ast.expr, ast.expr, str, tuple] | None:
  """(computed side, expected side, its parameter, methods) of `assert a == <argument>`."""
  if not (isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
          and len(node.test.ops) == 1 and isinstance(node.test.ops[0], ast.Eq)):
    return None
  pair = (node.test.left, node.test.comparators[0])
  for computed, expected in (pair, pair[::-1]):
    found = _argument(expected, params)
    if found and _argument(computed, params) is None and not layout.is_literal(computed):
      return computed, expected, *found
  return None


def _columns(func: ast.AST, params: list[str], ordinals: list[int]) -> dict[str, list[int]]:
  """The parameters whose every use in `func` is the expected side of one of the `ordinals`'
  asserts (their values can then leave the module), with those ordinals."""
  points = _points(func)
  by_param, inside = {}, set()
  for k in ordinals:
    sides = _case_sides(points[k], params) if k < len(points) else None
    if sides:
      by_param.setdefault(sides[2], []).append(k)
      inside |= {id(n) for n in ast.walk(sides[1])}
  uses = collections.defaultdict(list)
  for n in ast.walk(func):
    if isinstance(n, ast.Name):
      uses[n.id].append(n)
  return {p: ks for p, ks in by_param.items() if all(id(n) in inside for n in uses[p])}


def _expected_value(literal: ast.expr, methods: tuple):
  value = ast.literal_eval(literal)
  for m, args in methods:
    if type(value) is not str:  # pylint: disable=unidiomatic-typecheck
      raise SealError(f'{m}() of a case value that is no str: {value!r}')
    try:
      value = getattr(str, m)(value, *args)
    except (TypeError, ValueError) as e:
      raise SealError(f'{m}{args!r} of {value!r}: {e}') from e
  return value


@dataclasses.dataclass(frozen=True)
class _Table:
  """A parametrized test function whose case list sealing may rewrite."""
  key: str  # Node id of the function.
  test: testsource.Located
  cases: testsource.Cases
  ids: list[str]  # pytest's id of each case.


def _tables(module: ast.Module, rel: str) -> dict[str, _Table]:
  """The module's test functions with one parametrize list of literal cases and unique ids."""
  out = {}
  owners = [(module, f'{rel}::')] + [(c, f'{rel}::{c.name}::') for c in module.body
                                       if isinstance(c, ast.ClassDef)]
  for owner, prefix in owners:
    for f in owner.body:
      if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      test = testsource.Located(f, module, owner, prefix, None)
      try:
        cases = testsource.parametrize(test)
        ids = cases.ids() if cases else []
      except (testsource.Unplantable, ValueError):
        continue
      if cases and len(set(ids)) == len(ids):
        out[prefix + f.name] = _Table(prefix + f.name, test, cases, ids)
  return out


def _sharing(tables: dict[str, _Table], table: _Table) -> list[_Table] | None:
  """The tables that must be rewritten with `table`: itself, or every test parametrized over the
  same module constant (which then goes); None when some reader of it is not such a table."""
  container = table.cases.container
  if not table.cases.shared and not any(
      isinstance(a, ast.Assign) and a.value is container for a in table.test.module.body):
    return [table]
  readers = [t for t in tables.values() if t.cases.container is container]
  constant = next(a.targets[0].id for a in table.test.module.body
                  if isinstance(a, ast.Assign) and a.value is container)
  loads = [n for n in ast.walk(table.test.module) if isinstance(n, ast.Name)
           and n.id == constant and isinstance(n.ctx, ast.Load)]
  return readers if len(loads) == len(readers) else None


def _case_ordinals(tables: dict[str, _Table], key: str, ordinals: list[int]) -> list[int]:
  """Of a parametrized function's unguarded asserts, those sealable through its arguments."""
  table = tables.get(key)
  if table is None or _sharing(tables, table) is None:
    return []
  func, cases = table.test.func, table.cases
  points = _points(func)
  sealable = []
  for p, ks in _columns(func, cases.argnames, ordinals).items():
    column = [vals[cases.argnames.index(p)] for vals in cases.values]
    try:
      for k in ks:
        methods = _case_sides(points[k], cases.argnames)[3]
        for literal in column:
          _expected_value(literal, methods)
    except SealError:
      continue
    sealable += ks
  return sorted(sealable)


def candidates(tree: Path, tests: list[str], cases: bool = True) -> dict[str, list[int]]:
  """The sealable asserts of each required test's function (pristine tree), by ordinal (_form);
  with `cases`, also those that compare with a parametrize argument (_columns)."""
  out, modules, tables = {}, {}, {}
  for nodeid in tests:
    key = function_of(nodeid)
    if key in out:
      continue
    rel = key.split('::', 1)[0]
    if rel not in modules:
      try:
        modules[rel] = layout.parse_source((tree / rel).read_text())
      except (SyntaxError, OSError, UnicodeDecodeError):
        modules[rel] = None
    if modules[rel] is None:
      continue
    try:
      func = testsource.locate(modules[rel], key).func
    except testsource.Unplantable:
      continue
    guarded = _guarded(func)
    points = _points(func)
    free = [i for i, node in enumerate(points) if id(node) not in guarded]
    ordinals = [i for i in free if _form(points[i], func)]
    if cases:
      if rel not in tables:
        tables[rel] = _tables(modules[rel], rel)
      ordinals += _case_ordinals(tables[rel], key, [i for i in free if i not in ordinals])
    if ordinals:
      out[key] = sorted(ordinals)
  return out


def _guarded(func: ast.AST) -> set[int]:
  """Nodes where an exception may be what the test wants: inside `with` blocks (`pytest.raises`,
  `self.assertRaises`, ...) and `try` bodies. A sealed assert neither compares nor fails in the
  process, so a comparison that raises there (of self-referencing values), or an assert meant to
  fail, would change the test."""
  blocks = (ast.With, ast.AsyncWith, ast.Try, getattr(ast, 'TryStar', ast.Try))
  return {id(n) for block in ast.walk(func) if isinstance(block, blocks)
          for stmt in block.body for n in ast.walk(stmt)}


@dataclasses.dataclass
class Sealing:
  """The seals of one run: what each token stands for, and the twins sealed where they differ."""
  expect: dict[str, Expectation] = dataclasses.field(default_factory=dict)
  # Twins whose changed assert is sealed: they fail in the harness, not in pytest.
  sealed_twins: set[str] = dataclasses.field(default_factory=set)
  # Node ids grading gave the cases of rewritten parametrize lists -> the ids the task knows.
  names: dict[str, str] = dataclasses.field(default_factory=dict)
  # Per parametrized test function, the ordinals sealed through each argument.
  arguments: dict[str, dict[str, list[int]]] = dataclasses.field(default_factory=dict)
  # Per rewritten list: (the list it was made from, by its module and constant or function; the
  # arguments whose values it keeps, sealed or not).
  lists: dict[str, tuple[str, frozenset[str]]] = dataclasses.field(default_factory=dict)

  def restore(self, by_test: dict[str, object]) -> dict[str, object]:
    """`by_test` (outcomes, records, ...) keyed by the node ids the task knows."""
    return {self.names.get(n, n): v for n, v in by_test.items()}

  def run_ids(self, nodeids) -> list[str]:
    """The node ids the task knows as a run names them (restore's inverse)."""
    ids = {task: run for run, task in self.names.items()}
    return [ids.get(n, n) for n in nodeids]


def seal_asserts(tree: Path, functions: dict[str, list[int]], planted: list[twins.Twin],
                 rng: random.Random) -> Sealing:
  """Seals the asserts `functions` names (function node id -> ordinals) in the test files
  under `tree`, and the same asserts of each function twin in `planted` of such a function
  (twins.plant_twins wrote them first). Where a twin changed one of those asserts, it is sealed
  with the twin's literal."""
  copies = {}  # Function node id -> (source function, twin) for function twins.
  for t in planted:
    source = function_of(t.site.test)
    if source in functions and function_of(t.nodeid) != source:
      copies[function_of(t.nodeid)] = (source, t)
  by_file = {}
  for key in list(functions) + list(copies):
    by_file.setdefault(key.split('::', 1)[0], []).append(key)
  sealing = Sealing()
  for rel, keys in sorted(by_file.items()):
    _seal_file(tree, rel, {k: copies.get(k, (k, None)) for k in keys}, functions, planted,
               sealing, rng)
  return sealing


def _seal_file(tree: Path, rel: str, keys: dict[str, tuple[str, twins.Twin | None]],
               functions: dict[str, list[int]], planted: list[twins.Twin], sealing: Sealing,
               rng: random.Random) -> None:
  """Seals one test file's functions `keys` (node id -> (the function whose asserts it seals,
  its twin or None)) in place, with the record function inserted under a fresh name."""
  path = tree / rel
  text = path.read_text()
  mod = testsource.Module.parse(text)
  name = testsource.fresh_name(rng.choice(mod.vocab or ['value']), mod.vocab, mod.taken, rng,
                               prefix='_')
  edits = []
  documented = [mod.tree]  # Whose docstrings go: the module, each sealed test and its class.
  tables = _tables(mod.tree, rel)
  checks = frozenset(f.name for f in mod.tree.body if isinstance(f, ast.FunctionDef) and any(
      isinstance(n, ast.Constant) and n.value == value_check.MARK for n in ast.walk(f)))
  columns_sealed = {}  # Function -> argument -> (ordinal, token, str methods) of its asserts.
  for key, (source, twin) in keys.items():
    located = testsource.locate(mod.tree, key)
    documented += [located.func, located.owner]
    edits += _seal_function(mod, key, located.func, source, twin, functions[source], name,
                            checks, tables, sealing, columns_sealed)
  rewritten = _rewritten(tables, columns_sealed)
  for i, table in enumerate(rewritten):
    # The first list of a constant keeps the order its tests may rely on; the others are
    # shuffled, so that no two line up.
    shuffle = any(t.cases.container is table.cases.container for t in rewritten[:i])
    edits += _rewrite(mod, table, columns_sealed.get(table.key, {}), planted, sealing, rng,
                      shuffle)
    documented += [table.test.func, table.test.owner]
  # A constant whose every reader now has its own list goes: it pairs what the lists do not.
  lists = {id(t.cases.container) for t in rewritten}
  edits += [(*mod.src.span(a.value), 'None') for a in mod.tree.body
            if isinstance(a, ast.Assign) and id(a.value) in lists]
  edits += [c for c in _commentary(mod, documented)  # Not those in an assert replaced whole.
            if not any(a <= c[0] < b for a, b, _ in edits)]
  stmt = rng.choice([s for s in mod.tree.body if isinstance(
      s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))])
  at = mod.src.starts[min([d.lineno for d in stmt.decorator_list] + [stmt.lineno]) - 1]
  edits.append((at, at, f'{sandboxed.copied(record.PIECES, name)}\n\n\n'))
  sealed = testsource.apply(text, edits)
  try:
    layout.parse_source(sealed)
  except SyntaxError as e:
    raise SealError(f'sealing broke the syntax of {rel}: {e}') from e
  path.write_text(sealed)


def _seal_function(mod: testsource.Module, key: str, func: ast.AST, source: str,
                   twin: twins.Twin | None, ordinals: list[int], name: str,
                   checks: frozenset[str], tables: dict[str, _Table], sealing: Sealing,
                   columns_sealed: dict) -> list[testsource.Edit]:
  """The edits sealing asserts `ordinals` of one test function (or of a twin of `source`):
  each through a call of `name` with a fresh token; those that compare with a parametrize
  argument through the argument (recorded in `columns_sealed`)."""
  points = _points(func)
  originals = points if twin is None else _points(testsource.locate(mod.tree, source).func)
  edits = []
  names = []  # The names sealed asserts read their literal through.
  replaced = []  # (sealed assert, its computed side, which the seal keeps).
  by_argument = []  # Ordinals that compare with a parametrize argument.
  for ordinal in ordinals:
    if ordinal >= len(points):
      raise SealError(f'{key} has no assert {ordinal}')
    node = points[ordinal]
    form = _form(node, func, checks)
    if form is None and twin is None and key in tables:
      by_argument.append(ordinal)
      continue
    if form is None and twin is not None:
      continue  # The twin's change left no sealable form (a literal that no longer folds).
    if form is None:
      raise SealError(f'assert {ordinal} of {key} is no sealable comparison: '
                      f'{mod.src.segment(node)[:80]}')
    token = secrets.token_hex(6)
    sealing.expect[token] = Expectation(key, ordinal, form.value, form.op, form.holds)
    # Unparsed: a comment inside the side may quote the literal. Without its message, which may
    # quote the literal. From `assert`: the test may open a parenthesis.
    call = f'{name}({ast.unparse(form.recorded)}, {token!r})'
    edits.append((*mod.src.span(node),
                  f'assert {call}' if isinstance(node, ast.Assert) else f'self.assertTrue({call})'))
    if form.name is not None:
      names.append((form.name, form.literal))
    replaced.append((node, form.recorded))
    if (twin is not None and twin.kind != 'value'
        and ast.dump(node) != ast.dump(originals[ordinal])):
      # The twin's change is in this assert: it fails in the harness, not in pytest.
      sealing.sealed_twins.add(twin.nodeid)
  edits += _unbound(mod, func, names, replaced)
  if by_argument:
    edits += _seal_columns(mod, key, func, points, by_argument, name, tables, sealing,
                           columns_sealed)
  return edits


def _seal_columns(mod: testsource.Module, key: str, func: ast.AST, points: list, by_argument: list[int],
                  name: str, tables: dict[str, _Table], sealing: Sealing,
                  columns_sealed: dict) -> list[testsource.Edit]:
  """Seals the asserts `by_argument` of a parametrized test through their parametrize argument."""
  columns = _columns(func, tables[key].cases.argnames, by_argument)
  if sorted(k for ks in columns.values() for k in ks) != sorted(by_argument):
    raise SealError(f'{key}: asserts {by_argument} are no sealable comparisons')
  sealing.arguments[key] = columns
  edits = []
  for ordinal in by_argument:
    computed, _, param, methods = _case_sides(points[ordinal], tables[key].cases.argnames)
    token = secrets.token_hex(6)
    columns_sealed.setdefault(key, {}).setdefault(param, []).append((ordinal, token, methods))
    edits.append((*mod.src.span(points[ordinal]),
                  f'assert {name}({ast.unparse(computed)}, {token!r} + {param})'))
  return edits


def _rewritten(tables: dict[str, _Table], sealed: dict[str, dict]) -> list[_Table]:
  """The case lists to rewrite: those of functions with asserts sealed through an argument, and
  of every other test that reads the same module constant."""
  out = {}
  for key in sealed:
    readers = _sharing(tables, tables[key])
    if readers is None:
      raise SealError(f'{key}: its cases are in a constant that not only parametrize lists read')
    out.update((t.key, t) for t in readers)
  return list(out.values())


def _fixture_arguments(module: ast.Module) -> set[str]:
  """Names the module's fixtures take: a parametrize argument may feed one."""
  def fixture(d):
    d = d.func if isinstance(d, ast.Call) else d
    return getattr(d, 'attr', getattr(d, 'id', None)) == 'fixture'
  return {a.arg for f in ast.walk(module) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
          and any(map(fixture, f.decorator_list)) for a in f.args.args + f.args.kwonlyargs}


def _rewrite(mod: testsource.Module, table: _Table, sealed: dict[str, list[tuple[int, str, tuple]]],
             planted: list[twins.Twin], sealing: Sealing, rng: random.Random, shuffle: bool
             ) -> list[testsource.Edit]:
  """The test's parametrize list, written into its decorator: each case under an id of no
  meaning (pytest's ids are made from the values), with `shuffle` in a random order, the values
  of the `sealed` arguments replaced by tokens, of arguments the test does not read by None. The
  expectations of the sealed asserts, one per case, go to `sealing`."""
  func, cases = table.test.func, table.cases
  read = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
  taken = {a.arg for a in func.args.args + func.args.kwonlyargs} - _fixture_arguments(mod.tree)
  unread = {p for p in cases.argnames if p in taken and p not in read}
  twin_of = {t.nodeid: t for t in planted if t.kind == 'case'}
  rows = []
  for vals, case_id in zip(cases.values, table.ids):
    nodeid, tokens = f'{table.key}[{case_id}]', {p: secrets.token_hex(6) for p in sealed}
    parts = [repr(tokens[p]) if p in sealed else 'None' if p in unread else mod.src.segment(v)
             for p, v in zip(cases.argnames, vals)]
    for p, asserts in sealed.items():
      literal = vals[cases.argnames.index(p)]
      for ordinal, token, methods in asserts:
        sealing.expect[token + tokens[p]] = Expectation(
            table.key, ordinal, _expected_value(literal, methods), case=nodeid)
    twin = twin_of.get(nodeid)
    changed = twin and _case_sides(testsource.mutation_points(func)[twin.site.point], cases.argnames)
    if changed and changed[2] in sealed:
      sealing.sealed_twins.add(nodeid)  # Its changed value is sealed: it fails in the harness.
    opaque = secrets.token_hex(6)
    sealing.names[f'{table.key}[{opaque}]'] = nodeid
    rows.append((parts[0] if cases.single else f'({", ".join(parts)}{"," * (len(parts) == 1)})',
                 opaque))
  if shuffle:
    rng.shuffle(rows)
  constant = next((f'{table.key.split("::", 1)[0]}::{a.targets[0].id}' for a in mod.tree.body
                   if isinstance(a, ast.Assign) and a.value is cases.container), table.key)
  sealing.lists[table.key] = (constant, frozenset(cases.argnames) - unread)
  mark = next(m for m in testsource.marks(func) if len(m.args) == 2)
  line = mod.src.lines[mark.lineno - 1]
  indent = line[:len(line) - len(line.lstrip())]
  text = (f'{mod.src.segment(mark.func)}({mod.src.segment(mark.args[0])}, [\n'
          + ''.join(f'{indent}    {row},\n' for row, _ in rows)
          + f'{indent}], ids={[opaque for _, opaque in rows]!r})')
  return [(*mod.src.span(mark), text)]


def _unbound(mod: testsource.Module, func: ast.AST, names: list[tuple[ast.Name, ast.expr]],
             replaced: list[tuple[ast.AST, ast.expr]]) -> list[testsource.Edit]:
  """A local bound to a literal that nothing reads once the sealed asserts are replaced (their
  messages and literal sides go; their computed sides stay) is bound to None instead: the
  literal leaves the module with them."""
  gone = {id(n) for node, _ in replaced for n in ast.walk(node)}
  kept = {id(n) for _, computed in replaced for n in ast.walk(computed)}
  edits = []
  for name in {n.id for n, _ in names}:
    read = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name
            and isinstance(n.ctx, ast.Load) and (id(n) not in gone or id(n) in kept)]
    if not read:
      literal = next(lit for n, lit in names if n.id == name)
      edits.append((*mod.src.span(literal), 'None'))
  return edits


# Comments the module needs: an encoding declaration, a shebang.
_KEPT_COMMENT = re.compile(r'#!|#.*coding[:=]')


def _commentary(mod: testsource.Module, documented: list[ast.AST]) -> list[testsource.Edit]:
  """Every comment of a sealed module, and the docstrings of `documented` (the module, the sealed
  tests and their classes), removed: any may quote what a sealed assert expects (next to it,
  above its test, at the end of the file). Other docstrings stay: tests read those of the
  functions they define (toolz checks what `excepts` makes of them)."""
  edits = []
  for node in {id(n): n for n in documented}.values():
    first = node.body[0] if node.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)):
      edits.append((*mod.src.span(first.value), "''"))
  try:
    for tok in tokenize.generate_tokens(io.StringIO(mod.src.text).readline):
      if tok.type == tokenize.COMMENT and not (
          tok.start[0] <= 2 and _KEPT_COMMENT.match(tok.string)):
        at = mod.src.starts[tok.start[0] - 1] + tok.start[1]
        edits.append((at, at + len(tok.string), ''))
  except (tokenize.TokenError, SyntaxError):
    pass  # The module parsed: tokenize does not fail on it.
  return edits


def verified(records: dict[str, list[list[str]]], sealing: Sealing,
             tests: list[str]) -> list[str]:
  """The factory's run of the original: '<node id>@<ordinal>' of each test's sealed asserts
  (of its own function) that recorded, where no record of that assert, in any test, was
  unequal. Twins (copies of other functions, extra cases) are to be unequal, and are not
  counted: only the expectations of the required tests' functions and cases are."""
  required = set(tests)
  functions_of = {function_of(n) for n in tests}
  failed = {(e.function, e.ordinal) for recs in records.values()
            for e, text in ((sealing.expect[t], text) for t, text in _known(recs, sealing))
            if e.function in functions_of and (e.case is None or e.case in required)
            and not e.met(text)}
  seen = {(n, sealing.expect[t].ordinal) for n in tests
          for t, _ in _known(records.get(n, []), sealing)
          if sealing.expect[t].of(n)}
  kept = {(n, k) for n, k in seen if (function_of(n), k) not in failed}
  dropped = _unpaired(sealing, kept)
  return sorted(f'{n}@{k}' for n, k in kept if (function_of(n), k) not in dropped)


def _unpaired(sealing: Sealing, kept: set[tuple[str, int]]) -> set[tuple[str, int]]:
  """(function, ordinal) of the argument seals to drop: an argument's values leave the module
  only when all its asserts are sealed (_columns), and only when no list made from the same
  constant keeps them beside an argument the sealed test keeps (its input)."""
  whole = {f: set(ks) for f, ks in functions([f'{n}@{k}' for n, k in kept]).items()}
  sealed = {g: set() for g in sealing.lists}
  for f, args in sealing.arguments.items():
    sealed[f] = {p for p, ks in args.items() if set(ks) <= whole.get(f, set())}
  changed = True
  while changed:  # Each argument dropped is kept in its list: it may pair with another.
    changed = False
    for f, (source, keeps) in sealing.lists.items():
      plain_f = keeps - sealed[f]
      for g, (other, also) in sealing.lists.items():
        plain_g = also - sealed[g]
        if other == source and plain_g & plain_f and sealed[f] & plain_g:
          sealed[f] -= plain_g
          changed = True
  return {(f, k) for f, args in sealing.arguments.items() for p, ks in args.items()
          if p not in sealed[f] for k in ks}


def _known(records: list, sealing: Sealing) -> list[tuple[str, str]]:
  """The well-formed records of planted tokens (a test may run another function's sealed
  asserts: a test method a subclass inherits, a test that calls another)."""
  return [(r[0], r[1]) for r in records if isinstance(r, list) and len(r) == 2
          and all(isinstance(x, str) for x in r) and r[0] in sealing.expect]


def judge(records: dict[str, list[list[str]]], sealing: Sealing, required: list[str]
          ) -> tuple[dict[str, str], list[str]]:
  """(tests that fail in the harness, with why; tamper flags) from a grading's records.

  A test fails when a record it made, of any sealed assert, is unequal to that assert's literal,
  or (for the sealed asserts `required` names) when such an assert of its own recorded nothing.
  A record that is not a pair of strings, or whose token was never planted, is forged: no honest
  code writes records.
  """
  failed, flags = {}, []
  for nodeid, recs in records.items():
    for r in recs:
      if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)):
        flags.append(f'unreadable seal record in {nodeid}')
      elif r[0] not in sealing.expect:
        flags.append(f'seal record with a token never planted in {nodeid}')
    for token, text in _known(recs, sealing):
      exp = sealing.expect[token]
      if not exp.met(text):
        failed.setdefault(nodeid, f'sealed assert {exp.ordinal} {exp.unmet()}')
  recorded = {(n, sealing.expect[t].ordinal) for n, recs in records.items()
              for t, _ in _known(recs, sealing) if sealing.expect[t].of(n)}
  for nodeid, ordinal in map(_entry, required):
    if (nodeid, ordinal) not in recorded:
      failed.setdefault(nodeid, f'sealed assert {ordinal} recorded nothing')
  return failed, sorted(set(flags))


def _entry(entry: str) -> tuple[str, int]:
  """A Task.sealed entry, '<node id>@<ordinal>', as (node id, ordinal)."""
  nodeid, _, ordinal = entry.rpartition('@')
  return nodeid, int(ordinal)


def functions(entries: list[str]) -> dict[str, list[int]]:
  """Task.sealed's entries as ordinals by test function."""
  out = {}
  for nodeid, ordinal in map(_entry, entries):
    out.setdefault(function_of(nodeid), set()).add(ordinal)
  return {k: sorted(v) for k, v in out.items()}
