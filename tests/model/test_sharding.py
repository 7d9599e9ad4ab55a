"""Sharded runs equal the single-device run: logits, loss and a train step, on several meshes."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding

from research.data import synthetic
from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.train import step as step_lib

GQA = ModelConfig(num_layers=2, d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=8,
                  d_expert=32, d_ff=64, aux_loss_coef=0.01, z_loss_coef=1e-3)
MLA = dataclasses.replace(GQA, attention='mla', q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                          qk_rope_head_dim=8, v_head_dim=16, rope_interleaved=True, router='sigmoid',
                          n_group=4, topk_group=2, num_shared_experts=1, first_k_dense=1, num_layers=3,
                          routed_scaling_factor=2.0, bias_update_rate=1e-2)
MESHES = ['data:8', 'fsdp:2,expert:4', 'data:2,fsdp:2,expert:2', 'fsdp:2,expert:2,tensor:2']


def _batch():
  b = next(synthetic.packed_batches(0, 8, 32))
  return {k: jnp.asarray(v) for k, v in b.items()}


def _init(cfg):
  params = transformer.init(cfg, jax.random.key(0))
  if cfg.router == 'sigmoid':  # Non-zero bias so that selection and weights differ.
    rb = params['moe_layers']['moe']['router_bias']
    params['moe_layers']['moe']['router_bias'] = 0.05 * jax.random.normal(jax.random.key(1), rb.shape)
  return params


def _run(cfg, params, batch, mesh=None):
  fn = jax.jit(lambda p, b: step_lib.loss_fn(p, b, cfg)[0])
  logits_fn = jax.jit(lambda p, b: transformer.forward(p, b['tokens'], cfg,
                                                       segment_ids_BxT=b['segment_ids'])[0])
  if mesh is None:
    return logits_fn(params, batch), fn(params, batch)
  psh = sharding.tree_shardings(transformer.param_axes(cfg), params, mesh)
  params = jax.device_put(params, psh)
  batch = jax.device_put(batch, NamedSharding(mesh, sharding.spec(('act_batch',))))
  with jax.set_mesh(mesh):
    return logits_fn(params, batch), fn(params, batch)


@pytest.mark.parametrize('cfg,mesh_spec', [(GQA, MESHES[0]), (GQA, MESHES[3]), (MLA, MESHES[1]),
                                            (MLA, MESHES[2])])
def test_sharded_forward_equals_single_device(cfg, mesh_spec):
  params, batch = _init(cfg), _batch()
  ref_logits, ref_loss = _run(dataclasses.replace(cfg, moe_impl='dense'), params, batch)
  logits, loss = _run(cfg, params, batch, mesh_lib.make_mesh(mesh_spec))
  assert float(jnp.max(jnp.abs(logits - ref_logits))) <= 1e-5
  assert abs(float(loss) - float(ref_loss)) <= 1e-5


@pytest.mark.parametrize('impl', ['dense', 'ragged'])
def test_expert_parallel_paths_agree(impl):
  params, batch = _init(MLA), _batch()
  mesh = mesh_lib.make_mesh('expert:8')
  ref, _ = _run(dataclasses.replace(MLA, moe_impl='blocked'), params, batch, mesh)
  out, _ = _run(dataclasses.replace(MLA, moe_impl=impl), params, batch, mesh)
  assert float(jnp.max(jnp.abs(out - ref))) <= 1e-5


def test_sharded_train_step_equals_single_device():
  cfg, batch = MLA, _batch()
  results = []
  for spec in ('data:1', 'fsdp:2,expert:4'):
    trainer = step_lib.Trainer(cfg, optax.adamw(1e-2), mesh_lib.make_mesh(spec))
    state = trainer.init(jax.random.key(0))
    step = trainer.step_fn()
    for _ in range(2):
      state, metrics = step(state, trainer.put_batch(batch), jax.random.key(1))
    results.append((jax.device_get(state.params), float(metrics['loss'])))
  (p1, l1), (p2, l2) = results
  assert abs(l1 - l2) <= 1e-5
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_allclose(a, b, atol=1e-4)  # Adam divides by sqrt(v): near-zero grads amplify ulps.
  # The bias moves by +-rate per step from the measured load; the optimizer (Adam, decay) never
  # touches it, so it stays on the grid of multiples of the rate.
  steps = p1['moe_layers']['moe']['router_bias'] / cfg.bias_update_rate
  assert np.any(steps != 0)
  np.testing.assert_allclose(steps, np.round(steps), atol=1e-4)
