"""Value checks: the run-time half, copied by twins.py into each test module that calls it.

A required test's `assert a == b` (and `self.assertEqual(a, b)`) becomes `assert
changed_equal(a, b, seed)`, with this function defined in the module under a fresh name (the
runner watches it from the end of collection, by its message, so replacing it later is flagged).
Before `a == b` it asks each side whether it equals a faithful copy of the other side's
value (it must) and a changed copy (it must not). Copies are fresh objects made of exact builtins,
read through the builtins' own methods, so a subclass's overrides do not survive into them, and
all checks run at one line in an order drawn from os.urandom.

Correct code answers every check as builtin equality does: no value equals a changed copy of a
value equal to it, and every value equals its faithful copy. A forger does not:
- a builtin subclass that claims equality it does not have is copied into what it really holds,
  and the other side, compared with that copy, says no;
- any other object that claims equality must say yes to the faithful copy and no to the changed
  one without knowing the other side's value (it learns it only at the final `a == b`): it sees
  two fresh values of the same type, one reference each, in a random order, at the same line.
So such a forger fails a checked test in half of the comparisons it meets first, and a builtin
subclass in all of them, however it finds out which test or line it is in: the originals
themselves are checked, not only their twins.

In a checked original (`count` false) a wrong answer where `a == b` holds raises an
AssertionError whose message FAILED matches; the grader flags it (honest wrong code cannot make
`a == b` hold while failing a check). A value twin (`count` true) instead adds the wrong answers
to `changed_equal.forged`, returns `a == b`, and asserts the count at its end: correct code fails
it, and the factory keeps only seeds whose twin failed, which is exactly the seeds whose checks
correct code passes. `copies` false is for value twins of task records made before the copies
were checked (their seeds were verified without them).

The source of PIECES is copied into test modules (`changed_equal` and its helpers
`changed_equal_*` renamed by that prefix, sandboxed.copied): it may use nothing from this
package, and each piece takes builtins from the `builtins` module, not from names a module under
test could shadow in the test module's globals. The runner finds `changed_equal`'s copy by MARK,
a constant of its code, and watches it and its helpers (`<its name>_*`).
"""
import re

# A checked original's failure message (pytest prints `AssertionError: <message>`; the source of
# the raise, shown in tracebacks, does not match).
FAILED = re.compile(r'AssertionError: \d+ of \d+ value checks answered wrongly')
MARK = ' value checks answered wrongly'


def changed_equal(a, b, seed, count, copies):
  """`a == b`, after each side is compared with a faithful and a changed copy of the other.

  Every call passes `count` and `copies`: defaults live on the function object, where code under
  test could change them without replacing the function.

  Builtin scalars and containers (and their subclasses, copied as the builtin) are copied and
  changed, with changes `seed` picks; other values are neither, and a comparison that raises
  counts as unequal. A side of a builtin type that cannot be copied (too deep, cyclic) counts as
  a wrong answer.
  """
  from builtins import AssertionError, Exception, bool, len, object
  import random
  rng = random.Random(seed)
  same = object()  # Nothing to copy or change.
  wrong, checks = changed_equal_checks(a, b, rng, same, copies)
  n = len(checks)
  while checks:
    x, y, want = checks.pop()
    try:
      claimed = bool(x == y)
    except Exception:  # pylint: disable=broad-except
      claimed = False
    wrong += claimed is not want
  equal = a == b
  if count:
    changed_equal.forged += wrong
    return equal
  if wrong and equal:
    raise AssertionError(f'{wrong} of {n} value checks answered wrongly')
  return equal


def changed_equal_checks(a, b, rng, same, copies):
  """(wrong answers already, the checks to ask in a random order: (side, other, must be equal))."""
  from builtins import Exception, int, len, range, tuple
  import os
  wrong = 0
  copied = []
  for v in (a, b):
    c = same
    if changed_equal_base(v) is not object:
      try:
        c = changed_equal_copy(v, 0)
      except Exception:  # pylint: disable=broad-except
        wrong += 1  # What builtin equality reads cannot be read: no correct value does that.
    copied.append(c)
  changed = []
  for c in copied:
    try:
      changed.append(same if c is same else changed_equal_change(c, 0, rng, same))
    except Exception:  # pylint: disable=broad-except
      changed.append(same)
  # (side, other value, whether they must be equal); each other value a fresh copy, so that no
  # reference count or identity tells the faithful copy from the changed one.
  (copy_a, copy_b), (new_a, new_b) = copied, changed
  checks = [(x, y, False) for x, y in ((a, new_b), (new_a, b), (a, new_a), (b, new_b))
            if x is not same and y is not same]
  if copies:
    checks += [(x, y, True) for x, y in ((a, copy_b), (b, copy_a)) if y is not same]
  checks = [tuple(v if v is a or v is b else changed_equal_copy(v, 0) for v in check[:2]) + check[2:]
            for check in checks]
  noise = os.urandom(2 * len(checks))
  for i in range(len(checks) - 1, 0, -1):
    j = int.from_bytes(noise[2 * i:2 * i + 2], 'big') % (i + 1)
    checks[i], checks[j] = checks[j], checks[i]
  return wrong, checks


def changed_equal_base(v):
  """The builtin kind of `v` (None for None, object for any other value)."""
  from builtins import bool, bytes, dict, float, frozenset, int, issubclass, list, next, object, set, str, tuple, type
  # By type(), not isinstance(): an object can claim any class through `__class__`.
  kinds = (bool, int, float, str, bytes, list, tuple, dict, set, frozenset)
  return None if v is None else next((k for k in kinds if issubclass(type(v), k)), object)


def changed_equal_copy(v, depth):
  """A fresh copy of exact builtins (non-builtin objects inside are kept)."""
  from builtins import RecursionError, bool, bytes, dict, float, int, object, slice, str
  kind = changed_equal_base(v)
  if kind in (None, bool, object):
    return v
  if kind in (int, float):
    return kind.__add__(v, kind(0))
  if kind in (str, bytes):
    return kind.__add__(kind.__getitem__(v, slice(None, 1)), kind.__getitem__(v, slice(1, None)))
  if depth > 100:
    raise RecursionError('too deep to copy')
  if kind is dict:
    return {changed_equal_copy(k, depth + 1): changed_equal_copy(x, depth + 1) for k, x in dict.items(v)}
  return kind([changed_equal_copy(x, depth + 1) for x in kind.__iter__(v)])


def changed_equal_change(v, depth, rng, same):
  """A changed value of `v`, a copy; `same` where nothing can be changed."""
  from builtins import abs, bool, bytes, dict, float, frozenset, int, len, list, set, str, tuple
  kind = changed_equal_base(v)
  if kind is None:
    return 0
  if kind is bool:
    return not v
  if kind is int:
    return v + rng.choice((-3, -2, -1, 1, 2, 3))
  if kind is float:
    return v + rng.choice((-1, 1)) * (abs(v) + 1) * rng.choice((0.25, 0.5, 1.0)) \
        if v - v == 0 else same  # Not inf or nan.
  if kind in (str, bytes):
    i = rng.randrange(len(v) + 1)
    old = v[i:i + 1]
    op = rng.choice(('drop', 'replace', 'insert') if old else ('insert',))
    # Never a change of case only: case-insensitive equality must not pass for a forgery.
    new = rng.choice([c for c in 'etaoinshrdlu0123456789'
                      if c != (old.decode('latin-1') if kind is bytes else old).lower()])
    new = new.encode() if kind is bytes else new
    return v[:i] + (new[:0] if op == 'drop' else new) + v[i + (op != 'insert'):]
  if depth > 20:
    return same
  if kind in (list, tuple):
    if not v:
      return kind([0])
    i = rng.randrange(len(v))
    new = changed_equal_change(v[i], depth + 1, rng, same) if rng.random() < 0.75 else same
    return v[:i] + kind([] if new is same else [new]) + v[i + 1:]
  if kind is dict:
    if not v:
      return {0: 0}
    out = dict(v)
    key = list(out)[rng.randrange(len(out))]
    new = changed_equal_change(out[key], depth + 1, rng, same) if rng.random() < 0.75 else same
    if new is same:
      del out[key]
    else:
      out[key] = new
    return out
  if kind in (set, frozenset):
    items = list(v)
    return kind(items[:-1] if items else [0])
  return same


PIECES = (changed_equal, changed_equal_checks, changed_equal_base, changed_equal_copy,
          changed_equal_change)
