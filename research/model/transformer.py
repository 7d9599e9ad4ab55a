"""The decoder: embed, scanned dense layers, scanned MoE layers, norm, unembed. Pure functions.

params = {'embed': {'embedding': V x D},
          'dense_layers': {...stacked first_k_dense...},   # only if first_k_dense > 0
          'moe_layers': {...stacked num_layers - first_k_dense...},
          'final_norm': {'scale': D}, 'lm_head': {'kernel': D x V}}
Every leaf has logical axes (`param_axes`) that research/parallel/sharding.py maps onto the mesh.
The MoE router bias (sigmoid router) lives in params but takes no gradient: the train step updates
it from the measured load (`research.model.moe.update_router_bias`).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from research.model import attention as attn_lib
from research.model import moe as moe_lib
from research.model.config import ModelConfig
from research.model.kernels import MaskInfo
from research.model.layers import (ParamSpec, is_spec, materialize, rms_norm, stack, swiglu, swiglu_specs,
                                   take_rows)
from research.parallel.sharding import constrain

_REMAT = {
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _layer_specs(cfg: ModelConfig, is_moe: bool) -> dict:
  d = cfg.d_model
  return {
      'attn_norm': ParamSpec((d,), ('norm',), 'ones'),
      'attn': attn_lib.attention_specs(cfg),
      'mlp_norm': ParamSpec((d,), ('norm',), 'ones'),
      **({'moe': moe_lib.moe_specs(cfg)} if is_moe else {'mlp': swiglu_specs(d, cfg.d_ff)}),
  }


def param_specs(cfg: ModelConfig) -> dict:
  cfg.validate()
  d, v = cfg.d_model, cfg.vocab_size
  specs = {
      # Rows unsharded: a gather from a vocab-sharded table forces XLA to replicate it.
      'embed': {'embedding': ParamSpec((v, d), (None, 'embed'), std=1.0)},
      'final_norm': {'scale': ParamSpec((d,), ('norm',), 'ones')},
      'lm_head': {'kernel': ParamSpec((d, v), ('embed', 'vocab'))},
  }
  if cfg.first_k_dense:
    specs['dense_layers'] = stack(_layer_specs(cfg, False), cfg.first_k_dense)
  if cfg.num_moe_layers:
    specs['moe_layers'] = stack(_layer_specs(cfg, True), cfg.num_moe_layers)
  return specs


def init(cfg: ModelConfig, rng: jax.Array) -> dict:
  return materialize(param_specs(cfg), rng, jnp.dtype(cfg.param_dtype))


def param_axes(cfg: ModelConfig) -> dict:
  return jax.tree.map(lambda s: s.axes, param_specs(cfg), is_leaf=is_spec)


def is_trainable(path) -> bool:
  """False for leaves updated outside the optimizer (the router's selection bias)."""
  return not any(getattr(k, 'key', None) == 'router_bias' for k in path)


# ----------------------------------------------------------------------------------------------
# Forward.


def _block(cfg: ModelConfig, is_moe: bool, carry, xs):
  """One decoder layer; scanned over the stacked layer params (the cache view rides in the carry)."""
  x, pos, mask, valid, cache = carry
  p, layer, routes = xs
  if cache is not None:
    cache = dataclasses.replace(cache, layer=layer)
  h, cache, max_logit_H = attn_lib.attention(
      p['attn'], rms_norm(x, p['attn_norm'], cfg.norm_eps), pos, mask, cfg, cache)
  x = x + h
  h_in = rms_norm(x, p['mlp_norm'], cfg.norm_eps)
  if is_moe:
    h, stats = moe_lib.moe(p['moe'], h_in, valid, cfg, routes)
  else:
    h, stats = swiglu(p['mlp'], h_in), {}
  x = constrain(x + h, ('act_batch', 'act_seq', 'act_embed'))
  return (x, pos, mask, valid, cache), {'attn_max_logit': max_logit_H, **stats}


def _run_stack(cfg, is_moe, layers, cache, routes, carry):
  """Scans the layer stack. cache: its LayerCache (the whole stack, updated in place) or None."""
  fn = functools.partial(_block, cfg, is_moe)
  if cfg.remat != 'none':
    fn = jax.checkpoint(fn, policy=_REMAT[cfg.remat])
  n = jax.tree.leaves(layers)[0].shape[0]
  (*carry, cache), stats = jax.lax.scan(fn, (*carry, cache), (layers, jnp.arange(n, dtype=jnp.int32), routes))
  return tuple(carry), cache, stats


def _cache_step(cache, valid_BxT, positions_BxT, span: int | None):
  """Where a cached forward writes (each row at its own end) and what its queries see (the first
  `span` slots).

  Returns (write_at_B, the cache's valid slots after the write, positions, MaskInfo).
  """
  b, t = valid_BxT.shape
  write_at_B = cache['end']
  kv_valid = attn_lib.write_rows(cache['valid'], valid_BxT, write_at_B)
  pos = cache['pos'][:, None] + jnp.cumsum(valid_BxT, axis=1) - 1 if positions_BxT is None else positions_BxT
  seen = kv_valid[:, :span]
  mask = MaskInfo(jnp.ones((b, t), jnp.int32), seen.astype(jnp.int32), write_at_B[:, None] + jnp.arange(t),
                  jnp.arange(seen.shape[1]))
  return write_at_B, kv_valid, pos, mask


def forward(params: dict, tokens_BxT, cfg: ModelConfig, *, positions_BxT=None, segment_ids_BxT=None,
            cache=None, cache_span=None, routes=None, head=True):
  """Logits for tokens_BxT. Returns (logits_BxTxV float32, aux, new_cache).

  head=False returns the final normed hidden states (B x T x D) in place of the logits, for
  callers that apply `lm_head` a chunk at a time (never B x T x V at once).

  Without a cache: causal attention within segments (segment id 0 = padding; default: all 1) at
  `positions_BxT` (default: 0..T-1). With a cache (see research/model/decode.py): each row's tokens
  are written from its own slot cache['end'][b], attend to every valid earlier slot, and positions
  default to cache['pos'] + 0..T-1 over the real tokens. `cache_span` (static) limits attention to
  the cache's first slots: every row's queries must be written below it.
  aux: per-layer stacks 'load' (L_moe x E), 'aux_loss', 'z_loss' (L_moe), 'attn_max_logit' (L x H),
  'routes' (L_moe x B*T x k). Passing routes (same shape) replays them (router replay).
  """
  b, t = tokens_BxT.shape
  dt = jnp.dtype(cfg.dtype)
  if cache is None:
    seg = jnp.ones((b, t), jnp.int32) if segment_ids_BxT is None else segment_ids_BxT
    pos = jnp.broadcast_to(jnp.arange(t), (b, t)) if positions_BxT is None else positions_BxT
    mask = MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))
    valid, write_at = seg != 0, None
  else:
    valid = jnp.ones((b, t), bool) if segment_ids_BxT is None else segment_ids_BxT != 0
    write_at, kv_valid, pos, mask = _cache_step(cache, valid, positions_BxT, cache_span)
  # FSDP: gather the table (cast: half float32's bytes), then look up (XLA cannot reshard a
  # D-sharded lookup to batch-sharded).
  with jax.named_scope('embed'):
    x = take_rows(params['embed']['embedding'], tokens_BxT, dt, (None, None))
  x = constrain(x, ('act_batch', 'act_seq', 'act_embed'))
  carry = (x, pos, mask, valid)
  aux, new_cache = {}, {} if cache is not None else None
  for name, is_moe in (('dense_layers', False), ('moe_layers', True)):
    if name not in params:
      continue
    layer_cache = (None if cache is None else
                   attn_lib.LayerCache(cache[name], jnp.int32(0), write_at, cache_span))
    carry, layer_cache, stats = _run_stack(cfg, is_moe, params[name], layer_cache,
                                           routes if is_moe else None, carry)
    if cache is not None:
      new_cache[name] = layer_cache.stack
    for key, val in stats.items():
      aux[key] = val if key not in aux else jnp.concatenate([aux[key], val])
  x = rms_norm(carry[0], params['final_norm']['scale'], cfg.norm_eps)
  logits = lm_head(params['lm_head']['kernel'], x, cfg) if head else x
  if cache is not None:
    # A row's write index moves past its last real token: a row without one (stopped) stays put.
    last_B = jnp.max(jnp.where(valid, jnp.arange(t) + 1, 0), axis=1)
    new_cache.update(valid=kv_valid, end=write_at + last_B, pos=pos[:, -1] + 1)
  return logits, aux, new_cache


@functools.partial(jax.named_call, name='lm_head')
def lm_head(kernel_DxV, x_BxTxD, cfg: ModelConfig):
  """Unembedding: float32 logits B x T x V."""
  logits = jnp.einsum('btd,dv->btv', x_BxTxD, kernel_DxV.astype(cfg.dtype), preferred_element_type=jnp.float32)
  return constrain(logits, ('act_batch', 'act_seq', 'act_vocab'))
