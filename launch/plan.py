"""Plans a model at full scale without allocating it: parameters, bytes and the Muon step per device.

python -m launch.plan --config=experiments/kimi_k2.py --mesh=data:8,fsdp:64,expert:32 \
    [--peak_tflops=989] [--devices_per_node=8] [--intra_gbps=450] [--inter_gbps=50] [--json]
    [--rl_context=65536 --rl_rows=1024]   # also an RL step's memory per device (research/rl/plan.py)
python -m launch.plan --config=experiments/kimi_k2.py --devices=1024 [--hbm_gib=80] [--json]

The optimizer plan (research/optim/plan.py) counts Newton-Schulz FLOPs, all-to-all bytes (inside
a node and across nodes) and optimizer-state bytes per device for the layouts the runtime would
use, and predicts the step time from the given hardware numbers. Defaults: H100/H200 nodes of 8
GPUs, NVLink ~450 GB/s per direction, one 400 Gb/s (50 GB/s) NIC per GPU; the mesh's innermost
axes fill a node first (jax.make_mesh's device order).

With --devices, every mesh of that many devices is planned with each Muon layout (exchange
'all_to_all', 'balanced', 'auto' and 'auto_fastest': per-group spread and split chosen by the same
cost model, within 1.15x the balanced NS share where reachable or not). Of those whose params,
gradients and optimizer state fit --static_fraction of --hbm_gib, the fastest with NS within
1.15x the balanced share (else the fastest) is reported, with the reasons: its step's terms,
balance, bytes per link class, each exchange group's layout, the runners-up and the fastest
layout over the balance target.
"""

import dataclasses
import json
import math
from typing import Any, NamedTuple

import jax
from absl import app, flags
from ml_collections import config_flags

from research import configs
from research.model import config as model_config
from research.model import stats
from research.model import transformer
from research.optim import exchange as exchange_lib
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
_DEVICES = flags.DEFINE_integer('devices', None, 'Search every mesh of this many devices x the '
                                'Muon layouts in LAYOUTS instead of planning --mesh; report the '
                                'fastest that fits memory with NS within 1.15x the balanced share.')
_HBM = flags.DEFINE_float('hbm_gib', 80.0, 'Memory per device, GiB (H100: 80, H200: 141).')
_STATIC = flags.DEFINE_float('static_fraction', 0.5, 'Share of --hbm_gib params, gradients and '
                             'optimizer state may take; the rest is left to activations.')
_RL_CONTEXT = flags.DEFINE_integer('rl_context', 0, 'Also plan an RL step at this many tokens per trajectory.')
_RL_ROWS = flags.DEFINE_integer('rl_rows', 1024, 'Trajectories per RL step (sampled and updated at once).')
flags.mark_flags_as_required(['config'])


class Model(NamedTuple):
  """What every plan of one config shares: built once, planned on many meshes."""
  cfg: model_config.ModelConfig
  muon: optim.MuonConfig
  shapes: Any
  axes: Any
  dims: Any


def model(config) -> Model:
  cfg = model_config.from_dict(config.model)
  muon = configs.from_dict(optim.OptimizerConfig, config.optimizer, 'optimizer').muon
  axes = transformer.param_axes(cfg)
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  dims = jax.tree.map(lambda a: optim.dimension_numbers(a, muon.per_head), axes,
                      is_leaf=lambda x: isinstance(x, tuple))
  return Model(cfg, muon, shapes, axes, dims)


def plan_mesh(m: Model, shape: dict[str, int], peak_tflops: float = 989.0,
              topology: optim_plan.Topology = optim_plan.Topology()) -> dict:
  """The Muon step of `m` (its optimizer.muon settings) on one mesh, with memory per device."""
  # 'auto' is bfloat16 on the accelerators a plan is for.
  ns_dtype = 'bfloat16' if m.muon.ns_dtype == 'auto' else m.muon.ns_dtype
  opt = optim_plan.plan(m.shapes, m.axes, shape, weight_dimension_numbers=m.dims,
                        ns_coeffs=m.muon.ns_coeffs, ns_dtype=ns_dtype,
                        spread_axes=m.muon.spread_axes, exchange=m.muon.exchange,
                        chunk_bytes=m.muon.chunk_bytes, peak_flops=peak_tflops * 1e12,
                        topology=topology)
  opt_row = {k: v for k, v in dataclasses.asdict(opt).items() if k != 'groups'}
  param_bytes = stats.bytes_per_device(m.cfg, shape)
  return {'mesh': shape, 'devices': math.prod(shape.values()),
          'param_bytes_per_device': param_bytes,
          # Params, their gradients (same dtype) and the optimizer state; activations come on top.
          'static_bytes_per_device': 2 * param_bytes + opt.state_bytes_per_device,
          'optimizer': {**opt_row, 'flops_balance': opt.flops_balance,
                        'exchange_ratio': opt.exchange_ratio},
          'muon_groups': [dataclasses.asdict(g) for g in opt.groups]}


def plan(config, mesh_spec: str | None = None, peak_tflops: float = 989.0,
         topology: optim_plan.Topology = optim_plan.Topology()) -> dict:
  m = model(config)
  shape = mesh_lib.parse_mesh_spec(mesh_spec or config.mesh)
  return {**stats.param_counts(m.cfg), **plan_mesh(m, shape, peak_tflops, topology)}


def meshes(devices: int) -> list[dict[str, int]]:
  """Every {axis: size} over mesh_lib.AXES whose sizes multiply to `devices`."""
  out = [{}]
  for i, a in enumerate(mesh_lib.AXES):
    last = i == len(mesh_lib.AXES) - 1
    out = [{**m, a: n} for m in out for n in range(1, devices + 1)
           if (devices // math.prod(m.values()) == n if last
               else devices % (math.prod(m.values()) * n) == 0)]
  return out


# The Muon layouts compared on every mesh (optimizer.muon overrides).
LAYOUTS = tuple({'exchange': e} for e in ('all_to_all', 'balanced', 'auto', 'auto_fastest'))


def _reasons(best: dict, fit: list[dict], searched: int, budget: float) -> list[str]:
  o = best['optimizer']
  out = [f'{len(fit)} of {searched} (mesh, layout) pairs keep params, gradients and optimizer '
         f'state within {budget / 2**30:.1f} GiB per device',
         f'{sum(r["optimizer"]["flops_balance"] <= exchange_lib.BALANCE for r in fit)} of them '
         f'keep NS within {exchange_lib.BALANCE}x the balanced share',
         f'fastest: {best["mesh"]} with exchange={best["layout"]["exchange"]!r}: step '
         f'{o["step_seconds"]:.4f} s = max(NS {o["compute_seconds"]:.4f}, exchange '
         f'{o["exchange_seconds"]:.4f}) + min / {o["num_chunks"]} chunks',
         f'NS {o["flops_balance"]:.3f}x the balanced share; exchange '
         f'{o["intra_bytes_per_device"] / 1e9:.2f} GB inside the node, '
         f'{o["inter_bytes_per_device"] / 1e9:.2f} GB across nodes; '
         f'{best["static_bytes_per_device"] / 2**30:.1f} GiB static per device']
  for g in best['muon_groups']:
    out.append(f'{g["matrices"]} x {g["shape"][0]}x{g["shape"][1]}: {g["per_device"]} per device, '
               f'exchange over {g["exchange_size"]}, spread over {g["spread_size"]} '
               f'({g["restore"]}), split {g["split"]}')
  fastest = min(fit, key=lambda r: r['optimizer']['step_seconds'])
  if fastest is not best:
    fo = fastest['optimizer']
    out.append(f'faster but over the balance target: {fastest["mesh"]} exchange='
               f'{fastest["layout"]["exchange"]!r}: {fo["step_seconds"]:.4f} s with NS at '
               f'{fo["flops_balance"]:.3f}x')
  for other in fit[1:3]:
    oo = other['optimizer']
    out.append(f'runner-up {other["mesh"]} exchange={other["layout"]["exchange"]!r}: '
               f'{oo["step_seconds"]:.4f} s (NS {oo["compute_seconds"]:.4f} s at '
               f'{oo["flops_balance"]:.3f}x, exchange {oo["exchange_seconds"]:.4f} s)')
  return out


def search(config, devices: int, peak_tflops: float = 989.0,
           topology: optim_plan.Topology = optim_plan.Topology(),
           budget_bytes: float = 40 * 2**30) -> dict:
  """Every mesh of `devices` x every layout in LAYOUTS: of those whose static memory fits, the
  fastest with NS within exchange.BALANCE of the balanced share (else the fastest)."""
  base = model(config)
  rows = []
  for shape in meshes(devices):
    for layout in LAYOUTS:
      m = base._replace(muon=dataclasses.replace(base.muon, **layout))
      rows.append({**plan_mesh(m, shape, peak_tflops, topology), 'layout': layout})
  # Fastest first among those within the NS balance target, then the rest.
  fit = sorted((r for r in rows if r['static_bytes_per_device'] <= budget_bytes),
               key=lambda r: (r['optimizer']['flops_balance'] > exchange_lib.BALANCE,
                              r['optimizer']['step_seconds']))
  if not fit:
    raise ValueError(f'--devices={devices}: no mesh keeps params, gradients and optimizer state '
                     f'within {budget_bytes / 2**30:.1f} GiB per device')
  return {**stats.param_counts(base.cfg), **fit[0], 'searched': len(rows), 'fit': len(fit),
          'reasons': _reasons(fit[0], fit, len(rows), budget_bytes),
          'candidates': [{'mesh': r['mesh'], 'layout': r['layout'],
                          **{k: r['optimizer'][k] for k in ('step_seconds', 'compute_seconds',
                                                            'exchange_seconds', 'flops_balance')},
                          'static_bytes_per_device': r['static_bytes_per_device']}
                         for r in fit[:10]]}


def rl_step(config, out: dict, context: int, rows: int) -> dict:
  """An RL step's memory per device on the plan's mesh (bytes; research/rl/plan.py)."""
  m = rl_plan.rl_memory(model_config.from_dict(config.model), out['mesh'], rows=rows, context=context,
                        logit_chunk=rl_loop.LossConfig().logit_chunk,
                        opt_state_bytes=out['optimizer']['state_bytes_per_device'])
  return {**dataclasses.asdict(m), 'total': m.total, 'context': context, 'rows': rows}


def main(argv):
  del argv
  topology = optim_plan.Topology(_NODE.value, _INTRA.value * 1e9, _INTER.value * 1e9,
                                 _INTRA_US.value * 1e-6, _INTER_US.value * 1e-6,
                                 _PEAK.value * 1e12)
  if _DEVICES.value:
    out = search(_CONFIG.value, _DEVICES.value, _PEAK.value, topology,
                 _HBM.value * _STATIC.value * 2**30)
  else:
    out = plan(_CONFIG.value, _MESH.value, _PEAK.value, topology)
  if _RL_CONTEXT.value:  # On the planned mesh, or the one the search chose.
    out['rl'] = rl_step(_CONFIG.value, out, _RL_CONTEXT.value, _RL_ROWS.value)
  if _JSON.value:
    print(json.dumps(out))
    return
  for line in out.get('reasons', ()):
    print(line)
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
