"""Kernels and a whole train step on one accelerator: useful TFLOP/s per path, MFU, decode tokens/s.

python -m experiments.benchmarks.gpu_kernels --part=moe --json=FILE    # one part per process
Parts (each a `--part`; `gpu_suite.sh` runs them one after another under `timeout`):
  moe        the grouped expert FFN (rows already sorted, the kernel's number) per tokamax kernel
             and on the padded path (batched dense GEMMs over slots of 1.25x the mean group), and
             the whole MoE layer (routing, sorting, FFN, combine) on `moe_impl='auto'` and
             'padded', forward and forward + backward, bf16, top-8 at 8/64/384 experts of Kimi K2's
             shape (7168 -> 2048); then blocked / ragged_dot / tokamax / padded side by side on a
             smaller shape.
  attention  causal self-attention, GQA and MLA (value head 128 != query head 192), per
             `attention_impl`, forward and forward + backward.
  attention_long causal GQA forward + backward at 2k..64k tokens: blockwise's compiled temp bytes
             against a T x block score buffer, its block pairs run against all, and seconds of
             blockwise and xla where xla's T x T scores fit (runs on a CPU in ~2 minutes).
  train      one full train step (AdamW, then Muon) of a tiny-MoE-family model as large as fits
             one device: MFU = model FLOPs (research/metrics/flops.py, no recompute) / time / peak;
             then 3 more steps under the profiler: the device time of each model component
             (attention, experts, dispatch, norm, optimizer, ...) by pass (forward, recomputed,
             backward, outside the gradient), and the costliest ops (research/metrics/device_time.py).
  train_wide the same with fewer, wider layers (d_model 4096, experts of 2048), and AdamW over 4
             accumulated microbatches per update.
  decode     greedy KV-cache decoding of that model's shape: new tokens per second.
  breakdown  where the `train` part's AdamW step (base shape; `breakdown_wide`: the `train_wide`
             part's) spends its time, each piece its own
             compiled program: the whole step; the forward + loss; value_and_grad of the loss; the
             AdamW update alone (on real gradients); forward + backward of the first layer's
             attention block and MoE block, and of that MoE block's routing and its expert FFN (on
             rows sorted by expert) alone; the final norm + LM head + cross-entropy (the step's) from
             a B x T x D hidden state. Each row: seconds, share (seconds / the whole step's; shares
             need not add up: XLA fuses across pieces in the step, and a block runs once per layer,
             `layers` of them), useful TFLOP/s where a FLOP count applies, and XLA's own count of
             the compiled program (`xla_flops`, `xla_bytes`: bytes >> flops marks a memory-bound
             piece). The MoE block's `dispatch_seconds` (its time less routing and expert FFN) is
             the sort, gathers and combine, with the backward's regather and recomputed SwiGLU
             hidden units, by difference: moe.py runs them inside `experts_sorted` around
             `grouped_ffn` (timed alone, without that checkpoint). XLA counts
             a scanned loop's body once (the step, forward and value_and_grad rows hold one of the L
             layers; a block row is one layer, no loop) and may count custom calls (tokamax's
             kernels) as 0: useful TFLOP/s are the rate; XLA's counts say what kind of work it is.
Useful FLOPs count multiply-adds as 2 and only the work a dense reference must do (experts at k
per token; attention's causal half). Times: median of timed runs after a warm-up, in one process.
`--small` shrinks every shape to run on a CPU in seconds (what the test runs).
"""

import argparse
import dataclasses
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from experiments.benchmarks.muon_gpu import timed
from research.metrics import device_time
from research.metrics import flops as flops_lib
from research.model import attention, decode, kernels, moe, transformer
from research.model.config import ModelConfig
from research.model.layers import materialize, rms_norm
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train import step as step_lib

BF16 = dict(dtype='bfloat16', param_dtype='bfloat16')


def _row(name: str, useful_flops: float, fn, *args, cost=None, **extra) -> dict:
  """One measured row; a failure (a kernel that does not apply, memory) is recorded, not raised.
  cost: a function giving more fields once fn has run (_Program.cost: XLA's counts)."""
  try:
    s = timed(fn, *args)
    row = dict(name=name, seconds=s, **extra, **(cost() if cost else {}))
    if useful_flops:
      row['useful_tflop_per_s'] = useful_flops / s / 1e12
  except Exception as e:  # pylint: disable=broad-except
    row = dict(name=name, error=f'{type(e).__name__}: {str(e)[:300]}', **extra)
  print(json.dumps(row), flush=True)
  return row


def _sq_loss(fn):
  return lambda *a: jnp.sum(jnp.square(fn(*a).astype(jnp.float32)))


def _random_group_sizes(rows: int, experts: int):
  return jnp.bincount(jax.random.randint(jax.random.key(3), (rows,), 0, experts), length=experts).astype(jnp.int32)


def moe_rows(small: bool) -> list[dict]:
  d, f, tokens, experts = (64, 32, 256, (8, 16)) if small else (7168, 2048, 32768, (8, 64, 384))
  rows = []
  for e in experts:
    cfg = ModelConfig(d_model=d, d_expert=f, num_experts=e, num_experts_per_tok=8, **BF16)
    p = materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (1, tokens, d), jnp.bfloat16)
    m = tokens * 8
    xs = jax.random.normal(jax.random.key(2), (m, d), jnp.bfloat16)
    sizes = _random_group_sizes(m, e)
    fwd_flops = 6.0 * m * d * f
    for kernel in ('mosaic', 'triton', 'padded'):
      kernels.KERNEL_ORDER = None if kernel == 'padded' else (kernel,)
      path = moe.ExpertPath('padded', fallback='tokamax') if kernel == 'padded' else moe.ExpertPath('tokamax')
      ffn = lambda p, xs, path=path: moe.grouped_ffn(p, xs, sizes, path)
      rows.append(_row(f'ffn/{kernel}/fwd', fwd_flops, jax.jit(ffn), p, xs, experts=e, d=d, f=f, rows=m))
      rows.append(_row(f'ffn/{kernel}/train', 3 * fwd_flops, jax.jit(jax.grad(_sq_loss(ffn), (0, 1))), p, xs,
                       experts=e, d=d, f=f, rows=m))
    kernels.KERNEL_ORDER = None
    for impl in ('auto', 'padded'):
      c = dataclasses.replace(cfg, moe_impl=impl)
      layer = lambda p, x, c=c: moe.moe(p, x, jnp.ones(x.shape[:2], bool), c)[0]
      rows.append(_row(f'layer/{impl}/train', 3 * fwd_flops, jax.jit(jax.grad(_sq_loss(layer), (0, 1))), p, x,
                       experts=e, d=d, f=f, rows=m, impl=moe.resolve_impl(impl)))
  # The paths side by side where the blocked path's per-block weight copies fit.
  d, f, tokens, e = (64, 32, 256, 16) if small else (2048, 1024, 8192, 64)
  for impl in ('blocked', 'ragged', 'tokamax', 'padded'):
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


def attention_long_rows(small: bool, lengths=(2048, 8192, 32768, 65536), time_up_to: int = 8192,
                        block: int = 512) -> list[dict]:
  """Causal GQA fwd + bwd (f32) at growing T: XLA's compiled temp bytes of blockwise against one
  T x block f32 score buffer for all heads (what each step of key-only blocking held; it held
  several), its block pairs run against all pairs, and seconds of blockwise and xla up to
  `time_up_to` (xla's temp bytes too: T x T scores, compiled only where they fit)."""
  b, h, kh, d = 1, 4, 2, 64
  if small:
    lengths, time_up_to, block, d = (256, 512), 512, 64, 16
  rows = []
  for t in lengths:
    seg = jnp.ones((b, t), jnp.int32)
    mask = kernels.MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))
    shapes = [jax.ShapeDtypeStruct((b, t, n, d), jnp.float32) for n in (h, kh, kh)]
    nb = -(-t // block)
    live = attention._live_blocks(mask, min(block, t), min(block, t))  # pylint: disable=protected-access
    row = dict(name=f'attention_long/{t}', tokens=t, block=block, pairs_run=int(live.sum()), pairs_all=nb * nb,
               t_x_block_bytes=b * h * t * block * 4)
    for impl in ('blockwise', 'xla'):
      fn = lambda q, k, v, impl=impl: attention.attend(q, k, v, mask, d ** -0.5, impl, block)[0]
      grad = jax.jit(jax.grad(_sq_loss(fn), (0, 1, 2)))
      if impl == 'xla' and t > time_up_to:
        continue  # T x T scores: 64 GiB of them per buffer at 64k.
      row[f'{impl}_temp_bytes'] = int(grad.lower(*shapes).compile().memory_analysis().temp_size_in_bytes)
      if t <= time_up_to:
        args = [jax.random.normal(jax.random.key(i), x.shape) for i, x in enumerate(shapes)]
        row[f'{impl}_seconds'] = timed(grad, *args, reps=3)
    print(json.dumps(row), flush=True)
    rows.append(row)
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
                       dtype='bfloat16'), 6, 4096
  return ModelConfig(vocab_size=32768, d_model=2048, num_layers=8, num_heads=16, num_kv_heads=4,
                     head_dim=128, num_experts=64, num_experts_per_tok=8, d_expert=768,
                     dtype='bfloat16'), 16, 4096


def _param_count(cfg: ModelConfig) -> int:
  return sum(x.size for x in jax.tree.leaves(jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))))


def _setup(cfg: ModelConfig, rows_n: int, seq: int, opt: str,
           microbatches: int = 1) -> tuple[step_lib.Trainer, dict]:
  """A one-device trainer and a batch of random tokens on it: rows_n x microbatches rows, run as
  `microbatches` microbatches of rows_n rows per step."""
  rows_n *= microbatches
  tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows_n, seq + 1), dtype=np.int32)
  batch = dict(tokens=tokens[:, :-1], targets=tokens[:, 1:], segment_ids=np.ones((rows_n, seq), np.int32),
               loss_mask=np.ones((rows_n, seq), np.float32))
  mesh = mesh_lib.make_mesh('data:1')
  trainer = step_lib.Trainer(cfg, optim.make_optimizer(optim.OptimizerConfig(name=opt), 100, cfg, mesh), mesh,
                             microbatches=microbatches)
  return trainer, trainer.put_batch(batch)


class _Program:
  """fn jitted under the trainer's rules, compiled in its mesh on the first call (inside _row's
  error handling)."""

  def __init__(self, trainer: step_lib.Trainer, fn, donate: bool = False):
    self.trainer, self.fn, self.donate, self.compiled = trainer, fn, donate, None

  def __call__(self, *args):
    if self.compiled is None:
      jitted = self.trainer.jit(self.fn, donate_argnums=(0,) if self.donate else ())
      self.compiled = jitted.lower(*args).compile()
    return self.compiled(*args)

  def cost(self) -> dict:
    """XLA's count of the compiled program's flops and bytes accessed."""
    counts = self.compiled.cost_analysis() or {}
    return dict(xla_flops=counts.get('flops'), xla_bytes=counts.get('bytes accessed'))


def _threaded(trainer: step_lib.Trainer, fn, box: list):
  """(run, program) of fn(state, *args) -> (state, out), the state donated and carried in box
  (initialized by the trainer on the first, untimed, call)."""
  program = _Program(trainer, fn, donate=True)

  def run(*args):
    if not box:
      box.append(trainer.init(jax.random.key(0)))
    box[0], out = program(box[0], *args)
    return box[0], out
  return run, program


def _train_step_row(name: str, trainer: step_lib.Trainer, batch: dict, box: list) -> dict:
  """One full train step timed on the state in box; MFU against the device's bf16 peak."""
  cfg = trainer.cfg
  rows_n, seq = batch['tokens'].shape
  per_step = flops_lib.flops_per_token(cfg, seq)['train'] * rows_n * seq
  run, program = _threaded(trainer, functools.partial(step_lib.train_step, cfg=cfg, tx=trainer.tx,
                                                      microbatches=trainer.microbatches), box)
  row = _row(name, per_step, run, batch, jax.random.key(1), cost=program.cost, tokens=rows_n * seq,
             microbatches=trainer.microbatches,
             params=_param_count(cfg), attention=attention.resolve_impl(cfg.attention_impl),
             experts=moe.resolve_impl(cfg.moe_impl))
  if 'seconds' in row:
    row['mfu'] = per_step / row['seconds'] / (flops_lib.peak_flops() or float('nan'))
    metrics = []  # The profiled steps' own.
    step = lambda: metrics.append(jax.block_until_ready(run(batch, jax.random.key(1)))[1])
    row['profile'] = _profile(program, step)
    # The largest expert group over the mean (any layer): above moe_capacity_factor, the padded
    # path's layer fell back.
    row['router_max_load'] = float(metrics[-1]['router_max_load']) if metrics else None
  return row


def _profile(program: _Program, step) -> dict:
  """Where a timed step's device time goes (research/metrics/device_time.py); printed as a table."""
  try:
    prof = device_time.profile(step, program.compiled.as_text(), steps=3)
  except Exception as e:  # pylint: disable=broad-except
    return dict(error=f'{type(e).__name__}: {str(e)[:300]}')
  print(prof.table(), flush=True)
  return dataclasses.asdict(prof)


def train_rows(small: bool, wide: bool = False) -> list[dict]:
  """AdamW with the experts on `auto` (tokamax on a GPU) and on `padded`, (wide) AdamW accumulating
  4 microbatches per update (the optimizer's pass over the parameters amortized over 4x the
  tokens), then Muon; a step that does not fit is retried once on half the rows."""
  cfg, rows_n, seq = _model(small, wide)
  # (optimizer, microbatches, rows in each, experts): the float32 gradient accumulator (4 bytes a
  # parameter) leaves room for 2/3 of the rows (gpu_aot for an H200: wide:4x4 127.94 GiB, wide:6x4
  # 137.19); the padded experts' wide:6 step peaks at 127.81 GiB.
  runs = ([('adamw', 1, rows_n, 'auto'), ('adamw', 1, rows_n, 'padded')]
          + [('adamw', 4, rows_n * 2 // 3, 'auto')] * wide + [('muon', 1, rows_n, 'auto')])
  out = []
  for opt, micro, rows_n, experts in runs:
    for rows in (rows_n, rows_n // 2):
      name = (f'train_step/{"wide/" * wide}{opt}' + f'/x{micro}' * (micro > 1)
              + f'/{experts}' * (experts != 'auto'))
      trainer, batch = _setup(dataclasses.replace(cfg, moe_impl=experts), rows, seq, opt, micro)
      out.append(_train_step_row(name, trainer, batch, []))
      if 'seconds' in out[-1]:
        break
  return out


def _piece(name: str, useful_flops: float, trainer: step_lib.Trainer, fn, *args, **extra) -> dict:
  program = _Program(trainer, fn)
  return _row(name, useful_flops, program, *args, cost=program.cost, **extra)


def _block_flops(cfg: ModelConfig, seq: int) -> tuple[float, float, float]:
  """Forward FLOPs per token of one attention block, one MoE block (k experts and the router; no
  shared experts in this family) and the LM head, by flops.py (a layer: two depths' difference)."""
  per_token = lambda n: flops_lib.flops_per_token(dataclasses.replace(cfg, num_layers=n), seq)['forward']
  experts = moe.ideal_flops(1, cfg) + 2 * cfg.d_model * cfg.num_experts
  return per_token(2) - per_token(1) - experts, experts, 2.0 * cfg.d_model * cfg.vocab_size


def _block_rows(trainer: step_lib.Trainer, params: dict, batch: dict) -> list[dict]:
  """Forward + backward of the first layer's attention block and MoE block, of that block's routing
  and expert FFN alone, and of the final norm, LM head and cross-entropy, on random hidden states."""
  cfg, eps = trainer.cfg, trainer.cfg.norm_eps
  b, t = batch['tokens'].shape
  n, m, layers = b * t, b * t * cfg.num_experts_per_tok, cfg.num_moe_layers
  p = jax.tree.map(lambda a: a[0], params['moe_layers'])
  x = jax.random.normal(jax.random.key(2), (b, t, cfg.d_model), cfg.dtype)
  xs = jax.random.normal(jax.random.key(3), (m, cfg.d_model), cfg.dtype)

  def attn(p, x, seg):
    mask = kernels.MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))
    pos = jnp.broadcast_to(jnp.arange(t), (b, t))
    return x + attention.attention(p['attn'], rms_norm(x, p['attn_norm'], eps), pos, mask, cfg)[0]
  block = lambda p, x, seg: x + moe.moe(p['moe'], rms_norm(x, p['mlp_norm'], eps), seg != 0, cfg)[0]
  route = lambda p, x_NxD, valid_N: moe.route(p, x_NxD, valid_N, cfg)[0]
  impl = moe.resolve_impl(cfg.moe_impl)
  ffn = lambda p, xs, sizes: moe.grouped_ffn(p, xs, sizes, moe.expert_path(cfg))

  def head(p, h, targets):
    logits = transformer.lm_head(p['lm_head']['kernel'], rms_norm(h, p['final_norm']['scale'], eps), cfg)
    return jnp.mean(step_lib.token_nll(logits, targets))
  train = lambda fn: jax.grad(_sq_loss(fn), (0, 1))
  attn_f, moe_f, head_f = (3 * n * f for f in _block_flops(cfg, seq=t))
  seg = batch['segment_ids']
  rows = [
      _piece('breakdown/attention_block', attn_f, trainer, train(attn), p, x, seg, layers=cfg.num_layers),
      _piece('breakdown/moe_block', moe_f, trainer, train(block), p, x, seg, layers=layers, experts=impl),
      _piece('breakdown/moe_route', 6.0 * n * cfg.d_model * cfg.num_experts, trainer, train(route), p['moe'],
             x.reshape(n, -1), seg.reshape(-1) != 0, layers=layers),
      _piece('breakdown/moe_expert_ffn', 3 * moe.ideal_flops(n, cfg), trainer, train(ffn), p['moe'], xs,
             _random_group_sizes(m, cfg.num_experts), layers=layers, experts=impl),
      _piece('breakdown/head_and_ce', head_f, trainer, jax.grad(head, (0, 1)),
             {k: params[k] for k in ('final_norm', 'lm_head')}, x, batch['targets']),
  ]
  if all('seconds' in r for r in rows[1:4]):
    rows[1]['dispatch_seconds'] = rows[1]['seconds'] - rows[2]['seconds'] - rows[3]['seconds']
  return rows


def breakdown_rows(small: bool, wide: bool = False) -> list[dict]:
  """Where the `train` (or `train_wide`) part's AdamW step spends its time: see the module docstring."""
  cfg, rows_n, seq = _model(small, wide)
  trainer, batch = _setup(cfg, rows_n, seq, 'adamw')
  box = []
  rows = [_train_step_row('breakdown/step', trainer, batch, box)]
  if not box:
    return rows
  # The pieces need the parameters only: the optimizer state goes (the update below makes its own),
  # which leaves them the memory the step had.
  params = box.pop().params
  fwd = flops_lib.flops_per_token(cfg, seq)['forward'] * rows_n * seq

  def loss(params, batch):
    objective, aux = step_lib.loss_fn(params, batch, cfg)
    return objective + step_lib.router_loss(aux, cfg)
  rows.append(_piece('breakdown/forward', fwd, trainer, loss, params, batch))
  value_and_grad = _Program(trainer, jax.value_and_grad(loss))
  rows.append(_row('breakdown/value_and_grad', 3 * fwd, value_and_grad, params, batch, cost=value_and_grad.cost))
  rows += _block_rows(trainer, params, batch)
  if 'seconds' in rows[2]:  # Last: on a fresh state (params, AdamW's moments), donated.
    def update(state, grads):
      updates, opt_state = trainer.tx.update(grads, state.opt_state, state.params)
      return step_lib.TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state), ()
    run, program = _threaded(trainer, update, box)
    rows.append(_row('breakdown/optimizer_update', 0.0, run, value_and_grad(params, batch)[1], cost=program.cost))
  whole = rows[0].get('seconds')
  for row in rows:
    if whole and 'seconds' in row:
      row['share'] = row['seconds'] / whole
  print(_table(rows), flush=True)
  return rows


def _table(rows: list[dict]) -> str:
  """The breakdown as a markdown table; 'x layers' is a block's share times its number of layers."""
  fmt = lambda v, scale=1.0: 'n/a' if v is None else f'{v / scale:.4g}'
  lines = ['| piece | s | share | x layers | useful TFLOP/s | XLA GFLOP | XLA GB |', '|---|' + '---:|' * 6]
  for r in rows:
    if 'error' in r:
      lines.append(f"| {r['name']} | {r['error']} |")
      continue
    share = r.get('share')
    cells = [r['name'], fmt(r['seconds']), fmt(share), fmt(share and share * r.get('layers', 1)),
             fmt(r.get('useful_tflop_per_s')), fmt(r['xla_flops'], 1e9), fmt(r['xla_bytes'], 1e9)]
    lines.append('| ' + ' | '.join(cells) + ' |')
    if 'dispatch_seconds' in r:
      lines.append(f"| moe dispatch (block - route - FFN) | {fmt(r['dispatch_seconds'])} | "
                   f"{fmt(share and r['dispatch_seconds'] / r['seconds'] * share)} | | | | |")
  return '\n'.join(lines)


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


PARTS = {'moe': moe_rows, 'attention': attention_rows, 'attention_long': attention_long_rows,
         'train': train_rows, 'decode': decode_rows,
         'train_wide': lambda small: train_rows(small, wide=True), 'breakdown': breakdown_rows,
         'breakdown_wide': lambda small: breakdown_rows(small, wide=True)}


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
