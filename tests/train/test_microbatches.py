"""Gradient accumulation: a step over microbatches equals the step over the whole batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from research.data import synthetic
from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import mesh as mesh_lib
from research.train import loop
from research.train import step as step_lib

CFG = ModelConfig(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, num_experts=8,
                  num_experts_per_tok=2, d_expert=16, vocab_size=256)


def _batch(rows: int = 8):
  b = {k: jnp.asarray(v) for k, v in next(synthetic.packed_batches(0, rows, 16)).items()}
  # Rows keep different numbers of tokens, so microbatches do too: only a token-weighted average of
  # their gradients is the whole batch's.
  keep = jnp.arange(16)[None] < jnp.arange(2, 2 + 2 * rows, 2)[:, None] % 17
  return {**b, 'loss_mask': keep.astype(b['loss_mask'].dtype)}


def _step(params, batch, microbatches, cfg=CFG):
  tx = optax.sgd(1.0)  # params - new params = the gradient.
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  return jax.jit(lambda s, b: step_lib.train_step(s, b, None, cfg=cfg, tx=tx, microbatches=microbatches))(
      state, batch)


@pytest.mark.parametrize('microbatches', [2, 4])
def test_microbatched_step_equals_the_whole_batch(microbatches):
  params, batch = transformer.init(CFG, jax.random.key(0)), _batch()
  whole, m1 = _step(params, batch, 1)
  acc, mm = _step(params, batch, microbatches)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7), acc.params, whole.params)
  for k in ('loss', 'ce', 'grad_norm'):
    np.testing.assert_allclose(mm[k], m1[k], rtol=2e-5, err_msg=k)
  # Router load is averaged per microbatch by loss tokens, not by the routed tokens it counts.
  np.testing.assert_allclose(mm['router_max_load'], m1['router_max_load'], rtol=0.05)
  assert float(mm['tokens']) == float(m1['tokens']) == float(jnp.sum(batch['loss_mask']))

  # The plain mean of the microbatches' gradients is not the whole batch's: the test tells them apart.
  micro = step_lib.microbatch_split(batch, microbatches)
  grad = jax.jit(jax.grad(lambda p, b: step_lib.loss_fn(p, b, CFG)[0]))
  grads = [grad(params, jax.tree.map(lambda x: x[i], micro)) for i in range(microbatches)]
  plain = jax.tree.map(lambda *g: sum(g) / microbatches, *grads)
  full = jax.tree.map(jnp.subtract, params, whole.params)
  assert float(optax.tree.norm(jax.tree.map(jnp.subtract, plain, full))) > 1e-3 * float(optax.tree.norm(full))


def test_microbatches_on_an_expert_parallel_mesh():
  # Strided microbatches on fsdp:2,expert:4 (experts exchanged between devices): same update as the
  # whole batch's, through the trainer's sharded step.
  mesh = mesh_lib.make_mesh('fsdp:2,expert:4')
  params, batch = jax.device_get(transformer.init(CFG, jax.random.key(0))), _batch(16)  # Host copies: the step donates.
  out = []
  for m in (1, 2):
    trainer = step_lib.Trainer(CFG, optax.sgd(1.0), mesh, microbatches=m)
    state = trainer.start(params)
    state, _ = trainer.step_fn()(state, trainer.put_batch(batch), None)
    out.append(state.params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7), *out)


def test_bad_microbatches_are_named():
  params = transformer.init(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match=r"batch\['\w+'\] of shape \(6, 16\): its rows do not split into microbatches=4"):
    _step(params, _batch(6), 4)
  no_tokens = lambda p, b, cfg: (step_lib.loss_fn(p, b, cfg)[0], {})
  with pytest.raises(ValueError, match=r'aux\["tokens"\], which this loss does not give'):
    tx = optax.sgd(1.0)
    step_lib.train_step(step_lib.TrainState(0, params, tx.init(params)), _batch(), None, cfg=CFG, tx=tx,
                        loss=no_tokens, microbatches=2)
  with pytest.raises(ValueError, match=r'data.batch_size=8 is not divisible by train.microbatches=3'):
    loop.check_divisible(CFG, {'data': 1}, 8, microbatches=3)
  with pytest.raises(ValueError, match=r'data.batch_size / train.microbatches=2 is not divisible by the mesh axes'):
    loop.check_divisible(CFG, mesh_lib.parse_mesh_spec('fsdp:2,expert:4'), 8, microbatches=4)
