"""Test modules as source: locating a required test, its asserts and parametrize cases, and
editing a module's text at syntax-tree positions (what twins.py and seal.py plant with).

A node id names a test function (`file::test`, `file::Class::test`, with `[case]` for a
parametrized one); `locate` finds it in the module's tree. `Module` parses a test module once with
the names a planted function may not take and the words fresh names are made of.
"""
import ast
import collections
import dataclasses
import functools
import random

from research.tasks import layout


PRIMITIVE = (str, int, float, bool, type(None))


# Words a fresh test name never uses: pytest's own, and the names of the old canaries.
# unittest assertions, and the assertion that fails exactly when each passes.
UNITTEST_NEGATION = {
    'assertEqual': 'assertNotEqual', 'assertNotEqual': 'assertEqual', 'assertTrue': 'assertFalse',
    'assertFalse': 'assertTrue', 'assertIsNone': 'assertIsNotNone',
    'assertIsNotNone': 'assertIsNone', 'assertIn': 'assertNotIn', 'assertNotIn': 'assertIn',
    'assertIs': 'assertIsNot', 'assertIsNot': 'assertIs',
    'assertIsInstance': 'assertNotIsInstance', 'assertNotIsInstance': 'assertIsInstance'}


_NOT_WORDS = frozenset({'test', 'tests', 'self', 'cls', 'twin', 'twins', 'canary', 'mutant',
                        'pytest', 'mark', 'parametrize', 'fixture', 'raises'})


class Unplantable(ValueError):
  """A site where no twin can be planted."""


@dataclasses.dataclass(frozen=True)
class Located:
  """A required test located in its module's syntax tree."""
  func: ast.FunctionDef | ast.AsyncFunctionDef
  module: ast.Module
  owner: ast.Module | ast.ClassDef
  prefix: str  # 'file::' or 'file::Class::'.
  case: str | None  # The parametrize id, for a parametrized test.


def locate(tree: ast.Module, nodeid: str) -> Located:
  head, bracket, params = nodeid.partition('[')
  parts = head.split('::')
  owner = tree
  for name in parts[1:-1]:
    owner = next((n for n in owner.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if owner is None:
      raise Unplantable(f'no class {name} for {nodeid}')
  func = next((n for n in owner.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name == parts[-1]), None)
  if func is None or len(parts) > 3:
    raise Unplantable(f'no test function for {nodeid}')
  return Located(func, tree, owner, '::'.join(parts[:-1]) + '::', params[:-1] if bracket else None)


def unittest_assert(node: ast.AST) -> bool:
  return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name) and node.func.value.id == 'self'
          and node.func.attr in UNITTEST_NEGATION)


def mutation_points(func: ast.AST) -> list[ast.Assert | ast.With | ast.Call]:
  """Asserts, `with` blocks and unittest assertions, in source order."""
  nodes = [n for stmt in func.body for n in ast.walk(stmt)
           if isinstance(n, (ast.Assert, ast.With)) or unittest_assert(n)]
  return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def bound_once(func: ast.AST, name: str) -> ast.expr | None:
  """The literal a local name is bound to, when it is bound exactly once, to a literal."""
  binds = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name
           and isinstance(n.ctx, ast.Store)]
  assigns = [n for n in ast.walk(func) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]
  if len(binds) == 1 and len(assigns) == 1 and layout.is_literal(assigns[0].value):
    return assigns[0].value
  return None


@dataclasses.dataclass(frozen=True)
class Cases:
  """A test's single `pytest.mark.parametrize` with literal cases."""
  argnames: list[str]
  container: ast.List | ast.Tuple  # In the decorator, or a module constant.
  shared: bool  # Whether other tests are parametrized over the same constant.
  single: bool  # Each case is the value itself (one argument name, given as a string).
  values: list[list[ast.expr]]

  def ids(self) -> list[str]:
    return [case_id([ast.literal_eval(v) for v in vals], self.argnames, i)
            for i, vals in enumerate(self.values)]

  def primitive(self) -> bool:
    """Whether every id comes from the values, so that no id depends on a case's position."""
    return all(isinstance(ast.literal_eval(v), PRIMITIVE) for vals in self.values for v in vals)

  def case_values(self, text: str) -> list:
    """The argument values of a case written as `text`."""
    value = layout.literal_value(text)
    return [value] if self.single else list(value)


def marks(func: ast.AST) -> list[ast.Call]:
  return [d for d in func.decorator_list if isinstance(d, ast.Call)
          and isinstance(d.func, ast.Attribute) and d.func.attr == 'parametrize']


@functools.lru_cache(maxsize=8)
def _constants(module: ast.Module) -> dict[str, tuple[ast.List | ast.Tuple, bool]]:
  """Module constants that only parametrize decorators read: name -> (cases, shared by tests).

  Only those qualify as case lists: extra cases in them change no other code.
  """
  in_marks = {id(m.args[1]) for f in ast.walk(module) if isinstance(f, ast.FunctionDef)
              for m in marks(f) if len(m.args) == 2}
  uses = collections.defaultdict(list)
  for n in ast.walk(module):
    if isinstance(n, ast.Name):
      uses[n.id].append(n)
  out = {}
  for a in module.body:
    if (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
        and isinstance(a.value, (ast.List, ast.Tuple))):
      loads = [n for n in uses[a.targets[0].id] if isinstance(n.ctx, ast.Load)]
      if (len(uses[a.targets[0].id]) == len(loads) + 1
          and all(id(n) in in_marks for n in loads)):
        out[a.targets[0].id] = (a.value, len(loads) > 1)
  return out


def _case_list(module: ast.Module, container: ast.expr, func_name: str
               ) -> tuple[ast.List | ast.Tuple, bool]:
  """The literal list of cases (in the decorator or a module constant), and whether other tests
  share it."""
  if isinstance(container, (ast.List, ast.Tuple)):
    return container, False
  found = _constants(module).get(container.id) if isinstance(container, ast.Name) else None
  if found is None:
    raise Unplantable(f'{func_name}: cases are neither a literal nor a constant only '
                    'parametrize reads')
  return found


def parametrize(test: Located) -> Cases | None:
  found = marks(test.func)
  if not found:
    return None
  name = test.func.name
  if len(found) > 1 or found[0].keywords or len(found[0].args) != 2:
    raise Unplantable(f'{name}: parametrize form without predictable ids')
  names, container = found[0].args
  # pytest takes each case as the value itself only for one name given as a string.
  as_text = isinstance(names, ast.Constant) and isinstance(names.value, str)
  if as_text:
    argnames = [n.strip() for n in names.value.split(',') if n.strip()]
  elif isinstance(names, (ast.List, ast.Tuple)) and all(
      isinstance(e, ast.Constant) and isinstance(e.value, str) for e in names.elts):
    argnames = [e.value for e in names.elts]
  else:
    raise Unplantable(f'{name}: argument names are not literal')
  container, shared = _case_list(test.module, container, name)
  single = as_text and len(argnames) == 1
  values = []
  for elt in container.elts:
    vals = ([elt] if single else elt.elts
            if isinstance(elt, (ast.Tuple, ast.List)) and len(elt.elts) == len(argnames) else [])
    if not vals or not all(layout.is_literal(v) for v in vals):
      raise Unplantable(f'{name}: a case is not a literal')
    values.append(vals)
  if not values:
    raise Unplantable(f'{name}: no cases')
  return Cases(argnames, container, shared, single, values)


def _escape(text: str) -> str:
  """pytest's id for a string value (ascii_escaped)."""
  escaped = text.encode('unicode_escape').decode('ascii')
  table = {i: f'\\x{i:02x}' for i in range(128) if i not in range(32, 127)}
  table.update({ord('\t'): '\\t', ord('\r'): '\\r', ord('\n'): '\\n'})
  return escaped.translate(table)


def case_id(values: list, argnames: list[str], idx: int) -> str:
  """The id pytest gives a case when neither `ids` nor `pytest.param` names it."""
  parts = []
  for value, name in zip(values, argnames):
    if isinstance(value, str) and len(value) <= 100:
      parts.append(_escape(value))
    elif isinstance(value, (bool, int, float, type(None))):
      parts.append(str(value))
    else:
      parts.append(f'{name}{idx}')
  return '-'.join(parts)


class Source:
  """A module's text with character offsets for syntax-tree positions (which count bytes)."""

  def __init__(self, text: str):
    self.text = text
    self.lines = text.splitlines(keepends=True)
    self.starts = [0]
    for line in self.lines:
      self.starts.append(self.starts[-1] + len(line))

  def offset(self, lineno: int, col: int) -> int:
    return self.starts[lineno - 1] + len(self.lines[lineno - 1].encode()[:col].decode())

  def span(self, node: ast.AST) -> tuple[int, int]:
    return (self.offset(node.lineno, node.col_offset),
            self.offset(node.end_lineno, node.end_col_offset))

  def segment(self, node: ast.AST) -> str:
    start, end = self.span(node)
    return self.text[start:end]


Edit = tuple[int, int, str]  # Replace text[start:end] with the string.


def apply(text: str, edits: list[Edit], base: int = 0) -> str:
  """Applies non-overlapping edits (offsets relative to `base`); equal offsets keep their order."""
  order = sorted(range(len(edits)), key=lambda i: (edits[i][0], i), reverse=True)
  for start, end, new in (edits[i] for i in order):
    text = text[:start - base] + new + text[end - base:]
  return text


def vocabulary(module: ast.Module) -> list[str]:
  """Words of the module's identifiers, to make test names that fit in."""
  words = set()
  for node in ast.walk(module):
    for ident in (getattr(node, f, None) for f in ('name', 'id', 'attr', 'arg')):
      if isinstance(ident, str):
        words.update(w.lower() for w in ident.split('_'))
  return sorted(w for w in words
                if w.isascii() and w.isalpha() and 3 <= len(w) <= 12 and w not in _NOT_WORDS
                and not w.startswith('assert'))


def fresh_name(base: str, vocab: list[str], taken: set[str], rng: random.Random,
                prefix: str = 'test_') -> str:
  stem = [w for w in base.split('_') if w and w != 'test'] or ['case']
  for _ in range(200):
    words = stem[:rng.randint(1, len(stem))] + rng.sample(vocab, min(len(vocab), rng.randint(1, 2)))
    name = prefix + '_'.join(dict.fromkeys(words))
    if name not in taken:
      return name
  raise Unplantable(f'no fresh name near {base}')


@dataclasses.dataclass
class Module:
  """A test module parsed once, with what naming twins needs."""
  src: Source
  tree: ast.Module
  vocab: list[str]
  taken: set[str]  # Names a twin may not take.
  # Whether an `a == b` of two computed values gets its negated assert (grading: sites of tasks
  # made before value twins) or no twin (choosing sites: the test's value twin covers it).
  negate_computed: bool = False

  @classmethod
  def parse(cls, text: str) -> 'Module':
    tree = layout.parse_source(text)
    taken = {n.name for n in ast.walk(tree) if isinstance(getattr(n, 'name', None), str)}
    taken |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return cls(Source(text), tree, vocabulary(tree), taken)
