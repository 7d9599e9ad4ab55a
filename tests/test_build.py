"""Every module has a Bazel target in its package's BUILD, and every test file a py_test."""

import ast
import os

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

