"""The sharded Muon update compiled for 8 GPUs on a machine without one: is its exchange overlapped?

  make gpu-aot    # makes .venv-gpuaot from requirements-gpuaot.lock, then runs:
  .venv-gpuaot/bin/python -m experiments.benchmarks.muon_gpu_aot --json=/tmp/muon_gpu_aot.json

Deviceless ahead-of-time compilation: the CUDA PJRT plugin builds a topology of 8 devices from a
GPU target config (`gpu_specs/<gpu>.txtpb`, XLA's spec of that GPU) without a GPU, driver or
libcuda, and XLA:GPU's full pipeline, latency-hiding scheduler included, compiles for it; nothing
runs. Compiling kernels needs libdevice (nvidia-cuda-nvcc-cu12, or a CUDA toolkit in
/usr/local/cuda, whose ptxas is then used), none of the other nvidia-* wheels. The update of the
tiny-MoE tree on the mesh `fsdp:2,expert:4` (ours with bf16 NS, as on a GPU, and
optax.contrib.muon under the same shardings) is read with research/optim/hlo_stats: async
collective start/done pairs, how many have a matmul scheduled between start and done, collective
bytes per device. The optimized HLO of each variant goes next to the JSON
(`<json>.<variant>.hlo.txt`). About 30 s on 2 CPU cores. The CUDA wheels stay out of
requirements.lock: only this venv needs them (a GPU machine's jax[cuda12] has them).
"""

import os

# No GPU is needed or wanted: the plugin still registers and makes topologies, but skips its CUDA
# version checks and the attempt to open a device.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import argparse  # pylint: disable=g-import-not-at-top
import importlib.metadata
import json
import pathlib

import jax
import jax.numpy as jnp
import optax
from jax.experimental import topologies

from experiments.benchmarks.muon import moe_tree
from research.optim import hlo_stats
from research.optim import muon as muon_lib
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib

SPECS = pathlib.Path(__file__).parent / 'gpu_specs'
GPUS = {'h100': SPECS / 'h100_sxm.txtpb'}


def gpu_topology(target_config: str, topology: str = '1x1x8'):
  """Compile-only CUDA devices: `topology` is partitions x hosts per partition x GPUs per host."""
  return topologies.get_topology_desc(platform='cuda', topology_name='aot',
                                      target_config=target_config, topology=topology).devices


def variants(mesh, shardings, dims, chunk_bytes):
  return {
      # ns_dtype follows the target (muon's default looks at the default backend: CPU here).
      'ours': muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, weight_decay=0.1, mesh=mesh,
                            shardings=shardings, ns_dtype=jnp.bfloat16, chunk_bytes=chunk_bytes),
      'optax': optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims, weight_decay=0.1),
  }


def compile_update(opt, mesh, shapes, shardings):
  """Optimized HLO text of the update, params and state sharded alike, from shapes only."""
  state = jax.eval_shape(opt.init, shapes)
  state_sh = muon_lib.state_shardings(state, shapes, shardings, mesh)
  update = jax.jit(opt.update, in_shardings=(shardings, state_sh, shardings),
                   out_shardings=(shardings, state_sh))
  return update.lower(shapes, state, shapes).compile().as_text()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--json', required=True, help='where to write the results')
  parser.add_argument('--gpu', default='h100',
                      help=f'one of {sorted(GPUS)} or a GpuTargetConfigProto text file')
  parser.add_argument('--mesh', default='fsdp:2,expert:4')
  parser.add_argument('--chunk_bytes', type=int, default=2**20,
                      help='exchange chunk size; small, so the tiny tree has several chunks')
  args = parser.parse_args()

  spec = GPUS.get(args.gpu, pathlib.Path(args.gpu))
  devices = gpu_topology(spec.read_text())
  mesh = mesh_lib.make_mesh(args.mesh, devices)
  shapes, axes, dims = moe_tree()
  shardings = sharding_lib.tree_shardings(axes, shapes, mesh)
  result = {'gpu': devices[0].device_kind, 'target_config': str(spec), 'mesh': dict(mesh.shape),
            'devices': len(devices), 'jax': jax.__version__, 'plugin': _plugin_version()}
  stem = pathlib.Path(args.json)
  for name, opt in variants(mesh, shardings, dims, args.chunk_bytes).items():
    hlo = compile_update(opt, mesh, shapes, shardings)
    hlo_file = stem.with_name(f'{stem.name}.{name}.hlo.txt')
    hlo_file.write_text(hlo)
    result[name] = dict(hlo_stats.schedule(hlo),
                        collective_bytes_per_device=hlo_stats.collective_bytes(hlo),
                        hlo=str(hlo_file))
    r = result[name]
    print(f'{name}: {r["async"]} async collective pairs, {r["async_overlapped"]} with matmuls '
          f'between start and done; {r["matmuls_in_flight"]}/{r["matmuls"]} matmuls in flight; '
          f'{r["collective_bytes_per_device"] / 2**20:.2f} MiB sent per device')
  stem.write_text(json.dumps(result, indent=2))


def _plugin_version():
  for package in ('jax-cuda12-plugin', 'jax-cuda13-plugin'):
    try:
      return f'{package} {importlib.metadata.version(package)}'
    except importlib.metadata.PackageNotFoundError:
      pass
  return None


if __name__ == '__main__':
  main()
