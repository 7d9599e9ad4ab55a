"""Sharded runs equal the single-device run: logits, loss and a train step, on several meshes; a
Trainer's rules table lays out params, optimizer state, activations and the expert layer."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxprs
from research.data import synthetic
from research.model import transformer
from research.model.config import ModelConfig
from research.optim import muon as muon_lib
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.train import loop
from research.train import optimizer as optim
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


# Unlike RULES: the model dimension of weights on `expert`, experts on `fsdp`, tokens not split
# over `expert`.
ALT_RULES = {**sharding.RULES, 'embed': 'expert', 'expert_embed': 'expert', 'lora': 'expert',
             'experts': 'fsdp', 'act_batch': ('data', 'fsdp')}


def _muon_trainer(cfg, mesh_spec, rules=sharding.RULES):
  mesh, axes = mesh_lib.make_mesh(mesh_spec), transformer.param_axes(cfg)
  dims = jax.tree.map(optim.dimension_numbers, axes, is_leaf=sharding.is_axes)
  tx = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=axes)
  return step_lib.Trainer(cfg, tx, mesh, rules=rules)


def test_trainer_rules_lay_out_params_optimizer_state_and_activations():
  trainer = _muon_trainer(MLA, 'data:2,fsdp:2,expert:2', ALT_RULES)
  state, mesh = trainer.init(jax.random.key(0)), trainer.mesh
  same = lambda x, spec: x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim)
  moe_p = state.params['moe_layers']
  assert same(state.params['lm_head']['kernel'], P('expert', 'tensor'))
  assert same(moe_p['moe']['wi_gate'], P(None, 'fsdp', 'expert', 'tensor'))
  assert same(moe_p['attn']['q_a'], P(None, 'expert', None))  # `lora` -> expert too: used once.
  # Muon momentum and AdamW moments: every params-shaped subtree laid out like the params.
  expected = muon_lib.state_shardings(state.opt_state, state.params, trainer.param_shardings, mesh)
  got = jax.tree.leaves(state.opt_state)
  want = jax.tree.leaves(expected, is_leaf=lambda x: isinstance(x, NamedSharding))
  assert len(got) == len(want) and sum(w.spec != P() for w in want) > 20
  for x, w in zip(got, want):
    assert x.sharding.is_equivalent_to(w, x.ndim), (x.sharding, w)
  # Activations and the expert layer's shard_map, as traced by the step.
  batch = trainer.put_batch(_batch())
  with jax.set_mesh(mesh):
    jaxpr = jax.make_jaxpr(trainer.with_rules(lambda p, b: step_lib.loss_fn(p, b, MLA)[0]))(
        state.params, batch)
  eqns = list(jaxprs.eqns(jaxpr.jaxpr))
  batch_entries = {e.params['sharding'].spec[0] for e in eqns
                   if e.primitive.name == 'sharding_constraint' and len(e.params['sharding'].spec) > 2}
  assert batch_entries == {('data', 'fsdp')}
  (ep,) = [e for e in eqns if e.primitive.name == 'shard_map']
  assert ep.params['in_specs'][:3] == (P('fsdp', None, 'tensor'), P('fsdp', None, 'tensor'),
                                       P('fsdp', 'tensor', None))
  # And it trains as one device does.
  ref = _muon_trainer(MLA, 'data:1')
  ref_state, ref_step, step = ref.init(jax.random.key(0)), ref.step_fn(), trainer.step_fn()
  for i in range(2):
    state, metrics = step(state, batch, jax.random.key(i))
    ref_state, ref_metrics = ref_step(ref_state, ref.put_batch(_batch()), jax.random.key(i))
  assert abs(float(metrics['loss']) - float(ref_metrics['loss'])) <= 1e-5
  for a, b in zip(jax.tree.leaves(jax.device_get(state.params)),
                  jax.tree.leaves(jax.device_get(ref_state.params))):
    np.testing.assert_allclose(a, b, atol=1e-4)  # AdamW leaves (embedding): sqrt(v) amplifies ulps.


def test_check_divisible_names_the_axes_of_the_rules():
  shape = mesh_lib.parse_mesh_spec('data:2,expert:2')
  # RULES split the batch over data*fsdp*expert, ALT_RULES over data*fsdp only.
  with pytest.raises(ValueError, match=r"data.batch_size=6 is not divisible by the mesh axes "
                                       r"data\*fsdp\*expert \(= 4\) of rules\['act_batch'\]"):
    loop.check_divisible(MLA, shape, 6)
  loop.check_divisible(MLA, shape, 6, ALT_RULES)
  shape = mesh_lib.parse_mesh_spec('fsdp:16')
  loop.check_divisible(MLA, shape, 16)
  with pytest.raises(ValueError, match=r"model.num_experts=8 is not divisible by the mesh axes "
                                       r"fsdp \(= 16\) of rules\['experts'\]"):
    loop.check_divisible(MLA, shape, 16, ALT_RULES)
