"""Deletes code: a function body, a whole function or method, or a feature (symbol + helpers)."""
import ast
import dataclasses
import textwrap

from research.tasks import layout

STUB = 'raise NotImplementedError'


@dataclasses.dataclass(frozen=True)
class Symbol:
  """A function or method in a module, with the line ranges deletion needs (1-based)."""
  qualname: str  # 'slugify' or 'Histogram.render'.
  start: int  # First decorator line.
  end: int
  body_start: int  # First body line after the docstring; 0 when nothing follows it.
  body_indent: int
  in_class: bool
  names: frozenset[str]  # Names the function loads.

  @property
  def name(self) -> str:
    return self.qualname.rsplit('.', 1)[-1]

  @property
  def private(self) -> bool:
    return self.name.startswith('_') and not self.name.startswith('__')


def _symbol(node: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str) -> Symbol:
  body = node.body
  has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
             and isinstance(body[0].value.value, str))
  rest = body[1:] if has_doc else body
  body_start = rest[0].lineno if rest and rest[0].lineno > node.lineno else 0
  starts = [d.lineno for d in node.decorator_list] + [node.lineno]
  names = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
  return Symbol(prefix + node.name, min(starts), node.end_lineno, body_start,
                rest[0].col_offset if rest else 0, bool(prefix), names)


def _functions(source: str):
  """(qualname prefix, node) of module-level functions and methods of module-level classes."""
  for node in layout.parse_source(source).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      yield '', node
    elif isinstance(node, ast.ClassDef):
      yield from ((node.name + '.', n) for n in node.body
                  if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def symbols(source: str) -> list[Symbol]:
  """Module-level functions and methods of module-level classes (not nested functions)."""
  return [_symbol(node, prefix) for prefix, node in _functions(source)]


def _lines(source: str) -> list[str]:
  return source.splitlines(keepends=True)


def delete_body(source: str, sym: Symbol) -> tuple[str, str]:
  """Keeps decorators, signature and docstring; the body becomes `raise NotImplementedError`.

  Returns (new source, deleted text).
  """
  return replace_body(source, sym, STUB)


def replace_body(source: str, sym: Symbol, body: str) -> tuple[str, str]:
  """Keeps decorators, signature and docstring; the body becomes `body` (a statement).

  Returns (new source, replaced text).
  """
  if not sym.body_start:
    raise ValueError(f'{sym.qualname} has no body to delete besides its docstring')
  lines = _lines(source)
  removed = lines[sym.body_start - 1:sym.end]
  stub = ' ' * sym.body_indent + body + '\n'
  return ''.join(lines[:sym.body_start - 1] + [stub] + lines[sym.end:]), ''.join(removed)


# Bodies a solver that does not do the work writes first. Tests that every one of these fails
# are what make a task worth a reward.
TRIVIAL = ('return None', 'return True', 'return False', 'return 0', "return ''", 'return []',
           'return {}')


def trivial_bodies(source: str, sym: Symbol) -> list[str]:
  """TRIVIAL, the echoes of the function's own inputs (`return self`, each argument), and each
  constant the function itself returns, by value or by a name that is not its own (a module
  constant, `NotImplemented`): a branch the tests may be all of.

  A generator's trivial body yields nothing (in a form valid for async generators too).
  """
  prefix, node = next((p, n) for p, n in _functions(source) if _symbol(n, p) == sym)
  own = _own_nodes(node)
  if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in own):
    return ['if False: yield']
  params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
  decorators = {d.id for d in node.decorator_list if isinstance(d, ast.Name)}
  bound = bool(prefix) and 'staticmethod' not in decorators and params
  out = list(TRIVIAL)
  out += [f'return {p}' for p in params[:1] if bound]
  out += [f'return {p}' for p in params[bool(bound):]]
  local = set(params) | _bound_names(own)
  for ret in sorted((n for n in own if isinstance(n, ast.Return) and n.value is not None),
                    key=lambda n: n.lineno):
    body = f'return {ast.unparse(ret.value)}'
    constant = layout.is_literal(ret.value) or (
        isinstance(ret.value, ast.Name) and ret.value.id not in local)
    if constant and body not in out:
      out.append(body)
  return out


def _bound_names(nodes: list[ast.AST]) -> set[str]:
  """Names a function's own body binds (assignments, loops, imports, nested definitions)."""
  names = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
  names |= {n.name for n in nodes
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
  names |= {(a.asname or a.name).split('.')[0] for n in nodes
            if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
  names |= {n.name for n in nodes if isinstance(n, ast.ExceptHandler) and n.name}
  return names


def _own_nodes(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.AST]:
  """The nodes of the function's own body (nested scopes are not its body)."""
  out, todo = [], list(function.body)
  while todo:
    node = todo.pop()
    out.append(node)
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
      todo.extend(ast.iter_child_nodes(node))
  return out


def delete_symbols(source: str, syms: list[Symbol]) -> tuple[str, str]:
  """Deletes whole functions or methods, with their decorators and the blank lines after.

  A class left without a body gets `pass`.
  """
  lines = _lines(source)
  drop, removed = set(), []
  for sym in sorted(syms, key=lambda s: s.start):
    end = sym.end
    while end < len(lines) and not lines[end].strip():
      end += 1
    drop.update(range(sym.start - 1, end))
    removed.append(''.join(lines[sym.start - 1:sym.end]))
  new = ''.join(line for i, line in enumerate(lines) if i not in drop)
  if not _parses(new):
    # Only an emptied class can break the syntax here: give it a `pass`.
    new = _fill_empty_classes(source, drop)
  return new, '\n'.join(removed)


def _parses(source: str) -> bool:
  try:
    layout.parse_source(source)
    return True
  except SyntaxError:
    return False


def _fill_empty_classes(source: str, drop: set[int]) -> str:
  lines = _lines(source)
  out = []
  for node in layout.parse_source(source).body:
    if isinstance(node, ast.ClassDef):
      body_lines = set(range(node.body[0].lineno - 1, node.end_lineno))
      if body_lines <= drop:
        indent = ' ' * node.body[0].col_offset
        out.append((node.body[0].lineno - 1, indent + 'pass\n'))
  inserts = dict(out)
  result = []
  for i, line in enumerate(lines):
    if i in inserts:
      result.append(inserts[i])
    if i not in drop:
      result.append(line)
  new = ''.join(result)
  layout.parse_source(new)  # Raises if something else broke.
  return new


def helpers(source: str, sym: Symbol) -> list[Symbol]:
  """Private module-level functions only `sym` (directly or through each other) uses."""
  if sym.in_class:
    return []
  module = layout.parse_source(source)
  funcs = {s.name: s for s in symbols(source) if not s.in_class}
  chosen, todo = set(), [sym]
  while todo:
    for name in todo.pop().names:
      f = funcs.get(name)
      if f is not None and f.private and name not in chosen and name != sym.name:
        chosen.add(name)
        todo.append(f)
  if not chosen:
    return []
  # A helper also used from elsewhere in the module is not part of the feature, and neither
  # is what it uses: repeat until nothing changes.
  changed = True
  while changed:
    owners = [funcs[o] for o in {sym.name} | chosen]
    used_elsewhere = {n.id for n in ast.walk(module) if isinstance(n, ast.Name)
                      and n.id in chosen and not any(o.start <= n.lineno <= o.end for o in owners)}
    changed = bool(used_elsewhere)
    chosen -= used_elsewhere
  return [funcs[n] for n in sorted(chosen)]


def parse_fragment(code: str) -> ast.Module:
  """Parses deleted code: a whole (possibly indented) definition, or a body parsed inside an
  `if` when it is not valid at the top level."""
  try:
    return layout.parse_source(textwrap.dedent(code))
  except SyntaxError:
    return layout.parse_source('if 1:\n' + code).body[0]


_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.With,
             ast.AsyncWith, ast.BoolOp, ast.comprehension, ast.match_case, ast.Assert)


def cyclomatic(code: str) -> int:
  """1 + the decision points (branches, loops, handlers, boolean operators) of deleted code."""
  tree = parse_fragment(code)
  wrapper = isinstance(tree, ast.If)  # The `if` parse_fragment added is no decision of the code.
  return 1 + sum(isinstance(n, _BRANCHES) for n in ast.walk(tree)) - wrapper
