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


def pg_loss(logp_BxT, sampler_logp_BxT, adv_BxT, mask_BxT, denom, *, clip_eps: float = 0.0, is_cap: float = 0.0):
  """Sum over policy tokens of the per-token surrogate, divided by `denom`. Returns (loss, stats).
  adv_BxT is per token: in packed rows each token has its trajectory's advantage.

  With clip_eps: PPO's clipped surrogate. Else with is_cap: truncated importance sampling, each
  token's -A * log p weighted by min(p / p_sampler, is_cap) (no gradient through the weight), which
  corrects a sampler that is behind the trainer (an asynchronous pipeline) or truncates (top-k/p).
  stats: clip_frac, is_log_ratio (mean log p - log p_sampler), is_ess (effective sample size of the
  weights over the tokens, 1 = all equal) and is_capped (fraction of tokens whose ratio was capped).
  """
  log_ratio = jax.lax.stop_gradient(logp_BxT) - sampler_logp_BxT
  w = jnp.exp(log_ratio)
  n = jnp.maximum(jnp.sum(mask_BxT), 1)
  if clip_eps:
    ratio = jnp.exp(logp_BxT - sampler_logp_BxT)
    tok = -jnp.minimum(ratio * adv_BxT, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv_BxT)
    frac = jnp.sum((jnp.abs(ratio - 1) > clip_eps) * mask_BxT) / n
  else:
    if is_cap:
      w = jnp.minimum(w, is_cap)
    tok, frac = -adv_BxT * logp_BxT * (w if is_cap else 1.0), jnp.zeros(())
  ess = jnp.sum(w * mask_BxT) ** 2 / jnp.maximum(n * jnp.sum(w * w * mask_BxT), 1e-30)
  stats = {'clip_frac': frac, 'is_log_ratio': jnp.sum(log_ratio * mask_BxT) / n, 'is_ess': ess,
           'is_capped': jnp.sum((log_ratio > jnp.log(is_cap or jnp.inf)) * mask_BxT) / n}
  return jnp.sum(tok * mask_BxT) / denom, stats


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


def position_stats(s_logp, t_logp, tokens, *, kind: str, top_k: int = 0) -> dict:
  """What distillation needs of each position's two distributions (N x S x V -> N x S each).

  per: the loss whose gradient is the divergence's; rkl: reverse KL (logged); t_top / t_max: the
  teacher's argmax and its log-prob; s_max: the student's top log-prob (no gradient). The update
  computes these a chunk of positions at a time (research/rl/update/logprobs.py), never all N x S x V.
  """
  t_logp = jax.lax.stop_gradient(t_logp)
  return {'per': distill_per_position(s_logp, t_logp, tokens, kind=kind, top_k=top_k),
          'rkl': jax.lax.stop_gradient(_kl(s_logp, t_logp)), 't_top': jnp.argmax(t_logp, -1),
          't_max': jnp.max(t_logp, -1), 's_max': jax.lax.stop_gradient(jnp.max(s_logp, -1))}


def gate_mask(stats: dict, mask_NxS, *, gate: str, margin: float = 0.0):
  if gate == 'none':
    return mask_NxS
  if gate == 'confident':
    return mask_NxS * (stats['t_max'] - stats['s_max'] > margin)
  raise ValueError(f'loss.gate={gate!r}: expected one of {GATES}')


def divergence_mask(t_top_NxS, tokens, mask_NxS):
  """Positions up to and including the first where tokens differ from the teacher's argmax."""
  differ = (t_top_NxS != tokens) & (mask_NxS > 0)
  before = jnp.cumsum(differ, -1) - differ
  return mask_NxS * (before == 0)


def distill_loss(stats: dict, tokens, mask_NxS, *, gate: str = 'none', margin: float = 0.0,
                 until_divergence: bool = False):
  """Mean over (gated) target positions of `position_stats`' per-position loss.

  Returns (loss, reverse KL per target N, kept fraction).
  """
  g = divergence_mask(stats['t_top'], tokens, mask_NxS) if until_divergence else mask_NxS
  g = gate_mask(stats, g, gate=gate, margin=margin)
  loss = jnp.sum(stats['per'] * g) / jnp.maximum(jnp.sum(g), 1.0)
  kl_N = jnp.sum(stats['rkl'] * mask_NxS, -1) / jnp.maximum(jnp.sum(mask_NxS, -1), 1.0)
  return loss, kl_N, jnp.sum(g) / jnp.maximum(jnp.sum(mask_NxS), 1.0)
