"""GQA (Qwen3) and MLA (DeepSeek-V3) attention, with an optional KV cache.

Both build queries, keys and values per head and share `attend`. With a cache, the new keys are
written at slot `write_at` and queries attend over all cache slots; MLA caches only the compressed
latent and the shared rope key (kv_lora_rank + qk_rope_head_dim numbers per token).
"""

import jax
import jax.numpy as jnp

from research.model.config import ModelConfig
from research.model import layers
from research.model.layers import ParamSpec, rms_norm
from research.parallel.sharding import constrain

NEG_INF = -1e30  # Finite, so fully masked (padding) rows give a uniform softmax instead of NaN.


def attention_specs(cfg: ModelConfig) -> dict:
  d, h = cfg.d_model, cfg.num_heads
  out_std = cfg.init_std / (2 * cfg.num_layers) ** 0.5
  if cfg.attention == 'gqa':
    kv, dh = cfg.num_kv_heads, cfg.head_dim
    specs = {
        'q': ParamSpec((d, h, dh), ('embed', 'heads', 'head_dim')),
        'k': ParamSpec((d, kv, dh), ('embed', 'kv_heads', 'head_dim')),
        'v': ParamSpec((d, kv, dh), ('embed', 'kv_heads', 'head_dim')),
        'o': ParamSpec((h, dh, d), ('heads', 'head_dim', 'embed'), std=out_std),
    }
    if cfg.qk_norm:
      specs['q_norm'] = ParamSpec((dh,), ('norm',), 'ones')
      specs['k_norm'] = ParamSpec((dh,), ('norm',), 'ones')
    return specs
  r, dr, dn, dv = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
  specs = {
      'kv_a': ParamSpec((d, r + dr), ('embed', 'lora')),
      'kv_a_norm': ParamSpec((r,), ('norm',), 'ones'),
      'kv_b': ParamSpec((r, h, dn + dv), ('lora', 'heads', 'head_dim')),
      'o': ParamSpec((h, dv, d), ('heads', 'head_dim', 'embed'), std=out_std),
  }
  if cfg.q_lora_rank:
    specs['q_a'] = ParamSpec((d, cfg.q_lora_rank), ('embed', 'lora'))
    specs['q_a_norm'] = ParamSpec((cfg.q_lora_rank,), ('norm',), 'ones')
    specs['q_b'] = ParamSpec((cfg.q_lora_rank, h, dn + dr), ('lora', 'heads', 'head_dim'))
  else:
    specs['q'] = ParamSpec((d, h, dn + dr), ('embed', 'heads', 'head_dim'))
  return specs


def cache_specs(cfg: ModelConfig, batch: int, max_len: int) -> dict:
  """Shapes of one layer's cache entries."""
  if cfg.attention == 'gqa':
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return {'k': shape, 'v': shape}
  return {'ckv': (batch, max_len, cfg.kv_lora_rank), 'kpe': (batch, max_len, cfg.qk_rope_head_dim)}


def attend(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask_BxTxS, scale):
  """Softmax attention; H = K * G query heads share each key head. Returns (out, max logit per head)."""
  b, t, h, dq = q_BxTxHxQ.shape
  kh = k_BxSxKxQ.shape[2]
  q_BxTxKxGxQ = q_BxTxHxQ.reshape(b, t, kh, h // kh, dq)
  logits = jnp.einsum('btkgq,bskq->bkgts', q_BxTxKxGxQ, k_BxSxKxQ,
                      preferred_element_type=jnp.float32) * scale
  mask = mask_BxTxS[:, None, None]
  max_logit_H = jnp.max(jnp.where(mask, logits, NEG_INF), axis=(0, 3, 4)).reshape(h)
  probs = jax.nn.softmax(jnp.where(mask, logits, NEG_INF), axis=-1).astype(v_BxSxKxV.dtype)
  out = jnp.einsum('bkgts,bskv->btkgv', probs, v_BxSxKxV)
  return out.reshape(b, t, h, -1), max_logit_H


def _write(cache_x, new_x, write_at):
  return jax.lax.dynamic_update_slice_in_dim(cache_x, new_x.astype(cache_x.dtype), write_at, axis=1)


def _rope(x, pos_BxT, cfg: ModelConfig):
  if cfg.rope_yarn_factor == 1.0:
    return layers.rope(x, pos_BxT, cfg.rope_theta, cfg.rope_interleaved)
  freq = layers.yarn_frequencies(cfg.rope_dim, cfg.rope_theta, cfg.rope_yarn_factor,
                                 cfg.rope_yarn_original_len, cfg.rope_yarn_beta_fast,
                                 cfg.rope_yarn_beta_slow)
  return layers.rope(x, pos_BxT, cfg.rope_theta, cfg.rope_interleaved, freq,
                     cfg.rope_yarn_attention_factor)


def attention(p: dict, x_BxTxD, pos_BxT, mask_BxTxS, cfg: ModelConfig, cache=None, write_at=None):
  """Returns (out_BxTxD, new_cache or None, max_logit_H)."""
  dt = x_BxTxD.dtype
  w = lambda name: p[name].astype(dt)
  if cfg.attention == 'gqa':
    q = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('q'))
    k = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('k'))
    v = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('v'))
    if cfg.qk_norm:
      q, k = rms_norm(q, p['q_norm'], cfg.norm_eps), rms_norm(k, p['k_norm'], cfg.norm_eps)
    q, k = _rope(q, pos_BxT, cfg), _rope(k, pos_BxT, cfg)
    if cache is not None:
      cache = {'k': _write(cache['k'], k, write_at), 'v': _write(cache['v'], v, write_at)}
      k, v = cache['k'].astype(dt), cache['v'].astype(dt)
    scale = cfg.head_dim ** -0.5
  else:
    dn, r = cfg.qk_nope_head_dim, cfg.kv_lora_rank
    if cfg.q_lora_rank:
      q_lat = rms_norm(x_BxTxD @ w('q_a'), p['q_a_norm'], cfg.norm_eps)
      q = jnp.einsum('btr,rhq->bthq', q_lat, w('q_b'))
    else:
      q = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('q'))
    q = jnp.concatenate([q[..., :dn], _rope(q[..., dn:], pos_BxT, cfg)], -1)
    kv_a = x_BxTxD @ w('kv_a')
    ckv_BxTxR = rms_norm(kv_a[..., :r], p['kv_a_norm'], cfg.norm_eps)
    kpe_BxTxR = _rope(kv_a[..., None, r:], pos_BxT, cfg)[:, :, 0]
    if cache is not None:
      cache = {'ckv': _write(cache['ckv'], ckv_BxTxR, write_at),
               'kpe': _write(cache['kpe'], kpe_BxTxR, write_at)}
      ckv_BxTxR, kpe_BxTxR = cache['ckv'].astype(dt), cache['kpe'].astype(dt)
    kv = jnp.einsum('bsr,rhq->bshq', ckv_BxTxR, w('kv_b'))
    k_nope, v = kv[..., :dn], kv[..., dn:]
    kpe = jnp.broadcast_to(kpe_BxTxR[:, :, None], (*k_nope.shape[:3], kpe_BxTxR.shape[-1]))
    k = jnp.concatenate([k_nope, kpe], axis=-1)
    scale = cfg.qk_head_dim ** -0.5
  q = constrain(q, ('act_batch', 'act_seq', 'act_heads', None))
  out, max_logit_H = attend(q, k, v, mask_BxTxS, scale * cfg.attn_scale_mult)
  out = jnp.einsum('bthv,hvd->btd', out, w('o'))
  return out, cache, max_logit_H
