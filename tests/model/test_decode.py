"""Incremental decoding with the KV cache equals the full forward pass, for both attention types."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.model import decode
from research.model import transformer
from research.model.config import ModelConfig

GQA = ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4,
                  d_expert=32)
MLA = dataclasses.replace(GQA, attention='mla', kv_lora_rank=32, qk_nope_head_dim=16,
                          qk_rope_head_dim=8, v_head_dim=16, rope_interleaved=True, router='sigmoid',
                          num_shared_experts=1, first_k_dense=1, num_layers=3)
MLA_Q_LORA = dataclasses.replace(MLA, q_lora_rank=24)
STEPS = 6


@pytest.mark.parametrize('cfg', [GQA, MLA, MLA_Q_LORA], ids=['gqa', 'mla', 'mla_q_lora'])
def test_incremental_decode_equals_full_forward(cfg):
  params = transformer.init(cfg, jax.random.key(0))
  lengths = [10, 7, 4]
  t = max(lengths)
  prompts = np.asarray(jax.random.randint(jax.random.key(1), (3, t), 0, cfg.vocab_size))
  # Row 0 full, row 1 right-padded, row 2 left-padded.
  tokens = np.zeros_like(prompts)
  mask = np.zeros((3, t), bool)
  tokens[0], mask[0] = prompts[0], True
  tokens[1, :7], mask[1, :7] = prompts[1, :7], True
  tokens[2, t - 4:], mask[2, t - 4:] = prompts[2, :4], True
  gen = jax.jit(decode.greedy_generate, static_argnums=(3, 4))
  new, step_logits = gen(params, jnp.asarray(tokens), jnp.asarray(mask), cfg, STEPS)
  for row, n in enumerate(lengths):
    seq = np.concatenate([prompts[row, :n], np.asarray(new[row])])[None]
    full, _, _ = transformer.forward(params, jnp.asarray(seq), cfg)
    np.testing.assert_allclose(step_logits[row], full[0, n - 1:n - 1 + STEPS], atol=1e-5)
    np.testing.assert_array_equal(new[row], np.argmax(full[0, n - 1:n - 1 + STEPS], -1))


def test_cache_holds_only_the_latent_for_mla():
  cache = decode.init_cache(MLA, batch=2, max_len=16)
  entry = cache['moe_layers']
  assert set(entry) == {'ckv', 'kpe'}
  assert entry['ckv'].shape == (2, 2, 16, MLA.kv_lora_rank)
  assert entry['kpe'].shape == (2, 2, 16, MLA.qk_rope_head_dim)


@pytest.mark.parametrize('cfg', [GQA, MLA], ids=['gqa', 'mla'])
def test_rows_keep_their_own_write_index(cfg):
  """Chunks of different real lengths per row (right-padded; row 2 idle in the second): each row's
  tokens sit back to back from slot 0, its end is its length, and every row's last logits equal a
  full forward over its own tokens, in a cache only as long as the longest row plus one chunk."""
  params = transformer.init(cfg, jax.random.key(0))
  ids = np.asarray(jax.random.randint(jax.random.key(1), (3, 12), 0, cfg.vocab_size))
  chunks = [[5, 2, 3], [4, 6, 0]]  # Real tokens per row in each chunk.
  width = 6
  cache = decode.init_cache(cfg, 3, max_len=9 + width)  # Longest row 9; a shared index would need 12.
  done = [0, 0, 0]
  step = jax.jit(lambda p, t, m, c: transformer.forward(p, t, cfg, segment_ids_BxT=m, cache=c))
  for lens in chunks:
    tokens, mask = np.zeros((3, width), np.int32), np.zeros((3, width), np.int32)
    for r, n in enumerate(lens):
      tokens[r, :n], mask[r, :n] = ids[r, done[r]:done[r] + n], 1
      done[r] += n
    logits, _, cache = step(params, jnp.asarray(tokens), jnp.asarray(mask), cache)
    last = logits
  np.testing.assert_array_equal(cache['end'], done)
  for r, n in enumerate(done):
    assert np.asarray(cache['valid'][r, :n]).all() and not np.asarray(cache['valid'][r, n:]).any()
    full, _, _ = transformer.forward(params, jnp.asarray(ids[r:r + 1, :n]), cfg)
    k = chunks[-1][r] - 1 if chunks[-1][r] else None
    if k is not None:  # Row 2 wrote nothing in the last chunk.
      np.testing.assert_allclose(last[r, k], full[0, -1], atol=1e-5, rtol=1e-5)
