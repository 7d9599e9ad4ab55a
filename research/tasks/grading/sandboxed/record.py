"""Sealed asserts' run-time half (research/tasks/grading/seal.py): records leave the process at the
assert, written by the runner alone.

Standard library only. `record` (PIECES), copied as source into each sealed test module under a
fresh name (sandboxed.copied), is all a sealed assert calls: it hands the computed value and its
token to `put`, its default argument, which the runner binds when collection ends (it finds the
copy by MARK, a constant of its code). `put` is made by `recorder` in the runner before any code
under test runs: it encodes the value as exact builtins (`encode`) and has its writer `send`
write the record to the report pipe at once (JSON, `dump`) under a nonce only `send` holds, so
nothing kept in the process can be read back, rewritten or dropped later, and nothing code under
test writes to the pipe is a record.
Every name they use is bound as a default argument when they are made (nothing is looked up in a
module or in builtins at call time), and the runner's audit hook stops any change of their code or
defaults, and any read of the defaults of `put` and its writer (runner.py). `put` writes only what a
sealed assert's own code asks: the caller of `record` must run code of the sealed test file and
module `record` was copied into, code the runner lets run only through that module's import.
"""
import _signal
import json
import json.encoder
import numbers
import operator
import os
import sys

MARK = 'an expectation the grader sealed'
BUDGET = 1 << 20  # Nodes and characters of one encoding.


def record(value, token, put=None):
  """Records `value` under `token` through `put` (bound by the runner); returns True.

  The copy in a test module uses nothing but its arguments: a module under test could shadow any
  global or builtin of the test module.
  """
  mark = 'an expectation the grader sealed'  # MARK, a constant of this function's own code.
  del mark
  return put(value, token)


PIECES = (record,)


def encode(v, depth, budget, why, enc, _bool=bool, _bytearray=bytearray, _bytes=bytes,
           _complex=complex, _dict=dict, _float=float, _frozenset=frozenset, _int=int,
           _issubclass=issubclass, _isinstance=isinstance, _len=len, _list=list, _set=set,
           _sorted=sorted, _str=str, _tuple=tuple, _type=type, _repr=repr, _getattr=getattr,
           _overflow=OverflowError, _index=operator.index, _integral=numbers.Integral,
           _rational=numbers.Rational, _real=numbers.Real, _complex_abc=numbers.Complex):
  """`v` as JSON-able lists, [tag, content], read through the builtins' own methods (a builtin
  subclass's overrides are not called); other numbers (numpy's scalars, Fraction) as the builtin
  value `==` with a literal compares (what their own methods return is the value computed). `enc`
  is this function (recursion without a global); `budget` ([nodes and characters left]) and
  depth bound the work: past them, OverflowError(why)."""
  budget[0] -= 1
  if depth > 100 or budget[0] < 0:
    raise _overflow(why)
  if v is None:
    return ['N']
  kind = _type(v)
  if _issubclass(kind, _bool):
    return ['b', _int.__bool__(v)]
  if _issubclass(kind, _int):
    return ['i', _int.__repr__(v)]
  if _issubclass(kind, _float):
    return ['f', _float.hex(v)]
  if _issubclass(kind, _complex):
    return ['c', _float.hex(_complex.real.__get__(v)), _float.hex(_complex.imag.__get__(v))]
  for base, tag in ((_str, 's'), (_bytes, 'y'), (_bytearray, 'Y')):
    if _issubclass(kind, base):
      text = _str.__add__('', v) if base is _str else base.hex(v)
      budget[0] -= _len(text)
      if budget[0] < 0:
        raise _overflow(why)
      return [tag, text]
  if _issubclass(kind, _dict):
    return ['d', _sorted([[enc(k, depth + 1, budget, why, enc), enc(x, depth + 1, budget, why, enc)]
                          for k, x in _dict.items(v)], key=_repr)]
  for base, tag in ((_list, 'l'), (_tuple, 't'), (_set, 'e'), (_frozenset, 'z')):
    if _issubclass(kind, base):
      items = [enc(x, depth + 1, budget, why, enc) for x in base.__iter__(v)]
      # Sets in one order: equal values, equal records.
      return [tag, _sorted(items, key=_repr) if base in (_set, _frozenset) else items]
  if _isinstance(v, _integral):
    return enc(_index(v), depth, budget, why, enc)
  if _isinstance(v, _rational):
    return ['q', _int.__repr__(_index(v.numerator)), _int.__repr__(_index(v.denominator))]
  if _isinstance(v, _real):
    # numpy compares a half or single with a builtin at its own precision (NEP 50).
    size = _getattr(v, 'itemsize', 8)
    return ['F', _float.hex(_float(v)), size] if size in (2, 4) else ['f', _float.hex(_float(v))]
  if _isinstance(v, _complex_abc):
    return enc(_complex(v), depth, budget, why, enc)
  return ['?']


def dump(x, dump, _quote=json.encoder.encode_basestring_ascii, _type=type, _str=str, _bool=bool,
         _int=int, _join=', '.join):
  """An encoding (`encode`'s lists of str, int and bool) as the JSON text json.dumps gives; `dump`
  is this function."""
  kind = _type(x)
  if kind is _str:
    return _quote(x)
  if kind is _bool:
    return 'true' if x else 'false'
  if kind is _int:
    return _int.__repr__(x)
  return '[' + _join([dump(item, dump) for item in x]) + ']'


def recorder(fd, write, sealed, _urandom=os.urandom, _signals=_signal.valid_signals,
             _getsignal=_signal.getsignal):
  """The `put` that sealed asserts' `record` copies call. It writes `S <nonce> <token> <JSON of
  the encoding>` (`['?']` where encoding fails) as one line to `fd` with `write` (os.write, taken
  before any code under test ran), and returns True. The nonce, drawn here and announced first
  as `N <nonce>`, is held only by `send`'s defaults: the harness takes no record without it, so
  lines that code under test writes to the pipe itself are no records.

  It writes nothing where the caller of `record` runs code of another file or module than
  `record`'s, where `record` is not in one of the `sealed` files (the test files grading sealed,
  whose code the runner lets run once: sandboxed/runner.py), or while a Python signal handler is
  set that was not set here (a handler runs in whatever frame it interrupts). `send` writes
  nothing unless `put` calls it, and runs no code but its own: no frame code under test can
  reach ever holds the nonce."""
  nonce = _urandom(16).hex()
  write(fd, b'N ' + nonce.encode() + b'\n')
  putcode, = [c for c in recorder.__code__.co_consts if getattr(c, 'co_name', None) == 'put']

  def send(token, text, _fd=fd, _write=write, _head=b'S ' + nonce.encode() + b' ',
           _code=putcode, _frame=sys._getframe, _encode=str.encode):  # pylint: disable=protected-access
    if _frame(1).f_code is _code:
      _write(_fd, _head + _encode(token + ' ' + text + '\n'))

  signals = tuple(sorted(_signals()))

  def put(value, token, _send=send, _sealed=frozenset(sealed), _encode=encode, _dump=dump,
          _budget=BUDGET, _str=str, _type=type, _exception=Exception, _frame=sys._getframe,  # pylint: disable=protected-access
          _mark=MARK, _signals=signals, _handlers=tuple(map(_getsignal, signals)),
          _getsignal=_getsignal, _all=all, _map=map, _is=operator.is_):
    frame = _frame(1)
    caller = frame.f_back
    if (_type(token) is not _str or caller is None or caller.f_globals is not frame.f_globals
        or frame.f_code.co_filename not in _sealed
        or caller.f_code.co_filename != frame.f_code.co_filename
        or _mark not in frame.f_code.co_consts):
      return True
    try:
      text = _dump(_encode(value, 0, [_budget], _mark, _encode), _dump)
    except _exception:  # pylint: disable=broad-except
      text = '["?"]'
    # Nothing between this check and `send` runs code of the tree (only the main thread sets
    # handlers, and a handler runs only there).
    if _all(_map(_is, _map(_getsignal, _signals), _handlers)):
      _send(token, text)
    return True

  return put


def text(line: str) -> str:
  """The JSON text of a record line's encoding, as json.dumps writes it (the harness's side of
  `put`); ValueError where the line holds no JSON."""
  try:
    return json.dumps(json.loads(line))
  except (ValueError, RecursionError) as e:
    raise ValueError(f'unreadable seal record: {e}') from e
