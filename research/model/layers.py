"""Parameter specs and the small layers shared by attention and MoE: RMSNorm, RoPE, SwiGLU, lookups."""

import dataclasses
import functools
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from research.parallel.sharding import constrain


@dataclasses.dataclass(frozen=True)
class ParamSpec:
  """Shape, logical axes and initializer of one parameter: the single source for init and sharding."""
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  init: str = 'normal'  # 'normal' (scaled by std), 'ones' or 'zeros'.
  std: float = 0.02

  def __post_init__(self):
    assert len(self.shape) == len(self.axes), (self.shape, self.axes)


def stack(specs, n: int):
  """Adds a leading `layers` axis of size n to every spec in a tree."""
  return jax.tree.map(lambda s: dataclasses.replace(s, shape=(n, *s.shape), axes=('layers', *s.axes)),
                      specs, is_leaf=is_spec)


def is_spec(x) -> bool:
  return isinstance(x, ParamSpec)


def materialize(specs, rng: jax.Array, dtype) -> dict:
  """Initializes a tree of ParamSpec; each leaf gets an rng folded from its path (stable under edits)."""
  def one(path, s: ParamSpec):
    if s.init == 'ones':
      return jnp.ones(s.shape, dtype)
    if s.init == 'zeros':
      return jnp.zeros(s.shape, dtype)
    key = jax.random.fold_in(rng, zlib.crc32(jax.tree_util.keystr(path).encode()) % (2**31))
    return (s.std * jax.random.truncated_normal(key, -2.0, 2.0, s.shape, jnp.float32)).astype(dtype)
  return jax.tree_util.tree_map_with_path(one, specs, is_leaf=is_spec)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def take_rows(table, idx, dtype, table_axes=None):
  """table.astype(dtype)[idx] (the cast table laid out by logical `table_axes` first, if given).

  Its gradient is summed in the table's own dtype: jax's transpose of this lookup scatter-adds in
  `dtype`, and a bf16 sum stops growing at 256 times its terms (a token seen that often in a batch,
  an expert's weights gathered for that many blocks).
  """
  cast = table.astype(dtype)
  return (cast if table_axes is None else constrain(cast, table_axes))[idx]


def _take_rows_fwd(table, idx, dtype, table_axes):
  return take_rows(table, idx, dtype, table_axes), (table, idx)


def _take_rows_bwd(dtype, table_axes, res, ct):
  del dtype, table_axes
  table, idx = res
  return jnp.zeros_like(table).at[idx].add(ct.astype(table.dtype)), None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable, static_argnums=(2,))
def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm in float32 over the last axis. Its backward recomputes from x (elementwise) rather than
  keep two float32 copies of it (x and the normalized x: 4x a bf16 x's bytes)."""
  with jax.named_scope('norm'):
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def yarn_frequencies(r: int, theta: float, factor: float, original_len: int, beta_fast: float,
                     beta_slow: float) -> np.ndarray:
  """YaRN: interpolate (divide by factor) the slow dims, keep the fast ones, ramp in between.

  Same float32 arithmetic as transformers' `_compute_yarn_parameters` (truncate=True).
  """
  base = theta ** (np.arange(0, r, 2, dtype=np.float32) / np.float32(r))
  extra, inter = np.float32(1.0) / base, np.float32(1.0) / (np.float32(factor) * base)
  dim = lambda rot: r * math.log(original_len / (rot * 2 * math.pi)) / (2 * math.log(theta))
  low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), r - 1)
  ramp = np.clip((np.arange(r // 2, dtype=np.float32) - low) / np.float32(high - low or 0.001), 0, 1)
  keep = np.float32(1.0) - ramp
  return (inter * (1 - keep) + extra * keep).astype(np.float32)


def rope(x_BxTxHxR: jax.Array, pos_BxT: jax.Array, theta: float, interleaved: bool, freq=None,
         scale: float = 1.0) -> jax.Array:
  """Rotary embedding. interleaved rotates pairs (2i, 2i+1) (DeepSeek), else halves (i, i+R/2).

  freq (R/2,) overrides theta's frequencies (YaRN); scale multiplies cos and sin.
  """
  r = x_BxTxHxR.shape[-1]
  if freq is None:
    freq = theta ** (-jnp.arange(0, r, 2, dtype=jnp.float32) / r)
  ang_BxTx1xR2 = (pos_BxT.astype(jnp.float32)[..., None] * freq)[:, :, None, :]
  sin, cos = jnp.sin(ang_BxTx1xR2) * scale, jnp.cos(ang_BxTx1xR2) * scale
  x = x_BxTxHxR.astype(jnp.float32)
  if interleaved:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    y = jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).reshape(x.shape)
  else:
    x1, x2 = x[..., : r // 2], x[..., r // 2:]
    y = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return y.astype(x_BxTxHxR.dtype)


def swiglu_specs(d: int, f: int, embed_axis: str = 'embed', mlp_axis: str = 'mlp') -> dict:
  return {
      'wi_gate': ParamSpec((d, f), (embed_axis, mlp_axis)),
      'wi_up': ParamSpec((d, f), (embed_axis, mlp_axis)),
      'wo': ParamSpec((f, d), (mlp_axis, embed_axis)),
  }


@functools.partial(jax.named_call, name='mlp')
def swiglu(p: dict, x: jax.Array) -> jax.Array:
  h = jax.nn.silu(x @ p['wi_gate'].astype(x.dtype)) * (x @ p['wi_up'].astype(x.dtype))
  return h @ p['wo'].astype(x.dtype)

