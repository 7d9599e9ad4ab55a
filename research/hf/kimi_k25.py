"""How a checkpoint folder stores the language model: Kimi K2.5's container, prefixes, INT4 experts.

Kimi K2.5's config.json is a multimodal container (`model_type` `kimi_k25`): the DeepSeek-V3 language
model's config is `text_config` (with its `quantization_config` inside it), next to `vision_config`
and media fields. Its tensors are prefixed (`language_model.model.*`, `language_model.lm_head.*`);
the vision tower (`vision_tower.*`) and projector (`mm_projector.*`) are not converted (our model is
text-only) and are listed as skipped. Linear weights that compressed-tensors quantizes (the routed
experts, with Kimi's `ignore` list) are stored as `weight_packed` / `weight_scale` / `weight_shape`
(research/hf/pack_quantized.py). A `Layout` maps stored names to the plain DeepSeek-V3 names that
research/hf/weights.py's rules use ("logical" names) and back.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from research.hf import config_map
from research.hf import weights
from research.hf import pack_quantized as pq

PREFIX = 'language_model.'
SKIPPED_PREFIXES = ('vision_tower.', 'mm_projector.')  # Not converted: the model is text-only.


def split_container(config_json: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
  """config.json -> (the language model's config, stored-name prefix); a plain config passes through."""
  text_json = config_map.text_config(config_json)
  return text_json, (PREFIX if text_json is not config_json else '')


def scheme_of(text_json: Mapping[str, Any]) -> pq.Scheme | None:
  """The pack-quantized scheme of a language model config, None unless it is compressed-tensors."""
  qc_json = text_json.get('quantization_config') or {}
  return pq.Scheme.from_json(qc_json) if qc_json.get('quant_method') == pq.QUANT_METHOD else None


def linear_weights(rules: list[weights.Rule]) -> list[str]:
  """Logical names of nn.Linear weights (compressed-tensors' `Linear` target), in rule order.

  Not the MoE router (DeepSeek's gate is its own module), the embedding, nor fused expert stacks.
  """
  names = (r.hf for r in rules if r.kind == 'T' and not r.stacked and r.leaf[-1] != 'router'
           and not r.hf.endswith('embed_tokens.weight'))
  return list(dict.fromkeys(names))


@dataclasses.dataclass(frozen=True)
class Layout:
  """Stored <-> logical tensor names of one folder."""
  prefix: str                         # '' or 'language_model.'
  scheme: pq.Scheme | None            # compressed-tensors pack-quantized, or None
  stored: dict[str, str]              # logical name -> stored name (weight_packed for packed ones)
  packed: frozenset[str]              # logical names stored pack-quantized
  skipped: tuple[str, ...]            # stored names not converted (vision tower, projector)

  @classmethod
  def of(cls, names: list[str], prefix: str, scheme: pq.Scheme | None) -> 'Layout':
    stored, packed, skipped, parts = {}, set(), [], set()
    for name in names:
      if prefix and not name.startswith(prefix):
        if name.startswith(SKIPPED_PREFIXES):
          skipped.append(name)
        else:
          stored[name] = name  # Has no logical name: weights.check reports it as unused.
        continue
      logical = name[len(prefix):]
      base, _, part = logical.rpartition('.')
      if part == pq.PACKED:
        stored[f'{base}.weight'] = name
        packed.add(f'{base}.weight')
      elif part in (pq.SCALE, pq.SHAPE):
        parts.add(f'{base}.weight')
      else:
        stored[logical] = name
    orphans = sorted(parts - packed)
    if orphans:
      raise ValueError(f'tensor {prefix + orphans[0][:-len("weight")]}{pq.SCALE} (or weight_shape) has '
                       f'no {pq.PACKED} next to it')
    if packed and scheme is None:
      raise ValueError(f'tensor {stored[min(packed)]!r} is pack-quantized but config.json has no '
                       'compressed-tensors quantization_config')
    return cls(prefix, scheme, stored, frozenset(packed), tuple(skipped))

  @classmethod
  def for_export(cls, prefix: str, scheme: pq.Scheme | None, rules: list[weights.Rule]) -> 'Layout':
    """The layout an export writes: every Linear the scheme targets is packed."""
    layout = cls(prefix, scheme, {r.hf: prefix + r.hf for r in rules}, frozenset(), ())
    packed = frozenset(n for n in linear_weights(rules) if layout.should_pack(n))
    return dataclasses.replace(layout, packed=packed)

  def module(self, logical: str) -> str:
    """The stored module name of a logical weight (what quantization targets and ignore match)."""
    return self.prefix + logical.removesuffix('.weight')

  def should_pack(self, logical: str) -> bool:
    """Whether compressed-tensors quantizes this Linear weight: not matched by `ignore`."""
    return self.scheme is not None and not self.scheme.ignored(self.module(logical))

  def check_quantized(self, linear_names: list[str]):
    """Packed exactly where the scheme says: a Linear not ignored, stored plain or packed, is an error."""
    not_linear = sorted(self.packed - set(linear_names))
    if not_linear:
      raise ValueError(f'tensor {self.stored[not_linear[0]]!r} is pack-quantized but is not a Linear weight')
    for logical in linear_names:
      if self.should_pack(logical) != (logical in self.packed):
        state = 'pack-quantized' if logical in self.packed else 'not quantized'
        raise ValueError(f'tensor {self.stored[logical]!r} is {state}, but quantization_config '
                         f'(targets Linear, ignore {list(self.scheme.ignore)}) says otherwise for module '
                         f'{self.module(logical)!r}')

  def part(self, logical: str, part: str) -> str:
    """Stored name of weight_scale / weight_shape of a packed weight."""
    return self.prefix + logical.removesuffix('weight') + part

  def shapes(self, shape_of: Callable[[str], tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Logical name -> the (dequantized) shape; a packed weight's comes from its scale's shape."""
    out = {}
    for logical, name in self.stored.items():
      if logical in self.packed:
        rows, groups = shape_of(self.part(logical, pq.SCALE))
        out[logical] = (rows, groups * self.scheme.group_size)
        if tuple(shape_of(name)) != self.scheme.packed_shape(out[logical]):
          raise ValueError(f'tensor {name!r} has shape {shape_of(name)}, but weight_scale implies '
                           f'{self.scheme.packed_shape(out[logical])}')
      else:
        out[logical] = tuple(shape_of(name))
    return out

  def export_plan(self, specs: list[tuple[str, tuple[int, ...], np.dtype]]) -> list[tuple]:
    """(stored name, shape, dtype, logical name, part) of every tensor an export writes, in order.

    specs: (logical name, shape, dtype) of the plain weights; part is 'weight' or a pack-quantized part.
    """
    out = []
    for logical, shape, dtype in specs:
      if logical not in self.packed:
        out.append((self.prefix + logical, shape, dtype, logical, 'weight'))
        continue
      out += [(self.part(logical, pq.PACKED), self.scheme.packed_shape(shape), np.dtype(np.int32),
               logical, pq.PACKED),
              (self.part(logical, pq.SCALE), self.scheme.scale_shape(shape), dtype, logical, pq.SCALE),
              (self.part(logical, pq.SHAPE), (2,), np.dtype(np.int64), logical, pq.SHAPE)]
    return out

  def encode(self, x_RxC: np.ndarray, part: str, dtype: np.dtype) -> np.ndarray:
    """Rows of a plain weight -> the same rows of the stored part (weight_shape is not row-wise)."""
    if part == 'weight':
      return x_RxC.astype(dtype, copy=False)
    packed, scale = pq.quantize(x_RxC, self.scheme, dtype)
    return packed if part == pq.PACKED else scale
