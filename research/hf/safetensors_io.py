"""Streaming safetensors reading and writing, one tensor (or one slice of one) in memory at a time.

The format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}}
(offsets relative to the end of the header), then the raw little-endian bytes. Reads use positioned
file reads into fresh buffers (not mmap), so the page cache, not the process, holds the file and a
converted tensor is freed as soon as it has been written. The `safetensors` package itself cannot
return bfloat16 or float8 as numpy, hence this small reader; ml_dtypes provides those types.
"""

import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping

import ml_dtypes
import numpy as np

DTYPES = {
    'F64': np.dtype(np.float64), 'F32': np.dtype(np.float32), 'F16': np.dtype(np.float16),
    'BF16': np.dtype(ml_dtypes.bfloat16), 'F8_E4M3': np.dtype(ml_dtypes.float8_e4m3fn),
    'F8_E5M2': np.dtype(ml_dtypes.float8_e5m2), 'I64': np.dtype(np.int64), 'I32': np.dtype(np.int32),
    'I16': np.dtype(np.int16), 'I8': np.dtype(np.int8), 'U8': np.dtype(np.uint8),
    'BOOL': np.dtype(np.bool_),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
INDEX_FILE = 'model.safetensors.index.json'
SINGLE_FILE = 'model.safetensors'


class SafetensorsError(ValueError):
  pass


class ShardReader:
  """Lazily reads tensors (or leading-axis ranges of them) from one .safetensors file."""

  def __init__(self, path: str):
    self.path = path
    try:
      self._f = open(path, 'rb')
    except FileNotFoundError:
      raise SafetensorsError(f'missing shard {path}') from None
    raw = self._f.read(8)
    if len(raw) != 8:
      raise SafetensorsError(f'{path}: truncated safetensors header')
    (n,) = struct.unpack('<Q', raw)
    try:
      header = json.loads(self._f.read(n))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise SafetensorsError(f'{path}: unreadable safetensors header ({e})') from None
    self.metadata = header.pop('__metadata__', {}) or {}
    self._start = 8 + n
    self.entries = header
    size = os.fstat(self._f.fileno()).st_size
    for name, e in header.items():
      if e['dtype'] not in DTYPES:
        raise SafetensorsError(f'{path}: tensor {name!r} has unsupported dtype {e["dtype"]}')
      want = int(np.prod(e['shape'], dtype=np.int64)) * DTYPES[e['dtype']].itemsize
      begin, end = e['data_offsets']
      if end - begin != want or self._start + end > size:
        raise SafetensorsError(f'{path}: tensor {name!r} is truncated or its header is inconsistent '
                               f'(shape {e["shape"]}, {e["dtype"]}, bytes {begin}..{end}, file {size})')

  def close(self):
    self._f.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def keys(self) -> list[str]:
    """Tensor names in file order."""
    return sorted(self.entries, key=lambda k: self.entries[k]['data_offsets'][0])

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.entries[name]['shape'])

  def dtype(self, name: str) -> np.dtype:
    return DTYPES[self.entries[name]['dtype']]

  def read(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
    """The tensor, or rows start:stop of its leading axis (one contiguous read either way)."""
    e = self.entries[name]
    shape, dt = list(e['shape']), DTYPES[e['dtype']]
    begin = e['data_offsets'][0]
    if start is not None:
      row = int(np.prod(shape[1:], dtype=np.int64)) * dt.itemsize
      begin += start * row
      shape[0] = stop - start
    out = np.empty(shape, dt)
    buf = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(buf):  # os.preadv may return short reads.
      got = os.preadv(self._f.fileno(), [buf[done:]], self._start + begin + done)
      if got <= 0:
        raise SafetensorsError(f'{self.path}: unexpected end of file reading {name!r}')
      done += got
    return out


class Folder:
  """A checkpoint folder: model.safetensors, or shards listed by model.safetensors.index.json."""

  def __init__(self, path: str):
    self.path = path
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        self.weight_map = json.load(f)['weight_map']
    elif os.path.exists(os.path.join(path, SINGLE_FILE)):
      with ShardReader(os.path.join(path, SINGLE_FILE)) as r:
        self.weight_map = {k: SINGLE_FILE for k in r.keys()}
    else:
      raise SafetensorsError(f'{path}: no {SINGLE_FILE} or {INDEX_FILE}')
    self.shards = sorted(set(self.weight_map.values()))
    missing = [s for s in self.shards if not os.path.exists(os.path.join(path, s))]
    if missing:
      raise SafetensorsError(f'{path}: missing shard(s) {missing} listed in {INDEX_FILE} (they hold '
                             f'e.g. {next(k for k, v in self.weight_map.items() if v == missing[0])!r})')
    self._open: dict[str, ShardReader] = {}

  def reader(self, shard: str) -> ShardReader:
    if shard not in self._open:
      self._open[shard] = ShardReader(os.path.join(self.path, shard))
    return self._open[shard]

  def release(self, shard: str):
    """Closes one shard's reader (it reopens on demand)."""
    r = self._open.pop(shard, None)
    if r:
      r.close()

  def shard_of(self, name: str) -> ShardReader:
    if name not in self.weight_map:
      raise SafetensorsError(f'{self.path}: tensor {name!r} is not in the checkpoint')
    return self.reader(self.weight_map[name])

  def read(self, name: str, start: int | None = None, stop: int | None = None) -> np.ndarray:
    return self.shard_of(name).read(name, start, stop)

  def shape(self, name: str) -> tuple[int, ...]:
    return self.shard_of(name).shape(name)

  def shard_sizes(self) -> dict[str, int]:
    return {s: os.path.getsize(os.path.join(self.path, s)) for s in self.shards}

  def close(self):
    for r in self._open.values():
      r.close()
    self._open.clear()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _header(specs: Iterable[tuple[str, tuple[int, ...], np.dtype]], metadata=None) -> tuple[bytes, int]:
  header, offset = {}, 0
  if metadata:
    header['__metadata__'] = dict(metadata)
  for name, shape, dt in specs:
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
    header[name] = {'dtype': DTYPE_NAMES[np.dtype(dt)], 'shape': list(shape),
                    'data_offsets': [offset, offset + n]}
    offset += n
  raw = json.dumps(header, separators=(',', ':')).encode()
  raw += b' ' * (-len(raw) % 8)  # The reference writer aligns the data to 8 bytes.
  return struct.pack('<Q', len(raw)) + raw, offset


class ShardWriter:
  """Writes one shard whose tensor list is known up front, in that order, one tensor at a time.

  A tensor may come whole or as consecutive pieces of its leading axis (experts of gate_up_proj).
  """

  def __init__(self, path: str, specs: list[tuple[str, tuple[int, ...], np.dtype]], metadata=None):
    self.path, self._specs, self._next, self._rows = path, specs, 0, 0
    header, self.nbytes = _header(specs, metadata or {'format': 'pt'})
    self._f = open(path, 'wb')
    self._f.write(header)

  def write(self, name: str, x: np.ndarray):
    if self._next >= len(self._specs):
      raise SafetensorsError(f'{self.path}: no room for {name}')
    want, shape, dt = self._specs[self._next]
    shape = tuple(shape)
    rows = x.shape[0] if x.ndim and shape else None
    ok = (name == want and x.dtype == np.dtype(dt) and
          (tuple(x.shape) == shape if rows is None else
           (tuple(x.shape[1:]) == shape[1:] and self._rows + rows <= shape[0])))
    if not ok:
      raise SafetensorsError(f'{self.path}: expected {want} {shape} {np.dtype(dt)} (rows from '
                             f'{self._rows}), got {name} {tuple(x.shape)} {x.dtype}')
    self._f.write(np.ascontiguousarray(x).reshape(-1).view(np.uint8).data)
    self._rows += rows or 0
    if rows is None or self._rows == shape[0]:
      self._next, self._rows = self._next + 1, 0

  def close(self):
    self._f.close()
    if self._next != len(self._specs):
      raise SafetensorsError(f'{self.path}: {len(self._specs) - self._next} tensor(s) never written')


def plan_shards(specs: list[tuple[str, tuple[int, ...], np.dtype]], max_shard_bytes: int
                ) -> list[list[tuple[str, tuple[int, ...], np.dtype]]]:
  """Greedy split into shards of at most max_shard_bytes (a larger tensor gets a shard of its own)."""
  shards, cur, size = [], [], 0
  for s in specs:
    n = int(np.prod(s[1], dtype=np.int64)) * np.dtype(s[2]).itemsize
    if cur and size + n > max_shard_bytes:
      shards.append(cur)
      cur, size = [], 0
    cur.append(s)
    size += n
  if cur:
    shards.append(cur)
  return shards


def shard_names(n: int) -> list[str]:
  return [SINGLE_FILE] if n == 1 else [f'model-{i + 1:05d}-of-{n:05d}.safetensors' for i in range(n)]


def write_index(path: str, weight_map: Mapping[str, str], total_size: int):
  with open(os.path.join(path, INDEX_FILE), 'w') as f:
    json.dump({'metadata': {'total_size': total_size}, 'weight_map': dict(sorted(weight_map.items()))},
              f, indent=2)


def write_folder(path: str, shards: list[list[tuple[str, tuple[int, ...], np.dtype]]],
                 pieces: Callable[[str], Iterable[np.ndarray]]) -> dict[str, str]:
  """Writes planned shards (and the index, when there are several) into the folder `path`.

  pieces(name) yields the tensor whole or as consecutive pieces of its leading axis, in its
  shard's dtype. Returns the weight map {tensor name: shard file}.
  """
  weight_map, total = {}, 0
  for fname, shard in zip(shard_names(len(shards)), shards):
    w = ShardWriter(os.path.join(path, fname), shard)
    for name, _, _ in shard:
      for x in pieces(name):
        w.write(name, x)
      weight_map[name] = fname
    w.close()
    total += w.nbytes
  if len(shards) > 1:
    write_index(path, weight_map, total)
  return weight_map
