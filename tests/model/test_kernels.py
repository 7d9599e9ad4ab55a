"""Attention and expert paths against the dense references: blockwise, and tokamax's (its XLA
implementations on CPU, the same calls that select its GPU kernels on a GPU)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.model import attention, decode, kernels, moe
from research.model.config import ModelConfig
from research.model.layers import materialize
from research.model.transformer import forward, init

GQA = ModelConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                  num_experts=4, d_expert=16, attention_block=4)
MLA = dataclasses.replace(GQA, attention='mla', router='sigmoid', kv_lora_rank=16, qk_nope_head_dim=8,
                          qk_rope_head_dim=4, v_head_dim=6, rope_interleaved=True, q_lora_rank=12)
# Two packed segments, then padding; the second row unpacked with a shorter length.
SEG = np.array([[1] * 7 + [2] * 6 + [0] * 3, [1] * 11 + [0] * 5], np.int32)


def _loss(cfg):
  def loss(params, tokens):
    logits, _, _ = forward(params, tokens, cfg, segment_ids_BxT=jnp.asarray(SEG))
    return jnp.sum(jnp.where(SEG[..., None] != 0, jax.nn.log_softmax(logits), 0.0) ** 2) / 100
  return loss


@pytest.mark.parametrize('impl', ['blockwise', 'tokamax'])
@pytest.mark.parametrize('cfg', [GQA, MLA], ids=['gqa', 'mla'])
def test_attention_paths_match_dense(cfg, impl):
  """Logits at real positions, max logits, and every parameter's gradient equal the xla path's."""
  params = init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), SEG.shape, 0, cfg.vocab_size)
  ref_cfg, cfg = (dataclasses.replace(cfg, attention_impl=i) for i in ('xla', impl))
  (logits, aux, _), (ref, ref_aux, _) = (
      jax.jit(lambda p, t, c=c: forward(p, t, c, segment_ids_BxT=jnp.asarray(SEG)))(params, tokens)
      for c in (cfg, ref_cfg))
  real = SEG != 0
  np.testing.assert_allclose(np.asarray(logits)[real], np.asarray(ref)[real], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(aux['attn_max_logit'], ref_aux['attn_max_logit'], atol=1e-5, rtol=1e-5)
  grads, ref_grads = (jax.jit(jax.grad(_loss(c)))(params, tokens) for c in (cfg, ref_cfg))
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    r = ref_grads
    for key in path:
      r = r[key.key]
    np.testing.assert_allclose(g, r, atol=2e-5, rtol=2e-4, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('impl', ['blockwise', 'tokamax'])
def test_prefill_and_decode_match_xla(impl):
  """With a KV cache (left padding in one row) greedy decoding is token-identical to the xla path."""
  cfg = dataclasses.replace(GQA, attention_block=3)
  params = init(cfg, jax.random.key(2))
  tokens = jax.random.randint(jax.random.key(3), (2, 9), 0, cfg.vocab_size)
  mask = jnp.asarray([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1] * 9], bool)
  out = {i: decode.greedy_generate(params, tokens, mask, dataclasses.replace(cfg, attention_impl=i), 8)
         for i in ('xla', impl)}
  np.testing.assert_array_equal(out['xla'][0], out[impl][0])
  np.testing.assert_allclose(out['xla'][1], out[impl][1], atol=1e-5, rtol=1e-5)


def test_tokamax_cache_mask_has_holes():
  """A cache's valid slots need not be one range: the mask tokamax gets equals ours, holes included."""
  kv_seg = jnp.asarray([[0, 1, 1, 0, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0, 1, 0]])
  mask = kernels.MaskInfo(jnp.ones((2, 3), jnp.int32), kv_seg, jnp.asarray([[4, 5, 6], [2, 3, 4]]), jnp.arange(8))
  ours = mask.dense()
  theirs = kernels.tokamax_mask(mask, cached=True).as_array(3, 8)
  np.testing.assert_array_equal(jnp.broadcast_to(theirs, (2, 1, 3, 8))[:, 0], ours)


def test_resolve_auto_on_cpu():
  assert attention.resolve_impl('auto') == 'xla'
  assert attention.resolve_impl('tokamax') == 'tokamax'


def test_segment_starts():
  seg = jnp.asarray([[1, 1, 2, 2, 2, 0, 0], [3, 3, 3, 3, 1, 1, 0]])
  np.testing.assert_array_equal(kernels.segment_starts(seg), [[0, 0, 2, 2, 2, 5, 5], [0, 0, 0, 0, 4, 4, 6]])


def test_blockwise_memory_does_not_hold_scores():
  """At T = S = 2048 one head's f32 score matrix is 16 MiB; fwd + bwd of the blockwise path needs
  less temp memory than that in all, the dense path several times it."""
  b, t, h, d = 1, 2048, 2, 16
  q, k, v = (jax.ShapeDtypeStruct((b, t, h, d), jnp.float32) for _ in range(3))
  seg = jnp.ones((b, t), jnp.int32)
  mask = kernels.MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))

  def temp_bytes(fn):
    loss = lambda q, k, v: jnp.sum(fn(q, k, v)[0] ** 2)
    return jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes

  scores = t * t * 4
  dense = temp_bytes(lambda q, k, v: attention.attend_dense(q, k, v, mask.dense(), 0.25))
  block = temp_bytes(lambda q, k, v: attention.attend_blockwise(q, k, v, mask, 0.25, block=128))
  assert block < scores < dense / 2, (block, scores, dense)


def test_blockwise_memory_scales_with_both_blocks():
  """At T = 8192 one head's T x block f32 scores are 8 MiB (the old path held several); blocking
  the queries too leaves block x block scores per step, so fwd + bwd fits in a quarter of that."""
  t, block = 8192, 256
  q = jax.ShapeDtypeStruct((1, t, 1, 16), jnp.float32)
  seg = jnp.ones((1, t), jnp.int32)
  mask = kernels.MaskInfo(seg, seg, jnp.arange(t)[None], jnp.arange(t))
  loss = lambda q, k, v: jnp.sum(attention.attend_blockwise(q, k, v, mask, 0.25, block)[0] ** 2)
  temp = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, q, q).compile().memory_analysis().temp_size_in_bytes
  assert temp < t * block * 4 / 4, temp


def _cache_mask():
  """Two rows over a 24-slot cache: row 0's queries at slots 13-15, row 1's at 9-11; holes in the
  valid slots, nothing valid from slot 16 on."""
  kv_seg = np.zeros((2, 24), np.int32)
  kv_seg[0, [0, 1, 2, 5, 6, 9, 10, 11, 12, 13, 14, 15]] = 1
  kv_seg[1, 2:12] = 1
  return kernels.MaskInfo(jnp.ones((2, 3), jnp.int32), jnp.asarray(kv_seg), jnp.asarray([[13, 14, 15], [9, 10, 11]]),
                          jnp.arange(24))


def _train_mask(seg):
  seg = jnp.asarray(seg, jnp.int32)
  return kernels.MaskInfo(seg, seg, jnp.arange(seg.shape[1])[None], jnp.arange(seg.shape[1]))


MASKS = {
    'causal': _train_mask(np.ones((2, 20))),  # 20 is no multiple of the blocks below.
    'packed': _train_mask([[1] * 7 + [2] * 9 + [3] * 3 + [0] * 3, [4] * 13 + [5] * 6 + [0] * 3]),
    'decode': _cache_mask(),
}


@pytest.mark.parametrize('block,dtype', [(5, jnp.float32), (8, jnp.bfloat16)], ids=['5-f32', '8-bf16'])
@pytest.mark.parametrize('heads', [(4, 2, 8, 8), (4, 4, 12, 6)], ids=['gqa', 'mla'])
@pytest.mark.parametrize('name', sorted(MASKS))
def test_blockwise_masks_match_dense(name, heads, block, dtype):
  """Outputs, max logits and gradients equal the dense path's for causal, packed (segments across
  block boundaries, padding) and cached masks (queries at each row's end, holes). Cache slots that no
  query may see (whole blocks of them) hold NaN: a pair of blocks computed there would put NaN into
  the output."""
  mask = MASKS[name]
  (b, t), s = mask.q_seg_BxT.shape, mask.kv_seg_BxS.shape[1]
  h, kh, dq, dv = heads
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (b, t, h, dq)).astype(dtype)
  k, v = (jax.random.normal(key, (b, s, kh, d)).astype(dtype) for key, d in ((ks[1], dq), (ks[2], dv)))
  w = jax.random.normal(ks[3], (b, t, h, dv))
  seen = np.asarray(mask.dense()).any(-1)  # Queries that see a key (the others' output is arbitrary).

  def run(fn, k, v):
    loss = lambda q, k, v: jnp.sum(jnp.where(seen[..., None, None], fn(q, k, v)[0].astype(jnp.float32) * w, 0))
    return fn(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)

  (out, m), grads = run(lambda q, k, v: attention.attend_dense(q, k, v, mask.dense(), 0.3), k, v)
  dead = (jnp.arange(s) >= (20 if name == 'decode' else s))[None, :, None, None]
  k, v = (jnp.where(dead, jnp.nan, x) for x in (k, v))
  (out_b, m_b), grads_b = run(lambda q, k, v: attention.attend_blockwise(q, k, v, mask, 0.3, block), k, v)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  f32 = lambda x: np.asarray(x, np.float32)
  np.testing.assert_allclose(f32(out_b)[seen], f32(out)[seen], atol=tol, rtol=tol)
  np.testing.assert_allclose(m_b, m, atol=tol, rtol=tol)
  for g_b, g, what in zip(grads_b, grads, 'qkv'):
    np.testing.assert_allclose(f32(g_b), f32(g), atol=4 * tol, rtol=4 * tol, err_msg=what)


def _visited(mask, block):
  """How often the blockwise loop visits each (query block, key block) pair, and the pairs that
  hold a visible entry (from the dense mask: the least work there is)."""
  (_, t), s = mask.q_seg_BxT.shape, mask.kv_seg_BxS.shape[1]
  tq, tk = min(block, t), min(block, s)
  padded = attention._padded(jnp.zeros((1, 1, 1, t, 1)), jnp.zeros((1, s, 1, 1)), jnp.zeros((1, s, 1, 1)), mask,
                             tq, tk)[3]
  live = attention._live_blocks(padded, tq, tk)
  count, steps = attention._over_live(live, lambda i, j, c: c.at[i, j].add(1), jnp.zeros(live.shape, jnp.int32))
  dense = np.asarray(mask.dense()).any(0)
  dense = np.pad(dense, [(0, -t % tq), (0, -s % tk)]).reshape(-(-t // tq), tq, -(-s // tk), tk).any((1, 3))
  assert int(steps) == int(count.sum())
  return np.asarray(count), dense


@pytest.mark.parametrize('block', [3, 4, 5, 8])
@pytest.mark.parametrize('name', sorted(MASKS))
def test_blockwise_skips_masked_blocks(name, block):
  """The loop runs each pair of blocks that holds a visible entry once, and no other."""
  count, visible = _visited(MASKS[name], block)
  np.testing.assert_array_equal(count, visible.astype(np.int32))


def test_blockwise_causal_does_half_the_work():
  """Causal: 36 of the 64 block pairs at 8192 positions in blocks of 1024; 64 when every query sees
  every key (queries at the last slot, as in decoding)."""
  t = 8192
  causal = _train_mask(np.ones((1, t)))
  full = causal._replace(q_slot_BxT=jnp.full((1, t), t - 1))
  assert [int(_visited(m, 1024)[0].sum()) for m in (causal, full)] == [36, 64]


@pytest.mark.parametrize('experts', [4, 16])
def test_tokamax_experts_match_dense(experts):
  cfg = ModelConfig(d_model=32, num_experts=experts, num_experts_per_tok=2, d_expert=16)
  p = materialize(moe.moe_specs(cfg), jax.random.key(0), jnp.float32)
  p['router'] = jax.random.normal(jax.random.key(1), p['router'].shape)
  x = jax.random.normal(jax.random.key(2), (2, 24, cfg.d_model))
  valid = jnp.ones((2, 24), bool)

  def loss(p, x, impl):
    y, _ = moe.moe(p, x, valid, dataclasses.replace(cfg, moe_impl=impl))
    return jnp.sum(y ** 2), y

  (_, y), g = jax.value_and_grad(loss, (0, 1), has_aux=True)(p, x, 'tokamax')
  (_, y_ref), g_ref = jax.value_and_grad(loss, (0, 1), has_aux=True)(p, x, 'dense')
  np.testing.assert_allclose(y, y_ref, atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_tokamax_ragged_dot_zeroes_rows_past_the_groups():
  x = jnp.ones((10, 4))
  w = jnp.ones((2, 4, 3))
  sizes = jnp.asarray([3, 4], jnp.int32)
  y = kernels.ragged_dot(x, w, sizes)
  np.testing.assert_array_equal(y[:7], 4.0)
  np.testing.assert_array_equal(y[7:], 0.0)
  dx = jax.grad(lambda x: jnp.sum(kernels.ragged_dot(x, w, sizes)))(x)
  np.testing.assert_array_equal(dx[:7], 3.0)  # Each input feeds 3 outputs of weight 1.
  np.testing.assert_array_equal(dx[7:], 0.0)


@pytest.mark.parametrize('part', ['moe', 'train_wide', 'decode'])
def test_gpu_benchmark_runs_small_on_cpu(part):
  """The GPU suite's script at CPU sizes: every row is timed, except tokamax's GPU kernels, which
  say they do not apply here; a train step's row has its profile."""
  from experiments.benchmarks import gpu_kernels  # pylint: disable=g-import-not-at-top
  rows = gpu_kernels.PARTS[part](small=True)
  assert rows
  for row in rows:
    if row['name'].startswith(('ffn/mosaic', 'ffn/triton')):
      assert row['error'].startswith('NotImplementedError'), row
    else:
      assert row['seconds'] > 0, row
    if row['name'].startswith('train_step'):
      assert row['profile']['components']['experts'], row['profile']
      assert row['router_max_load'] >= 1, row
  if part == 'train_wide':
    assert [(r['microbatches'], r['experts']) for r in rows] == [(1, 'blocked'), (1, 'padded'), (4, 'blocked'),
                                                                 (1, 'blocked')]
  if part == 'moe':
    assert {'ffn/padded/train', 'layer/padded/train', 'layer/padded/fwd'} <= {r['name'] for r in rows}


def test_attention_long_benchmark_small_on_cpu():
  """The attention_long part at CPU sizes: causal runs fewer block pairs than all, and blockwise
  needs less temp memory than xla; both are timed."""
  from experiments.benchmarks import gpu_kernels  # pylint: disable=g-import-not-at-top
  rows = gpu_kernels.PARTS['attention_long'](small=True)
  assert [r['tokens'] for r in rows] == [256, 512]
  for r in rows:
    assert r['pairs_run'] < r['pairs_all'] and r['blockwise_temp_bytes'] < r['xla_temp_bytes'], r
    assert r['blockwise_seconds'] > 0 and r['xla_seconds'] > 0, r


def test_gpu_benchmark_breakdown_small_on_cpu():
  """The breakdown part at CPU sizes: every piece is timed and has its share of the step. XLA's
  counts of the compiled pieces order forward < forward + backward <= step, the optimizer update
  moves more bytes than it does FLOPs (memory-bound), and a block is at least the useful work
  research/metrics/flops.py counts for it. The blocks times their layers, plus the head, come within
  a sane factor of flops.py's forward + backward FLOPs (not of XLA's count of the whole
  value_and_grad, which holds the scanned layer body once)."""
  from experiments.benchmarks import gpu_kernels  # pylint: disable=g-import-not-at-top
  from research.metrics import flops as flops_lib  # pylint: disable=g-import-not-at-top
  rows = {r['name'].removeprefix('breakdown/'): r for r in gpu_kernels.breakdown_rows(small=True)}
  assert set(rows) == {'step', 'forward', 'value_and_grad', 'attention_block', 'moe_block', 'moe_route',
                       'moe_expert_ffn', 'head_and_ce', 'optimizer_update'}
  for name, row in rows.items():
    assert row['seconds'] > 0 and row['share'] == row['seconds'] / rows['step']['seconds'], (name, row)
  xla = {name: row['xla_flops'] for name, row in rows.items()}
  assert 0 < xla['forward'] < xla['value_and_grad'] <= xla['step'], xla
  assert rows['optimizer_update']['xla_bytes'] > xla['optimizer_update'] > 0
  for name in ('attention_block', 'moe_block', 'moe_route', 'moe_expert_ffn', 'head_and_ce'):
    row = rows[name]
    assert row['useful_tflop_per_s'] * row['seconds'] * 1e12 <= xla[name] * (1 + 1e-9), (name, row)
  cfg, b, t = gpu_kernels._model(small=True)  # pylint: disable=protected-access
  blocks = (xla['attention_block'] + xla['moe_block']) * cfg.num_layers + xla['head_and_ce']
  train = flops_lib.flops_per_token(cfg, t)['train'] * b * t
  assert train <= blocks <= 2.5 * train, (blocks, train)
