"""Grain input pipelines: documents -> chunks -> first-fit packed rows with segment ids -> batches.

A pipeline has `shards` virtual shards. Shard s reads documents s, s+S, s+2S, ... of the (seeded,
shuffled) document order, packs them into rows and contributes batch_size/S rows to every global
batch, in shard order. A host reads only the shards whose rows its devices hold, so the global batch
is the same for every number of hosts that divides `shards`, and a run can restart on another
topology. The iterator state, one small grain state per shard, is checkpointed with the model
(research/checkpoint).

    docs = pipeline.documents(config.data, 'train', seed)
    it = pipeline.Pipeline(docs, batch_size=16, seq_len=128, shards=8, seed=seed)
    batch = next(it)            # {'tokens', 'targets', 'segment_ids', 'loss_mask'}: int32 rows x T
    state = it.get_state()      # JSON-able {shard: state}; it.set_state(state) resumes exactly

Documents longer than a row are cut into row-sized chunks (nothing is dropped); a chunk's targets
are its inputs shifted by one, so no target crosses a document. Segment id 0 is padding.
"""

import dataclasses

import grain
import grain.experimental as gx
import numpy as np

from research import configs
from research.data import readers
from research.data import synthetic
from research.tokenizer.base import ByteTokenizer

SOURCES = ('synthetic', 'jsonl', 'array_record')
SPLITS = ('train', 'eval')
_BYTES = ByteTokenizer()


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """data: where documents come from and how they are batched."""
  batch_size: int = 16              # Global rows per step; divisible by data * fsdp * expert.
  seq_len: int = 128                # Tokens per row (documents are packed, longer ones cut).
  source: str = 'synthetic'         # 'synthetic', 'jsonl' or 'array_record'.
  train_files: str = ''             # Comma-separated globs of JSONL / ArrayRecord files.
  eval_files: str = ''              # The same for the eval split.
  text_field: str = 'text'          # JSON key of a document's text in a line / record.
  shards: int = 8                   # Virtual data shards: divides batch_size, a multiple of the hosts.

  def validate(self, path: str = 'data.') -> 'DataConfig':
    if self.source not in SOURCES:
      raise configs.invalid(path + 'source', self.source, f'expected one of {SOURCES}')
    for f in ('batch_size', 'seq_len', 'shards'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be positive')
    return self


def tokenize(text: str) -> np.ndarray:
  """Byte tokens ended by NUL, like the synthetic corpus, so a 256-token vocabulary reads files."""
  return np.array(_BYTES.encode(text) + [synthetic.EOS], np.int32)


def documents(cfg: DataConfig, split: str, seed: int) -> grain.MapDataset:
  """The split's token documents, in a deterministic order, repeated forever (train reshuffles)."""
  if split not in SPLITS:
    raise ValueError(f'split={split!r}: expected one of {SPLITS}')
  cfg = configs.from_dict(DataConfig, cfg, 'data')
  if cfg.source == 'synthetic':
    corpus = seed if split == 'train' else seed + 2**31  # A held-out corpus for eval.
    return grain.MapDataset.range(0, 2**62).map(lambda i: synthetic.document(corpus, i))
  files = cfg.train_files if split == 'train' else cfg.eval_files
  if not files:
    raise ValueError(f'data.{split}_files is empty: data.source={cfg.source!r} needs files')
  source = readers.JsonlSource if cfg.source == 'jsonl' else readers.ArrayRecordSource
  ds = grain.MapDataset.source(source(files, cfg.text_field)).map(tokenize)
  return (ds.shuffle(seed) if split == 'train' else ds).repeat()


class _Chunk(gx.FlatMapTransform):
  """A document -> {'inputs', 'targets'} chunks of at most seq_len tokens."""
  max_fan_out = 2**20

  def __init__(self, seq_len: int):
    self.seq_len = seq_len

  def flat_map(self, doc):
    n = len(doc) - 1  # Predictions a document holds.
    return [{'inputs': doc[i:min(i + self.seq_len, n)], 'targets': doc[i + 1:min(i + self.seq_len, n) + 1]}
            for i in range(0, n, self.seq_len)]


def _pack(docs: grain.MapDataset, seq_len: int, rows: int, seed: int) -> grain.DatasetIterator:
  # Two reader threads per shard (grain's default of 16 makes hundreds across shards).
  read = grain.ReadOptions(num_threads=2, prefetch_buffer_size=32)
  ds = gx.FlatMapIterDataset(docs.to_iter_dataset(read), _Chunk(seq_len))
  ds = gx.FirstFitPackIterDataset(ds, length_struct={'inputs': seq_len, 'targets': seq_len},
                                  num_packing_bins=max(rows, 8), seed=seed)
  return iter(ds.batch(rows, drop_remainder=True))


class Pipeline:
  """Host-local batches (rows host_rows[0]:host_rows[1] of each global batch); checkpointable."""

  def __init__(self, docs: grain.MapDataset, *, batch_size: int, seq_len: int, shards: int,
               seed: int, host_rows: tuple[int, int] | None = None):
    if shards < 1 or batch_size % shards:
      raise ValueError(f'data.shards={shards} must be positive and divide data.batch_size={batch_size}')
    rows = batch_size // shards
    lo, hi = host_rows or (0, batch_size)
    if lo % rows or hi % rows:
      raise ValueError(f'this host holds batch rows {lo}:{hi}, which is not a whole number of data '
                       f'shards of {rows} rows: make data.shards={shards} a multiple of the host count')
    self._its = {s: _pack(docs[s::shards], seq_len, rows, seed + s) for s in range(lo // rows, hi // rows)}

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(it) for it in self._its.values()]
    cat = lambda k: np.concatenate([p[k] for p in parts]).astype(np.int32)
    seg = cat('inputs_segment_ids')
    return {'tokens': cat('inputs'), 'targets': cat('targets'), 'segment_ids': seg,
            'loss_mask': (seg > 0).astype(np.int32)}

  @property
  def shards(self) -> list[int]:
    return list(self._its)

  def get_state(self) -> dict[str, dict]:
    return {str(s): it.get_state() for s, it in self._its.items()}

  def set_state(self, state: dict[str, dict]):
    missing = [s for s in self._its if str(s) not in state]
    if missing:
      raise ValueError(f'data iterator state has no entry for shard(s) {missing} '
                       f'(it holds {sorted(state, key=int)}): was data.shards changed?')
    for s, it in self._its.items():
      it.set_state(state[str(s)])


def from_config(cfg: DataConfig, split: str, seed: int,
                host_rows: tuple[int, int] | None = None) -> Pipeline:
  """The pipeline an experiment config's `data` section describes."""
  cfg = configs.from_dict(DataConfig, cfg, 'data')
  return Pipeline(documents(cfg, split, seed), batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                  shards=cfg.shards, seed=seed, host_rows=host_rows)
