"""Tensor-by-tensor mapping between Hugging Face weights and our parameter tree, both directions.

One `Rule` ties an HF tensor (or rows of one, for the fused gate_up_proj) to one block of one of our
leaves: leaf[index] where index is (layer,) or (layer, expert) into the stacked leaf, or () for an
unstacked one. HF linear weights are (out, in); ours are (in, ...out) with heads split out, so
  ours = hf_part.swapaxes(-1, -2).reshape(block_shape)        ('T' rules)
  ours = hf_part.reshape(block_shape)                          ('id' rules: norms, embedding, bias).
Experts come in two transformers layouts, both read and written:
  per_expert: mlp.experts.{e}.{gate,up,down}_proj.weight, (I, D) / (D, I) each;
  fused:      mlp.experts.gate_up_proj (E, 2I, D), gate rows first; mlp.experts.down_proj (E, D, I).
Attention needs no permutation: our per-head q/k/v/o are HF's rows split by head, and DeepSeek's
interleaved RoPE (pairs 2i, 2i+1) is what research/model/layers.rope does with interleaved=True.
"""

import dataclasses
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping

import numpy as np

from research.hf import config_map
from research.model import transformer
from research.model.config import ModelConfig
from research.model.layers import is_spec

PER_EXPERT, FUSED = 'per_expert', 'fused'
LAYOUTS = (PER_EXPERT, FUSED)


@dataclasses.dataclass(frozen=True)
class Rule:
  hf: str                       # HF tensor name.
  hf_shape: tuple[int, ...]     # Its full shape.
  leaf: tuple[str, ...]         # Our param path.
  index: tuple[int, ...]        # Leading index into the leaf (stacked layers, per-expert expert).
  block_shape: tuple[int, ...]  # Shape of leaf[index].
  kind: str                     # 'T' or 'id'.
  rows: tuple[int, int] | None = None  # Part of HF axis -2 (gate/up halves of gate_up_proj).

  @property
  def stacked(self) -> bool:
    """HF axis 0 is the experts axis (fused layout)."""
    return len(self.hf_shape) == 3

  @property
  def piece_axis(self) -> int | None:
    """Axis of our block that HF axis 0 becomes, when rows of the HF tensor map to a slice of it.

    Big tensors (fused experts, embedding, lm_head, dense MLPs) are converted in such row pieces;
    tensors whose rows are split into heads are converted whole.
    """
    if len(self.block_shape) != len(self.hf_shape):
      return None
    return len(self.hf_shape) - 1 if self.kind == 'T' and len(self.hf_shape) == 2 else 0

  def piece_rows(self, itemsize: int, piece_bytes: int) -> int:
    """HF rows per piece (the whole tensor if it has no piece axis)."""
    if self.piece_axis is None:
      return self.hf_shape[0]
    return max(1, min(self.hf_shape[0], piece_bytes // (int(np.prod(self.hf_shape[1:])) * itemsize)))

  def piece_index(self, rows: slice | None) -> tuple:
    """Index of leaf for the block piece that HF rows `rows` fill (the whole block for None)."""
    return self.index if rows is None else (*self.index, *(slice(None),) * self.piece_axis, rows)

  def part_shape(self, n: int | None = None) -> tuple[int, ...]:
    """Shape of the HF part this rule covers (n: rows of HF axis 0 in a piece)."""
    s = list(self.hf_shape)
    if self.rows:
      s[-2] = self.rows[1] - self.rows[0]
    if n is not None:
      s[0] = n
    return tuple(s)

  def to_ours(self, hf_x: np.ndarray) -> np.ndarray:
    """HF tensor (or rows of it along a piece axis) -> our block (or its matching slice)."""
    if self.rows:
      hf_x = hf_x[..., self.rows[0]:self.rows[1], :]
    shape = list(self.block_shape)
    if self.piece_axis is not None:
      shape[self.piece_axis] = hf_x.shape[0]
    if self.kind == 'T':
      hf_x = hf_x.swapaxes(-1, -2)
    return hf_x.reshape(shape)

  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    """Inverse of to_ours: our block (or a slice of it) -> the HF part (or its rows)."""
    part = self.part_shape(None if self.piece_axis is None else ours.shape[self.piece_axis])
    if self.kind == 'T':
      return ours.reshape(*part[:-2], part[-1], part[-2]).swapaxes(-1, -2)
    return ours.reshape(part)


def leaf_shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """Our param paths -> shapes, from the model's own param specs (no arrays are made)."""
  return dict(_spec_shapes((), transformer.param_specs(cfg)))


def _spec_shapes(prefix: tuple[str, ...], tree: Mapping) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
  for k, v in tree.items():
    if is_spec(v):
      yield (*prefix, k), tuple(v.shape)
    else:
      yield from _spec_shapes((*prefix, k), v)


Shapes = Mapping[tuple[str, ...], tuple[int, ...]]
_MLP = (('gate', 'wi_gate'), ('up', 'wi_up'), ('down', 'wo'))  # HF projection -> our leaf.


def rules(cfg: ModelConfig, layout: str = PER_EXPERT, tied_embeddings: bool = False) -> list[Rule]:
  """Every (HF tensor, our block) pair of a model, in HF checkpoint order."""
  if layout not in LAYOUTS:
    raise ValueError(f'expert layout {layout!r}: expected one of {LAYOUTS}')
  family = config_map.family_of(cfg)
  shapes = leaf_shapes(cfg)
  out = [_same(shapes, 'model.embed_tokens.weight', ('embed', 'embedding'), ())]
  for i in range(cfg.num_layers):
    out += _layer_rules(cfg, shapes, i, family, layout)
  out.append(_same(shapes, 'model.norm.weight', ('final_norm', 'scale'), ()))
  out.append(_linear(shapes, 'model.embed_tokens.weight' if tied_embeddings else 'lm_head.weight',
                     ('lm_head', 'kernel'), ()))
  return out


def _linear(shapes: Shapes, hf: str, leaf: tuple[str, ...], index: tuple[int, ...], n_in: int = 1) -> Rule:
  """HF (out, in) weight of our block (*in_dims, *out_dims), the first n_in dims being inputs."""
  block = shapes[leaf][len(index):]
  return Rule(hf, (int(np.prod(block[n_in:])), int(np.prod(block[:n_in]))), leaf, index, block, 'T')


def _same(shapes: Shapes, hf: str, leaf: tuple[str, ...], index: tuple[int, ...]) -> Rule:
  """A tensor stored as is (norm scales, embedding, router bias)."""
  block = shapes[leaf][len(index):]
  return Rule(hf, block, leaf, index, block, 'id')


def _stacked(shapes: Shapes, hf: str, hf_shape: tuple[int, int, int], leaf: tuple[str, ...],
             l: tuple[int], rows: tuple[int, int] | None = None) -> Rule:
  """A fused experts tensor (E, out, in), or rows of its out axis, onto the layer's expert stack."""
  return Rule(hf, hf_shape, leaf, l, shapes[leaf][len(l):], 'T', rows)


def _layer_rules(cfg: ModelConfig, shapes: Shapes, i: int, family: str, layout: str) -> list[Rule]:
  """Decoder layer i: its norms, attention and MLP (dense for the first `first_k_dense` layers)."""
  dense = i < cfg.first_k_dense
  stack = 'dense_layers' if dense else 'moe_layers'
  l = (i if dense else i - cfg.first_k_dense,)
  p = f'model.layers.{i}.'
  if dense:
    mlp = [_linear(shapes, f'{p}mlp.{n}_proj.weight', (stack, 'mlp', ours), l) for n, ours in _MLP]
  else:
    mlp = _moe_rules(cfg, shapes, p + 'mlp.', l, family, layout)
  return [_same(shapes, p + 'input_layernorm.weight', (stack, 'attn_norm'), l),
          *_attention_rules(cfg, shapes, p + 'self_attn.', (stack, 'attn'), l),
          _same(shapes, p + 'post_attention_layernorm.weight', (stack, 'mlp_norm'), l), *mlp]


def _attention_rules(cfg: ModelConfig, shapes: Shapes, a: str, leaf: tuple[str, ...],
                     l: tuple[int]) -> list[Rule]:
  """GQA (q, k, v, o, optional q/k norms) or MLA (low-rank q and kv with their norms, o)."""
  if cfg.attention == 'gqa':
    out = [_linear(shapes, f'{a}{n}_proj.weight', (*leaf, n), l) for n in ('q', 'k', 'v')]
    out.append(_linear(shapes, a + 'o_proj.weight', (*leaf, 'o'), l, n_in=2))  # (H, Dh) in, D out.
    if cfg.qk_norm:
      out += [_same(shapes, f'{a}{n}_norm.weight', (*leaf, f'{n}_norm'), l) for n in ('q', 'k')]
    return out
  if cfg.q_lora_rank:
    out = [_linear(shapes, a + 'q_a_proj.weight', (*leaf, 'q_a'), l),
           _same(shapes, a + 'q_a_layernorm.weight', (*leaf, 'q_a_norm'), l),
           _linear(shapes, a + 'q_b_proj.weight', (*leaf, 'q_b'), l)]
  else:
    out = [_linear(shapes, a + 'q_proj.weight', (*leaf, 'q'), l)]
  return out + [_linear(shapes, a + 'kv_a_proj_with_mqa.weight', (*leaf, 'kv_a'), l),
                _same(shapes, a + 'kv_a_layernorm.weight', (*leaf, 'kv_a_norm'), l),
                _linear(shapes, a + 'kv_b_proj.weight', (*leaf, 'kv_b'), l),
                _linear(shapes, a + 'o_proj.weight', (*leaf, 'o'), l, n_in=2)]


def _moe_rules(cfg: ModelConfig, shapes: Shapes, m: str, l: tuple[int], family: str,
               layout: str) -> list[Rule]:
  """Router (and DeepSeek's correction bias), routed experts in either layout, shared experts."""
  leaf = ('moe_layers', 'moe')
  out = [_linear(shapes, m + 'gate.weight', (*leaf, 'router'), l)]
  if family == config_map.DEEPSEEK_V3:
    out.append(_same(shapes, m + 'gate.e_score_correction_bias', (*leaf, 'router_bias'), l))
  if layout == FUSED:
    d, e, f = cfg.d_model, cfg.num_experts, cfg.d_expert
    out += [_stacked(shapes, m + 'experts.gate_up_proj', (e, 2 * f, d), (*leaf, 'wi_gate'), l, (0, f)),
            _stacked(shapes, m + 'experts.gate_up_proj', (e, 2 * f, d), (*leaf, 'wi_up'), l, (f, 2 * f)),
            _stacked(shapes, m + 'experts.down_proj', (e, d, f), (*leaf, 'wo'), l)]
  else:
    out += [_linear(shapes, f'{m}experts.{x}.{n}_proj.weight', (*leaf, ours), (*l, x))
            for x in range(cfg.num_experts) for n, ours in _MLP]
  if cfg.num_shared_experts:
    out += [_linear(shapes, f'{m}shared_experts.{n}_proj.weight', (*leaf, 'shared', ours), l)
            for n, ours in _MLP]
  return out


def detect_layout(weight_map: Mapping[str, str], cfg: ModelConfig) -> str:
  """Which expert layout a checkpoint uses (looked up in its first MoE layer)."""
  prefix = f'model.layers.{cfg.first_k_dense}.mlp.experts.'
  return FUSED if prefix + 'gate_up_proj' in weight_map else PER_EXPERT


_EXTRA = re.compile(r'.*(_scale_inv|\.rotary_emb\.inv_freq)$')


def check(rs: Iterable[Rule], shapes: Mapping[str, tuple[int, ...]], cfg: ModelConfig,
          ignore_tensors: Iterable[str] = ()) -> None:
  """Fails, naming the tensor, on a missing or wrongly shaped tensor, or one the model would not use.

  Tensors of layers past num_hidden_layers (DeepSeek's multi-token-prediction module) are skipped.
  """
  rs = list(rs)
  for r in rs:
    if r.hf not in shapes:
      raise ValueError(f'tensor {r.hf!r} is missing from the checkpoint (needed for {"/".join(r.leaf)})')
    if tuple(shapes[r.hf]) != r.hf_shape:
      raise ValueError(f'tensor {r.hf!r} has shape {tuple(shapes[r.hf])} but config.json implies '
                       f'{r.hf_shape}')
  used = {r.hf for r in rs} | set(ignore_tensors)
  for name in shapes:
    layer = re.match(r'model\.layers\.(\d+)\.', name)
    if name in used or _EXTRA.match(name) or (layer and int(layer.group(1)) >= cfg.num_layers):
      continue
    raise ValueError(f'tensor {name!r} is in the checkpoint but the model (as configured by '
                     'config.json) has no place for it')


def by_hf_name(rs: Iterable[Rule]) -> dict[str, list[Rule]]:
  out = defaultdict(list)
  for r in rs:
    out[r.hf].append(r)
  return dict(out)


def dequantize_fp8(w: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
  """DeepSeek-V3 / Kimi K2 fp8 weights: w * scale_inv per (block[0] x block[1]) tile, in float32."""
  s = np.repeat(np.repeat(scale_inv.astype(np.float32), block[0], 0), block[1], 1)
  return w.astype(np.float32) * s[:w.shape[0], :w.shape[1]]
