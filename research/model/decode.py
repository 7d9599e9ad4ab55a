"""KV-cache decoding: allocate, prefill a (left- or right-) padded batch, then one token per step.

The cache is a pytree: per layer stack the attention entries (research/model/attention.py), plus
  valid (B x S) which slots hold real tokens, end (B,) each row's next slot to write,
  pos (B,) each row's next RoPE position.
Each row writes from its own end, which moves past the row's last real token: rows hold their own
tokens back to back, so a cache is as long as its longest row (plus one write's width), not the
sum of every turn's widest row. Padding before a real token (a left-padded prompt) is an invalid
slot that attention skips; padding after the last real token is overwritten by the next write.
"""

import jax
import jax.numpy as jnp

from research.model import attention as attn_lib
from research.model.config import ModelConfig
from research.model.transformer import forward


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> dict:
  dtype = jnp.dtype(dtype or cfg.dtype)
  entry = attn_lib.cache_specs(cfg, batch, max_len)
  cache = {'valid': jnp.zeros((batch, max_len), bool), 'end': jnp.zeros((batch,), jnp.int32),
           'pos': jnp.zeros((batch,), jnp.int32)}
  for name, n in (('dense_layers', cfg.first_k_dense), ('moe_layers', cfg.num_moe_layers)):
    if n:
      cache[name] = {k: jnp.zeros((n, *shape), dtype) for k, shape in entry.items()}
  return cache


def prefill(params, tokens_BxT, mask_BxT, cache, cfg: ModelConfig):
  """Writes the prompt into the cache. mask_BxT marks real tokens (padding on either side).

  Returns (logits of each row's last real token, B x V; cache).
  """
  logits, _, cache = forward(params, tokens_BxT, cfg, segment_ids_BxT=mask_BxT.astype(jnp.int32),
                             cache=cache)
  t = tokens_BxT.shape[1]
  last = t - 1 - jnp.argmax(mask_BxT[:, ::-1], axis=1)
  return logits[jnp.arange(tokens_BxT.shape[0]), last], cache


def decode_step(params, tokens_B, cache, cfg: ModelConfig):
  """Feeds one token per row. Returns (logits B x V, cache)."""
  logits, _, cache = forward(params, tokens_B[:, None], cfg, cache=cache)
  return logits[:, 0], cache


def greedy_generate(params, tokens_BxT, mask_BxT, cfg: ModelConfig, num_steps: int):
  """Greedy continuation of a padded batch; returns (new tokens B x num_steps, their logits)."""
  b, t = tokens_BxT.shape
  cache = init_cache(cfg, b, t + num_steps)
  logits, cache = prefill(params, tokens_BxT, mask_BxT, cache, cfg)

  def step(carry, _):
    logits, cache = carry
    tok = jnp.argmax(logits, axis=-1).astype(tokens_BxT.dtype)
    new_logits, cache = decode_step(params, tok, cache, cfg)
    return (new_logits, cache), (tok, logits)

  _, (toks, all_logits) = jax.lax.scan(step, (logits, cache), None, length=num_steps)
  return toks.T, jnp.swapaxes(all_logits, 0, 1)
