"""Chunked log-probs, KLs and entropies: the values and gradients of the whole-sequence path, in less memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.model.config import ModelConfig
from research.rl.update import logprobs
from research.rl.update import losses

CFG = ModelConfig(vocab_size=97, d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, d_ff=32,
                  dtype='float32')


def _inputs(b, t, d, v, seed=0):
  ks = jax.random.split(jax.random.key(seed), 5)
  return (jax.random.normal(ks[0], (b, t, d)), jax.random.normal(ks[1], (b, t, d)),
          jax.random.randint(ks[2], (b, t), 0, v), jax.random.normal(ks[3], (d, v)) * 0.5,
          jax.random.normal(ks[4], (d, v)) * 0.5)


@pytest.mark.parametrize('chunk', [4, 5, 13])
def test_policy_terms_chunked_equal_whole_with_gradients(chunk):
  h, ref, y, head, ref_head = _inputs(2, 13, 16, 97)

  def f(h, head, chunk):
    out = logprobs.policy_terms(h, y, head, cfg=CFG, temperature=0.7, chunk=chunk, ref_h_BxTxD=ref,
                                ref_head_DxV=ref_head)
    return jnp.sum(out['logp'] * 0.3) + jnp.sum(out['kl']), out

  (v0, o0), g0 = jax.value_and_grad(f, (0, 1), has_aux=True)(h, head, 0)
  (v1, o1), g1 = jax.value_and_grad(f, (0, 1), has_aux=True)(h, head, chunk)
  logp = jax.nn.log_softmax(jnp.einsum('btd,dv->btv', h, head) / 0.7)  # Independent reference.
  r = jax.nn.log_softmax(jnp.einsum('btd,dv->btv', ref, ref_head) / 0.7)
  np.testing.assert_allclose(o1['logp'], jnp.take_along_axis(logp, y[..., None], -1)[..., 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(o1['kl'], jnp.sum(jnp.exp(logp) * (logp - r), -1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(o1['entropy'], -jnp.sum(jnp.exp(logp) * logp, -1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v1, v0, rtol=1e-5)
  for a, b in zip(g1, g0):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('kind', losses.DISTILL_KINDS)
def test_distill_terms_chunked_equal_full_vocab_stats(kind):
  s, t, y, head, t_head = _inputs(3, 7, 16, 97, seed=1)
  full = losses.position_stats(jax.nn.log_softmax(jnp.einsum('btd,dv->btv', s, head)),
                               jax.nn.log_softmax(jnp.einsum('btd,dv->btv', t, t_head)), y, kind=kind, top_k=5)
  f = lambda s, c: logprobs.distill_terms(s, t, y, head, t_head, cfg=CFG, temperature=1.0, chunk=c, kind=kind,
                                          top_k=5)
  got = f(s, 3)
  for k in full:
    np.testing.assert_allclose(got[k], full[k], rtol=1e-5, atol=1e-5)
  g = [jax.grad(lambda s: jnp.sum(f(s, c)['per']))(s) for c in (0, 3)]
  np.testing.assert_allclose(g[1], g[0], rtol=1e-4, atol=1e-6)


def test_chunks_bound_the_backward_pass_memory():
  """Forward and backward of the chunked path never hold B x T x V: temp memory falls with the chunk."""
  b, t, d, v = 2, 512, 16, 4096
  h, ref, y, head, ref_head = _inputs(b, t, d, v)

  def temp(chunk):
    def f(h, head, y, ref, ref_head):
      out = logprobs.policy_terms(h, y, head, cfg=CFG, temperature=1.0, chunk=chunk, ref_h_BxTxD=ref,
                                  ref_head_DxV=ref_head)
      return jnp.sum(out['logp']) + jnp.sum(out['kl'])
    compiled = jax.jit(jax.grad(f, (0, 1))).lower(h, head, y, ref, ref_head).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  logits_bytes = b * t * v * 4
  whole, chunked = temp(0), temp(32)  # A chunk's logits are 1/16 of the sequence's.
  assert whole >= logits_bytes, (whole, logits_bytes)
  assert chunked < logits_bytes / 3, (chunked, logits_bytes)
