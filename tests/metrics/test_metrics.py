"""FLOPs per token (hand count and XLA's count), MFU, metrics.jsonl and TensorBoard events."""

import glob
import struct

import jax
import jax.numpy as jnp
import pytest

import runs
from research.metrics import flops
from research.metrics.writer import MetricsWriter
from research.model import transformer
from research.model.config import ModelConfig
from research.train.step import loss_fn

TINY = dict(d_model=64, num_heads=4, num_kv_heads=2, head_dim=16, num_experts=4, d_expert=32,
            vocab_size=256)


def test_flops_per_token_hand_count():
  cfg = ModelConfig(num_layers=2, num_experts_per_tok=2, **TINY)
  attn_proj = 64 * 4 * 16 + 2 * (64 * 2 * 16) + 4 * 16 * 64   # q, k, v, o
  router = 64 * 4
  active_experts = 2 * 3 * 64 * 32                             # k=2 of the 4 experts
  lm_head = 64 * 256                                           # the embedding lookup is free
  matmul = 2 * (2 * (attn_proj + router + active_experts) + lm_head)
  scores = 2 * 2 * 4 * 16.5 * (16 + 16)                        # causal: (32 + 1) / 2 keys
  f = flops.flops_per_token(cfg, 32)
  assert f['forward'] == matmul + scores == 140544
  assert f['train'] == 3 * 140544
  # Idle experts cost nothing: all 4 active adds exactly 2 more experts' matmuls per layer.
  all_active = flops.flops_per_token(ModelConfig(num_layers=2, num_experts_per_tok=4, **TINY), 32)
  assert all_active['forward'] - f['forward'] == 2 * 2 * (2 * 3 * 64 * 32)


@pytest.mark.parametrize('attention', ['gqa', 'mla'])
def test_flops_match_xla_cost_analysis(attention):
  # XLA counts a scanned layer once, so one layer; all experts active and computed densely so the
  # compiled program does exactly the counted matmuls (plus elementwise work: softmax, norms, RoPE).
  cfg = ModelConfig(num_layers=1, num_experts_per_tok=4, moe_impl='dense', attention=attention,
                    **TINY)
  b, t = 2, 32
  params = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  tok = jax.ShapeDtypeStruct((b, t), jnp.int32)
  fwd = jax.jit(lambda p, x: transformer.forward(p, x, cfg)[0]).lower(params, tok).compile()
  batch = dict.fromkeys(('tokens', 'targets', 'segment_ids', 'loss_mask'), tok)
  grad = jax.jit(jax.grad(lambda p, x: loss_fn(p, x, cfg)[0])).lower(params, batch).compile()
  f = flops.flops_per_token(cfg, t, causal=False)
  for compiled, counted in ((fwd, f['forward']), (grad, f['train'])):
    ratio = compiled.cost_analysis()['flops'] / (b * t) / counted
    assert 1.0 <= ratio < 1.08, ratio


def test_mfu_and_peaks():
  assert flops.mfu(1e5, 6e9, 8, 1e15) == pytest.approx(1e5 * 6e9 / 8e15)
  assert flops.peak_flops() is None  # A CPU: unknown, so no MFU is reported.
  assert flops.PEAK_FLOPS['h100'] == 989e12


def _events(path):
  """Scalars of a TensorBoard event file (TFRecord framing: length, crc, payload, crc)."""
  from tensorboardX.proto import event_pb2
  out, data = [], open(path, 'rb').read()
  while data:
    (n,) = struct.unpack('<Q', data[:8])
    event = event_pb2.Event.FromString(data[12:12 + n])
    data = data[16 + n:]
    out += [(event.step, v.tag, v.simple_value) for v in event.summary.value]
  return out


def test_writer_jsonl_tensorboard_and_truncate(tmp_path):
  w = MetricsWriter(str(tmp_path), total_steps=6, console=False)
  for step in (2, 4, 6):
    w.write(step, {'loss': 1.0 / step, 'tokens_per_s': jnp.float32(100.0 * step)})
  w.close()
  rows = runs.metrics(tmp_path)
  assert rows[1] == {'step': 4, 'loss': 0.25, 'tokens_per_s': 400.0}
  events = _events(glob.glob(str(tmp_path / 'tensorboard' / 'events.out.tfevents.*'))[0])
  assert (6, 'loss', pytest.approx(1 / 6)) in events and (2, 'tokens_per_s', 200.0) in events
  MetricsWriter(str(tmp_path), tensorboard=False, console=False).truncate(4)
  assert [r['step'] for r in runs.metrics(tmp_path)] == [2, 4]
