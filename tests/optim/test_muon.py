"""Sharded Muon equals optax.contrib.muon: one device, several meshes, N-d leaves, mixed trees."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from optax.contrib import MuonDimensionNumbers as Dims

from experiments.benchmarks.trees import moe_tree
from research.optim import muon as muon_lib
from research.optim import newton_schulz
from research.optim import plan as plan_lib
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib

# L=3: stacks whose matrix count no shard count divides, so groups are padded.
SIZES = dict(L=3, D=32, H=4, K=2, Dh=8, E=8, F=16, Fs=16, V=64)
MESHES = ['fsdp:2,expert:4', 'fsdp:8', 'data:2,fsdp:2,expert:2', 'fsdp:2,expert:2,tensor:2']


def _tree():
  shapes, axes, dims = moe_tree(**SIZES)
  shapes['proj'] = jax.ShapeDtypeStruct((48, 32), jnp.float32)  # A plain 2-d leaf.
  axes['proj'] = ('mlp', 'embed')
  dims['proj'] = Dims()
  return shapes, axes, dims


def _random(shapes, seed):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(s.dtype), shapes)


# LLVM -O0: a quarter of the compile time; the HLO and the arithmetic are the same.
FAST_COMPILE = {'xla_backend_optimization_level': 0}


def _run(opt, params, grads, steps=2):
  """Updates of the last of `steps` steps (the second one exercises the momentum)."""
  state = jax.jit(opt.init, compiler_options=FAST_COMPILE)(params)
  update = jax.jit(opt.update, compiler_options=FAST_COMPILE)
  for _ in range(steps):
    updates, state = update(grads, state, params)
  return updates


def _assert_close(ours, ref):
  """2e-5 relative; 2e-6 absolute for leaves of magnitude <= 1, scaled with larger ones (f32
  rounding, e.g. after `adaptive` multiplies a leaf by its <momentum, update>)."""
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(ours)[0], jax.tree.leaves(ref)):
    atol = 2e-6 * max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=atol,
                               err_msg=muon_lib.path_str(path))


@functools.cache
def _reference(**kwargs):
  shapes, _, dims = _tree()
  params, grads = _random(shapes, 0), _random(shapes, 1)
  return _run(optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims, **kwargs),
              params, grads)


# 'spectral' runs only here: on 8 simulated CPU devices XLA:CPU hangs in its LAPACK SVD (or
# eigh) inside the shard_map that holds the all-to-alls.
@pytest.mark.parametrize('kwargs', [dict(weight_decay=0.1),
                                    dict(preconditioning='spectral', nesterov=False)])
def test_one_device_equals_optax(kwargs):
  shapes, _, dims = _tree()
  params, grads = _random(shapes, 0), _random(shapes, 1)
  ours = _run(muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, **kwargs), params, grads)
  _assert_close(ours, _reference(**kwargs))


@pytest.mark.parametrize('mesh_spec', MESHES)
def test_mesh_equals_optax(mesh_spec):
  mesh = mesh_lib.make_mesh(mesh_spec)
  shapes, axes, dims = _tree()
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  params = jax.device_put(_random(shapes, 0), shardings)
  grads = jax.device_put(_random(shapes, 1), shardings)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, weight_decay=0.1, mesh=mesh,
                      shardings=shardings)
  _assert_close(_run(opt, params, grads), _reference(weight_decay=0.1))


def test_options_equal_optax_on_mesh():
  """Plain momentum, bf16 momentum, a per-step schedule and consistent RMS, sharded."""
  mesh = mesh_lib.make_mesh('fsdp:2,expert:2,tensor:2')
  shapes, axes, dims = _tree()
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  params = jax.device_put(_random(shapes, 0), shardings)
  grads = jax.device_put(_random(shapes, 1), shardings)
  kwargs = dict(ns_coeffs=newton_schulz.PRESETS['polar_express'], ns_steps=8,
                mu_dtype=jnp.bfloat16, nesterov=False, consistent_rms=0.2, weight_decay=0.1,
                adam_weight_decay=0.05)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings,
                      **kwargs)
  _assert_close(_run(opt, params, grads), _reference(**kwargs))


@pytest.mark.parametrize('kwargs', [
    dict(preconditioning='aol', ns_coeffs='dion'),
    dict(preconditioning='schatten', adaptive=True),
])
def test_preconditioning_equals_optax_on_mesh(kwargs):
  """optax's other orthogonalization modes, run on whole matrices after the exchange."""
  mesh = mesh_lib.make_mesh('data:2,fsdp:2,expert:2')
  shapes, axes, dims = _tree()
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  params = jax.device_put(_random(shapes, 0), shardings)
  grads = jax.device_put(_random(shapes, 1), shardings)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings,
                      **kwargs)
  _assert_close(_run(opt, params, grads), _reference(**kwargs))


@pytest.mark.parametrize('mesh_spec', ['fsdp:8', 'fsdp:2,expert:2,tensor:2'])
def test_balanced_exchange_splits_matrices_and_equals_optax(mesh_spec):
  """exchange='balanced' splits the columns of the 3-matrix stacks over the exchange group (fewer
  NS FLOPs per device than padding them to 8 whole matrices) and still computes optax's update."""
  mesh = mesh_lib.make_mesh(mesh_spec)
  shapes, axes, dims = _tree()
  mesh_shape = dict(mesh.shape)
  flops = {e: plan_lib.plan(shapes, axes, mesh_shape, weight_dimension_numbers=dims,
                            exchange=e).ns_flops_per_device for e in ('all_to_all', 'balanced')}
  assert flops['balanced'] < flops['all_to_all']
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  params = jax.device_put(_random(shapes, 0), shardings)
  grads = jax.device_put(_random(shapes, 1), shardings)
  for kwargs in ({'weight_decay': 0.1}, {'preconditioning': 'aol'}):
    opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings,
                        exchange='balanced', **kwargs)
    _assert_close(_run(opt, params, grads), _reference(**kwargs))


@pytest.mark.parametrize('mesh_spec, preconditioning', [('data:2,fsdp:2,expert:2', 'frobenius'),
                                                       ('data:2,fsdp:2,expert:2', 'aol'),
                                                       ('expert:8', 'frobenius')])
def test_auto_layouts_equal_optax_on_mesh(mesh_spec, preconditioning):
  """exchange='auto' with NS priced high (a slow chip) balances NS better than 'all_to_all': on
  the first mesh the 3-matrix stacks are split by columns and spread over replicas (A (A X) on
  the narrow column sets); on expert:8 the replicated 3-matrix stacks go to 3 of 8 replicas,
  restored by an all-reduce of the 3 real matrices instead of gathering 8 padded ones. Still
  optax's update."""
  mesh = mesh_lib.make_mesh(mesh_spec)
  shapes, axes, dims = _tree()
  topology = plan_lib.Topology(devices_per_node=4, peak_flops=1e6)
  plan = plan_lib.plan(shapes, axes, dict(mesh.shape), weight_dimension_numbers=dims,
                       exchange='auto', topology=topology)
  if mesh_spec == 'expert:8':
    assert any(g.restore == 'psum' for g in plan.groups)
  else:
    assert any(g.split > 1 and g.spread_size > 1 for g in plan.groups)
  assert plan.flops_balance < plan_lib.plan(shapes, axes, dict(mesh.shape),
                                            weight_dimension_numbers=dims).flops_balance
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  params, grads = _random(shapes, 0), _random(shapes, 1)
  params, grads = jax.device_put(params, shardings), jax.device_put(grads, shardings)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings,
                      preconditioning=preconditioning, exchange='auto', topology=topology)
  _assert_close(_run(opt, params, grads), _reference(preconditioning=preconditioning))


def test_complex_leaves_equal_optax_on_mesh():
  """Complex matrices are exchanged as complex64 (never cast to the real ns_dtype) and
  orthogonalized with the conjugate transpose."""
  mesh = mesh_lib.make_mesh('fsdp:2,expert:2,tensor:2')
  shapes = {'w': jax.ShapeDtypeStruct((3, 32, 16), jnp.complex64),
            'v': jax.ShapeDtypeStruct((16, 48), jnp.complex64)}
  dims = {'w': Dims(1, 2), 'v': Dims()}
  shardings = {'w': NamedSharding(mesh, P(None, 'fsdp', 'tensor')),
               'v': NamedSharding(mesh, P('fsdp', 'tensor'))}
  complex_random = lambda seed: jax.tree.map(
      lambda re, im: re + 1j * im, _random(shapes, seed), _random(shapes, seed + 10))
  params, grads = complex_random(0), complex_random(1)
  ref = _run(optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims, adaptive=True),
             params, grads)
  params, grads = jax.device_put(params, shardings), jax.device_put(grads, shardings)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, adaptive=True, mesh=mesh,
                      shardings=shardings, ns_dtype=jnp.bfloat16)
  _assert_close(_run(opt, params, grads), ref)


def test_per_head_narrow_and_all_gather_exchange():
  """Heads as a batch axis (sharded over tensor); no spreading over the expert replicas; the
  ZeRO-1 style all-gather exchange."""
  mesh = mesh_lib.make_mesh('fsdp:2,expert:2,tensor:2')
  q = jax.ShapeDtypeStruct((3, 32, 4, 8), jnp.float32)
  w = jax.ShapeDtypeStruct((3, 32, 16), jnp.float32)
  shapes = {'q': q, 'w': w}
  dims = {'q': Dims(1, 3), 'w': Dims(1, 2)}
  shardings = {'q': NamedSharding(mesh, P(None, 'fsdp', 'tensor')),
               'w': NamedSharding(mesh, P(None, 'fsdp', 'tensor'))}
  params, grads = _random(shapes, 0), _random(shapes, 1)
  ref = _run(optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims), params, grads)
  params, grads = jax.device_put(params, shardings), jax.device_put(grads, shardings)
  for kwargs in ({}, {'spread_axes': lambda path: () if path == 'w' else None},
                 {'exchange': 'all_gather'}):
    opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh,
                        shardings=shardings, **kwargs)
    _assert_close(_run(opt, params, grads), ref)


def test_default_labels_and_state_sharding():
  mesh = mesh_lib.make_mesh('fsdp:2,expert:4')
  shapes, axes, dims = _tree()
  labels = muon_lib.default_param_labels(shapes, dims)
  assert labels['embed']['embedding'] == labels['lm_head']['kernel'] == 'adam'
  assert labels['layers']['attn_norm']['scale'] == 'adam'
  assert labels['layers']['moe']['wo'] == labels['layers']['moe']['router'] == 'muon'
  # With no dimension numbers: the 2-d rule, still excluding the embedding and the head.
  labels_2d = muon_lib.default_param_labels(shapes)
  assert labels_2d['proj'] == labels_2d['layers']['attn_norm']['scale'] == 'muon'
  assert labels_2d['lm_head']['kernel'] == labels_2d['layers']['moe']['wo'] == 'adam'

  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings)
  state = jax.jit(opt.init)(jax.device_put(_random(shapes, 0), shardings))
  mu = state.inner_states['muon'].inner_state[0].mu
  nu = state.inner_states['adam'].inner_state[0].nu
  wo, embedding = mu['layers']['moe']['wo'], nu['embed']['embedding']
  assert wo.sharding.is_equivalent_to(shardings['layers']['moe']['wo'], wo.ndim)
  assert embedding.sharding.is_equivalent_to(shardings['embed']['embedding'], embedding.ndim)
  assert isinstance(mu['embed']['embedding'], optax.MaskedNode)
  # Wrapped in optax.masked (e.g. a frozen leaf), the moments still follow the params.
  frozen = jax.tree.map(lambda _: True, shapes)
  frozen['layers']['moe']['router'] = False
  out = jax.jit(optax.masked(opt, frozen).init).lower(shapes).compile(FAST_COMPILE)
  nu = out.output_shardings.inner_state.inner_states['adam'].inner_state[0].nu
  assert nu['embed']['embedding'].is_equivalent_to(shardings['embed']['embedding'], 2)


@pytest.mark.parametrize('kwargs, field', [
    (dict(ns_coeffs='quartic'), 'ns_coeffs'),
    (dict(ns_coeffs=(1.0, 2.0)), 'ns_coeffs'),
    (dict(ns_steps=0), 'ns_steps'),
    (dict(exchange='ring'), 'exchange'),
    (dict(preconditioning='newton'), 'preconditioning'),
    (dict(exchange='balanced', preconditioning='spectral'), "exchange: 'balanced'"),
    (dict(exchange='auto', preconditioning='spectral'), "exchange: 'auto'"),
    (dict(spread_axes=('pipeline',)), "spread_axes at <all leaves>: mesh axis 'pipeline'"),
    (dict(shardings={'w': P('fsdp', 'model')}), "shardings at w: mesh axis 'model'"),
    (dict(muon_weight_dimension_numbers={'w': Dims(0.5, 1)}), 'weight_dimension_numbers at w'),
])
def test_bad_construction_names_the_field(kwargs, field):
  mesh = mesh_lib.make_mesh('fsdp:8')
  kwargs.setdefault('shardings', {'w': P('fsdp')})
  with pytest.raises(ValueError, match=field):
    muon_lib.muon(0.02, mesh=mesh, **kwargs)


@pytest.mark.parametrize('dims, shape, field', [
    (Dims(1, 3), (4, 8, 8), 'weight_dimension_numbers at w: output_axis 3 is out of range'),
    (Dims(1, 1), (4, 8, 8), 'overlap'),
    (None, (4, 8, 8), 'none given for a rank-3 leaf'),
    (Dims(0, 1), (6, 8), 'shardings at w: axis 0 of size 6 is not divisible'),
])
def test_bad_leaf_fails_at_init_naming_it(dims, shape, field):
  mesh = mesh_lib.make_mesh('fsdp:8')
  params = {'w': jnp.zeros(shape)}
  opt = muon_lib.scale_by_muon(weight_dimension_numbers={'w': dims}, mesh=mesh,
                               shardings={'w': P('fsdp')})
  with pytest.raises(ValueError, match=field):
    opt.init(params)
