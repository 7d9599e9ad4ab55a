"""What is what in a Python repository: source packages, tests, test configuration, artifacts;
and Python's parser, one thread at a time.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter state, so two threads
parsing at once (the grader pool's) can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython gh-106905). Every parse in research/tasks goes through `parse_source`.
"""
import ast
import fnmatch
import os
from pathlib import Path, PurePosixPath
import shutil
import sys
import threading

TEST_DIRS = frozenset({'tests', 'test', 'testing'})
CONFIG_FILES = frozenset({'pytest.ini', '.pytest.ini', 'pyproject.toml', 'tox.ini', 'setup.cfg',
                          'setup.py', 'noxfile.py'})
# Names Python or pytest load on their own; never allowed in a solution.
AUTOLOADED = frozenset({'conftest.py', 'sitecustomize.py', 'usercustomize.py', '__main__.py'})
# Caches, bytecode and build or docs output: all may hold copies of the deleted code.
ARTIFACT_DIRS = frozenset({
    '.git', '.hg', '.svn', '__pycache__', '.mypy_cache', '.pytype', '.pytest_cache',
    '.ruff_cache', '.hypothesis', '.tox', '.nox', '.eggs', '.venv', 'venv', '_build',
    '.ipynb_checkpoints', '.benchmarks', '.cache'})
# Output folders only at the top: a package may well have a subpackage named `build`.
TOP_ARTIFACT_DIRS = frozenset({'build', 'dist', 'site', 'htmlcov', 'wheelhouse'})
ARTIFACT_FILES = ('*.pyc', '*.pyo', '*.pyd', '*.so', '*.egg', '*.whl', '.coverage', '.coverage.*',
                  'coverage.xml', 'coverage.json', '*.orig', '*.rej', '*.swp', '*~')
ARTIFACT_DIR_PATTERNS = ('*.egg-info', '*.dist-info')


def is_artifact(rel: str | PurePosixPath, is_dir: bool) -> bool:
  p = PurePosixPath(rel)
  name = p.name
  if is_dir:
    return (name in ARTIFACT_DIRS or (len(p.parts) == 1 and name in TOP_ARTIFACT_DIRS)
            or any(fnmatch.fnmatch(name, pat) for pat in ARTIFACT_DIR_PATTERNS))
  return any(fnmatch.fnmatch(name, pat) for pat in ARTIFACT_FILES)


def is_test_path(rel: str | PurePosixPath) -> bool:
  p = PurePosixPath(rel)
  if any(part in TEST_DIRS for part in p.parts[:-1]):
    return True
  return p.name == 'conftest.py' or fnmatch.fnmatch(p.name, 'test_*.py') or fnmatch.fnmatch(
      p.name, '*_test.py')


def is_config_path(rel: str | PurePosixPath) -> bool:
  p = PurePosixPath(rel)
  return len(p.parts) == 1 and p.name in CONFIG_FILES


def source_root(repo: Path) -> str:
  """'' for a flat layout, 'src' for a src layout."""
  return 'src' if (repo / 'src').is_dir() and source_packages(repo, 'src') else ''


def source_packages(repo: Path, root: str | None = None) -> list[str]:
  """Top-level importable packages (relative paths), tests excluded."""
  root = source_root(repo) if root is None else root
  base = repo / root
  return sorted(
      str(PurePosixPath(root, d.name)) if root else d.name for d in base.iterdir()
      if d.is_dir() and (d / '__init__.py').is_file() and d.name not in TEST_DIRS
      and not is_artifact(d.relative_to(repo).as_posix(), True))


def iter_files(repo: Path, skip_artifacts: bool = True):
  """Yields relative POSIX paths of files (and symlinks) in the repository, sorted."""
  for dirpath, dirnames, filenames in os.walk(repo):
    rel_dir = Path(dirpath).relative_to(repo)
    if skip_artifacts:
      dirnames[:] = [d for d in dirnames if not is_artifact((rel_dir / d).as_posix(), True)]
    # A link to a directory is an entry of its own, never a way into another tree.
    links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
    dirnames[:] = sorted(d for d in dirnames if d not in links)
    for name in sorted(filenames + links):
      if not (skip_artifacts and is_artifact((rel_dir / name).as_posix(), False)):
        yield (rel_dir / name).as_posix()


def test_files(repo: Path) -> list[str]:
  return [f for f in iter_files(repo) if f.endswith('.py') and is_test_path(f)
          and PurePosixPath(f).name != 'conftest.py']


def is_editable(rel: str, packages: list[str]) -> bool:
  """Whether a solution may create or change this file: Python source inside a package."""
  p = PurePosixPath(rel)
  return (p.suffix == '.py' and not is_test_path(p) and p.name not in AUTOLOADED
          and any(p.is_relative_to(pkg) for pkg in packages) and '..' not in p.parts)


def protected_paths(repo: Path, packages: list[str]) -> list[str]:
  """Every file a solution may not touch (tests, test config, data, other code)."""
  return [f for f in iter_files(repo) if not is_editable(f, packages)]


def pytest_config(repo: Path) -> str | None:
  """The file pytest reads its settings from, as pytest itself would pick it."""
  for name, marker in (('pytest.ini', ''), ('.pytest.ini', ''),
                       ('pyproject.toml', '[tool.pytest'), ('tox.ini', '[pytest]'),
                       ('setup.cfg', '[tool:pytest]')):
    path = repo / name
    if path.is_file() and marker in path.read_text(errors='replace'):
      return name
  return None


def copy_tree(src: Path, dst: Path, skip_artifacts: bool = True) -> None:
  """Copies a tree without following symlinks, optionally leaving artifacts behind."""
  def ignore(d, names):
    rel = Path(d).relative_to(src)
    return [n for n in names
            if is_artifact((rel / n).as_posix(), os.path.isdir(os.path.join(d, n)))]
  shutil.copytree(src, dst, symlinks=True, ignore=ignore if skip_artifacts else None)


def shadows_stdlib(rel: str) -> bool:
  p = PurePosixPath(rel)
  return len(p.parts) == 1 and p.stem in sys.stdlib_module_names


_PARSE_LOCK = threading.Lock()


def parse_source(source: str, mode: str = 'exec') -> ast.AST:
  with _PARSE_LOCK:
    return ast.parse(source, mode=mode)


def literal_value(source: str):
  """The value of a literal written as `source` (ast.literal_eval, parsed under the lock)."""
  return ast.literal_eval(parse_source(source, 'eval'))


def is_literal(node: ast.AST) -> bool:
  """Whether ast.literal_eval takes the node (a constant, or containers of constants)."""
  try:
    ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return False
  return True
