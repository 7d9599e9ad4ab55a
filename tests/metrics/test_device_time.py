"""Device time by model component: op_name classification, trace parsing, and a real CPU trace."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.profiler import ProfileData

from research.metrics import device_time
from research.model import moe
from research.model.config import ModelConfig
from research.model.layers import materialize
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train import step as step_lib


@pytest.mark.parametrize('op_name,expected', [
    ('jit(f)/jvp()/while/body/closed_call/attention/btd,dhq->bthq/dot_general', ('attention', 'forward')),
    ('jit(f)/transpose(jvp())/while/body/closed_call/attention/attention/checkpoint/norm/mul',
     ('norm', 'backward')),
    ('jit(f)/transpose(jvp())/while/body/closed_call/checkpoint/rematted_computation/experts/jit(silu)',
     ('experts', 'recompute')),
    ('jit(f)/transpose(jvp(lm_head))/btd,dv->btv/transpose', ('lm_head', 'backward')),
    ('jit(f)/optimizer/mul', ('optimizer', 'outside')),
    ('jit(f)/transpose(jvp())/while/body/jit(dynamic_update_index_in_dim)/dynamic_update_slice',
     ('layer_stack', 'backward')),
    ('jit(f)/jvp()/broadcast_in_dim', ('other', 'forward')),
    ('', ('unnamed', 'outside')),
])
def test_classify(op_name, expected):
  assert device_time.classify(op_name) == expected


def test_self_times_subtract_nested_events():
  # A 10 ns loop holding two 3 ns ops, one of them holding a 1 ns op; a separate 2 ns op after.
  events = [(0, 10, 'loop'), (1, 3, 'a'), (2, 1, 'a.inner'), (5, 3, 'b'), (20, 2, 'c')]
  got = {name: s * 1e9 for _, s, name in device_time._self_times(events)}
  assert got == pytest.approx({'loop': 4, 'a': 2, 'a.inner': 1, 'b': 3, 'c': 2})


HLO = '''HloModule jit_traced, entry_computation_layout={()->()}

%fused_computation.7 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  %a = f32[8]{0} multiply(%param_0, %param_0), metadata={op_name="jit(traced)/jvp()/while/body/closed_call/experts/mul"}
  %b = f32[8]{0} add(%a, %a), metadata={op_name="jit(traced)/jvp()/while/body/closed_call/experts/add"}
  ROOT %c = f32[8]{0} negate(%b), metadata={op_name="jit(traced)/jvp()/while/body/jit(dynamic_index_in_dim)"}
}

ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %fusion.1 = f32[8]{0} fusion(%p), kind=kLoop, calls=%fused_computation.7
  %custom-call.3 = f32[8]{0} custom-call(%fusion.1), custom_call_target="__cublas$gemm", metadata={op_name="jit(traced)/transpose(jvp())/while/body/closed_call/attention/dot_general"}
  ROOT %fusion.2 = f32[8]{0} fusion(%custom-call.3), kind=kLoop, calls=%fused_computation.7, metadata={op_name="jit(traced)/optimizer/add"}
}
'''


def test_op_names_give_unnamed_fusions_their_commonest_component():
  names = device_time.op_names(HLO)
  assert device_time.classify(names['fusion.1']) == ('experts', 'forward')  # 2 of its 3 ops.
  assert names['custom-call.3'].endswith('attention/dot_general')
  assert names['fusion.2'] == 'jit(traced)/optimizer/add'  # Its own metadata first.


def _kernel(start_ps: int, dur_ps: int, annotation: str) -> str:
  return (f'events {{ metadata_id: 1 offset_ps: {start_ps} duration_ps: {dur_ps} '
          f'stats {{ metadata_id: 1 str_value: "{annotation}" }} }}')


def test_gpu_trace_attributed_by_the_kernels_annotations():
  # A GPU trace as XLA's profiler writes it: kernels on stream lines of a /device: plane, each with
  # the annotation stack it was launched under. Another program's kernel is left out; a kernel
  # with no HLO op is reported as unnamed; host events are ignored when a device plane has kernels,
  # and so is a line derived from the kernels ('XLA Ops': the same time again).
  mod = 'XlaModule:#hlo_module=jit_traced,program_id=1#'
  stream1 = [_kernel(0, 4_000_000, f'{mod}::Thunk:#hlo_op=while.1#::Thunk:#name=experts/mul,hlo_op=fusion.1#'),
             _kernel(5_000_000, 6_000_000, f'{mod}::Thunk:#name=attention/dot,hlo_op=custom-call.3#'),
             _kernel(20_000_000, 9_000_000, 'XlaModule:#hlo_module=jit_other#::Thunk:#hlo_op=fusion.1#')]
  stream2 = [_kernel(6_000_000, 2_000_000, f'{mod}::Thunk:#hlo_op=fusion.2#'),
             _kernel(30_000_000, 1_000_000, 'memcpy')]
  line = lambda i, name, evs: f'lines {{ id: {i} name: "{name}" timestamp_ns: 0 {" ".join(evs)} }}'
  text = f'''
  planes {{ id: 1 name: "/device:GPU:0"
    {line(1, "Stream #13(Compute)", stream1)} {line(2, "Stream #14(Compute)", stream2)}
    {line(3, "XLA Ops", stream1)}
    event_metadata {{ key: 1 value {{ id: 1 name: "kernel" }} }}
    stat_metadata {{ key: 1 value {{ id: 1 name: "annotation" }} }} }}
  planes {{ id: 2 name: "/host:CPU"
    {line(1, "python", [_kernel(0, 50_000_000, "Thunk:#hlo_op=fusion.1#")])}
    event_metadata {{ key: 1 value {{ id: 1 name: "host" }} }}
    stat_metadata {{ key: 1 value {{ id: 1 name: "annotation" }} }} }}'''
  trace = device_time.op_events(ProfileData.from_text_proto(text))
  assert trace.source == 'device'
  assert trace.lines == {'/device:GPU:0 | Stream #13(Compute)': 3, '/device:GPU:0 | Stream #14(Compute)': 2}
  assert [u['annotation'] for u in trace.unnamed] == ['memcpy']
  prof = device_time.attribute(trace, device_time.op_names(HLO), 'jit_traced', steps=2, wall_seconds=40e-6)
  us = lambda s: round(s * 1e6 / 1e-6) * 1e-6  # Seconds per step in microseconds.
  assert {c: {p: us(s) for p, s in v.items()} for c, v in prof.components.items()} == {
      'experts': {'forward': 2.0}, 'attention': {'backward': 3.0}, 'optimizer': {'outside': 1.0}}
  assert us(prof.op_seconds) == 6.0
  assert prof.launches == {'experts': 0.5, 'attention': 0.5, 'optimizer': 0.5}  # One each in 2 steps.
  assert us(prof.busy_seconds) == 5.0  # The union of [0, 4], [5, 11] and [6, 8] us (streams overlap), halved.
  assert prof.wall_seconds == pytest.approx(20e-6)
  assert [o['hlo_op'] for o in prof.top_ops] == ['custom-call.3', 'fusion.1', 'fusion.2']


def test_cpu_train_step_profile_covers_the_model():
  # A real trace of the jitted train step of a small MoE model with a dense first layer: every
  # scope the model sets is found, forward and backward, and most time is attributed.
  cfg = ModelConfig(vocab_size=256, d_model=64, num_layers=3, first_k_dense=1, d_ff=96, num_heads=4,
                    num_kv_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, d_expert=32)
  mesh = mesh_lib.make_mesh('data:1', devices=jax.devices()[:1])
  trainer = step_lib.Trainer(cfg, optim.make_optimizer(optim.OptimizerConfig(name='adamw'), 10, cfg, mesh), mesh)
  tokens = np.random.default_rng(0).integers(0, 256, (4, 65), dtype=np.int32)
  batch = trainer.put_batch(dict(tokens=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=np.ones((4, 64), np.int32),
                                 loss_mask=np.ones((4, 64), np.float32)))
  state = [trainer.init(jax.random.key(0))]
  fn = functools.partial(step_lib.train_step, cfg=cfg, tx=trainer.tx)
  with jax.set_mesh(mesh):
    compiled = jax.jit(trainer.with_rules(fn), donate_argnums=0).lower(state[0], batch, None).compile()

  def step():
    state[0], metrics = compiled(state[0], batch, None)
    jax.block_until_ready(metrics)
  step()
  prof = device_time.profile(step, compiled.as_text(), steps=2)
  assert prof.source == 'host' and prof.steps == 2
  used = set(device_time.COMPONENTS) - {'exchange'}  # Expert parallelism: the test below.
  assert used <= set(prof.components), used - set(prof.components)
  for comp in ('attention', 'experts', 'norm', 'lm_head'):
    assert prof.components[comp].get('forward', 0) > 0 and prof.components[comp].get('backward', 0) > 0, comp
  assert set(prof.components['optimizer']) == {'outside'}
  assert prof.components['experts']['recompute'] > 0  # dispatched_ffn's checkpoint.
  named = sum(sum(v.values()) for c, v in prof.components.items() if c != 'other')
  assert named > 0.6 * prof.op_seconds
  assert 0 < prof.busy_seconds <= prof.op_seconds
  assert '| experts |' in prof.table()


def test_expert_parallel_exchange_is_named():
  cfg = ModelConfig(d_model=32, num_experts=8, num_experts_per_tok=2, d_expert=16, ep_exchange='all_to_all')
  p = materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.float32)
  x = jnp.ones((8, 4, 32))
  with jax.set_mesh(mesh_lib.make_mesh('expert:8')):
    lowered = jax.jit(lambda p, x: moe.moe(p, x, jnp.ones(x.shape[:2], bool), cfg)[0]).lower(p, x)
  names = device_time.op_names(lowered.compile().as_text())
  assert {'exchange', 'dispatch', 'experts', 'combine'} <= {device_time.classify(n)[0] for n in names.values()}
