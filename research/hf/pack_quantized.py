'''compressed-tensors `pack-quantized` integer weights (Kimi K2.5's INT4 routed experts), in numpy.

The format, as compressed-tensors (0.12 to 0.20) writes and reads it for a symmetric, group-wise
quantized Linear weight W (out, in):
  weight_packed  int32 (out, ceil(in * bits / 32)): q + 2**(bits-1) (offset binary: 0..15 for INT4),
                 element k of a row in bits [bits*(k % p), bits*(k % p) + bits - 1] of word k // p,
                 p = 32 // bits, the first element in the least significant bits; padding is 0.
  weight_scale   (out, in / group_size), the model's float dtype: W[r, k] = q[r, k] * scale[r, k // g],
                 multiplied in the scale's dtype (compressed-tensors' `dequantize` does q.to(scale.dtype)
                 * scale), i.e. the exact product rounded once to that dtype.
  weight_shape   int (2,): (out, in).
Quantizing (export) follows compressed-tensors' `calculate_qparams` for symmetric INT: per group
scale = max|W| / ((2**bits - 1) / 2) (0 -> the dtype's eps), rounded to the scale dtype, and
q = clamp(round_half_even(W / scale), -2**(bits-1), 2**(bits-1) - 1), the quotient taken in float32.
Targets and `ignore` entries match module names as compressed-tensors' `match_name` does: `re:X` is
`re.match(X, name)` (anchored at the start only), anything else must equal the name.
'''

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

PACKED, SCALE, SHAPE = 'weight_packed', 'weight_scale', 'weight_shape'
QUANT_METHOD, FORMAT = 'compressed-tensors', 'pack-quantized'


class QuantizationConfigError(ValueError):
  pass


def _bad(field: str, value: Any, msg: str):
  raise QuantizationConfigError(f'quantization_config.{field}={value!r}: {msg}')


@dataclasses.dataclass(frozen=True)
class Scheme:
  '''One symmetric group-wise INT weight scheme applied to every Linear module not ignored.'''
  num_bits: int
  group_size: int
  ignore: tuple[str, ...]

  @classmethod
  def from_json(cls, qc_json: Mapping[str, Any]) -> 'Scheme':
    '''A config.json `quantization_config` (compressed-tensors) -> Scheme, rejecting what we cannot read.'''
    for key, want in (('quant_method', QUANT_METHOD), ('format', FORMAT)):
      if qc_json.get(key) != want:
        _bad(key, qc_json.get(key), f'only {want!r} is supported here')
    groups = qc_json.get('config_groups') or {}
    if len(groups) != 1:
      _bad('config_groups', sorted(groups), 'exactly one scheme group is supported')
    (group_name, group_json), = groups.items()
    where = f'config_groups.{group_name}'
    if list(group_json.get('targets') or []) != ['Linear']:
      _bad(f'{where}.targets', group_json.get('targets'), "only ['Linear'] is supported")
    for key in ('input_activations', 'output_activations'):
      if group_json.get(key):
        _bad(f'{where}.{key}', group_json[key], 'activation quantization is not supported')
    weights_json = group_json.get('weights') or {}
    for key, want in (('type', 'int'), ('symmetric', True), ('strategy', 'group'), ('dynamic', False)):
      if weights_json.get(key) != want:
        _bad(f'{where}.weights.{key}', weights_json.get(key), f'only {want!r} is supported')
    if weights_json.get('actorder') not in (None, 'static'):
      _bad(f'{where}.weights.actorder', weights_json['actorder'],
           'activation reordering (g_idx) is not supported')
    bits, group = weights_json.get('num_bits'), weights_json.get('group_size')
    if bits not in (2, 4, 8):
      _bad(f'{where}.weights.num_bits', bits, 'only 2, 4 or 8 bits (dividing 32) are supported')
    if not isinstance(group, int) or group <= 0:
      _bad(f'{where}.weights.group_size', group, 'a positive group size is required')
    return cls(bits, group, tuple(qc_json.get('ignore') or ()))

  def ignored(self, module: str) -> bool:
    return any(match_name(module, target) for target in self.ignore)

  def packed_shape(self, shape: Sequence[int]) -> tuple[int, int]:
    return shape[0], math.ceil(shape[1] * self.num_bits / 32)

  def scale_shape(self, shape: Sequence[int]) -> tuple[int, int]:
    if shape[1] % self.group_size:
      raise ValueError(f'in_features {shape[1]} is not a multiple of group_size {self.group_size}')
    return shape[0], shape[1] // self.group_size


def match_name(name: str, target: str) -> bool:
  '''compressed-tensors' target / ignore matching of a module name.'''
  if target.startswith('re:'):
    return re.match(target[3:], name) is not None
  return target == name


def unpack(packed_RxW: np.ndarray, cols: int, num_bits: int) -> np.ndarray:
  '''int32 words -> int8 values in [-2**(bits-1), 2**(bits-1)), (R, cols).'''
  per = 32 // num_bits
  if packed_RxW.shape[-1] * per < cols:
    raise ValueError(f'{packed_RxW.shape[-1]} packed words hold fewer than {cols} columns')
  words = np.ascontiguousarray(packed_RxW, dtype=np.int32).view(np.uint32)  # Logical shifts.
  shifts = np.arange(per, dtype=np.uint32) * num_bits
  fields = (words[..., None] >> shifts) & np.uint32((1 << num_bits) - 1)
  q = fields.reshape(*packed_RxW.shape[:-1], -1)[..., :cols]
  return (q.astype(np.int16) - (1 << (num_bits - 1))).astype(np.int8)


def pack(q_RxC: np.ndarray, num_bits: int) -> np.ndarray:
  '''int8 values (R, C) -> int32 words (R, ceil(C * bits / 32)), the inverse of unpack.'''
  per = 32 // num_bits
  lo, hi = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
  if q_RxC.size and (q_RxC.min() < lo or q_RxC.max() > hi):
    raise ValueError(f'values outside [{lo}, {hi}] cannot be packed in {num_bits} bits')
  rows, cols = q_RxC.shape
  u = np.zeros((rows, math.ceil(cols / per) * per), np.uint32)
  u[:, :cols] = (q_RxC.astype(np.int32) - lo).astype(np.uint32)
  shifts = np.arange(per, dtype=np.uint32) * num_bits
  words = np.bitwise_or.reduce(u.reshape(rows, -1, per) << shifts, axis=-1)
  return words.astype(np.uint32).view(np.int32)


def dequantize(packed_RxW: np.ndarray, scale_RxG: np.ndarray, cols: int, scheme: Scheme) -> np.ndarray:
  '''W = q * scale, the exact product rounded once to the scale's dtype (as compressed-tensors).'''
  q = unpack(packed_RxW, cols, scheme.num_bits)
  if scale_RxG.shape != (q.shape[0], cols // scheme.group_size):
    raise ValueError(f'weight_scale has shape {scale_RxG.shape}, expected '
                     f'{(q.shape[0], cols // scheme.group_size)} for {cols} columns in groups of '
                     f'{scheme.group_size}')
  s = np.repeat(scale_RxG.astype(np.float32), scheme.group_size, axis=1)
  return (q.astype(np.float32) * s).astype(scale_RxG.dtype)


def quantize(w_RxC: np.ndarray, scheme: Scheme, scale_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
  '''W -> (weight_packed, weight_scale) with compressed-tensors' symmetric min-max scales.'''
  rows, cols = w_RxC.shape
  g = w_RxC.astype(np.float32).reshape(rows, *scheme.scale_shape(w_RxC.shape)[1:], scheme.group_size)
  scale = (np.abs(g).max(-1) / ((2 ** scheme.num_bits - 1) / 2)).astype(scale_dtype)
  scale[scale == 0] = ml_dtypes.finfo(scale_dtype).eps
  lo, hi = -(1 << (scheme.num_bits - 1)), (1 << (scheme.num_bits - 1)) - 1
  q = np.clip(np.round(g / scale.astype(np.float32)[..., None]), lo, hi).astype(np.int8)
  return pack(q.reshape(rows, cols), scheme.num_bits), scale
