"""Compiled FLOPs over the ideal, and tokens/s, of one MoE layer for each expert path.

python -m experiments.benchmarks.moe_paths [--experts=8,32,128] [--tokens=2048] [--json=FILE]

Ideal = routed experts at exactly k per token plus the router matmul. FLOPs come from the compiled
program's cost_analysis(); tokens/s from the median of timed runs, all paths in one process.
"""

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from research.model import moe
from research.model.config import ModelConfig
from research.model.layers import materialize


def measure(cfg: ModelConfig, tokens: int, impl: str, repeats: int) -> dict:
  c = dataclasses.replace(cfg, moe_impl=impl)
  p = materialize(moe.moe_specs(c), jax.random.key(0), jnp.dtype(c.param_dtype))
  p['router'] = jax.random.normal(jax.random.key(1), p['router'].shape)
  x = jax.random.normal(jax.random.key(2), (1, tokens, c.d_model), jnp.dtype(c.dtype))
  valid = jnp.ones((1, tokens), bool)
  fn = jax.jit(lambda p, x: moe.moe(p, x, valid, c)[0])
  compiled = fn.lower(p, x).compile()
  ideal = moe.ideal_flops(tokens, c) + 2 * tokens * c.d_model * c.num_experts
  compiled(p, x).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    compiled(p, x).block_until_ready()
    times.append(time.perf_counter() - t0)
  return {'experts': c.num_experts, 'impl': impl, 'flops': compiled.cost_analysis()['flops'],
          'flops_over_ideal': compiled.cost_analysis()['flops'] / ideal,
          'tokens_per_s': tokens / float(np.median(times)),
          'useful_tflop_per_s': ideal / float(np.median(times)) / 1e12,
          'block': moe.block_size(tokens * c.num_experts_per_tok, c.num_experts) if impl == 'blocked' else None}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--experts', default='8,32,128')
  ap.add_argument('--tokens', type=int, default=2048)
  ap.add_argument('--d_model', type=int, default=256)
  ap.add_argument('--d_expert', type=int, default=128)
  ap.add_argument('--top_k', type=int, default=2)
  ap.add_argument('--impls', default='dense,ragged,blocked,padded')
  ap.add_argument('--repeats', type=int, default=5)
  ap.add_argument('--dtype', default='float32', help='activations and weights')
  ap.add_argument('--json', default=None)
  args = ap.parse_args()
  rows = []
  print(f'backend={jax.default_backend()} tokens={args.tokens} d_model={args.d_model} '
        f'd_expert={args.d_expert} k={args.top_k} dtype={args.dtype}')
  print(f'{"experts":>8} {"path":>8} {"FLOPs/ideal":>12} {"tokens/s":>12} {"useful TFLOP/s":>15}')
  for e in map(int, args.experts.split(',')):
    cfg = ModelConfig(d_model=args.d_model, d_expert=args.d_expert, num_experts=e,
                      num_experts_per_tok=args.top_k, dtype=args.dtype, param_dtype=args.dtype)
    for impl in args.impls.split(','):
      r = measure(cfg, args.tokens, impl, args.repeats)
      rows.append(r)
      print(f'{e:>8} {impl:>8} {r["flops_over_ideal"]:>12.3f} {r["tokens_per_s"]:>12.0f} '
            f'{r["useful_tflop_per_s"]:>15.3f}', flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(rows, f, indent=1)


if __name__ == '__main__':
  main()
