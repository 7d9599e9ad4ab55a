"""Tests that run alone: an answer another test holds is not in the process that judges it.

Sealing (seal.py) takes a sealed assert's literal out of the sandbox, but not the same string
where another test holds it: a round trip (`unshout('HELLO!') == 'hello'` beside
`shout('hello') == 'HELLO!'`), or inflection's plurals, the inputs of `test_singularize_plural`.
A forger with the inverse function intact tries the test files' strings through it and returns
the one that maps back; no rewriting of one module hides it, since that other test must keep its
input. A process of its own does: grading runs each F2P test function one of whose sealed string
answers (case ignored) another test holds in a pytest run of its own, on a copy of the tree whose
test files hold no other test. Every test function and method but it and its function twins is
removed from every test file (conftest.py included), with every module or class constant that
nothing left reads; helpers, fixtures, imports and classes stay. The main run's tree loses the
function and its twins. A function is isolated only where that hides one of its answers
(titleize's are its own inputs but for case: nothing to hide).

Tests are what pytest collects by default: functions and methods named `test*` that are not
fixtures, also inside `if` blocks (version gates). What a test reads elsewhere (data files, the
package's own source or documentation) is not hidden.
"""
import ast
import dataclasses
from pathlib import Path

from research.tasks import layout
from research.tasks.grading import seal
from research.tasks.grading import twins


@dataclasses.dataclass(frozen=True)
class Part:
  """One pytest run of a grading."""
  tree: Path
  files: list[str]  # The test files pytest is given.
  scratch: Path  # Where that run's harness and output go (grading.run_pytest).
  functions: frozenset[str]  # The function node ids it runs alone; empty for the main run.
  twins: frozenset[str]  # The node ids of the twins it runs (a twin runs with the test it copies).


def _qualname(nodeid: str) -> tuple[str, str]:
  """(file, 'Class::name') of a function node id."""
  rel, _, qual = seal.function_of(nodeid).partition('::')
  return rel, qual


def _is_test(node: ast.AST) -> bool:
  return (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.name.startswith('test')
          and not any('fixture' in ast.unparse(d) for d in node.decorator_list))


def _pure(node: ast.AST) -> bool:
  """A constant: an assignment to names whose value calls nothing (dropping it changes nothing
  but what reads it)."""
  if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
    return False
  targets = node.targets if isinstance(node, ast.Assign) else [node.target]
  names = [n for t in targets for n in ast.walk(t)]
  return all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in names) and not any(
      isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda))
      for n in ast.walk(node.value))


def _reads(node: ast.AST, parts: list[ast.AST]) -> set[str]:
  """The identifiers `parts` of `node` mention: names, attributes, imported names, and strings
  that are identifiers (`usefixtures('name')`, `getattr(x, 'name')`)."""
  out = set()
  for part in parts:
    for n in ast.walk(part):
      if isinstance(n, ast.Name):
        out.add(n.id)
      elif isinstance(n, ast.Attribute):
        out.add(n.attr)
      elif isinstance(n, ast.alias):
        out |= {*n.name.split('.'), *([n.asname] if n.asname else [])}
      elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier():
        out.add(n.value)
      elif isinstance(n, (ast.Global, ast.Nonlocal)):
        out |= set(n.names)
  return out


@dataclasses.dataclass
class _Unit:
  """A statement of a module or class body that may be dropped, or a root that stays."""
  node: ast.stmt
  binds: set[str]
  reads: set[str]
  droppable: bool


def _units(body: list[ast.stmt], prefix: str, drop_test, constants: bool, out: list[_Unit]):
  for node in body:
    qual = prefix + getattr(node, 'name', '')
    if isinstance(node, ast.ClassDef):
      # The class stays; its statements are units of their own.
      out.append(_Unit(node, {node.name}, _reads(node, [*node.bases, *node.keywords,
                                                        *node.decorator_list]), False))
      _units(node.body, qual + '::', drop_test, constants, out)
    elif isinstance(node, ast.If):
      # The `if` stays (a version gate); its branches' statements are units in the same scope.
      out.append(_Unit(node, set(), _reads(node, [node.test]), False))
      _units(node.body + node.orelse, prefix, drop_test, constants, out)
    elif _is_test(node):
      out.append(_Unit(node, {node.name}, _reads(node, [node]), drop_test(qual)))
    else:
      binds = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
               and isinstance(n.ctx, ast.Store)}
      value = node.value if _pure(node) else node
      out.append(_Unit(node, binds, _reads(node, [value]), constants and _pure(node)))


def _live(units: list[_Unit]) -> set[int]:
  """Ids of the units that stay: the roots, and what they read, transitively (across files:
  one test file imports another's constants)."""
  live = {id(u.node) for u in units if not u.droppable}
  reads = set().union(*(u.reads for u in units if not u.droppable))
  while True:
    more = [u for u in units if id(u.node) not in live and u.binds & reads]
    if not more:
      return live
    for u in more:
      live.add(id(u.node))
      reads |= u.reads


def _filtered(body: list[ast.stmt], live: set[int]) -> list[ast.stmt]:
  out = []
  for node in body:
    if id(node) not in live:
      continue
    if isinstance(node, ast.ClassDef):
      node = ast.ClassDef(**{**vars(node), 'body': _filtered(node.body, live) or [ast.Pass()]})
    elif isinstance(node, ast.If):
      node = ast.If(test=node.test, body=_filtered(node.body, live) or [ast.Pass()],
                    orelse=_filtered(node.orelse, live))
    out.append(node)
  return out


def _pruned(modules: dict[str, ast.Module | None], drop_test, constants: bool
            ) -> dict[str, ast.Module]:
  """The modules that lose something: `drop_test(rel, qualname)` says which tests go;
  `constants`: also the constants that nothing left reads."""
  units = {rel: [] for rel, module in modules.items() if module is not None}
  for rel, us in units.items():
    _units(modules[rel].body, '', lambda qual, rel=rel: drop_test(rel, qual), constants, us)
  live = _live([u for us in units.values() for u in us])
  return {rel: ast.Module(body=_filtered(modules[rel].body, live), type_ignores=[])
          for rel, us in units.items() if any(id(u.node) not in live for u in us)}


def _strings(modules) -> set[str]:
  return {n.value.casefold() for m in modules if m is not None for n in ast.walk(m)
          if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _parse(tree: Path) -> dict[str, ast.Module | None]:
  """The tree's test modules, None for one that does not parse."""
  out = {}
  for rel in layout.iter_files(tree):
    if rel.endswith('.py') and layout.is_test_path(rel):
      try:
        out[rel] = layout.parse_source((tree / rel).read_text(errors='replace'))
      except (SyntaxError, ValueError):
        out[rel] = None
  return out


def _alone(modules: dict[str, ast.Module | None], function: str, keep: set[str]
           ) -> dict[str, ast.Module]:
  """The test modules of a run of `function` alone, with `keep` (its function node ids). One
  that does not parse is emptied: it cannot be imported, and its text may hold answers."""
  rel = _qualname(function)[0]
  quals = {_qualname(k)[1] for k in keep}
  return {**modules, **{r: ast.Module(body=[], type_ignores=[]) for r, m in modules.items()
                        if m is None},
          **_pruned(modules, lambda r, q: not (r == rel and q in quals), True)}


def plan(fail_to_pass: list[str], modules: dict[str, ast.Module | None], sealing: seal.Sealing,
         planted: list[twins.Twin]) -> dict[str, set[str]]:
  """The F2P functions whose run alone hides one of their sealed string answers, each with the
  functions its run keeps (it and its function twins)."""
  everywhere = _strings(modules.values())
  keep = {}
  for function in sorted({seal.function_of(n) for n in fail_to_pass}):
    answers = {e.value.casefold() for e in sealing.expect.values()
               if e.function == function and isinstance(e.value, str)} & everywhere
    if not answers:
      continue
    mine = {function} | {seal.function_of(t.nodeid) for t in planted
                         if seal.function_of(t.site.test) == function}
    if answers - _strings(_alone(modules, function, mine).values()):
      keep[function] = mine
  return keep


def _write(tree: Path, modules: dict[str, ast.Module | None],
           before: dict[str, ast.Module | None]) -> None:
  for rel, module in modules.items():
    if module is not before[rel]:
      (tree / rel).write_text(ast.unparse(module) + '\n')


def split(fail_to_pass: list[str], files: list[str], work: Path, sealing: seal.Sealing,
          planted: list[twins.Twin], scratch: Path) -> list[Part]:
  """The runs of a grading of the planted tree `work`: the main run on `work` itself (the
  isolated functions taken out) and one per isolated function, each on a copy under `scratch`."""
  if not fail_to_pass:
    return [Part(work, list(files), scratch, frozenset(), frozenset(t.nodeid for t in planted))]
  modules = _parse(work)
  keep = plan(fail_to_pass, modules, sealing, planted)

  def copying(functions):
    return frozenset(t.nodeid for t in planted if seal.function_of(t.site.test) in functions)

  parts = [Part(work, list(files), scratch, frozenset(),
                frozenset(t.nodeid for t in planted) - copying(keep))]
  for k, (function, mine) in enumerate(keep.items()):
    root = scratch / f'alone-{k}'
    root.mkdir()
    layout.copy_tree(work, root / 'tree')
    _write(root / 'tree', _alone(modules, function, mine), modules)
    parts.append(Part(root / 'tree', [_qualname(function)[0]], root, frozenset({function}),
                      copying({function})))
  gone = {_qualname(k) for mine in keep.values() for k in mine}
  if gone:
    _write(work, {**modules, **_pruned(modules, lambda r, q: (r, q) in gone, False)}, modules)
  return parts
