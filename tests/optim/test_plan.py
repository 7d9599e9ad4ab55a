"""The analytic plan matches the compiled program; the exchange meets its bounds and can overlap."""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from experiments.benchmarks.trees import moe_tree
from research.optim import exchange as exchange_lib
from research.optim import hlo_stats
from research.optim import muon as muon_lib
from research.optim import plan as plan_lib
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib

# The benchmark's tree (same layer and expert counts, so the same padding), narrower.
SIZES = dict(L=4, D=64, H=4, K=2, Dh=16, E=16, F=64, Fs=64, V=128)
FAST_COMPILE = {'xla_backend_optimization_level': 0}


@functools.cache
def _lower(mesh_spec, **kwargs):
  """(lowered, plan) of the full Muon + AdamW update on the tiny MoE tree (`layers` of them,
  the other kwargs: muon's)."""
  mesh = mesh_lib.make_mesh(mesh_spec)
  shapes, axes, dims = moe_tree(**dict(SIZES, L=kwargs.pop('layers', SIZES['L'])))
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  opt = muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, mesh=mesh, shardings=shardings,
                      **kwargs)
  state = jax.eval_shape(opt.init, shapes)
  state_sh = muon_lib.state_shardings(state, shapes, shardings, mesh)
  lowered = jax.jit(opt.update, in_shardings=(shardings, state_sh, shardings)).lower(
      shapes, state, shapes)
  ns_dtype = kwargs.get('ns_dtype', jnp.float32)
  plan = plan_lib.plan(shapes, axes, dict(mesh.shape), weight_dimension_numbers=dims,
                       ns_dtype=ns_dtype, exchange=kwargs.get('exchange', 'all_to_all'),
                       topology=kwargs.get('topology'))
  return lowered, plan


@functools.cache
def _compile(mesh_spec, **kwargs):
  lowered, plan = _lower(mesh_spec, **kwargs)
  return lowered.compile(FAST_COMPILE), plan


@pytest.mark.parametrize('mesh_spec, kwargs', [
    ('fsdp:2,expert:4', {}),
    ('data:2,fsdp:2,expert:2', {}),
    ('fsdp:2,expert:2,tensor:2', {'exchange': 'all_gather'}),
    ('fsdp:8', {}),
    ('fsdp:8', {'exchange': 'balanced'}),
])
def test_plan_matches_compiled(mesh_spec, kwargs):
  compiled, plan = _compile(mesh_spec, **kwargs)
  flops = compiled.cost_analysis()['flops']
  sent = hlo_stats.collective_bytes(compiled.as_text())
  assert plan.ns_flops_per_device == pytest.approx(flops, rel=0.1)
  assert plan.exchange_bytes_per_device == pytest.approx(sent, rel=0.1)
  assert sent > 0


def test_exchange_bounds_on_the_benchmark_mesh():
  """At most 2.2x the local shard in f32, 1.1x in bf16; NS FLOPs at most 1.15x the ideal share."""
  compiled, plan = _compile('fsdp:2,expert:4')
  lowered_bf16, plan_bf16 = _lower('fsdp:2,expert:4', ns_dtype=jnp.bfloat16)
  f32 = hlo_stats.collective_bytes(compiled.as_text())
  # XLA:CPU widens bf16 collectives to f32; the lowered program keeps the exchanged width.
  bf16 = hlo_stats.collective_bytes(lowered_bf16.as_text(dialect='hlo'))
  assert plan_bf16.exchange_bytes_per_device == pytest.approx(bf16, rel=0.1)
  assert f32 <= 2.2 * plan.local_shard_bytes
  assert bf16 <= 1.1 * plan.local_shard_bytes
  ideal = plan.ns_flops_total / plan.num_devices
  assert compiled.cost_analysis()['flops'] <= 1.15 * ideal


def test_chunks_exchange_independently():
  """Each chunk's all-to-alls wait only on that chunk, so one chunk's exchange can run while
  another's NS computes; the memory-minimizing CPU schedule interleaves them."""
  mesh = mesh_lib.make_mesh('fsdp:8')
  shapes = {'w': jax.ShapeDtypeStruct((32, 64, 128), jnp.float32)}
  opt = muon_lib.scale_by_muon(
      weight_dimension_numbers={'w': muon_lib.MuonDimensionNumbers(1, 2)}, mesh=mesh,
      shardings={'w': P(None, 'fsdp')}, chunk_bytes=64 * 128 * 4)  # One matrix per chunk.
  lowered = jax.jit(opt.update).lower(shapes, jax.eval_shape(opt.init, shapes))
  chunks = 32 // 8
  default = hlo_stats.schedule(lowered.compile(FAST_COMPILE).as_text())
  assert default['collectives'] == 2 * chunks
  assert default['max_collective_deps'] == 1
  memory = hlo_stats.schedule(lowered.compile(
      dict(FAST_COMPILE, xla_cpu_scheduler_type='CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED')).as_text())
  assert memory['interleaved'] == 2 * chunks - 2


def test_whole_experts_need_no_exchange():
  """Experts sharded only on the expert axis: NS where they are, no collective at all."""
  mesh = mesh_lib.make_mesh('expert:8')
  shapes = {'wi': jax.ShapeDtypeStruct((2, 16, 32, 48), jnp.float32)}
  axes = {'wi': ('layers', 'experts', 'expert_embed', 'expert_mlp')}
  dims = {'wi': muon_lib.MuonDimensionNumbers(2, 3)}
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  opt = muon_lib.scale_by_muon(weight_dimension_numbers=dims, mesh=mesh, shardings=shardings)
  compiled = jax.jit(opt.update).lower(shapes, jax.eval_shape(opt.init, shapes)).compile(
      FAST_COMPILE)
  plan = plan_lib.plan(shapes, axes, dict(mesh.shape), weight_dimension_numbers=dims)
  assert hlo_stats.collective_bytes(compiled.as_text()) == plan.exchange_bytes_per_device == 0
  assert plan.flops_balance == 1.0
  assert compiled.cost_analysis()['flops'] == pytest.approx(plan.ns_flops_per_device, rel=0.1)


def test_narrow_dense_weights():
  """Dense weights kept in their fsdp exchange group repeat NS on every expert replica."""
  shapes, axes, dims = moe_tree(**SIZES)
  mesh_shape = {'fsdp': 2, 'expert': 4}
  wide = plan_lib.plan(shapes, axes, mesh_shape, weight_dimension_numbers=dims)
  narrow = plan_lib.plan(shapes, axes, mesh_shape, weight_dimension_numbers=dims,
                         spread_axes=lambda path: None if '/moe/w' in path else ())
  assert {g.spread_size for g in wide.groups} == {1, 4}
  assert {g.spread_size for g in narrow.groups} == {1}
  assert narrow.ns_flops_per_device > wide.ns_flops_per_device
  assert narrow.ns_flops_total == wide.ns_flops_total


def test_plan_kimi_scale_without_devices():
  """Kimi K2's experts (60 MoE layers x 384 x three 7168 x 2048) over 16384 devices."""
  shape = jax.ShapeDtypeStruct((60, 384, 7168, 2048), jnp.bfloat16)
  shapes = {'wi_gate': shape, 'wi_up': shape,
            'wo': jax.ShapeDtypeStruct((60, 384, 2048, 7168), jnp.bfloat16)}
  axes = {'wi_gate': ('layers', 'experts', 'expert_embed', 'expert_mlp'),
          'wi_up': ('layers', 'experts', 'expert_embed', 'expert_mlp'),
          'wo': ('layers', 'experts', 'expert_mlp', 'expert_embed')}
  dims = jax.tree.map(lambda _: muon_lib.MuonDimensionNumbers(2, 3), shapes)
  start = time.perf_counter()
  plan = plan_lib.plan(shapes, axes, {'data': 8, 'fsdp': 64, 'expert': 32, 'tensor': 1},
                       weight_dimension_numbers=dims, ns_dtype=jnp.bfloat16,
                       peak_flops=9.9e14, link_bandwidth=4.5e10)
  assert time.perf_counter() - start < 1.0
  assert plan.ns_flops_total == pytest.approx(4.75e16, rel=0.01)
  # 2160 local matrices per fsdp group spread over 8 x 64 devices: 5 each, not 4.22.
  assert plan.ns_flops_per_device == pytest.approx(plan.ns_flops_total / 16384 * 5 / 4.21875)
  local = 3 * 60 * 12 * 2048 * 112 * 2  # Three leaves' bf16 shards.
  assert plan.local_shard_bytes == local
  assert plan.exchange_bytes_per_device <= 2 * local
  assert plan.step_seconds == pytest.approx(
      max(plan.compute_seconds, plan.exchange_seconds)
      + min(plan.compute_seconds, plan.exchange_seconds) / plan.num_chunks)
  assert np.isfinite(plan.step_seconds)


# XLA:GPU's shape of things (trimmed from the update compiled for 8 H100s by
# experiments/benchmarks/gpu_aot.py): groups only on the -start, matmuls as gemm fusions or
# cuBLAS custom-calls, and a pair the scheduler left synchronous.
GPU_HLO = """\
%gemm_computation (p0: bf16[16,256], p1: bf16[256,16]) -> bf16[16,16] {
  %p0 = bf16[16,256]{1,0} parameter(0)
  %p1 = bf16[256,16]{0,1} parameter(1)
  ROOT %dot.1 = bf16[16,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: bf16[2,1,256,128], y: bf16[16,256], z: bf16[256,16]) -> bf16[2,1,256,128] {
  %x = bf16[2,1,256,128]{3,2,1,0} parameter(0)
  %y = bf16[16,256]{1,0} parameter(1)
  %z = bf16[256,16]{0,1} parameter(2)
  %all-to-all-start.1 = ((bf16[2,1,256,128]{3,2,1,0}), bf16[2,1,256,128]{3,2,1,0}) all-to-all-start(%x), channel_id=1, replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, backend_config={"collective_backend_config":{"is_sync":false}}
  %gemm_fusion.1 = bf16[16,16]{1,0} fusion(%y, %z), kind=kCustom, calls=%gemm_computation
  %cublas.1 = (bf16[16,16]{1,0}, s8[0]{0}) custom-call(%y, %z), custom_call_target="__cublas$gemm"
  %all-to-all-done.1 = bf16[2,1,256,128]{3,2,1,0} all-to-all-done(%all-to-all-start.1)
  %all-to-all-start.2 = ((bf16[2,1,256,128]{3,2,1,0}), bf16[2,1,256,128]{3,2,1,0}) all-to-all-start(%all-to-all-done.1), channel_id=2, replica_groups={{0,4},{1,5},{2,6},{3,7}}, dimensions={0}, backend_config={"collective_backend_config":{"is_sync":true}}
  %gemm_fusion.2 = bf16[16,16]{1,0} fusion(%y, %z), kind=kCustom, calls=%gemm_computation
  ROOT %all-to-all-done.2 = bf16[2,1,256,128]{3,2,1,0} all-to-all-done(%all-to-all-start.2)
}
"""


def test_hlo_stats_reads_gpu_async_pairs():
  stats = hlo_stats.schedule(GPU_HLO)
  assert (stats['collectives'], stats['async'], stats['async_overlapped']) == (2, 1, 1)
  assert (stats['matmuls'], stats['matmuls_in_flight']) == (3, 2)
  assert hlo_stats.collective_bytes(GPU_HLO) == 2 * (2 * 256 * 128 * 2) / 2


RAGGED_HLO = """\
ENTRY %main (x: f32[64,8], o: f32[512,8], s: s64[8]) -> f32[512,8] {
  %x = f32[64,8]{1,0} parameter(0)
  %o = f32[512,8]{1,0} parameter(1)
  %s = s64[8]{0} parameter(2)
  %a2a-start = ((f32[64,8]{1,0}, f32[512,8]{1,0}, s64[8]{0}, s64[8]{0}, s64[8]{0}, /*index=5*/s64[8]{0}), f32[512,8]{1,0}) ragged-all-to-all-start(%x, %o, %s, %s, %s, /*index=5*/%s), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}
  %a2a-done = f32[512,8]{1,0} ragged-all-to-all-done(%a2a-start)
  %offsets = s64[8]{0} all-to-all(%s), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  ROOT %out = f32[512,8]{1,0} copy(%a2a-done)
}
"""


def test_hlo_stats_counts_ragged_exchanges_but_not_their_worst_case_bytes():
  assert hlo_stats.collective_ops(RAGGED_HLO) == {'ragged-all-to-all-start': 1, 'all-to-all': 1}
  assert hlo_stats.schedule(RAGGED_HLO)['async'] == 1
  assert hlo_stats.collective_bytes(RAGGED_HLO) == 8 * 8 * 7 / 8  # Only the offsets' all-to-all.


# exchange='auto' as chosen for a slow chip (NS priced high): splits and spreads on the first
# mesh; on expert:8 with 3 layers, the dense 3-matrix stacks go to 3 of 8 replicas and come back
# by an all-reduce of the 3 real matrices.
SLOW_CHIP = plan_lib.Topology(devices_per_node=4, peak_flops=1e6)


@pytest.mark.parametrize('mesh_spec, kwargs', [
    ('fsdp:2,expert:4', {}),
    ('data:2,fsdp:2,expert:2', {}),
    ('fsdp:8', {'exchange': 'balanced'}),
    ('data:2,fsdp:2,expert:2', {'exchange': 'auto', 'topology': SLOW_CHIP}),
    ('expert:8', {'exchange': 'auto', 'topology': SLOW_CHIP, 'layers': 3}),
])
def test_link_classes_match_compiled_on_two_nodes(mesh_spec, kwargs):
  """8 devices as 2 nodes of 4: the bytes the compiled program sends inside and across nodes
  (its replica groups name the devices) equal the topology model's split; 'balanced' and 'auto'
  add the all-reduces of split matrices and of sparsely spread ones."""
  compiled, _ = _compile(mesh_spec, **kwargs)
  shapes, axes, dims = moe_tree(**dict(SIZES, L=kwargs.get('layers', SIZES['L'])))
  topology = kwargs.get('topology', plan_lib.Topology(devices_per_node=4, peak_flops=1e12))
  plan = plan_lib.plan(shapes, axes, mesh_lib.parse_mesh_spec(mesh_spec),
                       weight_dimension_numbers=dims, exchange=kwargs.get('exchange', 'all_to_all'),
                       topology=topology, peak_flops=topology.peak_flops)
  if kwargs:
    assert any(g.split > 1 for g in plan.groups) or mesh_spec == 'expert:8'
    assert any(g.restore == 'psum' for g in plan.groups) or mesh_spec != 'expert:8'
  hlo = compiled.as_text()
  for device in (0, 5):
    sent = hlo_stats.collective_bytes_by_link(hlo, 4, device)
    assert sent['intra'] == pytest.approx(plan.intra_bytes_per_device, rel=1e-6)
    assert sent['inter'] == pytest.approx(plan.inter_bytes_per_device, rel=1e-6)
  assert plan.intra_bytes_per_device > 0 and plan.inter_bytes_per_device > 0
  assert plan.ns_flops_per_device == pytest.approx(hlo_stats.matmul_flops(hlo), rel=0.02)
  # Time: inter-node bytes at 50 GB/s dominate intra-node bytes at 450 GB/s.
  assert plan.exchange_seconds >= plan.inter_bytes_per_device / topology.inter_bandwidth


@pytest.mark.parametrize('mesh_spec', ['fsdp:2,expert:4', 'data:2,fsdp:2,expert:2', 'expert:8'])
def test_auto_trades_step_for_balance(mesh_spec):
  """'auto_fastest' predicts the fastest step of the layouts 'auto' chooses among, including
  'all_to_all''s; 'auto' keeps NS within exchange.BALANCE where 'auto_fastest' does not, or
  else is the same. The choice is pure Python: it needs no devices."""
  shapes, axes, dims = moe_tree(**SIZES)
  topology = plan_lib.Topology(devices_per_node=4, peak_flops=1e12)
  plans = {e: plan_lib.plan(shapes, axes, mesh_lib.parse_mesh_spec(mesh_spec),
                            weight_dimension_numbers=dims, exchange=e, topology=topology)
           for e in ('all_to_all', 'auto', 'auto_fastest')}
  fastest, auto = plans['auto_fastest'], plans['auto']
  assert fastest.step_seconds <= min(auto.step_seconds, plans['all_to_all'].step_seconds)
  if fastest.flops_balance > exchange_lib.BALANCE:  # fsdp:2,expert:4: 1.31x; auto: 1.08x.
    assert auto.flops_balance <= exchange_lib.BALANCE < fastest.flops_balance
    assert auto.step_seconds > fastest.step_seconds
  else:  # expert:8: the fastest is balanced already.
    assert auto == fastest


def test_peers_follow_row_major_device_order():
  mesh_shape = {'data': 2, 'fsdp': 4, 'expert': 8, 'tensor': 1}
  assert plan_lib.peers(mesh_shape, ('expert',), 8) == (7, 0)
  assert plan_lib.peers(mesh_shape, ('fsdp',), 8) == (0, 3)
  assert plan_lib.peers(mesh_shape, ('fsdp', 'expert'), 16) == (15, 16)
  assert plan_lib.peers(mesh_shape, (), 8) == (0, 0)


def test_replica_groups_iota_form():
  line = 'x = f32[8] all-to-all(y), replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}'
  assert hlo_stats.replica_groups(line) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert hlo_stats.replica_groups('replica_groups={{0,1},{2,3}}, x') == [[0, 1], [2, 3]]
