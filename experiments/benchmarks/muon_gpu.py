"""Muon on one GPU: NS throughput on a Kimi-like expert stack and the optimizer step vs optax.

  python -m experiments.benchmarks.muon_gpu --json=$OUT/muon_gpu.json [--small]

Default: batched NS (standard and Polar Express schedules, bf16 and f32) on E experts of
2048 x 7168 (Kimi K2's 7168 x 2048 expert matrices, wide side), E in (8, 16), reported as ms and
TFLOP/s; then one optimizer step on a tree of three (16, 7168, 2048)-ish expert leaves: ours (bf16
and f32 NS) against optax.contrib.muon. `--small` shrinks everything to run on CPU in seconds.
Needs only jax, optax and numpy. The sharded update's schedule on 8 GPUs: gpu_aot.py.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from optax.contrib import MuonDimensionNumbers as Dims

from research.optim import muon as muon_lib
from research.optim import newton_schulz


def timed(fn, *args, reps: int = 5) -> float:
  """Median seconds of fn(*args) (compiled and run once before)."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def ns_throughput(experts, rows, cols, reps):
  out = []
  for e in experts:
    x = jax.random.normal(jax.random.key(0), (e, rows, cols), jnp.float32)
    for dtype in (jnp.bfloat16, jnp.float32):
      for preset in ('standard', 'polar_express'):
        coeffs = newton_schulz.schedule(preset, 5)
        fn = jax.jit(lambda y, c=coeffs, d=dtype: newton_schulz.orthogonalize(y, c, dtype=d))
        seconds = timed(fn, x, reps=reps)
        flops = e * newton_schulz.flops(rows, cols, len(coeffs))
        out.append({'experts': e, 'shape': [rows, cols], 'dtype': jnp.dtype(dtype).name,
                    'coeffs': preset, 'ms': 1e3 * seconds, 'tflops': flops / seconds / 1e12})
  return out


def optimizer_step(experts, d, f, reps):
  key = iter(jax.random.split(jax.random.key(1), 6))
  shapes = {'wi_gate': (experts, d, f), 'wi_up': (experts, d, f), 'wo': (experts, f, d)}
  params = {k: jax.random.normal(next(key), s, jnp.float32) for k, s in shapes.items()}
  grads = {k: jax.random.normal(next(key), s, jnp.float32) for k, s in shapes.items()}
  dims = {k: Dims(1, 2) for k in shapes}
  variants = {
      'ours_bf16': muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, ns_dtype=jnp.bfloat16),
      'ours_f32': muon_lib.muon(0.02, muon_weight_dimension_numbers=dims, ns_dtype=jnp.float32),
      'optax': optax.contrib.muon(0.02, muon_weight_dimension_numbers=dims),
  }
  out = {}
  for name, opt in variants.items():
    state = opt.init(params)
    update = jax.jit(opt.update)
    out[name] = {'ms': 1e3 * timed(update, grads, state, params, reps=reps)}
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--json', required=True, help='where to write the results')
  parser.add_argument('--small', action='store_true', help='tiny sizes (CPU smoke test)')
  args = parser.parse_args()
  result = {'backend': jax.default_backend(), 'device': str(jax.devices()[0]),
            'jax': jax.__version__}
  experts, d, f, reps = ((2,), 64, 32, 2) if args.small else ((8, 16), 7168, 2048, 10)
  result['ns'] = ns_throughput(experts, f, d, reps)
  result['step'] = optimizer_step(experts[-1], d, f, reps)
  print(f'{"experts":>7} {"shape":>12} {"dtype":>8} {"coeffs":>14} {"ms":>9} {"TFLOP/s":>8}')
  for r in result['ns']:
    print(f'{r["experts"]:>7} {"x".join(map(str, r["shape"])):>12} {r["dtype"]:>8} '
          f'{r["coeffs"]:>14} {r["ms"]:>9.2f} {r["tflops"]:>8.1f}')
  for name, r in result['step'].items():
    print(f'optimizer step, {experts[-1]} experts x 3 matrices, {name}: {r["ms"]:.2f} ms')
  with open(args.json, 'w') as fp:
    json.dump(result, fp, indent=2)


if __name__ == '__main__':
  main()
