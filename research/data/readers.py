"""Random-access text sources for grain: JSONL files and ArrayRecord files.

Both yield one document's text per index. A JSONL line and an ArrayRecord record hold the same thing,
a JSON object whose `field` (default "text") is the document, so `write_array_record` converts one
into the other.
"""

import glob
import json
import os

import grain


def expand(pattern: str) -> list[str]:
  """Comma-separated globs -> sorted files; fails naming the pattern that matched nothing."""
  files = []
  for p in filter(None, (s.strip() for s in pattern.split(','))):
    hits = sorted(glob.glob(os.path.expanduser(p)))
    if not hits:
      raise FileNotFoundError(f'data files {p!r} match no file')
    files += hits
  if not files:
    raise ValueError('no data files given')
  return files


def _text(raw: bytes | str, field: str, where: str) -> str:
  try:
    obj = json.loads(raw)
    return obj[field]
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f'{where}: expected a JSON object with a {field!r} string ({e!r})') from None


class JsonlSource:
  """Documents of JSONL files; line offsets are indexed once at open, lines read on demand."""

  def __init__(self, pattern: str, field: str = 'text'):
    self.field = field
    self._index = []  # (file, byte offset) per non-empty line.
    for path in expand(pattern):
      with open(path, 'rb') as f:
        offset = 0
        for line in f:
          if line.strip():
            self._index.append((path, offset))
          offset += len(line)

  def __len__(self) -> int:
    return len(self._index)

  def __getitem__(self, i: int) -> str:
    path, offset = self._index[i]
    with open(path, 'rb') as f:
      f.seek(offset)
      return _text(f.readline(), self.field, f'{path} at byte {offset}')


class ArrayRecordSource:
  """Documents of ArrayRecord files, each record a UTF-8 JSON object."""

  def __init__(self, pattern: str, field: str = 'text'):
    self.field = field
    self._src = grain.sources.ArrayRecordDataSource(expand(pattern))

  def __len__(self) -> int:
    return len(self._src)

  def __getitem__(self, i: int) -> str:
    return _text(self._src[i], self.field, f'ArrayRecord record {i}')


def write_array_record(path: str, texts, field: str = 'text'):
  """Writes documents as ArrayRecord records (e.g. to convert a JSONL corpus)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1')
  for t in texts:
    writer.write(json.dumps({field: t}).encode())
  writer.close()
