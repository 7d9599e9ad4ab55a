"""GPU kernels from tokamax (pinned in requirements.lock): grouped GEMM for the experts, flash attention.

tokamax tries its implementations in order and takes the first that does not raise
NotImplementedError: Mosaic GPU kernels on sm90/sm100, then Pallas Triton, then XLA. On a CPU only
the XLA ones apply (`jax.lax.ragged_dot_general`; a dense masked softmax), which is what the
parity tests compare our paths with.
"""

from typing import NamedTuple

from absl import flags
import jax
import jax.numpy as jnp
import tokamax
# The public `dot_product_attention` takes a dense T x S boolean mask or causal + lengths only; packed
# segments need the per-query key range of `Mask` (k_start), which the kernels take natively.
from tokamax._src.ops.attention import api as _attention_api
from tokamax._src.ops.attention import base as _attention_base

# tokamax implementations, tried in order (benchmarks may narrow it before tracing).
KERNEL_ORDER = ('mosaic', 'triton', 'xla')


def _flags_ready():
  """tokamax reads its options from absl flags and parses sys.argv itself when nobody has (which
  fails under pytest or Jupyter); outside an absl app its defaults are what we want."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


class MaskInfo(NamedTuple):
  """A causal, segmented attention mask without its T x S array.

  Query t sees key s iff kv_seg[s] != 0, q_seg[t] == kv_seg[s] and kv_slot[s] <= q_slot[t].
  Training: segment ids (0 = padding) on both sides and slots 0..T-1. With a KV cache: every query
  in segment 1, kv_seg the cache's valid slots, q_slot the slots being written.
  """
  q_seg_BxT: jax.Array
  kv_seg_BxS: jax.Array
  q_slot_T: jax.Array
  kv_slot_S: jax.Array

  def dense(self):
    """The B x T x S boolean mask."""
    same = self.q_seg_BxT[:, :, None] == self.kv_seg_BxS[:, None, :]
    causal = self.kv_slot_S[None, None, :] <= self.q_slot_T[None, :, None]
    return same & (self.kv_seg_BxS[:, None, :] != 0) & causal


def segment_starts(seg_BxT):
  """Index of the first position of the run each position belongs to (segments are contiguous)."""
  t = seg_BxT.shape[1]
  idx = jnp.arange(t)
  new_run = jnp.concatenate([jnp.ones_like(seg_BxT[:, :1], bool), seg_BxT[:, 1:] != seg_BxT[:, :-1]], 1)
  return jax.lax.cummax(jnp.where(new_run, idx, 0), axis=1)


def flash_attention(q_BxTxHxQ, k_BxTxKxQ, v_BxTxKxV, seg_BxT, scale: float):
  """Causal self-attention within contiguous segments through tokamax's flash kernels.

  Each query attends to keys from the start of its segment up to itself (`Mask(k_start,
  is_causal)`); a padding query (segment 0) attends to itself only, so no row is empty.
  H = K * G query heads share each key head; the value head size may differ from the query's (MLA).
  """
  t = q_BxTxHxQ.shape[1]
  k_start_BxT = jnp.where(seg_BxT != 0, segment_starts(seg_BxT), jnp.arange(t))
  mask = _attention_base.Mask(k_start=k_start_BxT[:, None, :], is_causal=True)
  _flags_ready()
  errors = []
  for name in KERNEL_ORDER:
    impl = _attention_api.IMPLEMENTATIONS.get('mosaic_gpu' if name == 'mosaic' else name)
    if impl is None:
      continue
    try:
      return impl(q_BxTxHxQ, k_BxTxKxQ, v_BxTxKxV, mask=mask, logits_scale=scale)
    except NotImplementedError as e:
      errors.append(f'{name}: {e}')
  raise NotImplementedError(f'no tokamax attention implementation applies: {errors}')


def ragged_dot(x_MxK, w_GxKxN, group_sizes_G):
  """Grouped GEMM over rows sorted by group; rows past sum(group_sizes) come back as zeros."""
  _flags_ready()
  y = tokamax.ragged_dot(x_MxK, w_GxKxN.astype(x_MxK.dtype), group_sizes_G,
                         preferred_element_type=x_MxK.dtype, implementation=KERNEL_ORDER)
  real_M = jnp.arange(x_MxK.shape[0]) < jnp.sum(group_sizes_G)
  return jnp.where(real_M[:, None], y, 0)
