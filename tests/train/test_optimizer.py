"""The model's leaves as Muon sees them, Muon on a mesh equal to Muon on one device, QK-clip."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments import tiny_moe
from research.data import synthetic
from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train import step as step_lib

MLA = ModelConfig(num_layers=2, d_model=64, num_heads=4, attention='mla', kv_lora_rank=32,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=24,
                  router='sigmoid', num_experts=8, d_expert=32, num_shared_experts=1, first_k_dense=1)


def test_dimension_numbers_of_model_leaves():
  dims = jax.tree.map(optim.dimension_numbers, transformer.param_axes(MLA),
                      is_leaf=lambda x: isinstance(x, tuple))
  moe = dims['moe_layers']
  # Stacked experts (L, E, D, F): L and E are batch axes.
  assert moe['moe']['wi_gate'].reduction_axis == (2,) and moe['moe']['wi_gate'].output_axis == (3,)
  assert moe['moe']['wo'].reduction_axis == (2,) and moe['moe']['wo'].output_axis == (3,)
  # Per-head projections: q_b (L, Rq, H, Q) reduces over Rq; o (L, H, V, D) over heads x V.
  assert moe['attn']['q_b'].reduction_axis == (1,) and moe['attn']['q_b'].output_axis == (2, 3)
  assert moe['attn']['o'].reduction_axis == (1, 2) and moe['attn']['o'].output_axis == (3,)
  assert moe['attn_norm'] is None and moe['moe']['router_bias'] is None
  per_head = optim.dimension_numbers(('layers', 'lora', 'heads', 'head_dim'), per_head=True)
  assert per_head.reduction_axis == (1,) and per_head.output_axis == (3,)


def _opt_config(name):
  c = tiny_moe.get_config().optimizer
  c.name = name
  return c


def test_muon_on_a_mesh_equals_muon_on_one_device():
  batch = {k: jnp.asarray(v) for k, v in next(synthetic.packed_batches(0, 8, 32)).items()}
  params = []
  for spec in ('data:1', 'fsdp:2,expert:4'):
    mesh = mesh_lib.make_mesh(spec)
    trainer = step_lib.Trainer(MLA, optim.make_optimizer(_opt_config('muon'), 10, MLA, mesh), mesh)
    state, step = trainer.init(jax.random.key(0)), trainer.step_fn()
    for i in range(3):
      state, _ = step(state, trainer.put_batch(batch), jax.random.key(i))
    params.append(jax.device_get(state.params))
  for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])):
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_muon_needs_the_model_config():
  with pytest.raises(ValueError, match='model config'):
    optim.make_optimizer(_opt_config('muon'), 10)
  with pytest.raises(ValueError, match='optimizer.name'):
    optim.make_optimizer(_opt_config('lion'), 10)


def test_qk_clip_caps_each_heads_max_logit():
  params = transformer.init(MLA, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 4.0, params)  # Large logits.
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, MLA.vocab_size)
  _, aux, _ = transformer.forward(params, tokens, MLA)
  before = np.asarray(aux['attn_max_logit'])
  tau = float(np.median(before))
  clipped = step_lib.apply_qk_clip(params, aux['attn_max_logit'], MLA, tau)
  _, aux2, _ = transformer.forward(clipped, tokens, MLA)
  after = np.asarray(aux2['attn_max_logit'])
  hot = before > tau
  assert hot.any() and (~hot).any()
  # Layer 0's clip changes layer 1's inputs, so compare exactly only where inputs are unchanged.
  np.testing.assert_allclose(after[0][hot[0]], tau, rtol=1e-4)
  np.testing.assert_allclose(after[0][~hot[0]], before[0][~hot[0]], rtol=1e-5)


def test_qk_clip_rejects_qk_norm_models():
  with pytest.raises(ValueError, match='qk_norm'):
    optim.qk_clip_targets(ModelConfig(qk_norm=True))


def test_every_muon_field_reaches_muon(monkeypatch):
  """optimizer.muon's fields arrive at research/optim/muon.py's `muon` (ns_dtype 'auto' as None)."""
  seen = {}
  monkeypatch.setattr(optim.muon_lib, 'muon', lambda lr, **kw: seen.update(kw) or optax.identity())
  c = _opt_config('muon')
  c.muon.update(ns_coeffs='polar_express', beta=0.9, consistent_rms=0.3, ns_dtype='bfloat16',
                exchange='all_gather', chunk_bytes=4096, spread_axes=('fsdp',))
  optim.make_optimizer(c, 10, MLA)
  assert {k: seen[k] for k in ('ns_coeffs', 'beta', 'consistent_rms', 'ns_dtype', 'exchange', 'chunk_bytes',
                               'spread_axes')} == {
      'ns_coeffs': 'polar_express', 'beta': 0.9, 'consistent_rms': 0.3, 'ns_dtype': 'bfloat16',
      'exchange': 'all_gather', 'chunk_bytes': 4096, 'spread_axes': ('fsdp',)}
  c.muon.ns_dtype = 'auto'
  optim.make_optimizer(c, 10, MLA)
  assert seen['ns_dtype'] is None  # muon picks: float32 on CPU, bfloat16 elsewhere.
