"""Muon state is sharded like the params, saves with orbax and restores onto another mesh."""

import jax
import numpy as np
import orbax.checkpoint as ocp

from experiments.benchmarks.trees import moe_tree
from research.optim import muon as muon_lib
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib

SIZES = dict(L=2, D=32, H=4, K=2, Dh=8, E=8, F=16, Fs=16, V=64)
FAST_COMPILE = {'xla_backend_optimization_level': 0}


def _setup(mesh_spec):
  mesh = mesh_lib.make_mesh(mesh_spec)
  shapes, axes, dims = moe_tree(**SIZES)
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings)
  return mesh, shapes, shardings, opt


def test_save_on_one_mesh_restore_on_another(tmp_path):
  _, shapes, shardings_a, opt_a = _setup('fsdp:8')
  rng = np.random.default_rng(0)
  params = jax.device_put(
      jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes), shardings_a)
  state = jax.jit(opt_a.init, compiler_options=FAST_COMPILE)(params)
  _, state = jax.jit(opt_a.update, compiler_options=FAST_COMPILE)(params, state, params)
  mu_a = state.inner_states['muon'].inner_state[0].mu['layers']['moe']['wi_gate']
  assert mu_a.sharding.is_equivalent_to(shardings_a['layers']['moe']['wi_gate'], mu_a.ndim)

  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(tmp_path / 'state', state)
    ckpt.wait_until_finished()

  mesh_b, _, shardings_b, opt_b = _setup('data:2,fsdp:2,expert:2')
  abstract = jax.eval_shape(opt_b.init, shapes)
  target = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract,
      muon_lib.state_shardings(abstract, shapes, shardings_b, mesh_b))
  with ocp.StandardCheckpointer() as ckpt:
    restored = ckpt.restore(tmp_path / 'state', target)

  for a, b, t in zip(jax.tree.leaves(state), jax.tree.leaves(restored), jax.tree.leaves(target)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert b.sharding.is_equivalent_to(t.sharding, b.ndim)
