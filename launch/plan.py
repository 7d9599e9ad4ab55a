"""Plans a model at full scale without allocating it: parameters, bytes and the Muon step per device.

python -m launch.plan --config=experiments/kimi_k2.py --mesh=data:8,fsdp:64,expert:32 \
    [--peak_tflops=989] [--devices_per_node=8] [--intra_gbps=450] [--inter_gbps=50] [--json]
    [--rl_context=65536 --rl_rows=1024]   # also an RL step's memory per device (research/rl/plan.py)

The optimizer plan (research/optim/plan.py) counts Newton-Schulz FLOPs, all-to-all bytes (inside
a node and across nodes) and optimizer-state bytes per device for the layouts the runtime would
use, and predicts the step time from the given hardware numbers. Defaults: H100/H200 nodes of 8
GPUs, NVLink ~450 GB/s per direction, one 400 Gb/s (50 GB/s) NIC per GPU; the mesh's innermost
axes fill a node first (jax.make_mesh's device order).
"""

import dataclasses
import json
import math

import jax
from absl import app, flags
from ml_collections import config_flags

from research import configs
from research.model import config as model_config
from research.model import stats, transformer
from research.optim import plan as optim_plan
from research.parallel import mesh as mesh_lib
from research.rl import loop as rl_loop
from research.rl import plan as rl_plan
from research.train import optimizer as optim

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_MESH = flags.DEFINE_string('mesh', None, 'Mesh as axis:size pairs; default: the config\'s mesh.')
_PEAK = flags.DEFINE_float('peak_tflops', 989.0, 'Peak dense bf16 TFLOP/s per device (H100/H200).')
_NODE = flags.DEFINE_integer('devices_per_node', 8, 'Devices per node (NVLink domain).')
_INTRA = flags.DEFINE_float('intra_gbps', 450.0, 'GB/s one device sends inside its node.')
_INTER = flags.DEFINE_float('inter_gbps', 50.0, 'GB/s one device sends to other nodes.')
_INTRA_US = flags.DEFINE_float('intra_latency_us', 10.0, 'Latency of an intra-node collective.')
_INTER_US = flags.DEFINE_float('inter_latency_us', 30.0, 'Latency of a cross-node collective.')
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.')
_RL_CONTEXT = flags.DEFINE_integer('rl_context', 0, 'Also plan an RL step at this many tokens per trajectory.')
_RL_ROWS = flags.DEFINE_integer('rl_rows', 1024, 'Trajectories per RL step (sampled and updated at once).')
flags.mark_flags_as_required(['config'])


def plan(config, mesh_spec: str | None = None, peak_tflops: float = 989.0,
         topology: optim_plan.Topology = optim_plan.Topology()) -> dict:
  cfg = model_config.from_dict(config.model)
  muon = configs.from_dict(optim.OptimizerConfig, config.optimizer, 'optimizer').muon
  shape = mesh_lib.parse_mesh_spec(mesh_spec or config.mesh)
  axes = transformer.param_axes(cfg)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  dims = jax.tree.map(lambda a: optim.dimension_numbers(a, muon.per_head), axes,
                      is_leaf=lambda x: isinstance(x, tuple))
  # 'auto' is bfloat16 on the accelerators a plan is for.
  ns_dtype = 'bfloat16' if muon.ns_dtype == 'auto' else muon.ns_dtype
  opt = optim_plan.plan(shapes, axes, shape, weight_dimension_numbers=dims, ns_coeffs=muon.ns_coeffs,
                        ns_dtype=ns_dtype, spread_axes=muon.spread_axes, exchange=muon.exchange,
                        chunk_bytes=muon.chunk_bytes, peak_flops=peak_tflops * 1e12,
                        topology=topology)
  opt_row = {k: v for k, v in dataclasses.asdict(opt).items() if k != 'groups'}
  return {**stats.param_counts(cfg), 'mesh': shape, 'devices': math.prod(shape.values()),
          'param_bytes_per_device': stats.bytes_per_device(cfg, shape),
          'optimizer': {**opt_row, 'flops_balance': opt.flops_balance,
                        'exchange_ratio': opt.exchange_ratio}}


def rl_step(config, out: dict, context: int, rows: int) -> dict:
  """An RL step's memory per device on the plan's mesh (bytes; research/rl/plan.py)."""
  m = rl_plan.rl_memory(model_config.from_dict(config.model), out['mesh'], rows=rows, context=context,
                        logit_chunk=rl_loop.LossConfig().logit_chunk,
                        opt_state_bytes=out['optimizer']['state_bytes_per_device'])
  return {**dataclasses.asdict(m), 'total': m.total, 'context': context, 'rows': rows}


def main(argv):
  del argv
  topology = optim_plan.Topology(_NODE.value, _INTRA.value * 1e9, _INTER.value * 1e9,
                                 _INTRA_US.value * 1e-6, _INTER_US.value * 1e-6)
  out = plan(_CONFIG.value, _MESH.value, _PEAK.value, topology)
  if _RL_CONTEXT.value:
    out['rl'] = rl_step(_CONFIG.value, out, _RL_CONTEXT.value, _RL_ROWS.value)
  if _JSON.value:
    print(json.dumps(out))
    return
  o = out['optimizer']
  print(f'mesh                     {out["mesh"]} ({out["devices"]} devices)')
  print(f'total parameters         {out["total_params"]:.4e}')
  print(f'active parameters        {out["active_params"]:.4e}')
  print(f'param bytes / device     {out["param_bytes_per_device"] / 2**30:.2f} GiB')
  print(f'Muon NS FLOPs / device   {o["ns_flops_per_device"]:.3e} ({o["flops_balance"]:.2f}x the balanced share)')
  print(f'Muon exchange / device   {o["exchange_bytes_per_device"] / 2**20:.1f} MiB '
        f'({o["exchange_ratio"]:.2f}x the local shard; {o["intra_bytes_per_device"] / 2**20:.1f} '
        f'MiB inside the node, {o["inter_bytes_per_device"] / 2**20:.1f} MiB across nodes)')
  print(f'optimizer state / device {o["state_bytes_per_device"] / 2**30:.2f} GiB')
  print(f'predicted Muon step      {o["step_seconds"]:.3f} s (NS {o["compute_seconds"]:.3f} s, '
        f'exchange {o["exchange_seconds"]:.3f} s, {o["num_chunks"]} chunks; '
        f'{_PEAK.value:g} TFLOP/s, {_INTRA.value:g} / {_INTER.value:g} GB/s in / across '
        f'nodes of {_NODE.value})')
  if 'rl' in out:
    r = out['rl']
    print(f'RL step / device         {r["rows"]} trajectories x {r["context"]} tokens: params '
          f'{r["params"] / 2**30:.2f} + optimizer {r["opt_state"] / 2**30:.2f} + KV cache '
          f'{r["kv_cache"] / 2**30:.2f} + update activations {r["activations"] / 2**30:.2f} '
          f'(logits {r["logits"] / 2**30:.2f}) = {r["total"] / 2**30:.2f} GiB')


if __name__ == '__main__':
  app.run(main)
