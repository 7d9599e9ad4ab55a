"""Kernels and a whole train step on one accelerator: useful TFLOP/s per path, MFU, decode tokens/s.

python -m experiments.benchmarks.gpu_kernels --part=moe --json=FILE    # one part per process
Parts (each a `--part`; `gpu_suite.sh` runs them one after another under `timeout`):
  moe        the grouped expert FFN (rows already sorted, the kernel's number) per tokamax kernel,
             and the whole MoE layer (routing, sorting, FFN, combine) on `moe_impl='auto'`, forward
             and forward + backward, bf16, top-8 at 8/64/384 experts of Kimi K2's shape (7168 ->
             2048); then blocked / ragged_dot / tokamax side by side on a smaller shape.
  attention  causal self-attention, GQA and MLA (value head 128 != query head 192), per
             `attention_impl`, forward and forward + backward.
  train      one full train step (AdamW, then Muon) of a tiny-MoE-family model as large as fits
             one device: MFU = model FLOPs (research/metrics/flops.py, no recompute) / time / peak.
  train_wide the same with fewer, wider layers (d_model 4096, experts of 2048).
  decode     greedy KV-cache decoding of that model's shape: new tokens per second.
Useful FLOPs count multiply-adds as 2 and only the work a dense reference must do (experts at k
per token; attention's causal half). Times: median of timed runs after a warm-up, in one process.
`--small` shrinks every shape to run on a CPU in seconds (what the test runs).
"""

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.muon_gpu import timed
from research.metrics import flops as flops_lib
from research.model import attention, decode, kernels, moe, transformer
from research.model.config import ModelConfig
from research.model.layers import materialize
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train import step as step_lib

BF16 = dict(dtype='bfloat16', param_dtype='bfloat16')


def _row(name: str, useful_flops: float, fn, *args, **extra) -> dict:
  """One measured row; a failure (a kernel that does not apply, memory) is recorded, not raised."""
  try:
    s = timed(fn, *args)
    row = dict(name=name, seconds=s, useful_tflop_per_s=useful_flops / s / 1e12, **extra)
  except Exception as e:  # pylint: disable=broad-except
    row = dict(name=name, error=f'{type(e).__name__}: {str(e)[:300]}', **extra)
  print(json.dumps(row), flush=True)
  return row


def _sq_loss(fn):
  return lambda *a: jnp.sum(jnp.square(fn(*a).astype(jnp.float32)))


def moe_rows(small: bool) -> list[dict]:
  d, f, tokens, experts = (64, 32, 256, (8, 16)) if small else (7168, 2048, 32768, (8, 64, 384))
  rows = []
  for e in experts:
    cfg = ModelConfig(d_model=d, d_expert=f, num_experts=e, num_experts_per_tok=8, **BF16)
    p = materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (1, tokens, d), jnp.bfloat16)
    m = tokens * 8
    xs = jax.random.normal(jax.random.key(2), (m, d), jnp.bfloat16)
    sizes = jnp.bincount(jax.random.randint(jax.random.key(3), (m,), 0, e), length=e).astype(jnp.int32)
    fwd_flops = 6.0 * m * d * f
    for kernel in ('mosaic', 'triton'):
      kernels.KERNEL_ORDER = (kernel,)
      ffn = lambda p, xs: moe.grouped_ffn(p, xs, sizes, 'tokamax')
      rows.append(_row(f'ffn/{kernel}/fwd', fwd_flops, jax.jit(ffn), p, xs, experts=e, d=d, f=f, rows=m))
      rows.append(_row(f'ffn/{kernel}/train', 3 * fwd_flops, jax.jit(jax.grad(_sq_loss(ffn), (0, 1))), p, xs,
                       experts=e, d=d, f=f, rows=m))
    kernels.KERNEL_ORDER = None
    layer = lambda p, x, c=cfg: moe.moe(p, x, jnp.ones(x.shape[:2], bool), c)[0]
    rows.append(_row('layer/auto/train', 3 * fwd_flops, jax.jit(jax.grad(_sq_loss(layer), (0, 1))), p, x,
                     experts=e, d=d, f=f, rows=m, impl=moe.resolve_impl('auto')))
  # The paths side by side where the blocked path's per-block weight copies fit.
  d, f, tokens, e = (64, 32, 256, 16) if small else (2048, 1024, 8192, 64)
  for impl in ('blocked', 'ragged', 'tokamax'):
    cfg = ModelConfig(d_model=d, d_expert=f, num_experts=e, num_experts_per_tok=8, moe_impl=impl, **BF16)
    p = materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (1, tokens, d), jnp.bfloat16)
    layer = lambda p, x, c=cfg: moe.moe(p, x, jnp.ones(x.shape[:2], bool), c)[0]
    rows.append(_row(f'layer/{impl}/fwd', 6.0 * tokens * 8 * d * f, jax.jit(layer), p, x,
                     experts=e, d=d, f=f, rows=tokens * 8))
  return rows


def attention_rows(small: bool) -> list[dict]:
  b, t = (1, 256) if small else (2, 8192)
  shapes = {'gqa': (32, 8, 128, 128), 'mla': (64, 64, 192, 128)}  # heads, kv heads, q/k head, v head.
  if small:
    shapes = {'gqa': (4, 2, 16, 16), 'mla': (4, 4, 24, 16)}
  seg = jnp.ones((b, t), jnp.int32)
  mask = kernels.MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))
  rows = []
  for kind, (h, kh, dq, dv) in shapes.items():
    q = jax.random.normal(jax.random.key(0), (b, t, h, dq), jnp.bfloat16)
    k = jax.random.normal(jax.random.key(1), (b, t, kh, dq), jnp.bfloat16)
    v = jax.random.normal(jax.random.key(2), (b, t, kh, dv), jnp.bfloat16)
    fwd_flops = 2.0 * b * h * t * (t + 1) / 2 * (dq + dv)
    for impl in ('xla', 'blockwise', 'tokamax'):
      fn = lambda q, k, v, impl=impl: attention.attend(q, k, v, mask, dq ** -0.5, impl)[0]
      rows.append(_row(f'{kind}/{impl}/fwd', fwd_flops, jax.jit(fn), q, k, v, tokens=b * t))
      # Backward: 5 matmuls of the forward's 2 (dS recomputed in flash kernels is not counted).
      rows.append(_row(f'{kind}/{impl}/train', 3.5 * fwd_flops, jax.jit(jax.grad(_sq_loss(fn), (0, 1, 2))),
                       q, k, v, tokens=b * t))
  return rows


def _model(small: bool, wide: bool = False) -> tuple[ModelConfig, int, int]:
  """(config, rows, seq_len) of the train step: Qwen3-MoE-like, top-8. Base: 8 layers of 64 experts
  of 768 (2.6B parameters); wide: 6 layers of 32 experts of 2048 at d_model 4096 (5.4B)."""
  if small:
    return ModelConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       num_experts=8, num_experts_per_tok=2, d_expert=32, dtype='bfloat16'), 4, 64
  if wide:
    return ModelConfig(vocab_size=32768, d_model=4096, num_layers=6, num_heads=32, num_kv_heads=8,
                       head_dim=128, num_experts=32, num_experts_per_tok=8, d_expert=2048,
                       dtype='bfloat16'), 4, 4096
  return ModelConfig(vocab_size=32768, d_model=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                     head_dim=128, num_experts=64, num_experts_per_tok=8, d_expert=768,
                     dtype='bfloat16'), 8, 4096


def _param_count(cfg: ModelConfig) -> int:
  return sum(x.size for x in jax.tree.leaves(jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))))


def _train_step_row(name: str, cfg: ModelConfig, rows_n: int, seq: int, opt: str) -> dict:
  """One full train step timed; MFU against the device's bf16 peak."""
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows_n, seq + 1), dtype=np.int32)
  batch = dict(tokens=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=np.ones((rows_n, seq), np.int32),
               loss_mask=np.ones((rows_n, seq), np.float32))
  per_step = flops_lib.flops_per_token(cfg, seq)['train'] * rows_n * seq
  mesh = mesh_lib.make_mesh('data:1')
  trainer = step_lib.Trainer(cfg, optim.make_optimizer(optim.OptimizerConfig(name=opt), 100, cfg, mesh), mesh)
  box = []

  def run(put):  # Init on the first (untimed) call, inside _row's error handling.
    if not box:
      box.extend((trainer.init(jax.random.key(0)), trainer.step_fn()))
    box[0], metrics = box[1](box[0], put, jax.random.key(1))
    return metrics['loss']
  row = _row(name, per_step, run, trainer.put_batch(batch), tokens=rows_n * seq,
             params=_param_count(cfg), attention=attention.resolve_impl(cfg.attention_impl),
             experts=moe.resolve_impl(cfg.moe_impl))
  if 'seconds' in row:
    row['mfu'] = per_step / row['seconds'] / (flops_lib.peak_flops() or float('nan'))
  return row


def train_rows(small: bool, wide: bool = False) -> list[dict]:
  """AdamW then Muon; a step that does not fit is retried once on half the rows."""
  cfg, rows_n, seq = _model(small, wide)
  out = []
  for opt in ('adamw', 'muon'):
    for rows in (rows_n, rows_n // 2):
      out.append(_train_step_row(f'train_step/{"wide/" * wide}{opt}', cfg, rows, seq, opt))
      if 'seconds' in out[-1]:
        break
  return out


def decode_rows(small: bool) -> list[dict]:
  cfg, _, _ = _model(small)
  cfg = dataclasses.replace(cfg, param_dtype='bfloat16')
  b, prompt, new = (4, 16, 8) if small else (64, 1024, 256)
  params = jax.jit(lambda: transformer.init(cfg, jax.random.key(0)))()
  toks = jax.random.randint(jax.random.key(1), (b, prompt), 0, cfg.vocab_size)
  gen = jax.jit(lambda p, t: decode.greedy_generate(p, t, jnp.ones_like(t, bool), cfg, new)[0])
  row = _row('decode/greedy', 0.0, gen, params, toks, rows=b, prompt=prompt, new_tokens=new,
             attention=attention.resolve_impl(cfg.attention_impl))
  if 'seconds' in row:
    row['tokens_per_s'] = b * new / row['seconds']
  return [row]


PARTS = {'moe': moe_rows, 'attention': attention_rows, 'train': train_rows, 'decode': decode_rows,
         'train_wide': lambda small: train_rows(small, wide=True)}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--part', required=True, choices=sorted(PARTS))
  ap.add_argument('--json', required=True)
  ap.add_argument('--small', action='store_true', help='CPU-sized shapes (a smoke run)')
  args = ap.parse_args()
  result = dict(part=args.part, device=jax.devices()[0].device_kind, jax=jax.__version__,
                gpu_kernels={op: kernels.gpu_kernels(op) for op in ('ragged_dot', 'attention')},
                date=time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime()), rows=PARTS[args.part](args.small))
  with open(args.json, 'w') as f:
    json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
