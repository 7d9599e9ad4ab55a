"""Git-style unified diffs: made from two trees, parsed into per-file sections, applied."""
import dataclasses
import difflib
import os
from pathlib import Path, PurePosixPath
import re
import subprocess

from research.tasks import layout

SYMLINK_MODE, GITLINK_MODE = '120000', '160000'


class PatchError(ValueError):
  """A patch that cannot be parsed or applied."""
  tampering = False

  @property
  def flags(self) -> list[str]:
    """Tamper flags for the grade: errors no honest patch can cause."""
    return [f'{type(self).__doc__.split(":")[0]}: {self}'] if self.tampering else []


class SmuggledSection(PatchError):
  """Smuggled file section: one git applies without a `diff --git` line starting it."""
  tampering = True


class RefusedPath(PatchError):
  """Path git refuses: it would write through a symlink, or is not a valid path."""
  tampering = True


@dataclasses.dataclass(frozen=True)
class FileSection:
  """The part of a patch that changes one file."""
  old_path: str | None  # None for a created file.
  new_path: str | None  # None for a deleted file.
  text: str
  binary: bool
  modes: frozenset[str]
  added: int  # Lines, as `git apply --numstat` counts them.
  deleted: int

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
  path = path.split('\t')[0]
  if path == '/dev/null':
    return None
  if path.startswith('"'):
    raise PatchError(f'quoted path in patch: {path}')
  parts = path.split('/', 1)
  if len(parts) != 2 or not parts[1]:
    raise PatchError(f'path without a/ or b/ prefix: {path}')
  return parts[1]


_HUNK = re.compile(r'@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(?: .*)?')
_MODE = r'(?P<mode>[0-7]{6})'
# The extended header lines `git diff` writes; each at most once per section.
_EXTENDED = {k: re.compile(v) for k, v in {
    'old mode': 'old mode ' + _MODE, 'new mode': 'new mode ' + _MODE,
    'deleted file mode': 'deleted file mode ' + _MODE, 'new file mode': 'new file mode ' + _MODE,
    'similarity index': r'similarity index \d{1,3}%',
    'dissimilarity index': r'dissimilarity index \d{1,3}%',
    'rename from': r'rename from (?P<path>\S+)', 'rename to': r'rename to (?P<path>\S+)',
    'copy from': r'copy from (?P<path>\S+)', 'copy to': r'copy to (?P<path>\S+)',
    'index': r'index [0-9a-f]{7,64}\.\.[0-9a-f]{7,64}(?: ' + _MODE + ')?'}.items()}
_BASE85 = re.compile(r'[A-Za-z][0-9A-Za-z!#$%&()*+;<=>?@^_`{|}~-]{5,}')


class _Lines:
  """The lines of a patch, split at '\\n' only (as git does), with a cursor."""

  def __init__(self, patch: str):
    if patch and not patch.endswith('\n'):
      raise PatchError('patch does not end with a newline')
    self.lines = patch.split('\n')[:-1]
    self.i = 0

  def peek(self) -> str | None:
    return self.lines[self.i] if self.i < len(self.lines) else None

  def take(self) -> str:
    self.i += 1
    return self.lines[self.i - 1]

  def header(self) -> str:
    """The next line, which must be a header line: printable, tabs allowed (`diff -u` puts
    a timestamp after one on `---`/`+++` lines; `_strip` cuts it off, as git does)."""
    line = self.take()
    if not line.replace('\t', ' ').isprintable():
      raise PatchError(f'control character in header line {self.i}: {line[:80]!r}')
    return line


def _hunks(lines: _Lines) -> tuple[int, int]:
  """Reads the hunks of one section, exactly as long as their headers say; (added, deleted)."""
  added = deleted = 0
  while (line := lines.peek()) is not None and line.startswith('@@'):
    match = _HUNK.fullmatch(lines.header())
    if not match:
      raise PatchError(f'malformed hunk header at line {lines.i}: {line[:80]!r}')
    old, new = (int(n) if n is not None else 1 for n in match.group(2, 4))
    while old or new:
      body = lines.peek()
      kind = body[:1] if body is not None else 'end of patch'
      if kind not in (' ', '-', '+') or (kind != '+' and not old) or (kind != '-' and not new):
        raise PatchError(f'hunk at line {lines.i} shorter than its header says '
                         f'(then {kind!r})')
      lines.take()
      old -= kind != '+'
      new -= kind != '-'
      added += kind == '+'
      deleted += kind == '-'
      if (lines.peek() or '').startswith('\\'):
        if lines.header() != '\\ No newline at end of file':
          raise PatchError(f'unknown marker at line {lines.i}')
  if not added + deleted:
    raise PatchError(f'file section without hunks ending at line {lines.i}')
  return added, deleted


def _binary(lines: _Lines) -> None:
  """Skips a `GIT binary patch` body: literal or delta blocks of base85 lines."""
  for _ in range(2):  # Forward and reverse.
    if not re.fullmatch(r'(literal|delta) \d+', lines.peek() or ''):
      break
    lines.header()
    while _BASE85.fullmatch(lines.peek() or ''):
      lines.take()
    if lines.peek() != '':
      raise PatchError(f'malformed binary patch at line {lines.i + 1}')
    lines.take()


def _extended(lines: _Lines) -> dict[str, re.Match]:
  found = {}
  while (line := lines.peek()) is not None and not line.startswith(('diff --git ', '--- ')):
    name = next((k for k, r in _EXTENDED.items() if r.fullmatch(line)), None)
    if name is None:
      break
    if name in found:
      raise PatchError(f'{name} twice at line {lines.i + 1}')
    found[name] = _EXTENDED[name].fullmatch(lines.header())
  return found


def _git_section(lines: _Lines) -> FileSection:
  """One section that starts with `diff --git a/X b/Y`."""
  start = lines.i
  parts = lines.header().split(' ')
  if len(parts) != 4:
    raise PatchError(f'cannot read the paths of line {lines.i} (spaces in a path?)')
  old, new = _strip(parts[2]), _strip(parts[3])
  ext = _extended(lines)
  moved = {k: ext[k]['path'] for k in ('rename from', 'rename to', 'copy from', 'copy to')
           if k in ext}
  if moved:
    if (sorted(moved) not in (['rename from', 'rename to'], ['copy from', 'copy to'])
        or [old, new] != list(moved.values())):
      raise PatchError(f'rename or copy lines disagree with line {start + 1}')
  elif old != new:
    raise PatchError(f'two paths without a rename at line {start + 1}')
  old = None if 'new file mode' in ext else old
  new = None if 'deleted file mode' in ext else new
  modes = frozenset(m['mode'] for m in ext.values() if 'mode' in m.groupdict() and m['mode'])
  added = deleted = 0
  binary = False
  line = lines.peek() or ''
  if line.startswith('Binary files '):
    binary = bool(lines.header())
  elif line == 'GIT binary patch':
    binary = bool(lines.header())
    _binary(lines)
  elif line.startswith('--- '):
    if _strip(lines.header()[4:]) != old or not (lines.peek() or '').startswith('+++ ') or (
        _strip(lines.header()[4:]) != new):
      raise PatchError(f'---/+++ lines disagree with line {start + 1}')
    added, deleted = _hunks(lines)
  return FileSection(old, new, _join(lines.lines[start:lines.i]), binary, modes, added, deleted)


def _plain_section(lines: _Lines) -> FileSection:
  """One section of a plain unified diff: `--- a/X`, `+++ b/X`, hunks."""
  start = lines.i
  old = _strip(lines.header()[4:])
  if not (lines.peek() or '').startswith('+++ '):
    raise PatchError(f'--- without +++ at line {lines.i}')
  new = _strip(lines.header()[4:])
  if old is None and new is None or old and new and old != new:
    raise PatchError(f'cannot read the path of the section at line {start + 1}')
  added, deleted = _hunks(lines)
  return FileSection(old, new, _join(lines.lines[start:lines.i]), False, frozenset(), added,
                     deleted)


def _join(lines: list[str]) -> str:
  return ''.join(line + '\n' for line in lines)


def parse(patch: str) -> list[FileSection]:
  """Splits a patch into file sections, accounting for every line.

  Anything `git diff` does not write is an error: text before, between or after sections, a hunk
  longer or shorter than its header, a section without a `diff --git` line in a git-style patch
  (git would apply it; this is how a test file gets smuggled in after an allowed hunk).
  """
  lines = _Lines(patch)
  if not patch.strip():
    return []
  git_style = patch.startswith('diff --git ')
  if not git_style and not patch.startswith('--- '):
    raise PatchError(f'text before the first file section: {lines.peek()[:80]!r}')
  sections = []
  while (line := lines.peek()) is not None:
    if git_style and line.startswith('diff --git '):
      sections.append(_git_section(lines))
    elif not git_style and line.startswith('--- '):
      sections.append(_plain_section(lines))
    else:
      error = SmuggledSection if line.startswith(('--- ', '+++ ', 'diff ')) else PatchError
      raise error(f'line {lines.i + 1} is not part of a file section: {line[:80]!r}')
  return sections


def is_safe_path(rel: str) -> bool:
  p = PurePosixPath(rel)
  return bool(rel) and rel.isprintable() and not p.is_absolute() and '..' not in p.parts and (
      '\\' not in rel) and all(part not in ('', '.') for part in rel.split('/'))


def _git_apply(tree: Path, args: list[str], sections: list[FileSection]
               ) -> subprocess.CompletedProcess:
  """`git apply ARGS` on the sections' text in `tree`, with no repository or config around it."""
  env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOME': '/nonexistent',
         'GIT_CONFIG_NOSYSTEM': '1', 'GIT_CEILING_DIRECTORIES': str(tree.parent)}
  return subprocess.run(['git', 'apply', *args], cwd=tree, env=env, capture_output=True,
                        input=''.join(s.text for s in sections).encode())


# What git says when it will not write a path: tampering, not a patch that does not fit.
_REFUSALS = re.compile(r'beyond a symbolic link|invalid path|unsafe', re.I)


def apply(tree: Path, sections: list[FileSection]) -> None:
  """Applies sections to a tree with `git apply` (which also refuses to write through symlinks)."""
  if not sections:
    return
  proc = _git_apply(tree, ['--whitespace=nowarn'], sections)
  if proc.returncode:
    stderr = proc.stderr.decode(errors='replace').strip()[:500]
    error = RefusedPath if _REFUSALS.search(stderr) else PatchError
    raise error(f'patch does not apply: {stderr}')


def misreadings(tree: Path, sections: list[FileSection]) -> list[str]:
  """Where `git apply --numstat` reads the sections otherwise than `parse` did (files, counts)."""
  proc = _git_apply(tree, ['--numstat', '-z'], sections)
  if proc.returncode:
    return [f'git cannot read the patch: {proc.stderr.decode(errors="replace").strip()[:300]}']
  theirs = [tuple(entry.split('\t', 2))
            for entry in proc.stdout.decode(errors='surrogateescape').split('\0')[:-1]]
  ours = [('-', '-') if s.binary else (str(s.added), str(s.deleted)) for s in sections]
  ours = [(*counts, s.new_path or s.old_path) for counts, s in zip(ours, sections)]
  if theirs == ours:
    return []
  return [f'git reads the patch as {theirs[:5]}, the grader as {ours[:5]}']


def snapshot(root: Path) -> dict[str, tuple[bytes, str]]:
  """(content, mode) of every file and link under root, artifacts included."""
  return {rel: read_entry(root / rel) for rel in layout.iter_files(root, skip_artifacts=False)}
