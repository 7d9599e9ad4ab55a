"""Log-probabilities, KL terms and entropies over the vocabulary, a chunk of positions at a time.

Every per-position quantity of the RL update (the target's log-prob, the entropy, the KL to the
anchor, the distillation divergence) needs the whole vocabulary at that position. Taking them from
B x T x V logits makes memory grow with vocabulary x context; here the model hands over hidden states
(`transformer.forward(head=False)`), and `seq_map` unembeds `chunk` positions at a time under
`jax.checkpoint`: the forward pass holds one chunk's logits, the backward pass recomputes them chunk
by chunk. chunk=0 takes the whole sequence at once (the unchunked path, kept for comparison).
"""

import jax
import jax.numpy as jnp

from research.model.config import ModelConfig
from research.model.transformer import lm_head
from research.rl.update import losses


def seq_map(fn, chunk: int, *xs_BxT):
  """fn(*chunks) over chunks of `chunk` positions of axis 1 of every xs; outputs joined on axis 1.

  The last chunk is zero-padded (its outputs are cut). fn's outputs are a pytree of B x chunk x ...
  """
  t = xs_BxT[0].shape[1]
  c = min(chunk or t, t)
  if c == t:
    return fn(*xs_BxT)
  n = -(-t // c)

  def split(x):  # B x T x ... -> n x B x c x ...
    x = jnp.pad(x, [(0, 0), (0, n * c - t)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape(x.shape[0], n, c, *x.shape[2:]), 1, 0)

  out = jax.lax.map(jax.checkpoint(lambda a: fn(*a)), tuple(split(x) for x in xs_BxT))
  return jax.tree.map(lambda y: jnp.moveaxis(y, 0, 1).reshape(y.shape[1], n * c, *y.shape[3:])[:, :t], out)


def _logp(head_DxV, h_BxCxD, cfg: ModelConfig, temperature: float):
  return losses.tempered_log_softmax(lm_head(head_DxV, h_BxCxD, cfg), temperature)


def policy_terms(h_BxTxD, targets_BxT, head_DxV, *, cfg: ModelConfig, temperature: float, chunk: int,
                 ref_h_BxTxD=None, ref_head_DxV=None) -> dict:
  """Per position (B x T): `logp` of the target, `entropy` (no gradient) and, given the anchor's
  hidden states and head, `kl` = KL(policy || anchor) (gradient through the policy only)."""
  def fn(h, y, *ref):
    logp = _logp(head_DxV, h, cfg, temperature)
    out = {'logp': jnp.take_along_axis(logp, y[..., None], -1)[..., 0],
           'entropy': jax.lax.stop_gradient(-jnp.sum(jnp.exp(logp) * logp, -1))}
    if ref:
      r = jax.lax.stop_gradient(_logp(ref_head_DxV, ref[0], cfg, temperature))
      out['kl'] = jnp.sum(jnp.exp(logp) * (logp - r), -1)
    return out
  return seq_map(fn, chunk, h_BxTxD, targets_BxT, *([] if ref_h_BxTxD is None else [ref_h_BxTxD]))


def distill_terms(s_h_NxSxD, t_h_NxSxD, tokens_NxS, head_DxV, t_head_DxV, *, cfg: ModelConfig,
                  temperature: float, chunk: int, kind: str, top_k: int) -> dict:
  """losses.position_stats of student vs teacher hidden states at the target positions (N x S each)."""
  def fn(s_h, t_h, y):
    return losses.position_stats(_logp(head_DxV, s_h, cfg, temperature),
                                 _logp(t_head_DxV, t_h, cfg, temperature), y, kind=kind, top_k=top_k)
  return seq_map(fn, chunk, s_h_NxSxD, t_h_NxSxD, tokens_NxS)
