"""Sharded programs compiled for 8 GPUs on a machine without one: what XLA:GPU makes of them.

  make gpu-aot    # makes .venv-gpuaot from requirements-gpuaot.lock, then runs:
  .venv-gpuaot/bin/python -m experiments.benchmarks.gpu_aot --json=/tmp/gpu_aot.json

Deviceless ahead-of-time compilation: the CUDA PJRT plugin builds a topology of 8 devices from a
GPU target config (`gpu_specs/<gpu>.txtpb`, XLA's spec of that GPU) without a GPU, driver or
libcuda, and XLA:GPU's full pipeline, latency-hiding scheduler included, compiles for it; nothing
runs. Compiling kernels needs libdevice (nvidia-cuda-nvcc-cu12, or a CUDA toolkit in
/usr/local/cuda, whose ptxas is then used), none of the other nvidia-* wheels. Two parts:
  muon    the update of the tiny-MoE tree on `fsdp:2,expert:4` (ours with bf16 NS, as on a GPU,
          and optax.contrib.muon under the same shardings), read with research/optim/hlo_stats:
          async collective start/done pairs, how many have a matmul between start and done,
          collective bytes per device;
  moe_ep  forward + backward of an expert-parallel MoE layer with each `ep_exchange` on
          `expert:8` and `fsdp:2,expert:2,tensor:2`: does XLA:GPU take jax.lax.ragged_all_to_all
          as we call it, and which collectives come out.
  kernels forward + backward of a bf16 MoE layer (`moe_impl='tokamax'`, expert-parallel on
          `expert:8`, and on one GPU at gpu_kernels' `train` shape: 8,192 tokens, d_model 2048, 64
          experts of 768, top-8) and of GQA and MLA attention (`attention_impl='tokamax'`) with
          tokamax's Triton kernels (tokamax's cross-compile option: no GPU to ask): how many Triton
          kernel calls the compiled program holds (`kernel_calls`; 0 would mean a silent XLA
          fallback). Its Mosaic GPU kernels ask the device for its compute capability, so they
          cannot be built without one. The one-GPU layer again with `moe_impl='padded'` (tokamax
          as its fallback): its expert GEMMs are XLA's own, batched over experts (`batched_gemms`:
          dots with one batch dimension).
  train   (only with --train_step=base:ROWS or wide:ROWS[xMICRO]; a minute on 2 cores) gpu_kernels' `train`
          step of that shape with AdamW on one GPU, the state donated: its memory_analysis() says
          whether ROWS x 4,096 tokens fit a device before a GPU run tries (`peak_bytes`).
Every program's `scatters` lists the scatter ops XLA kept (dtype[shape]): one over D-wide rows of
activations is a pass of atomics on a GPU. `temp_bytes` is XLA's memory_analysis() scratch.
The optimized HLO of each program goes next to the JSON (`<json>.<name>.hlo.txt`). About 1 min on 2
CPU cores. The CUDA wheels stay out of requirements.lock: only this venv needs them (a GPU
machine's jax[cuda12] has them).
"""

import os

# No GPU is needed or wanted: the plugin still registers and makes topologies, but skips its CUDA
# version checks and the attempt to open a device.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# XLA:GPU sorts long arrays with CUB, whose scratch size is asked of a device: XLA's own sort instead.
os.environ['XLA_FLAGS'] = os.environ.get('XLA_FLAGS', '') + ' --xla_gpu_enable_cub_radix_sort=false'

import argparse  # pylint: disable=g-import-not-at-top
import dataclasses
import functools
import importlib.metadata
import json
import pathlib
import re

import jax
import jax.numpy as jnp
from jax.experimental import topologies

from experiments.benchmarks import gpu_kernels
from experiments.benchmarks import muon as muon_bench
from experiments.benchmarks import trees
from research.model import attention
from research.model import kernels
from research.model import moe
from research.model import transformer
from research.model.config import ModelConfig
from research.model.layers import materialize
from research.optim import hlo_stats
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib
from research.train import optimizer as optim
from research.train import step as step_lib

SPECS = pathlib.Path(__file__).parent / 'gpu_specs'
GPUS = {'h100': SPECS / 'h100_sxm.txtpb', 'h200': SPECS / 'h200_sxm.txtpb'}
# One MoE layer: 16 x 256 tokens, d_model 256, 16 experts of 128 hidden units, top-2.
MOE_CFG = ModelConfig(d_model=256, num_experts=16, num_experts_per_tok=2, d_expert=128, moe_impl='blocked')


def gpu_topology(target_config: str, topology: str = '1x1x8'):
  """Compile-only CUDA devices: `topology` is partitions x hosts per partition x GPUs per host."""
  return topologies.get_topology_desc(platform='cuda', topology_name='aot',
                                      target_config=target_config, topology=topology).devices


def muon_programs(devices, mesh_spec, chunk_bytes):
  """name -> compiled optimizer update (params and state sharded alike), from shapes only."""
  mesh = mesh_lib.make_mesh(mesh_spec, devices)
  shapes, axes, dims = trees.moe_tree()
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  # ns_dtype follows the target (muon's default looks at the default backend: CPU here).
  for name, variant in (('muon_ours', 'ours_bf16'), ('muon_optax', 'optax')):
    opt = muon_bench.build(variant, mesh, shardings, dims, chunk_bytes=chunk_bytes)
    state = jax.eval_shape(opt.init, shapes)
    update, _ = muon_bench.sharded_update(opt, mesh, shapes, state, shardings)
    yield name, update.lower(shapes, state, shapes).compile()


def moe_programs(devices):
  """name -> compiled value and gradient of one expert-parallel MoE layer, per mesh and exchange."""
  x = jax.ShapeDtypeStruct((16, 256, MOE_CFG.d_model), jnp.float32)
  valid = jax.ShapeDtypeStruct((16, 256), jnp.bool_)
  for mesh_spec in ('expert:8', 'fsdp:2,expert:2,tensor:2'):
    for exchange in ('ragged', 'all_to_all'):
      cfg = dataclasses.replace(MOE_CFG, ep_exchange=exchange)
      p = jax.eval_shape(lambda c=cfg: materialize(moe.moe_specs(c), jax.random.key(0), jnp.float32))
      loss = lambda p, x, v, c=cfg: jnp.sum(moe.moe(p, x, v, c)[0])
      with jax.set_mesh(mesh_lib.make_mesh(mesh_spec, devices)):
        yield f'moe_ep_{exchange}_{mesh_spec}', jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(
            p, x, valid).compile()


TRITON_CALL = 'custom_call_target="__gpu$xla.gpu.triton"'
BATCHED_DOT = re.compile(r' dot\([^)]*\), lhs_batch_dims=\{0\}, ')  # One batch dimension: E x slots x K.
SCATTER = re.compile(r'= (\w+\[[\d,]*\])\{[^}]*\} scatter\(')


def kernel_programs(devices):
  """name -> compiled value and gradient of a program whose expert or attention path is tokamax's
  Triton (the value too: a train step needs the forward's output, and grad alone lets XLA drop it)."""
  import tokamax  # pylint: disable=g-import-not-at-top
  kernels.KERNEL_ORDER = ('triton',)
  cfg = dataclasses.replace(MOE_CFG, moe_impl='tokamax', dtype='bfloat16', ep_exchange='all_to_all')
  p = jax.eval_shape(lambda: materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.bfloat16))
  x = jax.ShapeDtypeStruct((16, 256, cfg.d_model), jnp.bfloat16)
  valid = jax.ShapeDtypeStruct((16, 256), jnp.bool_)
  loss = lambda p, x, v: jnp.sum(moe.moe(p, x, v, cfg)[0].astype(jnp.float32))
  seg = jnp.ones((2, 512), jnp.int32)
  mask = kernels.MaskInfo(seg, seg, jnp.arange(512)[None], jnp.arange(512))
  one = jax.sharding.SingleDeviceSharding(devices[0])
  big = dataclasses.replace(cfg, d_model=2048, num_experts=64, num_experts_per_tok=8, d_expert=768)
  p_big = jax.eval_shape(lambda: materialize(moe.moe_specs(big), jax.random.key(0), jnp.bfloat16))
  x_big = jax.ShapeDtypeStruct((2, 4096, big.d_model), jnp.bfloat16)
  loss_big = lambda p, x, v, c=big: jnp.sum(moe.moe(p, x, v, c)[0].astype(jnp.float32))
  padded = dataclasses.replace(big, moe_impl='padded', moe_fallback_impl='tokamax')
  with tokamax.config.cross_compile(True):
    with jax.set_mesh(mesh_lib.make_mesh('expert:8', devices)):
      yield 'kernels_moe_ep_expert:8', jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(
          p, x, valid).compile()
    for suffix, c in (('', big), ('_padded', padded)):
      with jax.set_mesh(mesh_lib.make_mesh('expert:1', devices[:1])):
        yield f'kernels_moe_1gpu_train_shape{suffix}', jax.jit(
            jax.value_and_grad(functools.partial(loss_big, c=c), argnums=(0, 1)), in_shardings=(one,) * 3,
            out_shardings=(one, (jax.tree.map(lambda _: one, p_big), one))).lower(
                p_big, x_big, jax.ShapeDtypeStruct((2, 4096), jnp.bool_)).compile()
    for name, (h, kh, dq, dv) in {'gqa': (8, 2, 128, 128), 'mla': (8, 8, 192, 128)}.items():
      shapes = [jax.ShapeDtypeStruct((2, 512, n, d), jnp.bfloat16) for n, d in ((h, dq), (kh, dq), (kh, dv))]
      attend = lambda q, k, v, dq=dq: jnp.sum(
          attention.attend(q, k, v, mask, dq ** -0.5, 'tokamax')[0].astype(jnp.float32))
      yield f'kernels_attention_{name}', jax.jit(jax.value_and_grad(attend, (0, 1, 2)), in_shardings=(one,) * 3,
                                                 out_shardings=(one, (one,) * 3)).lower(*shapes).compile()
  kernels.KERNEL_ORDER = None


def train_shape(text: str) -> tuple[str, int, int]:
  """--train_step's value: 'base:ROWS' or 'wide:ROWS', optionally 'xMICROBATCHES' after ROWS ->
  (kind, rows, microbatches)."""
  m = re.fullmatch(r'(base|wide):(\d+)(?:x(\d+))?', text)
  if not m or int(m[2]) < 1 or int(m[3] or 1) < 1:
    raise argparse.ArgumentTypeError(f'{text!r}: expected base:ROWS or wide:ROWS (then optionally xMICROBATCHES), '
                                     'positive integers')
  return m[1], int(m[2]), int(m[3] or 1)


def train_program(devices, kind: str, rows: int, microbatches: int = 1, moe_impl: str = 'tokamax'):
  """(name, compiled): gpu_kernels' AdamW train step of shape `kind` ('base' or 'wide') on rows x seq,
  times microbatches accumulated per update, its experts on `moe_impl`."""
  import tokamax  # pylint: disable=g-import-not-at-top
  cfg, _, seq = gpu_kernels._model(False, wide=kind == 'wide')  # pylint: disable=protected-access
  cfg = dataclasses.replace(cfg, moe_impl=moe_impl, moe_fallback_impl='tokamax', attention_impl='tokamax')
  mesh = mesh_lib.make_mesh('data:1', devices[:1])
  tx = step_lib.freeze_untrainable(optim.make_optimizer(optim.OptimizerConfig(name='adamw'), 100, cfg, mesh))

  def init():
    params = transformer.init(cfg, jax.random.key(0))
    return step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  state, key = jax.eval_shape(init), jax.eval_shape(lambda: jax.random.key(0))
  batch = {k: jax.ShapeDtypeStruct((rows * microbatches, seq), jnp.float32 if k == 'loss_mask' else jnp.int32)
           for k in ('tokens', 'targets', 'segment_ids', 'loss_mask')}
  one = jax.sharding.SingleDeviceSharding(devices[0])
  on_one = lambda tree: jax.tree.map(lambda _: one, tree)
  step = functools.partial(step_lib.train_step, cfg=cfg, tx=tx, microbatches=microbatches)
  kernels.KERNEL_ORDER = ('triton',)
  with tokamax.config.cross_compile(True), jax.set_mesh(mesh), sharding_lib.use_rules(sharding_lib.RULES):
    compiled = jax.jit(step, in_shardings=(on_one(state), on_one(batch), one),
                       out_shardings=(on_one(state), one), donate_argnums=0).lower(state, batch, key).compile()
  kernels.KERNEL_ORDER = None
  name = f'train_step_{kind}_{rows}x{seq}' + f'_x{microbatches}' * (microbatches > 1)
  return name + f'_{moe_impl}' * (moe_impl != 'tokamax'), compiled


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--json', required=True, help='where to write the results')
  parser.add_argument('--gpu', default='h100',
                      help=f'one of {sorted(GPUS)} or a GpuTargetConfigProto text file')
  parser.add_argument('--mesh', default='fsdp:2,expert:4', help='mesh of the Muon part')
  parser.add_argument('--train_step', type=train_shape, default=None,
                      help='also compile gpu_kernels\' train step: base:ROWS or wide:ROWS (a minute)')
  parser.add_argument('--moe_impl', default='tokamax', choices=('tokamax', 'padded'),
                      help='the train step\'s expert path')
  parser.add_argument('--chunk_bytes', type=int, default=2**20,
                      help='exchange chunk size; small, so the tiny tree has several chunks')
  args = parser.parse_args()

  spec = GPUS.get(args.gpu, pathlib.Path(args.gpu))
  devices = gpu_topology(spec.read_text())
  result = {'gpu': devices[0].device_kind, 'target_config': str(spec), 'devices': len(devices),
            'jax': jax.__version__, 'plugin': _plugin_version()}
  stem = pathlib.Path(args.json)
  stem.parent.mkdir(parents=True, exist_ok=True)
  programs = [*muon_programs(devices, args.mesh, args.chunk_bytes), *moe_programs(devices),
              *kernel_programs(devices)]
  if args.train_step:
    programs.append(train_program(devices, *args.train_step, moe_impl=args.moe_impl))
  for name, compiled in programs:
    hlo = compiled.as_text()
    hlo_file = stem.with_name(f'{stem.name}.{name.replace(":", "").replace(",", "_")}.hlo.txt')
    hlo_file.write_text(hlo)
    r = result[name] = dict(hlo_stats.schedule(hlo), ops=hlo_stats.collective_ops(hlo),
                            collective_bytes_per_device=hlo_stats.collective_bytes(hlo), hlo=str(hlo_file),
                            kernel_calls=hlo.count(TRITON_CALL), batched_gemms=len(BATCHED_DOT.findall(hlo)),
                            scatters=SCATTER.findall(hlo),
                            **_memory(compiled.memory_analysis()))
    print(f'{name}: {r["ops"]}; {r["async"]} async pairs, {r["async_overlapped"]} with matmuls '
          f'between start and done; {r["collective_bytes_per_device"] / 2**20:.2f} MiB sent per device; '
          f'{r["kernel_calls"]} Triton kernel calls; {r["batched_gemms"]} batched GEMMs; scatters {r["scatters"]}; '
          f'{r["temp_bytes"] / 2**20:.1f} MiB scratch, peak {r["peak_bytes"] / 2**30:.2f} GiB')
  print('(ragged-all-to-all bytes depend on the routing and are not counted)')
  stem.write_text(json.dumps(result, indent=2))


def _memory(m) -> dict:
  """XLA's scratch and peak (arguments + outputs not aliased to a donated argument + scratch)."""
  return dict(temp_bytes=m.temp_size_in_bytes, peak_bytes=m.argument_size_in_bytes + m.output_size_in_bytes
              - m.alias_size_in_bytes + m.temp_size_in_bytes)


def _plugin_version():
  for package in ('jax-cuda12-plugin', 'jax-cuda13-plugin'):
    try:
      return f'{package} {importlib.metadata.version(package)}'
    except importlib.metadata.PackageNotFoundError:
      pass
  return None


if __name__ == '__main__':
  main()
