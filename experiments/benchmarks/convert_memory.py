"""Peak host memory of HF -> orbax import and orbax -> HF export against shard and folder size.

Writes synthetic Qwen3-MoE-shaped Hugging Face folders (random bfloat16 tensors, tensor by tensor),
then converts each in a fresh subprocess, which first tunes malloc as launch/convert.py does
(research/hf/malloc.py; --nomalloc_tuning measures glibc's defaults). After its imports it resets the kernel's peak
RSS mark (`/proc/self/clear_refs`), records its RSS (the baseline), converts, and reads the peak RSS
since the reset (VmHWM); where the reset is unavailable the peak is ru_maxrss, which also counts
the import-time peak (an upper bound). The claim: peak - baseline stays under twice the largest
shard, whatever the folder's size.

python -m experiments.benchmarks.convert_memory [--sizes_mb=256,1024 --shard_mb=32,64] [--layout=fused]
"""

import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import jax
import ml_dtypes
import numpy as np
import psutil
from absl import app, flags

from research.hf import config_map
from research.hf import convert
from research.hf import weights
from research.hf import safetensors_io as st
from research.model.config import ModelConfig

_SIZES = flags.DEFINE_list('sizes_mb', ['256', '512'], 'Approximate folder sizes, MiB.')
_SHARDS = flags.DEFINE_list('shard_mb', ['32', '64'], 'Shard sizes, MiB.')
_JSON = flags.DEFINE_bool('json', False, 'Print the rows as JSON lines.')
_LAYOUT = flags.DEFINE_string('layout', 'per_expert', 'Expert layout of the synthetic folders.')
_TUNE = flags.DEFINE_bool('malloc_tuning', True, 'Tune glibc malloc in the worker, as the CLI does.')


def model_config(size_mb: int):
  """A Qwen3-MoE shape whose bfloat16 weights take about size_mb MiB (experts dominate)."""
  d, e, f = 512, 16, 256
  per_layer = 3 * e * d * f * 2
  layers = max(2, round(size_mb * 2**20 / per_layer))
  return ModelConfig(vocab_size=8192, d_model=d, num_layers=layers, num_heads=8, num_kv_heads=2,
                     head_dim=64, d_ff=1024, num_experts=e, num_experts_per_tok=2, d_expert=f,
                     param_dtype='bfloat16', dtype='bfloat16')


def make_folder(path: str, cfg, shard_bytes: int, layout: str = 'per_expert', seed: int = 0) -> dict:
  """Writes a random HF folder for cfg; returns {'folder_bytes', 'largest_shard_bytes', 'shards'}."""
  os.makedirs(path)
  dt = np.dtype(ml_dtypes.bfloat16)
  specs = [(n, r[0].hf_shape, dt) for n, r in weights.by_hf_name(weights.rules(cfg, layout)).items()]
  shapes = {name: shape for name, shape, _ in specs}
  rng = np.random.default_rng(seed)
  weight_map = st.write_folder(path, st.plan_shards(specs, shard_bytes),
                               lambda name: [(rng.standard_normal(shapes[name], np.float32) * 0.02).astype(dt)])
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(config_map.to_hf(cfg, 'bfloat16'), f)
  sizes = [os.path.getsize(os.path.join(path, n)) for n in set(weight_map.values())]
  return {'folder_bytes': sum(sizes), 'largest_shard_bytes': max(sizes), 'shards': len(sizes)}


def _worker(direction: str, src: str, dst: str, shard_bytes: str):
  """Runs in the subprocess: baseline RSS after imports, then one conversion, then peak RSS."""
  jax.devices()  # Backend start-up is a fixed cost, not conversion memory.
  gc.collect()
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')  # Resets the peak-RSS mark to the current RSS.
    reset = True
  except OSError:
    reset = False
  base = psutil.Process().memory_info().rss
  t0 = time.perf_counter()
  if direction == 'import':
    convert.hf_to_orbax(src, dst)
  else:
    convert.orbax_to_hf(src, dst, max_shard_bytes=int(shard_bytes))
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  if reset:
    with open('/proc/self/status') as f:
      peak = next(int(l.split()[1]) * 1024 for l in f if l.startswith('VmHWM:'))
  print(json.dumps({'baseline_bytes': base, 'peak_bytes': peak, 'above_baseline_bytes': peak - base,
                    'seconds': time.perf_counter() - t0, 'peak_reset': reset}))


def measure(direction: str, src: str, dst: str, shard_bytes: int, malloc_tuning: bool = True) -> dict:
  """Converts in a fresh interpreter and returns its memory report (export: shards of shard_bytes)."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=root)
  tune = 'from research.hf import malloc; malloc.tune_for_streaming(); ' if malloc_tuning else ''
  res = subprocess.run([sys.executable, '-c', tune + 'import sys; from experiments.benchmarks import '
                        'convert_memory as m; m._worker(*sys.argv[1:])', direction, src, dst,
                        str(shard_bytes)],
                       capture_output=True, text=True, env=env, cwd=root, check=False)
  if res.returncode:
    raise RuntimeError(f'{direction} worker failed:\n{res.stderr[-3000:]}')
  return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  rows = []
  for size in map(int, _SIZES.value):
    for shard in map(int, _SHARDS.value):
      tmp = tempfile.mkdtemp(prefix='convert_memory_')
      try:
        info = make_folder(os.path.join(tmp, 'hf'), model_config(size), shard << 20, _LAYOUT.value)
        for direction, src, dst in (('import', 'hf', 'ckpt'), ('export', 'ckpt', 'out')):
          m = measure(direction, os.path.join(tmp, src), os.path.join(tmp, dst), shard << 20,
                      _TUNE.value)
          rows.append({'direction': direction, **info, **m,
                       'ratio_to_largest_shard': m['above_baseline_bytes'] / info['largest_shard_bytes']})
      finally:
        shutil.rmtree(tmp, ignore_errors=True)
  mib = lambda b: f'{b / 2**20:8.1f}'
  if _JSON.value:
    for r in rows:
      print(json.dumps(r))
    return
  print('direction  folder MiB  shards  largest shard MiB  baseline MiB  peak-baseline MiB  ratio  seconds')
  for r in rows:
    print(f'{r["direction"]:9s}  {mib(r["folder_bytes"])}  {r["shards"]:6d}  {mib(r["largest_shard_bytes"])}'
          f'           {mib(r["baseline_bytes"])}      {mib(r["above_baseline_bytes"])}          '
          f'{r["ratio_to_largest_shard"]:.2f}  {r["seconds"]:7.1f}')


if __name__ == '__main__':
  app.run(main)
