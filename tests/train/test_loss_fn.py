"""The supervised loss: masked next-token cross-entropy against numpy, and its gradient against the
log-softmax formula it replaces."""

import jax
import jax.numpy as jnp
import numpy as np

from research.data import synthetic
from research.model import transformer
from research.model.config import ModelConfig
from research.train import step as step_lib

CFG = ModelConfig(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
                  d_expert=16, d_ff=32)


def _batch():
  b = {k: jnp.asarray(v) for k, v in next(synthetic.packed_batches(0, 4, 16)).items()}
  mask = jax.random.bernoulli(jax.random.key(2), 0.7, b['loss_mask'].shape)
  return {**b, 'loss_mask': mask.astype(b['loss_mask'].dtype)}


def test_cross_entropy_matches_numpy_and_log_softmax_gradient():
  params, batch = transformer.init(CFG, jax.random.key(0)), _batch()
  ce, aux = step_lib.loss_fn(params, batch, CFG)
  logits = np.asarray(transformer.forward(params, batch['tokens'], CFG,
                                          segment_ids_BxT=batch['segment_ids'])[0], np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  nll = -np.take_along_axis(logp, np.asarray(batch['targets'])[..., None], -1)[..., 0]
  mask = np.asarray(batch['loss_mask'], np.float64)
  assert 0 < mask.sum() < mask.size
  np.testing.assert_allclose(ce, (nll * mask).sum() / mask.sum(), rtol=1e-5)
  assert int(aux['tokens']) == int(mask.sum())

  def log_softmax_ce(params):
    logits = transformer.forward(params, batch['tokens'], CFG, segment_ids_BxT=batch['segment_ids'])[0]
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch['targets'][..., None], -1)[..., 0]
    return jnp.sum(nll * batch['loss_mask']) / jnp.sum(batch['loss_mask'])
  got = jax.grad(lambda p: step_lib.loss_fn(p, batch, CFG)[0])(params)
  want = jax.grad(log_softmax_ce)(params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
