"""Leak scrubbing: the policy's tree is rebuilt from the deleted state, then searched.

The tree is a copy without artifacts (bytecode, tool caches, coverage, build and docs output,
egg-info, VCS data) with one fresh commit. The leak gate looks for distinctive lines of the
deleted code in every file of that tree (git objects decompressed), in everything the sandbox
mounts for Python, and checks that no installed copy of the packages is importable.
"""
import collections
import os
from pathlib import Path
import subprocess
import tempfile
from typing import Iterable

from research.tasks import layout

MIN_FINGERPRINT = 16  # Shorter lines are too common to mean anything.
# Files a leak in the venv could be read from; binaries are left to the import check.
_TEXT_TYPES = ('*.py', '*.pyi', '*.txt', '*.html', '*.json', '*.md', '*.rst', '*.cfg', '*.toml')


def build_policy_tree(src: Path, dst: Path, hidden: Iterable[str] = ()) -> None:
  """Copies src without artifacts or the `hidden` files (tests that decide the reward) and
  records it as the only commit of a new repository."""
  layout.copy_tree(src, dst, skip_artifacts=True)
  for rel in hidden:
    (dst / rel).unlink()
  git_commit_all(dst, 'task')


def fingerprints(deleted: str, remaining: Iterable[str]) -> list[str]:
  """Lines of the deleted code that appear nowhere (not even inside a line) in what is kept."""
  kept = '\n'.join(remaining)
  out = []
  for line in deleted.splitlines():
    line = line.strip()
    if len(line) >= MIN_FINGERPRINT and not line.startswith('#') and line not in kept:
      out.append(line)
  return sorted(set(out))


def _git_objects(repo: Path) -> bytes:
  """All objects of a repository's object store, decompressed."""
  proc = subprocess.run(
      ['git', 'cat-file', '--batch-all-objects', '--batch', '--unordered'], cwd=repo,
      capture_output=True, env={'PATH': os.environ.get('PATH', '/usr/bin:/bin'),
                                'HOME': '/nonexistent', 'GIT_DIR': str(repo / '.git')})
  return proc.stdout


def _artifact(rel: str) -> bool:
  parts = rel.split('/')
  return any(layout.is_artifact('/'.join(parts[:i + 1]), i < len(parts) - 1)
             for i in range(len(parts)))


def scan_tree(tree: Path, prints: list[str]) -> list[str]:
  """'path: line' for each fingerprint found anywhere in the tree, git objects included.

  Artifacts count as leaks by themselves: bytecode holds code without its lines.
  """
  needles = [p.encode() for p in prints]
  files = [rel for rel in layout.iter_files(tree, skip_artifacts=False)
           if not rel.startswith('.git/') and not (tree / rel).is_symlink()]
  found = [f'{rel}: artifact' for rel in files if _artifact(rel)]
  blobs = [(rel, (tree / rel).read_bytes()) for rel in files]
  if (tree / '.git').is_dir():
    blobs.append(('.git (objects)', _git_objects(tree)))
  for rel, data in blobs:
    found += [f'{rel}: {n.decode()}' for n in needles if n in data]
  return found


def scan_venv(roots: Iterable[str], prints_by_key: dict[str, list[str]],
                     skip: Iterable[str] = ()) -> dict[str, list[str]]:
  """For each key, the readable files holding at least two of its fingerprints (or its only one).

  One `grep -F` pass over all roots keeps this cheap for a whole task set. Files under `skip`
  (directories the sandbox hides) do not count.
  """
  all_prints = sorted({p for prints in prints_by_key.values() for p in prints})
  roots = [r for r in roots if os.path.isdir(r)]
  if not all_prints or not roots:
    return {}
  with tempfile.NamedTemporaryFile('w', suffix='.txt') as patterns:
    patterns.write('\n'.join(all_prints) + '\n')
    patterns.flush()
    includes = [f'--include={t}' for t in _TEXT_TYPES]
    proc = subprocess.run(['grep', '-rIlF', '-f', patterns.name, *includes, *roots],
                          capture_output=True)
  hits = collections.defaultdict(list)
  skip = tuple(os.path.join(s, '') for s in skip)
  for name in proc.stdout.decode(errors='replace').splitlines():
    if name.startswith(skip):
      continue
    data = Path(name).read_bytes()
    for key, prints in prints_by_key.items():
      need = min(2, len(prints))
      if need and sum(p.encode() in data for p in prints) >= need:
        hits[key].append(name)
  return dict(hits)


def git_commit_all(repo: Path, message: str) -> None:
  """Commits everything in `repo` (made a repository if it is none), with fixed names and dates."""
  env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOME': '/nonexistent',
         'GIT_CONFIG_NOSYSTEM': '1', 'GIT_AUTHOR_NAME': 'fixture',
         'GIT_AUTHOR_EMAIL': 'fixture@example.com', 'GIT_COMMITTER_NAME': 'fixture',
         'GIT_COMMITTER_EMAIL': 'fixture@example.com',
         'GIT_AUTHOR_DATE': '2020-01-01T00:00:00Z', 'GIT_COMMITTER_DATE': '2020-01-01T00:00:00Z'}
  if not (repo / '.git').exists():
    subprocess.run(['git', 'init', '-q', '-b', 'main'], cwd=repo, env=env, check=True)
  subprocess.run(['git', 'add', '-A'], cwd=repo, env=env, check=True)
  subprocess.run(['git', 'commit', '-q', '--allow-empty', '-m', message], cwd=repo, env=env,
                 check=True)
