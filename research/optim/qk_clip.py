"""QK-clip (Kimi K2's MuonClip): shrink query/key weights of heads whose logits grew too large.

  qk_clip(params, max_logits, targets, tau=100.0) -> params

After the optimizer step, every head h whose largest pre-softmax logit in the step exceeded tau
gets gamma_h = tau / max_logit_h < 1, and its query and key weights are scaled by gamma_h ** power
(power 0.5 on both sides scales that head's logits by gamma_h). The function knows nothing of the
model: `targets` (a tree or prefix matching `params`, or a callable of `params`) holds None for
leaves to leave alone and a QKClipTarget (or a tuple of them) for query/key weights, naming the
head axis, the stacked-layer axis that matches max_logits' leading axis, the power and an optional
slice of the leaf to rescale. Examples, with max_logits of shape (L, H):

  q (L, D, H, Dh), k (L, D, K, Dh): QKClipTarget(head_axis=2, layer_axis=0) for both. With K < H
    kv heads (GQA), a kv head takes the smallest gamma of the H / K query heads that share it, so
    every clipped head's logits shrink at least by its gamma.
  MLA q_b (L, Rq, H, Dn + Dr), kv_b (L, Rkv, H, Dn + Dv): the head-specific parts only, as Kimi
    K2 does: q_b: (QKClipTarget(2, 0, 0.5, (3, 0, Dn)), QKClipTarget(2, 0, 1.0, (3, Dn, Dn + Dr)))
    (the rope part of q meets the shared rope key, so it takes all of gamma); kv_b:
    QKClipTarget(2, 0, 0.5, (3, 0, Dn)) (the value part is left alone).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from research.optim.muon import path_str


class QKClipTarget(NamedTuple):
  head_axis: int
  layer_axis: int | None = None
  power: float = 0.5
  slice: tuple[int, int, int] | None = None  # (axis, start, stop) of the part to rescale.


_is_target = lambda x: x is None or isinstance(x, QKClipTarget) or (
    isinstance(x, tuple) and x and all(isinstance(t, QKClipTarget) for t in x))


def clip_factors(max_logits: jax.Array, tau: float) -> jax.Array:
  """gamma = min(1, tau / max_logit) per head."""
  return jnp.minimum(1.0, tau / jnp.maximum(max_logits.astype(jnp.float32), 1e-30))


def _scale_leaf(w: jax.Array, gamma: jax.Array, t: QKClipTarget, where: str) -> jax.Array:
  heads = w.shape[t.head_axis]
  if gamma.shape[-1] % heads:
    raise ValueError(f'targets at {where}: head axis {t.head_axis} has {heads} heads, which do '
                     f'not divide the {gamma.shape[-1]} heads of max_logits')
  if gamma.ndim != (1 if t.layer_axis is None else 2):
    raise ValueError(f'targets at {where}: max_logits of shape {gamma.shape} needs '
                     f'{"no" if gamma.ndim == 1 else "a"} layer_axis')
  # A kv head shared by several query heads takes the smallest gamma among them.
  gamma = gamma.reshape(gamma.shape[:-1] + (heads, -1)).min(-1)
  scale = gamma ** t.power
  axes = (t.head_axis,) if t.layer_axis is None else (t.layer_axis, t.head_axis)
  order = sorted(range(len(axes)), key=lambda i: axes[i] % w.ndim)
  scale = scale.transpose(order)
  shape = [1] * w.ndim
  for i in order:
    shape[axes[i] % w.ndim] = w.shape[axes[i]]
  scale = scale.reshape(shape)
  if t.slice is not None:
    axis, start, stop = t.slice
    inside = (jnp.arange(w.shape[axis]) >= start) & (jnp.arange(w.shape[axis]) < stop)
    inside = inside.reshape([-1 if a == axis % w.ndim else 1 for a in range(w.ndim)])
    scale = jnp.where(inside, scale, 1.0)
  return (w * scale).astype(w.dtype)


def qk_clip(params: Any, max_logits: jax.Array, targets: Any, tau: float = 100.0) -> Any:
  """Params with the query/key weights of heads above `tau` rescaled (module docstring)."""
  gamma = clip_factors(max_logits, tau)
  targets = targets(params) if callable(targets) else targets
  targets = jax.tree.map(lambda t, sub: jax.tree.map(lambda _: t, sub), targets, params,
                         is_leaf=_is_target)

  def apply(path, w, t):
    if t is None:
      return w
    where = path_str(path) or '<root>'
    for one in (t,) if isinstance(t, QKClipTarget) else t:
      w = _scale_leaf(w, gamma, one, where)
    return w

  return jax.tree_util.tree_map_with_path(apply, params, targets)
