"""The RL objective that research/train/step.py's train step runs: policy gradient, distillation on
hinted targets, and the anchor KL, from one forward of the policy."""
import jax
import jax.numpy as jnp

from research.model import transformer
from research.rl.config import LossConfig
from research.rl.update import logprobs
from research.rl.update import losses


def objective(params, batch, cfg, *, lc: LossConfig, temperature: float):
  """pg_coef * policy gradient + distill_coef * distillation + anchor_coef * anchor KL (the train
  step adds the router losses). Log-probs, KLs and entropies a chunk of positions at a time.

  batch: rows (B-leading: tokens, segment_ids, targets, mask, sampler_logp, adv B x T (per token:
  a row packs several trajectories, one segment each), valid B (valid trajectories in the row), and
  routes B x T x L x k for router replay, ref_hidden B x T x D for the anchor), targets (N-leading:
  d_row, d_pos, d_tok, d_mask, t_hidden N x S x D) and teacher_head (D x V). Returns (loss, aux).
  Every term sums over tokens and normalises by batch totals, so the layout of trajectories in rows
  changes nothing but the compute.
  """
  rows, tgt, chunk = batch['rows'], batch['targets'], lc.logit_chunk
  routes = rows['routes'] if 'routes' in rows else None
  if routes is not None:  # B x T x L x k -> L x B*T x k, the forward's layout.
    routes = jnp.moveaxis(routes, 2, 0).reshape(routes.shape[2], -1, routes.shape[3])
  h, aux, _ = transformer.forward(params, rows['tokens'], cfg, segment_ids_BxT=rows['segment_ids'],
                                  routes=routes, head=False)
  head, t_head = params['lm_head']['kernel'], batch['teacher_head']
  anchor = lc.anchor_coef > 0
  terms = logprobs.policy_terms(h, rows['targets'], head, cfg=cfg, temperature=temperature, chunk=chunk,
                                ref_h_BxTxD=rows['ref_hidden'] if anchor else None, ref_head_DxV=t_head)
  mask = rows['mask']
  on_target = jnp.zeros_like(mask).at[tgt['d_row'][:, None], tgt['d_pos']].max(tgt['d_mask'])
  denom = jnp.maximum(jnp.sum(rows['valid']), 1.0) * lc.norm_tokens
  # On a hinted message the teacher's per-token signal replaces the advantage (unless pg_on_targets).
  pg, pg_stats = losses.pg_loss(terms['logp'], rows['sampler_logp'], rows['adv'],
                                mask if lc.pg_on_targets else mask * (1 - on_target), denom,
                                clip_eps=lc.clip_eps, is_cap=lc.is_cap)
  stats = logprobs.distill_terms(h[tgt['d_row'][:, None], tgt['d_pos']], tgt['t_hidden'], tgt['d_tok'], head,
                                 t_head, cfg=cfg, temperature=temperature, chunk=chunk,
                                 kind=lc.distill_kind, top_k=lc.distill_top_k)
  dl, kl_N, gated = losses.distill_loss(stats, tgt['d_tok'], tgt['d_mask'], gate=lc.gate, margin=lc.gate_margin,
                                        until_divergence=lc.until_divergence)
  loss = lc.pg_coef * pg + lc.distill_coef * dl
  anchor_kl = jnp.zeros(())
  if anchor:  # Reverse KL to the teacher weights without a hint on every other policy token.
    keep = mask * (1 - on_target)
    anchor_kl = jnp.sum(terms['kl'] * keep) / jnp.maximum(jnp.sum(keep), 1.0)
    loss += lc.anchor_coef * anchor_kl
  n = jnp.maximum(jnp.sum(mask), 1.0)
  diff = (rows['sampler_logp'] - jax.lax.stop_gradient(terms['logp'])) * mask
  return loss, {**aux, **pg_stats, 'pg_loss': pg, 'distill_loss': dl, 'anchor_kl': anchor_kl, 'kl_N': kl_N,
                'gated_frac': gated, 'entropy': jnp.sum(terms['entropy'] * mask) / n,
                'logp_mismatch': jnp.sum(jnp.abs(diff)) / n, 'logp_mismatch_mean': jnp.sum(diff) / n}
