"""Git-style unified diffs: made from two trees, parsed into per-file sections, applied."""
import dataclasses
import difflib
import os
from pathlib import Path, PurePosixPath
import subprocess
import tempfile

from research.tasks import layout

SYMLINK_MODE, GITLINK_MODE = '120000', '160000'


class PatchError(ValueError):
  """A patch that cannot be parsed or applied."""


@dataclasses.dataclass(frozen=True)
class FileSection:
  """The part of a patch that changes one file."""
  old_path: str | None  # None for a created file.
  new_path: str | None  # None for a deleted file.
  text: str
  binary: bool
  modes: frozenset[str]

  @property
  def paths(self) -> list[str]:
    return sorted({p for p in (self.old_path, self.new_path) if p is not None})


def read_entry(path: Path) -> tuple[bytes, str] | None:
  """(content, git mode) of a file without following symlinks."""
  if path.is_symlink():
    return os.readlink(path).encode(), SYMLINK_MODE
  if path.is_file():
    return path.read_bytes(), '100755' if os.access(path, os.X_OK) else '100644'
  return None


def _text(data: bytes) -> str | None:
  if b'\0' in data:
    return None
  try:
    return data.decode()
  except UnicodeDecodeError:
    return None


def file_diff(rel: str, old: tuple[bytes, str] | None, new: tuple[bytes, str] | None) -> str:
  """One file's section, in the form `git diff` writes it."""
  lines = [f'diff --git a/{rel} b/{rel}\n']
  if old is None:
    lines.append(f'new file mode {new[1]}\n')
  elif new is None:
    lines.append(f'deleted file mode {old[1]}\n')
  elif old[1] != new[1]:
    lines += [f'old mode {old[1]}\n', f'new mode {new[1]}\n']
  a = _text(old[0]) if old else ''
  b = _text(new[0]) if new else ''
  if a is None or b is None:
    return ''.join(lines) + f'Binary files a/{rel} and b/{rel} differ\n'
  body = difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                              f'a/{rel}' if old else '/dev/null',
                              f'b/{rel}' if new else '/dev/null')
  for line in body:
    lines.append(line if line.endswith('\n') else line + '\n\\ No newline at end of file\n')
  return ''.join(lines)


def diff_trees(old_root: Path, new_root: Path) -> str:
  """Everything that differs between two trees, artifacts and .git left out."""
  rels = sorted(set(layout.iter_files(old_root)) | set(layout.iter_files(new_root)))
  sections = []
  for rel in rels:
    old, new = read_entry(old_root / rel), read_entry(new_root / rel)
    if old != new:
      sections.append(file_diff(rel, old, new))
  return ''.join(sections)


def _strip(path: str) -> str | None:
  """A header path as `git apply -p1` reads it; None for /dev/null."""
  path = path.rstrip('\n').split('\t')[0]
  if path == '/dev/null':
    return None
  if path.startswith('"'):
    raise PatchError(f'quoted path in patch: {path}')
  parts = path.split('/', 1)
  if len(parts) != 2 or not parts[1]:
    raise PatchError(f'path without a/ or b/ prefix: {path}')
  return parts[1]


def parse(patch: str) -> list[FileSection]:
  """Splits a patch into file sections; the text before the first one is ignored."""
  lines = patch.splitlines(keepends=True)
  git_style = any(line.startswith('diff --git ') for line in lines)
  starts = [i for i, line in enumerate(lines)
            if (line.startswith('diff --git ') if git_style else
                line.startswith('--- ') and i + 1 < len(lines) and lines[i + 1].startswith('+++ '))]
  if patch.strip() and not starts:
    raise PatchError('no file sections in patch')
  sections = []
  for start, end in zip(starts, starts[1:] + [len(lines)]):
    chunk = lines[start:end]
    old = new = None
    header_paths = []
    modes, binary = set(), False
    for line in chunk:
      if line.startswith('@@'):
        break
      key, _, value = line.partition(' ')
      if line.startswith('diff --git '):
        header_paths = line[len('diff --git '):].split()
      elif key == '---':
        old = _strip(value)
      elif key == '+++':
        new = _strip(value)
      elif line.startswith(('rename from ', 'copy from ')):
        old = line.split(' ', 2)[2].rstrip('\n')
      elif line.startswith(('rename to ', 'copy to ')):
        new = line.split(' ', 2)[2].rstrip('\n')
      elif line.startswith(('new file mode ', 'deleted file mode ', 'old mode ', 'new mode ')):
        modes.add(line.split()[-1])
      elif line.startswith(('Binary files ', 'GIT binary patch')):
        binary = True
    if old is None and new is None:
      if len(header_paths) != 2:
        raise PatchError(f'cannot read the paths of: {chunk[0].strip()}')
      # A section without hunks (mode change, binary, empty file) names its file only here.
      old, new = _strip(header_paths[0]), _strip(header_paths[1])
      text = ''.join(chunk)
      if 'new file mode' in text:
        old = None
      if 'deleted file mode' in text:
        new = None
    sections.append(FileSection(old, new, ''.join(chunk), binary, frozenset(modes)))
  return sections


def is_safe_path(rel: str) -> bool:
  p = PurePosixPath(rel)
  return bool(rel) and not p.is_absolute() and '..' not in p.parts and '\\' not in rel and all(
      part not in ('', '.') for part in rel.split('/'))


def apply(tree: Path, sections: list[FileSection]) -> None:
  """Applies sections to a tree with `git apply` (which also refuses to write through symlinks)."""
  if not sections:
    return
  with tempfile.NamedTemporaryFile('w', suffix='.patch', delete=False) as f:
    f.write(''.join(s.text for s in sections))
  env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOME': '/nonexistent',
         'GIT_CONFIG_NOSYSTEM': '1', 'GIT_CEILING_DIRECTORIES': str(tree.parent)}
  try:
    proc = subprocess.run(['git', 'apply', '--whitespace=nowarn', f.name], cwd=tree, env=env,
                          capture_output=True, text=True)
  finally:
    os.unlink(f.name)
  if proc.returncode:
    raise PatchError(f'patch does not apply: {proc.stderr.strip()[:500]}')
