"""Hugging Face folder -> orbax checkpoint -> Hugging Face folder, streaming; and loading onto a mesh.

Import reads the shards one after another, tensor by tensor (big ones, such as fused experts,
embeddings and lm_head, in row pieces of at most 1/8 of a shard), and writes each block straight
into its slice of the stacked leaf with tensorstore (zarr chunks aligned with those writes), so host
memory holds about one piece at a time whatever the model's size. The checkpoint is an ordinary
orbax PyTree checkpoint (one zarr array per leaf): orbax writes its metadata around placeholder
leaves, which are then replaced by the full-size arrays. Our ModelConfig rides along in the
checkpoint's custom metadata. Export does the reverse, reading leaf slices and writing safetensors
shards tensor by tensor. Both write into `<dest>.partial-<id>` and rename it into place when
complete, so an interrupted or failed conversion never leaves a folder that looks finished.
Processes that convert big folders should call research.hf.malloc.tune_for_streaming() before
importing anything else (launch/convert.py does), or glibc keeps freed pieces and RSS grows.
"""

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts
from etils import epath

from research.hf import config_map
from research.hf import kimi_k25
from research.hf import weights
from research.hf import pack_quantized as pq
from research.hf import safetensors_io as st
from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import sharding

PIECE_BYTES = 64 << 20   # Big tensors are read / written in row pieces of at most this size.
CHUNK_BYTES = 64 << 20   # Upper bound on a zarr chunk of a block converted whole.
_META_KEY = 'model_config'
_SOURCE_KEY, _SKIPPED_KEY = 'hf_source_config', 'hf_skipped_tensors'
# Files a serving stack wants next to the weights; export copies them from the original folder.
SIDE_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'tokenizer.model',
              'generation_config.json', 'chat_template.jinja', 'vocab.json', 'merges.txt')


def _np_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == 'bfloat16' else np.dtype(name)


@contextlib.contextmanager
def _atomic_dir(dest: str, overwrite: bool, create: bool) -> Iterator[str]:
  """Yields a temporary sibling path; renames it to dest only if the block completes."""
  dest = os.path.abspath(dest)
  if os.path.exists(dest) and not overwrite:
    raise FileExistsError(f'{dest} already exists (pass overwrite=True / --overwrite to replace it)')
  tmp = f'{dest}.partial-{uuid.uuid4().hex[:8]}'
  if create:
    os.makedirs(tmp)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if os.path.exists(dest):
    shutil.rmtree(dest)
  os.rename(tmp, dest)


def _chunks(r: weights.Rule, leaf_shape: tuple[int, ...], itemsize: int, piece_bytes: int) -> list[int]:
  """Zarr chunks aligned with the writes.

  1 along the rule's index axes (layer, expert), a piece of rows along its piece axis; a block
  converted whole is split along its first axis to at most CHUNK_BYTES.
  """
  lead = len(r.index)
  chunk = [1] * lead + list(leaf_shape[lead:])
  if r.piece_axis is not None:
    chunk[lead + r.piece_axis] = r.piece_rows(itemsize, piece_bytes)
  elif len(chunk) > lead:
    row = int(np.prod(leaf_shape[lead + 1:], dtype=np.int64)) * itemsize
    chunk[lead] = max(1, min(chunk[lead], CHUNK_BYTES // max(row, 1)))
  return chunk


def _nest(flat: dict[tuple[str, ...], object]) -> dict:
  out = {}
  for path, v in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


# Bytes per value while a pack-quantized piece is dequantized or quantized (uint32 fields, float32
# values, scales, products): pieces of such tensors are sized by this, not by the output dtype.
_DEQUANT_BYTES = 16
_FP8 = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))


class _Source:
  """Reads HF tensors by logical name: whole or rows; fp8 and pack-quantized ones come back dequantized."""

  def __init__(self, folder: st.Folder, layout: kimi_k25.Layout, fp8_block: tuple[int, int] | None):
    self.folder, self.layout, self.fp8_block = folder, layout, fp8_block

  def dtype(self, logical: str) -> np.dtype:
    name = self.layout.stored[logical]
    return self.folder.shard_of(name).dtype(name)

  def read(self, logical: str, start=None, stop=None) -> np.ndarray:
    name = self.layout.stored[logical]
    x = self.folder.read(name, start, stop)
    if logical in self.layout.packed:
      shape = tuple(int(n) for n in self.folder.read(self.layout.part(logical, pq.SHAPE)))
      scale = self.folder.read(self.layout.part(logical, pq.SCALE), start, stop)
      return pq.dequantize(x, scale, shape[1], self.layout.scheme)
    if x.dtype in _FP8:
      scale = name + '_scale_inv'
      if self.fp8_block is None or scale not in self.folder.weight_map or x.ndim != 2:
        raise ValueError(f'tensor {name!r} is fp8 but has no {scale!r} block scale (or is not 2-D)')
      x = weights.dequantize_fp8(x, self.folder.read(scale), self.fp8_block)
    return x


@dataclasses.dataclass(frozen=True)
class _Import:
  cfg: ModelConfig
  folder: st.Folder
  rules: list[weights.Rule]
  src: _Source
  config_json: dict  # The folder's config.json (a container's multimodal fields kept in metadata).


def _open_hf(hf_dir: str, ignore_fields: Iterable[str], ignore_tensors: Iterable[str]) -> _Import:
  path = os.path.join(hf_dir, 'config.json')
  if not os.path.exists(path):
    raise FileNotFoundError(f'{path} not found: not a Hugging Face checkpoint folder')
  with open(path) as f:
    config_json = json.load(f)
  cfg = config_map.from_hf(config_json, ignore_fields)
  text_json, prefix = kimi_k25.split_container(config_json)
  folder = st.Folder(hf_dir)
  layout = kimi_k25.Layout.of(list(folder.weight_map), prefix, kimi_k25.scheme_of(text_json))
  ignore = list(ignore_tensors)
  tied = bool(text_json.get('tie_word_embeddings', False))
  if tied:
    ignore.append('lm_head.weight')  # transformers ties it to the embedding whatever the file holds.
  rs = weights.rules(cfg, weights.detect_layout(layout.stored, cfg), tied_embeddings=tied)
  weights.check(rs, layout.shapes(folder.shape), cfg, ignore)
  layout.check_quantized([n for n in kimi_k25.linear_weights(rs) if n in layout.stored])
  return _Import(cfg, folder, rs, _Source(folder, layout, config_map.fp8_block_size(text_json)), config_json)


def _pieces(src: _Source, r: weights.Rule, itemsize: int, piece_bytes: int):
  """(HF rows or None for all, HF array) covering one tensor, in pieces along its piece axis.

  Pack-quantized pieces are sized by their dequantization's working set (_DEQUANT_BYTES a value).
  """
  if r.hf in src.layout.packed:
    itemsize = max(itemsize, _DEQUANT_BYTES)
  n = r.piece_rows(itemsize, piece_bytes)
  if n >= r.hf_shape[0] or src.dtype(r.hf) in _FP8:
    yield None, src.read(r.hf)
    return
  for r0 in range(0, r.hf_shape[0], n):
    rows = slice(r0, min(r0 + n, r.hf_shape[0]))
    yield rows, src.read(r.hf, rows.start, rows.stop)


def _piece_bytes(shard_bytes: int) -> int:
  """Pieces of at most 1/8 of a shard keep conversion memory well under twice the largest shard."""
  return max(1 << 16, min(PIECE_BYTES, shard_bytes // 8))


def hf_to_orbax(hf_dir: str, ckpt_dir: str, *, ignore_fields: Iterable[str] = (),
                ignore_tensors: Iterable[str] = (), overwrite: bool = False,
                piece_bytes: int | None = None) -> ModelConfig:
  """Converts a Hugging Face folder to an orbax params checkpoint; returns the model config.

  Fails before writing anything on an unsupported config field or a missing / misshapen / unused
  tensor, naming it. A container's multimodal config fields and the tensors not converted (vision
  tower, projector) are kept in the checkpoint's metadata (read_hf_source).
  """
  imp = _open_hf(hf_dir, ignore_fields, ignore_tensors)
  cfg, folder = imp.cfg, imp.folder
  dtype = _np_dtype(cfg.param_dtype)
  piece_bytes = piece_bytes or _piece_bytes(max(folder.shard_sizes().values()))
  leaves = weights.leaf_shapes(cfg)
  with folder, _atomic_dir(ckpt_dir, overwrite, create=False) as tmp:
    skeleton = _nest({k: np.zeros((1,), dtype) for k in leaves})
    meta = {_META_KEY: dataclasses.asdict(cfg)}
    if imp.src.layout.prefix or imp.src.layout.scheme:
      meta.update({_SOURCE_KEY: imp.config_json, _SKIPPED_KEY: list(imp.src.layout.skipped)})
    ocp.PyTreeCheckpointer(use_ocdbt=False).save(
        tmp, args=ocp.args.PyTreeSave(skeleton), custom_metadata=meta)
    stores = _create_stores(tmp, imp.rules, leaves, dtype, piece_bytes, imp.src.layout.packed)
    written = _stream(imp, stores, dtype, piece_bytes)
    for leaf, shape in leaves.items():  # Every element of every leaf came from exactly one tensor.
      assert written[leaf] == int(np.prod(shape)), (leaf, written[leaf], shape)
  return cfg


def _create_stores(tmp: str, rs: list[weights.Rule], leaves, dtype: np.dtype, piece_bytes: int,
                   packed: frozenset[str]) -> dict:
  """One zarr array per leaf, chunked like the writes (_pieces)."""
  first = {}
  for r in rs:
    first.setdefault(r.leaf, r)
  # One data-copy thread: writes are issued one at a time anyway, and fewer threads hold fewer
  # malloc arenas (research/hf/malloc.py).
  context = ts.Context({'data_copy_concurrency': {'limit': 1}})
  itemsize = lambda r: max(dtype.itemsize, _DEQUANT_BYTES) if r.hf in packed else dtype.itemsize
  stores = {}
  for leaf, shape in leaves.items():
    stores[leaf] = ts.open(
        {'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': os.path.join(tmp, '.'.join(leaf))},
         'metadata': {'compressor': {'id': 'zstd', 'level': 1},
                      'chunks': _chunks(first[leaf], shape, itemsize(first[leaf]), piece_bytes)}},
        create=True, delete_existing=True, dtype=ts.dtype(dtype.name), shape=shape,
        context=context).result()
  return stores


def _stream(imp: _Import, stores: dict, dtype: np.dtype, piece_bytes: int) -> dict:
  """Shard by shard, each in file order, piece by piece into the stores; returns elements per leaf."""
  by_name = weights.by_hf_name(imp.rules)
  logical_of = {stored: logical for logical, stored in imp.src.layout.stored.items()}
  written = dict.fromkeys(stores, 0)
  for shard in imp.folder.shards:
    for name in imp.folder.reader(shard).keys():
      logical = logical_of.get(name)  # None: a weight_scale / weight_shape (read with its weight), skipped.
      if logical not in by_name:
        continue
      for rows, x in _pieces(imp.src, by_name[logical][0], dtype.itemsize, piece_bytes):
        for r in by_name[logical]:
          block = r.to_ours(x).astype(dtype, copy=False)
          stores[r.leaf][r.piece_index(rows)].write(block).result()
          written[r.leaf] += block.size
        del x, block
    imp.folder.release(shard)
  return written


def read_hf_source(ckpt_dir: str) -> tuple[dict | None, list[str]]:
  """(source config.json, skipped tensors) kept by hf_to_orbax for containers / quantized folders."""
  meta_json = ocp.PyTreeCheckpointer().metadata(epath.Path(ckpt_dir)).custom_metadata or {}
  return meta_json.get(_SOURCE_KEY), list(meta_json.get(_SKIPPED_KEY, []))


def read_model_config(ckpt_dir: str) -> ModelConfig:
  """The ModelConfig stored in a checkpoint written by hf_to_orbax."""
  meta = ocp.PyTreeCheckpointer().metadata(epath.Path(ckpt_dir)).custom_metadata or {}
  if _META_KEY not in meta:
    raise ValueError(f'{ckpt_dir}: no model config in the checkpoint metadata; pass cfg explicitly')
  return ModelConfig(**meta[_META_KEY]).validate()


def param_targets(cfg: ModelConfig, mesh=None, rules=sharding.RULES):
  """Abstract params (shape, dtype and, given a mesh, the sharding training uses)."""
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  if mesh is None:
    return shapes
  shardings = sharding.tree_shardings(transformer.param_axes(cfg), shapes, mesh, rules)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)


def load_params(ckpt_dir: str, cfg: ModelConfig | None = None, mesh=None, rules=sharding.RULES):
  """Restores params, sharded over `mesh` as training shards them; each host reads only its chunks.

  Returns (params, cfg). Without a mesh the params land on the default device.
  """
  cfg = cfg or read_model_config(ckpt_dir)
  target = param_targets(cfg, mesh, rules)
  if mesh is None:
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=dev), target)
  return ocp.StandardCheckpointer().restore(os.path.abspath(ckpt_dir), target), cfg


def _open_leaves(ckpt_dir: str, leaves, subtree: tuple[str, ...]) -> dict:
  """Read-only tensorstores of the leaves of any orbax PyTree checkpoint (OCDBT or not)."""
  path = epath.Path(os.path.abspath(ckpt_dir))
  ocdbt = ocp.type_handlers.is_ocdbt_checkpoint(path)
  context = ocp.type_handlers.get_ts_context(use_ocdbt=ocdbt, data_copy_concurrency_limit=1)
  out = {}
  for leaf in leaves:
    info = ocp.type_handlers.ParamInfo(name='.'.join((*subtree, *leaf)), parent_dir=path,
                                       is_ocdbt_checkpoint=ocdbt, ts_context=context)
    spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=ocdbt)
    try:
      out[leaf] = ts.open(spec, read=True, context=context).result()
    except ValueError as e:
      raise ValueError(f'{ckpt_dir}: cannot open leaf {"/".join(leaf)} ({e})') from None
    if tuple(out[leaf].shape) != leaves[leaf]:
      raise ValueError(f'{ckpt_dir}: leaf {"/".join(leaf)} has shape {tuple(out[leaf].shape)}, '
                       f'the config implies {leaves[leaf]}')
  return out


def orbax_to_hf(ckpt_dir: str, out_dir: str, *, cfg: ModelConfig | None = None,
                expert_layout: str = weights.PER_EXPERT, dtype: str | None = None,
                max_shard_bytes: int = 5 << 30, copy_from: str | None = None,
                subtree: tuple[str, ...] = (), overwrite: bool = False,
                piece_bytes: int | None = None) -> str:
  """Writes a Hugging Face folder (config.json, safetensors shards + index) from a checkpoint.

  expert_layout: 'per_expert' (what checkpoints on the Hub and serving stacks use) or 'fused'
  (transformers 5's in-memory layout). subtree: path of the params inside the checkpoint (e.g.
  ('params',) for a train state). copy_from: an HF folder whose tokenizer / generation files to copy.
  A Kimi K2.5 container or compressed-tensors source (copy_from's config.json, else the one kept at
  import) is written back in its own format: its config.json, prefixed names, the Linear weights its
  scheme targets re-quantized, and copy_from's vision tower / projector tensors copied unchanged.
  """
  cfg = cfg or read_model_config(ckpt_dir)
  out_dtype = _np_dtype(dtype or cfg.param_dtype)
  rs = weights.rules(cfg, expert_layout)
  by_name = weights.by_hf_name(rs)
  stores = _open_leaves(ckpt_dir, weights.leaf_shapes(cfg), tuple(subtree))
  source_json = _export_source(ckpt_dir, cfg, copy_from, expert_layout)
  text_json, prefix = kimi_k25.split_container(source_json or {})
  layout = kimi_k25.Layout.for_export(prefix, kimi_k25.scheme_of(text_json), rs)
  plan = layout.export_plan([(n, r[0].hf_shape, out_dtype) for n, r in by_name.items()])
  parts = {p[0]: p[3:] for p in plan}
  copied = _copied_tensors(copy_from) if prefix else {}
  scale_dtype = _scale_dtype(copy_from, out_dtype)
  plan = [p if p[4] != pq.SCALE else (p[0], p[1], scale_dtype, *p[3:]) for p in plan]
  shards = st.plan_shards([p[:3] for p in plan] + [(n, *v) for n, v in copied.items()], max_shard_bytes)
  piece_bytes = piece_bytes or _piece_bytes(max_shard_bytes)

  def logical_pieces(name):
    group = sorted(by_name[name], key=lambda r: r.rows or (0, 0))  # gate rows before up rows.
    itemsize = max(out_dtype.itemsize, _DEQUANT_BYTES) if name in layout.packed else out_dtype.itemsize
    n, total = group[0].piece_rows(itemsize, piece_bytes), group[0].hf_shape[0]
    for rows in [None] if n >= total else [slice(r0, min(r0 + n, total)) for r0 in range(0, total, n)]:
      hf_parts = [r.to_hf(stores[r.leaf][r.piece_index(rows)].read().result()) for r in group]
      yield hf_parts[0] if len(hf_parts) == 1 else np.concatenate(hf_parts, axis=-2)

  def pieces(stored):
    if stored in copied:
      with st.Folder(copy_from) as source:
        yield source.read(stored)
      return
    logical, part = parts[stored]
    if part == pq.SHAPE:
      yield np.asarray(by_name[logical][0].hf_shape, np.int64)
      return
    for x in logical_pieces(logical):
      yield layout.encode(x, part, scale_dtype if part == pq.SCALE else out_dtype)

  with _atomic_dir(out_dir, overwrite, create=True) as tmp:
    st.write_folder(tmp, shards, pieces)
    with open(os.path.join(tmp, 'config.json'), 'w') as f:
      json.dump(source_json or config_map.to_hf(
          cfg, 'bfloat16' if out_dtype == np.dtype(ml_dtypes.bfloat16) else out_dtype.name), f, indent=2)
    for name in SIDE_FILES if copy_from else ():
      if os.path.exists(os.path.join(copy_from, name)):
        shutil.copy(os.path.join(copy_from, name), tmp)
  return out_dir


def params_to_hf(params, out_dir: str, *, cfg: ModelConfig, expert_layout: str = weights.PER_EXPERT,
                 dtype: str | None = None, max_shard_bytes: int = 5 << 30, overwrite: bool = False) -> str:
  """Writes a Hugging Face folder (config.json, safetensors) from params in memory, on one host.

  What a serving engine loads at start and, written again after each update, reloads in place
  (research/rl/rollout/vllm_engine). Each tensor is made from its blocks as it is written.
  """
  out_dtype = _np_dtype(dtype or cfg.param_dtype)
  by_name = weights.by_hf_name(weights.rules(cfg, expert_layout))
  host = jax.device_get(params)

  def pieces(name):
    group = sorted(by_name[name], key=lambda r: r.rows or (0, 0))  # gate rows before up rows.
    parts = [r.to_hf(functools.reduce(lambda t, k: t[k], r.leaf, host)[r.index]) for r in group]
    yield (parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-2)).astype(out_dtype)

  shards = st.plan_shards([(n, rs[0].hf_shape, out_dtype) for n, rs in by_name.items()], max_shard_bytes)
  with _atomic_dir(out_dir, overwrite, create=True) as tmp:
    st.write_folder(tmp, shards, pieces)
    with open(os.path.join(tmp, 'config.json'), 'w') as f:
      json.dump(config_map.to_hf(cfg, 'bfloat16' if out_dtype == np.dtype(ml_dtypes.bfloat16)
                                 else out_dtype.name), f, indent=2)
  return out_dir


def _export_source(ckpt_dir: str, cfg: ModelConfig, copy_from: str | None, expert_layout: str) -> dict | None:
  """The config.json to export under when the source was a container or pack-quantized, else None.

  Taken from copy_from, else from the import's metadata; it must describe the same architecture.
  """
  path = os.path.join(copy_from or '', 'config.json')
  if copy_from and os.path.exists(path):
    with open(path) as f:
      source_json = json.load(f)
  else:
    source_json, _ = read_hf_source(ckpt_dir)
  text_json = config_map.text_config(source_json or {})
  if not source_json or (text_json is source_json and not kimi_k25.scheme_of(text_json)):
    return None
  if config_map.to_hf(config_map.from_hf(source_json), 'float32') != config_map.to_hf(cfg, 'float32'):
    raise ValueError(f'{path if copy_from else ckpt_dir}: the source config.json describes another '
                     'architecture than the checkpoint\'s model config')
  if expert_layout != weights.PER_EXPERT:
    raise ValueError(f'expert_layout={expert_layout!r}: a pack-quantized / Kimi K2.5 export stores '
                     'experts per expert')
  return source_json


def _scale_dtype(copy_from: str | None, out_dtype: np.dtype) -> np.dtype:
  """weight_scale's dtype: the source folder's (copy_from), else the exported weights' dtype."""
  if copy_from and os.path.exists(os.path.join(copy_from, 'config.json')):
    with st.Folder(copy_from) as folder:
      for name in folder.weight_map:
        if name.endswith('.' + pq.SCALE):
          return folder.shard_of(name).dtype(name)
  return out_dtype


def _copied_tensors(copy_from: str | None) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
  """Tensors copied unchanged into a container export (vision tower, projector), with shape and dtype."""
  if not copy_from:
    return {}
  with st.Folder(copy_from) as folder:
    return {n: (folder.shape(n), folder.shard_of(n).dtype(n)) for n in folder.weight_map
            if n.startswith(kimi_k25.SKIPPED_PREFIXES)}


def hf_to_mesh(hf_dir: str, mesh, *, ignore_fields: Iterable[str] = (),
               ignore_tensors: Iterable[str] = (), rules=sharding.RULES):
  """Params straight from a Hugging Face folder onto a mesh, without an orbax checkpoint.

  Each device's callback reads only the layers (and experts) its shard holds; within one layer's
  matrix it reads the whole HF tensor and keeps its slice. Returns (params, cfg).
  """
  imp = _open_hf(hf_dir, ignore_fields, ignore_tensors)
  cfg, folder, rs, src = imp.cfg, imp.folder, imp.rules, imp.src
  dtype = _np_dtype(cfg.param_dtype)
  targets = param_targets(cfg, mesh, rules)
  per_leaf: dict[tuple[str, ...], dict] = {}
  for r in rs:
    per_leaf.setdefault(r.leaf, {})[r.index] = r

  def region(leaf, shape, idx):
    idx = tuple(slice(*s.indices(n)) for s, n in zip(idx, shape))
    leaf_rules = per_leaf[leaf]
    if () in leaf_rules:
      r = leaf_rules[()]
      return r.to_ours(src.read(r.hf))[idx]
    out = []
    for l in range(idx[0].start, idx[0].stop):
      if (l,) in leaf_rules:
        r = leaf_rules[(l,)]
        if r.stacked:  # Fused experts: read only this shard's experts.
          x = r.to_ours(src.read(r.hf, idx[1].start, idx[1].stop))[(slice(None), *idx[2:])]
        else:
          x = r.to_ours(src.read(r.hf))[idx[1:]]
      else:  # Per-expert tensors.
        x = np.stack([leaf_rules[(l, e)].to_ours(src.read(leaf_rules[(l, e)].hf))[idx[2:]]
                      for e in range(idx[1].start, idx[1].stop)])
      out.append(x)
    return np.stack(out)

  flat = {}
  with folder:
    for leaf, shape in weights.leaf_shapes(cfg).items():
      t = targets
      for k in leaf:
        t = t[k]
      flat[leaf] = jax.make_array_from_callback(
          shape, t.sharding, lambda idx, leaf=leaf, shape=shape: region(leaf, shape, idx).astype(dtype))
  return _nest(flat), cfg
