"""Router, expert paths and expert parallelism against the dense reference and numpy."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxprs
from research.model import moe
from research.model.config import ModelConfig
from research.model.layers import materialize
from research.parallel import mesh as mesh_lib

SOFTMAX = ModelConfig(d_model=32, num_experts=8, num_experts_per_tok=2, d_expert=16)
SIGMOID = dataclasses.replace(SOFTMAX, router='sigmoid', num_experts=16, num_experts_per_tok=4, n_group=4,
                              topk_group=2, routed_scaling_factor=2.5, num_shared_experts=1)


def _params(cfg, seed=0):
  p = materialize(moe.moe_specs(cfg), jax.random.key(seed), jnp.float32)
  p['router'] = jax.random.normal(jax.random.key(seed + 1), p['router'].shape)  # Avoid top-k ties.
  if 'router_bias' in p:
    p['router_bias'] = 0.1 * jax.random.normal(jax.random.key(seed + 2), p['router_bias'].shape)
  return p


def _np_route(p, x, cfg):
  """Direct numpy transcription of the two routers."""
  logits = np.asarray(x, np.float64) @ np.asarray(p['router'], np.float64)
  k = cfg.num_experts_per_tok
  if cfg.router == 'softmax':
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    idx = np.argsort(-probs, axis=-1)[:, :k]
    w = np.take_along_axis(probs, idx, -1)
    return w / w.sum(-1, keepdims=True), idx
  s = 1 / (1 + np.exp(-logits))
  biased = s + np.asarray(p['router_bias'])
  g = biased.reshape(len(x), cfg.n_group, -1)
  gscore = np.sort(g, -1)[..., -2:].sum(-1)
  keep = np.argsort(-gscore, -1)[:, :cfg.topk_group]
  mask = np.zeros_like(gscore, bool)
  np.put_along_axis(mask, keep, True, -1)
  biased = np.where(np.repeat(mask, g.shape[-1], 1), biased, -np.inf)
  idx = np.argsort(-biased, -1)[:, :k]
  w = np.take_along_axis(s, idx, -1)
  return w / w.sum(-1, keepdims=True) * cfg.routed_scaling_factor, idx


@pytest.mark.parametrize('cfg', [SOFTMAX, SIGMOID], ids=['softmax', 'sigmoid'])
def test_router_matches_numpy(cfg):
  p = _params(cfg)
  x = jax.random.normal(jax.random.key(3), (64, cfg.d_model))
  w, idx, stats = moe.route(p, x, jnp.ones(64, bool), cfg)
  w_ref, idx_ref = _np_route(p, x, cfg)
  np.testing.assert_array_equal(np.sort(idx, -1), np.sort(idx_ref, -1))
  order, order_ref = np.argsort(idx, -1), np.argsort(idx_ref, -1)
  np.testing.assert_allclose(np.take_along_axis(np.asarray(w), order, -1),
                             np.take_along_axis(w_ref, order_ref, -1), rtol=1e-5)
  counts = np.bincount(idx_ref.ravel(), minlength=cfg.num_experts)
  np.testing.assert_allclose(stats['load'], counts / counts.sum(), rtol=1e-6)


def test_group_limit_only_selects_kept_groups():
  p = _params(SIGMOID)
  x = jax.random.normal(jax.random.key(4), (128, SIGMOID.d_model))
  _, idx, _ = moe.route(p, x, jnp.ones(128, bool), SIGMOID)
  groups = np.asarray(idx) // (SIGMOID.num_experts // SIGMOID.n_group)
  assert max(len(set(row)) for row in groups) <= SIGMOID.topk_group


def test_padding_tokens_do_not_count_in_load():
  p = _params(SOFTMAX)
  x = jax.random.normal(jax.random.key(5), (32, SOFTMAX.d_model))
  valid = jnp.arange(32) < 16
  _, idx, stats = moe.route(p, x, valid, SOFTMAX)
  counts = np.bincount(np.asarray(idx)[:16].ravel(), minlength=SOFTMAX.num_experts)
  np.testing.assert_allclose(stats['load'], counts / counts.sum(), rtol=1e-6)


def test_bias_update_moves_toward_balance():
  load = jnp.array([0.5, 0.25, 0.125, 0.125])
  bias = moe.update_router_bias(jnp.zeros(4), load, 0.01)
  np.testing.assert_allclose(bias, [-0.01, 0.0, 0.01, 0.01])


@pytest.mark.parametrize('cfg', [SOFTMAX, SIGMOID], ids=['softmax', 'sigmoid'])
@pytest.mark.parametrize('impl', ['ragged', 'blocked', 'padded'])
def test_grouped_paths_match_dense(cfg, impl):
  p = _params(cfg)
  x = jax.random.normal(jax.random.key(6), (2, 24, cfg.d_model))
  valid = jnp.ones((2, 24), bool)
  ref, _ = jax.jit(lambda p, x: moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl='dense')))(p, x)
  out, _ = jax.jit(lambda p, x: moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl=impl)))(p, x)
  np.testing.assert_allclose(out, ref, atol=1e-5)


def _grads_and_dense_reference(cfg, seed: int):
  """(grad: config -> gradient function of the layer's output against a random probe, params,
  input, that gradient on the dense path)."""
  p = _params(cfg)
  x = jax.random.normal(jax.random.key(seed), (2, 24, cfg.d_model))
  valid = jnp.ones((2, 24), bool)
  probe = jax.random.normal(jax.random.key(seed + 1), x.shape)
  grad = lambda c: jax.grad(lambda p, x: jnp.sum(moe.moe(p, x, valid, c)[0] * probe), argnums=(0, 1))
  return grad, p, x, grad(dataclasses.replace(cfg, moe_impl='dense'))(p, x)


def _slots_fit(cfg, p, x) -> bool:
  """Whether the padded path's slots hold every expert's group for this input (no fallback)."""
  experts = moe.route(p, x.reshape(-1, cfg.d_model), jnp.ones(x.shape[0] * x.shape[1], bool), cfg)[1]
  rows = experts.size
  return int(jnp.max(jnp.bincount(experts.reshape(-1), length=cfg.num_experts))) <= moe.capacity(
      rows, cfg.num_experts, cfg.moe_capacity_factor)


@pytest.mark.parametrize('impl,capacity_factor', [('ragged', 1.25), ('blocked', 1.25), ('padded', 1.0),
                                                  ('padded', 16.0)])
def test_sorted_paths_gradients_match_dense_and_move_rows_by_gathers(impl, capacity_factor):
  """Sorting token copies by expert and back is a permutation both ways: no scatter of D-wide rows
  in the forward or backward program (a GPU would run it with atomics); the FFN path's own
  scatters (the blocked layout) are its business, so only `ragged` and `padded` (its slots filled
  and emptied by gathers too; falling back to `ragged`) are checked for none. The padded path with
  slots for the mean group falls back here, with 16x the mean it does not: both branches."""
  cfg = dataclasses.replace(SIGMOID, moe_impl=impl, moe_fallback_impl='ragged', moe_capacity_factor=capacity_factor)
  grad_fn, p, x, ref = _grads_and_dense_reference(cfg, seed=14)
  if impl == 'padded':
    assert _slots_fit(cfg, p, x) == (capacity_factor > 1)
  grad = grad_fn(cfg)
  for a, b in zip(jax.tree.leaves(jax.jit(grad)(p, x)), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  row_scatters = [e.primitive.name for e in jaxprs.eqns(jax.make_jaxpr(grad)(p, x).jaxpr)
                  if e.primitive.name.startswith('scatter') and e.invars[0].aval.shape[-1] == cfg.d_model]
  if impl in ('ragged', 'padded'):
    assert not row_scatters, row_scatters
  else:
    assert row_scatters  # The check sees scatters where there are some.


def test_padded_path_uses_its_slots_when_every_group_fits_and_falls_back_otherwise():
  """grouped_ffn's padded path against the ragged path on the same sorted rows, including rows past
  the groups (zeros); a group one row larger than the slots takes the fallback (here a marker)."""
  cfg = dataclasses.replace(SOFTMAX, num_experts=4)
  p = {k: v for k, v in _params(cfg).items() if k.startswith('w')}
  xs = jax.random.normal(jax.random.key(21), (40, cfg.d_model))
  scale = jax.random.uniform(jax.random.key(22), (40,))
  marker = lambda w, xs, scale: jnp.full_like(xs, 7.0)
  padded = jax.jit(lambda sizes: moe._ffn_padded(p, xs, sizes, 8, scale, marker))  # pylint: disable=protected-access
  for sizes in ([8, 0, 5, 8], [3, 8, 8, 8], [1, 2, 3, 4]):
    sizes = jnp.asarray(sizes, jnp.int32)
    ref = moe.grouped_ffn(p, xs, sizes, moe.ExpertPath('ragged'), scale)
    np.testing.assert_allclose(padded(sizes), ref, atol=1e-5)
    assert np.all(np.asarray(ref)[int(sizes.sum()):] == 0)
  np.testing.assert_array_equal(padded(jnp.asarray([9, 0, 0, 0], jnp.int32)), np.full(xs.shape, 7.0))
  assert moe.capacity(196608, 32, 1.25) == 7680 and moe.capacity(96, 8, 1.25) == 16
  assert moe.capacity(10, 8, 16.0) == 10  # Never more slots than rows.


def test_permute_rows_backward_is_the_inverse_permutation():
  order, inverse = moe.sort_order(jnp.asarray([3, 0, 1, 3, 2, 0, 1, 1, 2, 0]))
  np.testing.assert_array_equal(order[inverse], np.arange(10))
  assert np.all(np.diff(np.asarray([3, 0, 1, 3, 2, 0, 1, 1, 2, 0])[np.asarray(order)]) >= 0)
  x, g = jax.random.normal(jax.random.key(16), (10, 3)), jax.random.normal(jax.random.key(17), (10, 3))
  np.testing.assert_array_equal(moe.permute_rows(x, order, inverse), np.asarray(x)[np.asarray(order)])
  dx = jax.grad(lambda x: jnp.sum(moe.permute_rows(x, order, inverse) * g))(x)
  expected = np.zeros((10, 3))
  np.add.at(expected, np.asarray(order), np.asarray(g))
  np.testing.assert_allclose(dx, expected, rtol=1e-6)


def test_dropless_when_every_token_picks_the_same_experts():
  cfg = dataclasses.replace(SOFTMAX, norm_topk_prob=False)
  p = _params(cfg)
  p['router'] = jnp.zeros_like(p['router']).at[:, :2].set(10.0)  # All tokens -> experts 0 and 1.
  x = jnp.abs(jax.random.normal(jax.random.key(7), (1, 64, cfg.d_model)))
  valid = jnp.ones((1, 64), bool)
  ref, _ = moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl='dense'))
  out, stats = moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl='blocked', moe_block_size=4))
  np.testing.assert_allclose(out, ref, atol=1e-5)
  assert float(stats['load'][0] + stats['load'][1]) == pytest.approx(1.0)


def test_blocked_path_compiled_flops_near_ideal():
  cfg = dataclasses.replace(SOFTMAX, d_model=64, d_expert=64, num_experts=32, num_experts_per_tok=2)
  p = _params(cfg)
  n = 1024
  x = jnp.ones((1, n, cfg.d_model))
  valid = jnp.ones((1, n), bool)
  ideal = moe.ideal_flops(n, cfg) + 2 * n * cfg.d_model * cfg.num_experts  # Experts + router.
  flops = {}
  for impl in ('dense', 'blocked'):
    c = dataclasses.replace(cfg, moe_impl=impl)
    compiled = jax.jit(lambda p, x: moe.moe(p, x, valid, c)[0]).lower(p, x).compile()
    flops[impl] = compiled.cost_analysis()['flops']
  assert flops['blocked'] <= 1.3 * ideal, flops['blocked'] / ideal
  assert flops['dense'] >= 0.9 * ideal * cfg.num_experts / cfg.num_experts_per_tok


def test_router_replay_reuses_routes():
  p = _params(SIGMOID)
  x = jax.random.normal(jax.random.key(8), (1, 16, SIGMOID.d_model))
  valid = jnp.ones((1, 16), bool)
  y, stats = moe.moe(p, x, valid, SIGMOID)
  p2 = {**p, 'router_bias': p['router_bias'] + 5.0 * jax.random.normal(jax.random.key(9), (16,))}
  y_new, stats_new = moe.moe(p2, x, valid, SIGMOID)
  y_replay, stats_replay = moe.moe(p2, x, valid, SIGMOID, stats['routes'])
  assert not np.array_equal(stats_new['routes'], stats['routes'])
  np.testing.assert_array_equal(stats_replay['routes'], stats['routes'])
  np.testing.assert_allclose(y_replay, y, atol=1e-6)  # The bias only affects selection.


# ----------------------------------------------------------------------------------------------
# Expert parallelism. XLA:CPU cannot run ragged_all_to_all, so the exchange runs here through its
# emulation (`ep_exchange='all_to_all'`), and the real primitive is only lowered.


def _np_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets):
  """ragged_all_to_all's docstring on stacked per-device arrays: result[j] gets sender i's slice t."""
  ep, k = send_sizes.shape
  s = k // ep
  result = output.copy()
  for i in range(ep):
    for t in range(k):
      j, n, o = t // s, send_sizes[i, t], output_offsets[i, t]
      result[j, o:o + n] = operand[i, input_offsets[i, t]:input_offsets[i, t] + n]
  return result


def _layout(rng, sizes_XxK):
  """Offsets that lay each row's slices out in order with random gaps; returns offsets, length."""
  gaps = rng.integers(0, 2, sizes_XxK.shape)
  ends = np.cumsum(gaps + sizes_XxK, axis=1)
  return (ends - sizes_XxK).astype(np.int32), int(ends[:, -1].max())


def test_ragged_all_to_all_emulation_matches_numpy():
  ep, s, d = 8, 2, 3  # Two slices per destination.
  rng = np.random.default_rng(0)
  send = rng.integers(0, 3, (ep, ep * s)).astype(np.int32)  # send[i, j*s + t]; ~1/3 empty.
  recv = send.reshape(ep, ep, s).transpose(1, 0, 2).reshape(ep, ep * s)  # recv[j, i*s + t].
  in_off, n = _layout(rng, send)
  recv_off, m = _layout(rng, recv)
  out_off = recv_off.reshape(ep, ep, s).transpose(1, 0, 2).reshape(ep, ep * s)
  operand = rng.normal(size=(ep, n, d)).astype(np.float32)
  output = rng.normal(size=(ep, m + 2, d)).astype(np.float32)  # Unwritten rows must survive.
  ref = _np_ragged_all_to_all(operand, output, in_off, send, out_off)

  mesh = mesh_lib.make_mesh('expert:8')
  fn = jax.shard_map(functools.partial(moe._ragged_all_to_all_emulated, axis_name='expert'),
                     mesh=mesh, in_specs=P('expert'), out_specs=P('expert'), check_vma=False)
  flat = lambda a: a.reshape(-1, *a.shape[2:])
  with jax.set_mesh(mesh):
    out = jax.jit(fn)(*map(flat, (operand, output, in_off, send, out_off, recv)))
  np.testing.assert_array_equal(np.asarray(out).reshape(ref.shape), ref)


def _moe_on_mesh(cfg, mesh_spec, p, x, valid):
  with jax.set_mesh(mesh_lib.make_mesh(mesh_spec)):
    return jax.jit(lambda p, x: moe.moe(p, x, valid, cfg)[0])(p, x)


@pytest.mark.parametrize('mesh_spec', ['expert:4', 'fsdp:2,expert:2,tensor:2'])
@pytest.mark.parametrize('impl', ['blocked', 'ragged', 'padded'])
def test_expert_parallel_matches_dense(mesh_spec, impl):
  p = _params(SOFTMAX)
  x = jax.random.normal(jax.random.key(10), (2, 24, SOFTMAX.d_model))
  valid = jnp.ones((2, 24), bool)
  ref, _ = moe.moe(p, x, valid, dataclasses.replace(SOFTMAX, moe_impl='dense'))
  out = _moe_on_mesh(dataclasses.replace(SOFTMAX, moe_impl=impl, ep_exchange='all_to_all'),
                     mesh_spec, p, x, valid)
  np.testing.assert_allclose(out, ref, atol=1e-5)


def test_expert_parallel_dropless_when_one_device_receives_everything():
  cfg = dataclasses.replace(SOFTMAX, moe_impl='blocked', moe_block_size=4, ep_exchange='all_to_all')
  p = _params(cfg)
  p['router'] = jnp.zeros_like(p['router']).at[:, :2].set(10.0)  # Experts 0 and 1: device 0.
  x = jnp.abs(jax.random.normal(jax.random.key(11), (2, 24, cfg.d_model)))
  valid = jnp.ones((2, 24), bool)
  ref, _ = moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl='dense'))
  np.testing.assert_allclose(_moe_on_mesh(cfg, 'expert:4', p, x, valid), ref, atol=1e-5)


@pytest.mark.parametrize('mesh_spec,impl', [('expert:4', 'blocked'), ('fsdp:2,expert:2,tensor:2', 'blocked'),
                                             ('expert:4', 'padded')])
def test_expert_parallel_gradients_match_dense(mesh_spec, impl):
  grad, p, x, ref = _grads_and_dense_reference(SOFTMAX, seed=12)
  cfg = dataclasses.replace(SOFTMAX, moe_impl=impl, ep_exchange='all_to_all')
  with jax.set_mesh(mesh_lib.make_mesh(mesh_spec)):
    out = jax.jit(grad(cfg))(p, x)
  for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_ragged_exchange_lowers_to_the_primitive():
  """XLA:CPU cannot compile it, but the forward and backward programs lower to ragged_all_to_all."""
  p = _params(SOFTMAX)
  x = jnp.ones((2, 24, SOFTMAX.d_model))
  valid = jnp.ones((2, 24), bool)
  texts = {}
  for exchange in ('ragged', 'auto'):
    cfg = dataclasses.replace(SOFTMAX, moe_impl='blocked', ep_exchange=exchange)
    loss = lambda p, x: jnp.sum(moe.moe(p, x, valid, cfg)[0])
    with jax.set_mesh(mesh_lib.make_mesh('expert:4')):
      texts[exchange] = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(p, x).as_text()
  assert texts['ragged'].count('ragged_all_to_all') >= 4  # Two exchanges, each transposed.
  assert 'ragged_all_to_all' not in texts['auto']  # `auto` emulates it on CPU.


@pytest.mark.parametrize('param_dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('slots', [0, 16])
def test_expert_ffn_backward_keeps_its_projections_and_weight_casts_only(param_dtype, slots):
  """bf16 compute: the backward keeps, besides its arguments, the gate and up projections (M x F)
  and, from float32 parameters, the weights' bf16 casts: not the rows in expert order nor the output
  rows (M x D each); silu(gate) * up is recomputed. The padded path (slots > 0, falling back to
  `ragged`) keeps the same: its cond's branches share those residuals, not one set each."""
  cfg = dataclasses.replace(SOFTMAX, dtype='bfloat16')
  p = {k: v.astype(param_dtype) for k, v in _params(cfg).items() if k.startswith('w')}
  n, k, f = 24, 2, cfg.d_expert
  x = jax.random.normal(jax.random.key(18), (n, cfg.d_model), jnp.bfloat16)
  experts = jax.random.randint(jax.random.key(19), (n * k,), 0, cfg.num_experts)
  order, inverse = moe.sort_order(experts)
  sizes = jnp.bincount(experts, length=cfg.num_experts).astype(jnp.int32)
  scale = jax.random.uniform(jax.random.key(20), (n * k,))
  path = moe.ExpertPath('padded' if slots else 'ragged', fallback='ragged')
  ffn = lambda p, x, scale, order, inverse: moe.dispatched_ffn(p, x, k, order, inverse, sizes, path,
                                                              scale_M=scale, slots=slots)
  kept = sorted(line.split(' ')[0] for line in jaxprs.kept_residuals(ffn, p, x, scale, order, inverse))
  casts = [f'bf16[{",".join(map(str, w.shape))}]' for w in p.values()] if param_dtype == 'float32' else []
  assert kept == sorted([f'bf16[{n * k},{f}]'] * 2 + casts), kept
