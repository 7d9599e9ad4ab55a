"""GPU kernels from tokamax (pinned in requirements.lock): grouped GEMM for the experts, flash attention.

tokamax has Mosaic GPU kernels (sm90/sm100), Pallas Triton kernels and XLA fallbacks. A pinned
tokamax can lag jax: 0.0.12's Mosaic kernels do not build on jax 0.11 (`plgpu.Mesh` lost
`out_shape`) and its Triton kernels call `pl.dot`, removed in 0.11 (restored below). So the GPU
kernels in use are the ones that compile here (`gpu_kernels`, probed once per process), and the
`auto` paths fall back to ours when none does. On a CPU only the XLA implementations apply
(`jax.lax.ragged_dot_general`; a dense masked softmax): the parity tests compare ours with those.
"""

import functools
from typing import NamedTuple
import warnings

from absl import flags
import jax
from jax.experimental import pallas as pl
import jax.numpy as jnp
import tokamax
# The public `dot_product_attention` takes a dense T x S boolean mask or causal + lengths only; packed
# segments need the per-query key range of `Mask` (k_start), which the kernels take natively.
from tokamax._src.ops.attention import api as _attention_api
from tokamax._src.ops.attention import base as _attention_base

# tokamax implementations to try, in order; None: the GPU kernels that compile here, then XLA.
KERNEL_ORDER: tuple[str, ...] | None = None


def _pallas_dot(a, b, trans_a: bool = False, trans_b: bool = False, allow_tf32=None, precision=None):
  """`pl.dot` as jax 0.10 had it (2-D, f32 accumulation), for tokamax 0.0.12's Triton kernels."""
  del allow_tf32
  dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
  return jax.lax.dot_general(a, b, dims, precision=precision, preferred_element_type=jnp.float32)


with warnings.catch_warnings():  # jax 0.10 warns on the access; 0.11 raises.
  warnings.simplefilter('ignore', DeprecationWarning)
  try:
    pl.dot  # pylint: disable=pointless-statement
  except AttributeError:
    pl.dot = _pallas_dot


@functools.cache
def gpu_kernels(op: str) -> tuple[str, ...]:
  """The tokamax GPU implementations of `op` ('ragged_dot' or 'attention') that compile here."""
  if jax.default_backend() != 'gpu':
    return ()
  _flags_ready()
  bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  ok = []
  for name in ('mosaic', 'triton'):
    if op == 'ragged_dot':
      fn = lambda x, w, g, name=name: tokamax.ragged_dot(x, w, g, implementation=name)
      args = (bf16(256, 128), bf16(2, 128, 128), jax.ShapeDtypeStruct((2,), jnp.int32))
    else:
      fn = lambda q, k, v, name=name: tokamax.dot_product_attention(q, k, v, is_causal=True, implementation=name)
      args = (bf16(1, 256, 4, 64), bf16(1, 256, 2, 64), bf16(1, 256, 2, 64))
    try:
      jax.jit(jax.grad(lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32)), (0, 1))).lower(*args).compile()
      ok.append(name)
    except Exception:  # pylint: disable=broad-except  # Whatever breaks, this kernel is not usable here.
      pass
  return tuple(ok)


def kernel_order(op: str) -> tuple[str, ...]:
  return KERNEL_ORDER if KERNEL_ORDER is not None else (*gpu_kernels(op), 'xla')


def _flags_ready():
  """tokamax reads its options from absl flags and parses sys.argv itself when nobody has (which
  fails under pytest or Jupyter); outside an absl app its defaults are what we want."""
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


class MaskInfo(NamedTuple):
  """A causal, segmented attention mask without its T x S array.

  Query t sees key s iff kv_seg[s] != 0, q_seg[t] == kv_seg[s] and kv_slot[s] <= q_slot[t].
  Training: segment ids (0 = padding) on both sides and slots 0..T-1 (q_slot 1 x T). With a KV
  cache: every query in segment 1, kv_seg the cache's valid slots, q_slot the slots each row's
  queries are written to (B x T: rows have their own write index).
  """
  q_seg_BxT: jax.Array
  kv_seg_BxS: jax.Array
  q_slot_BxT: jax.Array  # Or 1 x T, shared by the rows.
  kv_slot_S: jax.Array

  def dense(self):
    """The B x T x S boolean mask."""
    same = self.q_seg_BxT[:, :, None] == self.kv_seg_BxS[:, None, :]
    causal = self.kv_slot_S[None, None, :] <= self.q_slot_BxT[:, :, None]
    return same & (self.kv_seg_BxS[:, None, :] != 0) & causal


def segment_starts(seg_BxT):
  """Index of the first position of the run each position belongs to (segments are contiguous)."""
  t = seg_BxT.shape[1]
  idx = jnp.arange(t)
  new_run = jnp.concatenate([jnp.ones_like(seg_BxT[:, :1], bool), seg_BxT[:, 1:] != seg_BxT[:, :-1]], 1)
  return jax.lax.cummax(jnp.where(new_run, idx, 0), axis=1)


def tokamax_mask(mask: MaskInfo, cached: bool):
  """`mask` as tokamax's `Mask`, without a T x S array.

  No cache (keys are the queries' positions): each query sees keys from the start of its segment
  up to itself (`k_start`, causal; segments must be contiguous runs); a padding query sees itself
  only, so no row is empty. With a cache (every query in segment 1): the valid slots (a B x S mask
  broadcast over queries) up to the query's own slot (`k_end`).
  """
  if cached:
    valid = (mask.kv_seg_BxS != 0)[:, None, None, :]
    return _attention_base.Mask(valid, k_end=(mask.q_slot_BxT + 1)[:, None, :])
  t = mask.q_seg_BxT.shape[1]
  k_start_BxT = jnp.where(mask.q_seg_BxT != 0, segment_starts(mask.q_seg_BxT), jnp.arange(t))
  return _attention_base.Mask(k_start=k_start_BxT[:, None, :], is_causal=True)


def flash_attention(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask: MaskInfo, scale: float, cached: bool):
  """Softmax attention through tokamax's flash kernels, the first of `kernel_order` that applies.

  H = K * G query heads share each key head; the value head size may differ from the query's (MLA).
  """
  _flags_ready()
  errors = []
  for name in kernel_order('attention'):
    impl = _attention_api.IMPLEMENTATIONS.get('mosaic_gpu' if name == 'mosaic' else name)
    if impl is None:
      continue
    try:
      return impl(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask=tokamax_mask(mask, cached), logits_scale=scale)
    except NotImplementedError as e:
      errors.append(f'{name}: {e}')
  raise NotImplementedError(f'no tokamax attention implementation applies: {errors}')


def ragged_dot(x_MxK, w_GxKxN, group_sizes_G):
  """Grouped GEMM over rows sorted by group; rows past sum(group_sizes) come back as zeros."""
  _flags_ready()
  y = tokamax.ragged_dot(x_MxK, w_GxKxN.astype(x_MxK.dtype), group_sizes_G,
                         preferred_element_type=x_MxK.dtype,
                         implementation=kernel_order('ragged_dot'))
  return _keep_rows(y, jnp.arange(x_MxK.shape[0]) < jnp.sum(group_sizes_G))


@jax.custom_vjp
def _keep_rows(y_MxN, keep_M):
  """y with the rows not in keep_M zeroed. The backward keeps the M-vector: jnp.where's transpose
  saves its broadcast M x N condition, a residual as large as y (bool) for each call."""
  return jnp.where(keep_M[:, None], y_MxN, 0)


def _keep_rows_fwd(y_MxN, keep_M):
  return _keep_rows(y_MxN, keep_M), keep_M


def _keep_rows_bwd(keep_M, g_MxN):
  return jnp.where(keep_M[:, None], g_MxN, 0), None


_keep_rows.defvjp(_keep_rows_fwd, _keep_rows_bwd)
