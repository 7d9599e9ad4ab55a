"""Every module has a Bazel target in its package's BUILD, and every test file a py_test."""

import ast
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _targets(build_path):
  """{src file: rule kind} from a BUILD file (Starlark is Python syntax for these rules)."""
  tree = ast.parse(open(build_path).read())
  out = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, 'id', None) in ('py_library', 'py_binary',
                                                                        'py_test'):
      for kw in node.keywords:
        if kw.arg == 'srcs':
          for elt in kw.value.elts:
            out[elt.value] = node.func.id
  return out


def _python_dirs(top):
  for root, dirs, files in os.walk(os.path.join(REPO, top)):
    dirs[:] = [d for d in dirs if not d.startswith(('.', '__'))]
    py = sorted(f for f in files if f.endswith('.py'))
    if py:
      yield root, py


@pytest.mark.parametrize('top', ['research', 'launch', 'experiments'])
def test_every_module_has_a_target(top):
  missing = []
  for root, files in _python_dirs(top):
    build = os.path.join(root, 'BUILD')
    targets = _targets(build) if os.path.exists(build) else {}
    missing += [os.path.relpath(os.path.join(root, f), REPO) for f in files if f not in targets]
  assert not missing, f'modules without a BUILD target: {missing}'


def test_every_test_file_has_a_py_test():
  missing = []
  for root, files in _python_dirs('tests'):
    build = os.path.join(root, 'BUILD')
    targets = _targets(build) if os.path.exists(build) else {}
    missing += [os.path.relpath(os.path.join(root, f), REPO) for f in files
                if f.startswith('test_') and targets.get(f) != 'py_test']
  assert not missing, f'test files without a py_test target: {missing}'



def _imported(path):
  tree = ast.parse(open(path).read())
  names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  for n in ast.walk(tree):
    if isinstance(n, ast.ImportFrom) and n.module:
      names |= {n.module} | {f'{n.module}.{a.name}' for a in n.names}
  return names


@pytest.mark.parametrize('top', ['research/rl', 'research/tasks/grading', 'research/tasks/factory'])
def test_the_red_team_is_imported_only_by_tests_and_experiments(top):
  found = [os.path.relpath(os.path.join(root, f), REPO) for root, files in _python_dirs(top)
           for f in files if any('redteam' in n for n in _imported(os.path.join(root, f)))]
  assert not found, f'modules importing the red team: {found}'


def test_loading_the_rl_config_imports_no_grading():
  """The experiment config names settings only: the grader, the factory and the red team load
  with the environment that uses them, never with a config."""
  layers = ("research.tasks.grading", "research.tasks.factory", "research.tasks.redteam")
  code = f'import sys; import research.rl.config; print(sorted(m for m in sys.modules if m.startswith({layers})))'
  out = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True, text=True,
                       check=True, timeout=120).stdout
  assert out.strip() == '[]', out


def test_layers_are_visible_in_the_tree():
  """The tasks package's top level holds only its shared primitives; no function in research/
  is over 60 lines."""
  top = sorted(f for f in os.listdir(os.path.join(REPO, 'research/tasks')) if f.endswith('.py'))
  assert len(top) <= 6, top
  long = []
  for root, files in _python_dirs('research'):
    for f in files:
      for n in ast.walk(ast.parse(open(os.path.join(root, f)).read())):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno >= 60:
          long.append(f'{os.path.relpath(os.path.join(root, f), REPO)}:{n.lineno} {n.name}')
  assert not long, long
