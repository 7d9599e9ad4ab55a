"""RL objective: group-baseline policy gradient on policy tokens + lambda x distillation on targets.

Policy gradient (Dr.GRPO by default): the advantage of a rollout is its reward minus the mean reward
of its group (the G rollouts of one task), optionally divided by the group's std (GRPO). The loss
sums -A * log p over policy tokens and divides by a constant (rollouts x `norm_tokens`), not by each
sequence's length, so long and short answers are weighted alike. With clip_eps > 0 it is PPO's
clipped surrogate on the ratio to the sampler's log-probs.

Distillation on each target span, per position t with student p_S and teacher p_T over the vocab:
  reverse_kl  sum_v p_S (log p_S - log p_T)      (mode seeking; the on-policy distillation default)
  forward_kl  sum_v p_T (log p_T - log p_S)
  jsd         (KL(p_T || m) + KL(p_S || m)) / 2,  m = (p_T + p_S) / 2
  topk        forward KL over the teacher's top-k tokens, both renormalized there
  sampled     the sampled-token estimator: -sg(log p_T(y) - log p_S(y)) * log p_S(y), whose gradient
              is the reverse KL's in expectation over the student's own tokens y
Gate 'confident' keeps positions where the teacher's top probability exceeds the student's by more
than `gate_margin` (in log space). `until_divergence` keeps a target's positions up to and including
the first where the student's token is not the teacher's top choice: later positions are conditioned
on a prefix the hinted teacher would not have written, and its signal there degrades.
"""

import jax
import jax.numpy as jnp
import numpy as np

DISTILL_KINDS = ('reverse_kl', 'forward_kl', 'jsd', 'topk', 'sampled')
GATES = ('none', 'confident')


def tempered_log_softmax(logits, temperature: float, axis: int = -1):
  """The policy's log-probs at a sampling temperature. Temperature 0 (greedy) has no tempered
  distribution (a point mass): the policy is then softmax(logits), which greedy decoding takes the
  mode of, so sampler, update and teacher all use temperature 1 there."""
  return jax.nn.log_softmax(logits / (temperature or 1.0), axis=axis)


def group_advantages(rewards_B, groups_B, valid_B, *, std_norm: bool = False, eps: float = 1e-6):
  """Reward minus its group's mean over valid rollouts (faults excluded; they get 0)."""
  r, g, v = np.asarray(rewards_B, np.float64), np.asarray(groups_B), np.asarray(valid_B, bool)
  adv = np.zeros_like(r)
  for k in np.unique(g[v]):
    sel = v & (g == k)
    adv[sel] = r[sel] - r[sel].mean()
    if std_norm:
      adv[sel] /= r[sel].std() + eps
  return adv.astype(np.float32)


def pg_loss(logp_BxT, sampler_logp_BxT, adv_B, mask_BxT, denom, *, clip_eps: float = 0.0):
  """Sum over policy tokens of the per-token surrogate, divided by `denom`. Returns (loss, clip_frac)."""
  a = adv_B[:, None]
  if clip_eps:
    ratio = jnp.exp(logp_BxT - sampler_logp_BxT)
    tok = -jnp.minimum(ratio * a, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * a)
    clipped = (jnp.abs(ratio - 1) > clip_eps) & (mask_BxT > 0)
    frac = jnp.sum(clipped) / jnp.maximum(jnp.sum(mask_BxT), 1)
  else:
    tok, frac = -a * logp_BxT, jnp.zeros(())
  return jnp.sum(tok * mask_BxT) / denom, frac


def _kl(p_logp, q_logp):
  return jnp.sum(jnp.exp(p_logp) * (p_logp - q_logp), axis=-1)


def distill_per_position(s_logp, t_logp, tokens, *, kind: str, top_k: int = 0):
  """Per-position loss (N x S) whose gradient is the chosen divergence's. s_logp, t_logp: N x S x V."""
  t_logp = jax.lax.stop_gradient(t_logp)
  if kind == 'reverse_kl':
    return _kl(s_logp, t_logp)
  if kind == 'forward_kl':
    return _kl(t_logp, s_logp)
  if kind == 'jsd':
    m = jnp.logaddexp(s_logp, t_logp) - jnp.log(2.0)
    return 0.5 * (_kl(t_logp, m) + _kl(s_logp, m))
  if kind == 'topk':
    if top_k <= 0:
      raise ValueError(f'loss.distill_top_k={top_k}: must be positive for distill kind topk')
    idx = jax.lax.top_k(t_logp, top_k)[1]
    t_k = jax.nn.log_softmax(jnp.take_along_axis(t_logp, idx, -1))
    s_k = jax.nn.log_softmax(jnp.take_along_axis(s_logp, idx, -1))
    return _kl(t_k, s_k)
  if kind == 'sampled':
    s_y = jnp.take_along_axis(s_logp, tokens[..., None], -1)[..., 0]
    t_y = jnp.take_along_axis(t_logp, tokens[..., None], -1)[..., 0]
    return -jax.lax.stop_gradient(t_y - s_y) * s_y
  raise ValueError(f'loss.distill_kind={kind!r}: expected one of {DISTILL_KINDS}')


def gate_mask(s_logp, t_logp, mask_NxS, *, gate: str, margin: float = 0.0):
  if gate == 'none':
    return mask_NxS
  if gate == 'confident':
    conf = jnp.max(t_logp, -1) - jax.lax.stop_gradient(jnp.max(s_logp, -1)) > margin
    return mask_NxS * conf
  raise ValueError(f'loss.gate={gate!r}: expected one of {GATES}')


def divergence_mask(t_logp, tokens, mask_NxS):
  """Positions up to and including the first where tokens differ from the teacher's argmax."""
  differ = (jnp.argmax(t_logp, -1) != tokens) & (mask_NxS > 0)
  before = jnp.cumsum(differ, -1) - differ
  return mask_NxS * (before == 0)


def distill_loss(s_logp, t_logp, tokens, mask_NxS, *, kind: str, top_k: int = 0, gate: str = 'none',
                 margin: float = 0.0, until_divergence: bool = False):
  """Mean over (gated) target positions. Returns (loss, reverse KL per target N, kept fraction)."""
  g = divergence_mask(t_logp, tokens, mask_NxS) if until_divergence else mask_NxS
  g = gate_mask(s_logp, t_logp, g, gate=gate, margin=margin)
  per = distill_per_position(s_logp, t_logp, tokens, kind=kind, top_k=top_k)
  loss = jnp.sum(per * g) / jnp.maximum(jnp.sum(g), 1.0)
  rkl = jax.lax.stop_gradient(_kl(s_logp, t_logp))
  kl_N = jnp.sum(rkl * mask_NxS, -1) / jnp.maximum(jnp.sum(mask_NxS, -1), 1.0)
  return loss, kl_N, jnp.sum(g) / jnp.maximum(jnp.sum(mask_NxS), 1.0)
