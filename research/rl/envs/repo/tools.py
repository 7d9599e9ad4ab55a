"""The repository environment's file tools, kept inside the work area: view, search, str_replace,
insert, create; and the linter an edit's observation shows. The shell tool (`run`) lives in
env.py: it needs the sandbox. A tool that refuses raises `ToolError` (calls.py), whose text is
the observation.
"""

import ast
import difflib
import json
import os
from pathlib import Path, PurePosixPath
import re
import subprocess
import sys

from research.rl.envs.repo.calls import Missing, ToolError
from research.tasks import layout


def nearest(root: Path, rel: str) -> str:
  """The existing path closest to `rel`: same file name, else most similar, else an ancestor."""
  files = list(layout.iter_files(root))
  paths = files + sorted({str(PurePosixPath(f).parent) for f in files} - {'.'})
  name = PurePosixPath(rel).name
  same = [p for p in paths if PurePosixPath(p).name == name]
  close = same or difflib.get_close_matches(rel, paths, n=1, cutoff=0.6)
  if close:
    return close[0]
  for parent in PurePosixPath(rel).parents:
    if (root / parent).is_dir():
      return str(parent)
  return '.'


def resolve(root: Path, rel: str, must_exist: bool = True) -> Path:
  """`rel` inside the work area; refuses absolute paths, `..` and links that lead outside."""
  p = PurePosixPath(rel)
  if not rel.strip():
    raise ToolError('give a path relative to the repository root')
  if not is_text(rel) or not rel.isprintable():
    raise ToolError('a path must be printable UTF-8 text')
  if len(p.parts) > MAX_DEPTH or len(rel.encode()) > MAX_PATH:
    raise ToolError(f'{rel[:80]}...: paths are at most {MAX_DEPTH} parts and {MAX_PATH} bytes long')
  if p.is_absolute():
    raise ToolError(f'{rel}: absolute paths are refused; give a path relative to the repository root')
  if '..' in p.parts:
    raise ToolError(f'{rel}: ".." is refused; paths stay inside the repository')
  full = root.joinpath(*p.parts)
  base = os.path.realpath(root)
  real = os.path.realpath(full)
  if real != base and not real.startswith(base + os.sep):
    raise ToolError(f'{rel}: a link that leads outside the repository is refused')
  if must_exist and not os.path.lexists(full):
    raise Missing(str(p), nearest(root, str(p)))
  return full


# How deep and long a path in the work area may be: the harness walks it host-side (Python's own
# walks recurse; the kernel refuses paths of more than PATH_MAX bytes).
MAX_DEPTH, MAX_PATH = 64, 1024


def survey(root: Path, most_entries: float = float('inf'), most_bytes: float = float('inf')
           ) -> tuple[int, int, str | None]:
  """(entries, bytes in regular files, the first problem) of a tree, without following links.

  A problem: more entries or bytes than allowed, a path deeper or longer than MAX_DEPTH /
  MAX_PATH, a name that is not printable UTF-8 (it could not be shown, diffed or tokenized), a
  directory that cannot be read. The walk is iterative, stops at the first problem and skips
  what vanishes under it (a command still running)."""
  entries = size = 0
  stack = ['']
  while stack:
    rel = stack.pop()
    try:
      with os.scandir(root / rel if rel else root) as it:
        found = list(it)
    except (FileNotFoundError, NotADirectoryError):
      continue
    except OSError as e:
      return entries, size, f'{rel!r} cannot be read ({e.strerror})'
    for entry in found:
      sub = f'{rel}/{entry.name}' if rel else entry.name
      if not (is_text(entry.name) and entry.name.isprintable()):
        return entries, size, f'{sub!r} is not a printable UTF-8 name'
      if sub.count('/') >= MAX_DEPTH or len(sub.encode()) > MAX_PATH:
        return entries, size, f'{sub[:80]!r}... is deeper than {MAX_DEPTH} or longer than {MAX_PATH} bytes'
      entries += 1
      try:
        if entry.is_dir(follow_symlinks=False):
          stack.append(sub)
        elif entry.is_file(follow_symlinks=False):
          size += entry.stat(follow_symlinks=False).st_size
      except FileNotFoundError:
        continue
      if entries > most_entries or size > most_bytes:
        return entries, size, (f'holds more than {most_entries} entries' if entries > most_entries
                               else f'holds more than {most_bytes >> 20} MiB')
  return entries, size, None


def is_text(s: str) -> bool:
  """Whether a string can reach the file system (no NUL, no lone surrogates)."""
  try:
    s.encode()
  except UnicodeEncodeError:
    return False
  return '\0' not in s


def _write(path: Path, text: str) -> None:
  if not is_text(text):
    raise ToolError('the text must be UTF-8 without NUL bytes')
  path.write_text(text)


def _read(path: Path, rel: str) -> str:
  if not path.is_file():
    raise ToolError(f'{rel} is not a file')
  return path.read_text(errors='replace')


def _numbered(lines: list[str], first: int) -> str:
  return ''.join(f'{first + k:6d}\t{line}' if line.endswith('\n') else f'{first + k:6d}\t{line}\n'
                 for k, line in enumerate(lines))


def _fit(lines: list[str], most: int) -> int:
  """How many of the lines, numbered, make more than `most` characters."""
  n = size = 0
  while n < len(lines) and size <= most:
    size, n = size + len(lines[n]) + 7, n + 1  # At least what `_numbered` makes of it.
  return n


def view(root: Path, path: str, start: int = 1, end: int = -1, most: int | None = None) -> str:
  """`most`: the observation's size; only the head and tail lines that fill it are numbered (all
  of a file of 8 MiB of newlines took 6 s and 0.8 GB, for an observation that keeps 6000 chars)."""
  full = resolve(root, path)
  if full.is_dir():
    files = list(layout.iter_files(full))
    return f'{path}/ holds {len(files)} files:\n' + ''.join(f'{f}\n' for f in files)
  lines = _read(full, path).splitlines(keepends=True)
  last = len(lines) if end == -1 else end
  if not 1 <= start <= max(last, 1) or last > len(lines):
    raise ToolError(f'{path} has {len(lines)} lines; lines {start}..{end} are out of range')
  lines = lines[start - 1:last]
  head = tail = len(lines)
  if most is not None:
    head, tail = _fit(lines, most // 2), _fit(lines[::-1], most // 2)
  if head + tail >= len(lines):
    return _numbered(lines, start)
  cut = len(lines) - head - tail
  return (_numbered(lines[:head], start) + f'[... {cut} lines ...]\n'
          + _numbered(lines[head + cut:], start + head + cut))


# The pattern is compiled and matched in a child process under a time limit: Python's `re`
# backtracks without bound (`(a+)+$` on a line of a's) without letting go of the GIL, and its
# parser recurses (a few thousand nested groups raise RecursionError), so a pattern handled here
# could stall every thread of the trainer or raise what the episode would be masked for.
_SEARCH = """
import json, os, re, sys
pattern, root, rels, most = json.load(sys.stdin)
try:
  regex = re.compile(pattern)
except (re.error, RecursionError, OverflowError) as e:
  json.dump(['error', str(e)], sys.stdout)
  sys.exit()
hits, n = [], 0
for rel in rels:
  f = os.path.join(root, rel)
  if os.path.islink(f) or not os.path.isfile(f):
    continue
  with open(f, errors='replace') as text:
    for k, line in enumerate(text.read().splitlines(), 1):
      if regex.search(line):
        n += 1
        if n <= most:
          hits.append(f'{rel}:{k}: {line[:300]}')  # A line may be megabytes long.
json.dump([hits, n], sys.stdout)
"""
SEARCH_S = 5.0


def search(root: Path, pattern: str, path: str = '.', max_matches: int = 100) -> str:
  if not is_text(pattern):
    raise ToolError('the pattern must be UTF-8 text without NUL bytes')
  full = resolve(root, path)
  if full.is_dir():
    rels = [PurePosixPath(path, f).as_posix() for f in layout.iter_files(full)]
  else:
    rels = [str(PurePosixPath(path))]
  try:
    out = subprocess.run([sys.executable, '-I', '-S', '-c', _SEARCH], capture_output=True,
                         timeout=SEARCH_S, input=json.dumps([pattern, str(root), rels,
                                                             max_matches]).encode())
  except subprocess.TimeoutExpired:
    raise ToolError(f'the search for {pattern!r} took more than {SEARCH_S:g}s; '
                    'give a simpler pattern or a narrower path') from None
  if out.returncode:
    raise ToolError(f'the search for {pattern!r} failed: '
                    f'{out.stderr.decode(errors="replace").strip()[-200:]}')
  hits, n = json.loads(out.stdout)
  if hits == 'error':
    raise ToolError(f'bad regular expression {pattern!r}: {n}')
  more = f'\n[{n - max_matches} more matches]' if n > max_matches else ''
  return '\n'.join(hits) + more if hits else f'no match for {pattern!r} in {path}'


def _snippet(text: str, first: int, last: int, context: int = 2) -> str:
  lines = text.splitlines(keepends=True)
  lo, hi = max(first - context, 1), min(last + context, len(lines))
  return _numbered(lines[lo - 1:hi], lo)


def matches(text: str, old: str, most: int = 100) -> int:
  """Where `old` starts in text, overlaps counted (x\\nx\\n is in x\\nx\\nx\\n twice), up to `most`."""
  n, at = 0, text.find(old) if old else -1
  while at != -1 and n < most:
    n, at = n + 1, text.find(old, at + 1)
  return n


def str_replace(root: Path, path: str, old: str, new: str) -> str:
  full = resolve(root, path)
  text = _read(full, path)
  count = matches(text, old)
  if count != 1:
    raise ToolError(f'old text found {count} times in {path}; it must match exactly once '
                    '(copy the lines exactly, whitespace included, and add lines to make it unique)')
  at = text.index(old)
  text = text[:at] + new + text[at + len(old):]
  _write(full, text)
  first = text.count('\n', 0, at) + 1
  return f'Edited {path}:\n' + _snippet(text, first, first + new.count('\n'))


def insert(root: Path, path: str, line: int, text: str) -> str:
  full = resolve(root, path)
  lines = _read(full, path).splitlines(keepends=True)
  if not 0 <= line <= len(lines):
    raise ToolError(f'{path} has {len(lines)} lines; line must be in 0..{len(lines)}')
  if lines and not lines[-1].endswith('\n'):
    lines[-1] += '\n'
  new = text if text.endswith('\n') else text + '\n'
  out = ''.join(lines[:line]) + new + ''.join(lines[line:])
  _write(full, out)
  return f'Edited {path}:\n' + _snippet(out, line + 1, line + new.count('\n'))


def create(root: Path, path: str, text: str) -> str:
  full = resolve(root, path, must_exist=False)
  if os.path.lexists(full):
    raise ToolError(f'{path} exists; change it with str_replace or insert')
  if not is_text(text):
    raise ToolError('the text must be UTF-8 without NUL bytes')
  full.parent.mkdir(parents=True, exist_ok=True)
  full.write_text(text)
  return f'Created {path} ({len(text.splitlines())} lines).'


# Sources longer than this are not linted: parsing 8 MiB of `x = 1` lines takes seconds and GBs.
LINT_CHARS = 1 << 20


def syntax_error(source: str) -> tuple[int, str] | None:
  """(line, message) of the first syntax error in Python source, None when it parses (or is
  longer than LINT_CHARS)."""
  if len(source) > LINT_CHARS:
    return None
  try:
    layout.parse_source(source)
  except SyntaxError as e:
    return e.lineno or 0, e.msg
  except (RecursionError, MemoryError) as e:  # Nesting a few thousand deep (`- - - ... 1`).
    return 0, f'too deeply nested for the parser ({type(e).__name__})'
  return None


def docstring(source: str, qualname: str) -> str | None:
  """The docstring of a function or method (`Class.method`) in source, if it has one."""
  try:
    scope = layout.parse_source(source)
  except SyntaxError:
    return None
  for part in qualname.split('.'):
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    scope = next((n for n in scope.body if isinstance(n, kinds) and n.name == part), None)
    if scope is None:
      return None
  return ast.get_docstring(scope)
