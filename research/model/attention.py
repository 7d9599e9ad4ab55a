"""GQA (Qwen3) and MLA (DeepSeek-V3) attention, with an optional KV cache.

Both build queries, keys and values per head and share `attend`. With a cache (a `LayerCache`), each
row's new keys are written at that row's own slot and queries attend over all cache slots; MLA caches only the compressed
latent and the shared rope key (kv_lora_rank + qk_rope_head_dim numbers per token).

The mask travels as a `MaskInfo` (segment ids and slots), never as a T x S array, and `attend` has
three paths (`attention_impl`):
  xla       - the T x S scores and mask at once. Exact reference; the CPU default.
  blockwise - flash-style in plain JAX: queries and keys in blocks, one loop over the (query block,
              key block) pairs the mask leaves visible (a causal mask: about half of them) with an
              online softmax, and a backward pass that recomputes each pair, so no step holds more
              than block x block scores per head (plus O(T) outputs and accumulators). Any mask;
              long contexts on any backend.
  tokamax   - tokamax's flash kernels (Mosaic GPU on Hopper, else Triton, else XLA: those that
              compile here, research/model/kernels.py), GQA and MLA (value head != query head), in
              training (causal within contiguous segments), prefill and decoding (a cache's valid
              slots as a B x S mask). `auto` on GPU; blockwise there when no kernel compiles.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from research.model.config import ModelConfig
from research.model import kernels
from research.model import layers
from research.model.kernels import MaskInfo
from research.model.layers import ParamSpec, rms_norm
from research.parallel.sharding import constrain

NEG_INF = -1e30  # Finite, so fully masked (padding) rows give a uniform softmax instead of NaN.


def attention_specs(cfg: ModelConfig) -> dict:
  d, h = cfg.d_model, cfg.num_heads
  out_std = cfg.init_std / (2 * cfg.num_layers) ** 0.5
  if cfg.attention == 'gqa':
    kv, dh = cfg.num_kv_heads, cfg.head_dim
    specs = {
        'q': ParamSpec((d, h, dh), ('embed', 'heads', 'head_dim')),
        'k': ParamSpec((d, kv, dh), ('embed', 'kv_heads', 'head_dim')),
        'v': ParamSpec((d, kv, dh), ('embed', 'kv_heads', 'head_dim')),
        'o': ParamSpec((h, dh, d), ('heads', 'head_dim', 'embed'), std=out_std),
    }
    if cfg.qk_norm:
      specs['q_norm'] = ParamSpec((dh,), ('norm',), 'ones')
      specs['k_norm'] = ParamSpec((dh,), ('norm',), 'ones')
    return specs
  r, dr, dn, dv = cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim, cfg.v_head_dim
  specs = {
      'kv_a': ParamSpec((d, r + dr), ('embed', 'lora')),
      'kv_a_norm': ParamSpec((r,), ('norm',), 'ones'),
      'kv_b': ParamSpec((r, h, dn + dv), ('lora', 'heads', 'head_dim')),
      'o': ParamSpec((h, dv, d), ('heads', 'head_dim', 'embed'), std=out_std),
  }
  if cfg.q_lora_rank:
    specs['q_a'] = ParamSpec((d, cfg.q_lora_rank), ('embed', 'lora'))
    specs['q_a_norm'] = ParamSpec((cfg.q_lora_rank,), ('norm',), 'ones')
    specs['q_b'] = ParamSpec((cfg.q_lora_rank, h, dn + dr), ('lora', 'heads', 'head_dim'))
  else:
    specs['q'] = ParamSpec((d, h, dn + dr), ('embed', 'heads', 'head_dim'))
  return specs


def cache_specs(cfg: ModelConfig, batch: int, max_len: int) -> dict:
  """Shapes of one layer's cache entries."""
  if cfg.attention == 'gqa':
    shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return {'k': shape, 'v': shape}
  return {'ckv': (batch, max_len, cfg.kv_lora_rank), 'kpe': (batch, max_len, cfg.qk_rope_head_dim)}


def _split_heads(q_BxTxHxQ, kh: int):
  b, t, h, dq = q_BxTxHxQ.shape
  return q_BxTxHxQ.reshape(b, t, kh, h // kh, dq)


def attend_dense(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask_BxTxS, scale):
  """Softmax attention; H = K * G query heads share each key head. Returns (out, max logit per head).

  Rows and key heads fold into one batch axis N = B * K, and a key head's G query heads and T
  queries into one axis M: dots with a single batch axis run as plain batched matmuls on XLA's CPU
  backend (two batch axes, or one that is not leading, cost several times more in decoding).
  """
  b, t, h, _ = q_BxTxHxQ.shape
  s, kh = k_BxSxKxQ.shape[1], k_BxSxKxQ.shape[2]
  g = h // kh
  heads_first = lambda x: jnp.moveaxis(x, 2, 1).reshape(b * kh, s, x.shape[-1])  # N x S x Q.
  q_NxMxQ = jnp.moveaxis(_split_heads(q_BxTxHxQ, kh), 1, 3).reshape(b * kh, g * t, -1)
  logits = jnp.einsum('nmq,nsq->nms', q_NxMxQ, heads_first(k_BxSxKxQ),
                      preferred_element_type=jnp.float32) * scale
  mask = jnp.broadcast_to(mask_BxTxS[:, None, None], (b, kh, g, t, s)).reshape(b * kh, g * t, s)
  logits = jnp.where(mask, logits, NEG_INF)
  max_logit_H = jnp.max(logits.reshape(b, kh, g, t, s), axis=(0, 3, 4)).reshape(h)
  probs = jax.nn.softmax(logits, axis=-1).astype(v_BxSxKxV.dtype)
  out = jnp.einsum('nms,nsv->nmv', probs, heads_first(v_BxSxKxV))  # N x M x V: b, k, g, t.
  return jnp.moveaxis(out.reshape(b, kh, g, t, -1), 3, 1).reshape(b, t, h, -1), max_logit_H


def _pad_to(x, axis: int, block: int, fill=0):
  return jnp.pad(x, [(0, -x.shape[axis] % block if a == axis else 0) for a in range(x.ndim)],
                 constant_values=fill)


def _padded(q_BxKxGxTxQ, k_BxSxKxQ, v_BxSxKxV, mask: MaskInfo, tq: int, tk: int):
  """Queries and keys padded to whole blocks; padding is masked (segment 0, key slot past all)."""
  q_slot_BxT = jnp.broadcast_to(mask.q_slot_BxT, mask.q_seg_BxT.shape)
  mask = MaskInfo(_pad_to(mask.q_seg_BxT, 1, tq), _pad_to(mask.kv_seg_BxS, 1, tk), _pad_to(q_slot_BxT, 1, tq),
                  _pad_to(mask.kv_slot_S, 0, tk, jnp.iinfo(mask.kv_slot_S.dtype).max))
  return _pad_to(q_BxKxGxTxQ, 3, tq), _pad_to(k_BxSxKxQ, 1, tk), _pad_to(v_BxSxKxV, 1, tk), mask


def _live_blocks(mask: MaskInfo, tq: int, tk: int):
  """nq x nk: whether (query block, key block) may hold a visible entry in any row, from each
  block's range of segment ids and slots over its non-padding entries. Never false for a pair
  with a visible entry; exact for contiguous increasing segments and for KV caches."""
  big = jnp.iinfo(jnp.int32).max

  def ranges(seg_BxN, slot_BxN, block):
    cut = lambda x: jnp.broadcast_to(x, seg_BxN.shape).astype(jnp.int32).reshape(seg_BxN.shape[0], -1, block)
    seg, slot = cut(seg_BxN), cut(slot_BxN)
    lo = lambda x: jnp.min(jnp.where(seg != 0, x, big), -1)  # Empty blocks: lo > hi, never live.
    hi = lambda x: jnp.max(jnp.where(seg != 0, x, -big), -1)
    return lo(seg), hi(seg), lo(slot), hi(slot)

  q_lo, q_hi, _, q_slot_hi = (x[:, :, None] for x in ranges(mask.q_seg_BxT, mask.q_slot_BxT, tq))
  k_lo, k_hi, k_slot_lo, _ = (x[:, None, :] for x in ranges(mask.kv_seg_BxS, mask.kv_slot_S[None], tk))
  return jnp.any((q_lo <= k_hi) & (k_lo <= q_hi) & (k_slot_lo <= q_slot_hi), axis=0)


def _over_live(live_IxJ, body, carry):
  """carry = body(i, j, carry) for each live pair (i, j): one loop of dynamic length over the list
  of live pairs, so a dead pair costs nothing (no cond per pair). Returns (carry, steps run)."""
  nk, n_live = live_IxJ.shape[1], jnp.sum(live_IxJ)
  pairs = jnp.nonzero(live_IxJ.ravel(), size=live_IxJ.size)[0]
  step = lambda c: (c[0] + 1, body(pairs[c[0]] // nk, pairs[c[0]] % nk, c[1]))
  n, carry = jax.lax.while_loop(lambda c: c[0] < n_live, step, (0, carry))
  return carry, n


def _cut(x, i, n: int, axis: int):
  return jax.lax.dynamic_slice_in_dim(x, i * n, n, axis)


def _put(x, y, i, axis: int):
  """x with its i-th block along axis set to y (in place inside the loop)."""
  return jax.lax.dynamic_update_slice_in_dim(x, y, i * y.shape[axis], axis)


def _block_scores(q, k, mask: MaskInfo, i, j, tq: int, tk: int, scale):
  """Query block i and key block j of padded inputs: the masked f32 scores and the mask."""
  qi = lambda x, axis: _cut(x, i, tq, axis)
  kj = lambda x, axis: _cut(x, j, tk, axis)
  s = jnp.einsum('bkgtq,bckq->bkgtc', qi(q, 3), kj(k, 1), preferred_element_type=jnp.float32)
  m = MaskInfo(qi(mask.q_seg_BxT, 1), kj(mask.kv_seg_BxS, 1), qi(mask.q_slot_BxT, 1), kj(mask.kv_slot_S, 0))
  m = m.dense()[:, None, None]
  return jnp.where(m, s * scale, NEG_INF), m


def _sizes(q_BxKxGxTxQ, k_BxSxKxQ, block: int):
  """Query and key block sizes: `block`, or all of T (S) when shorter (decoding: T = 1)."""
  return min(block, q_BxKxGxTxQ.shape[3]), min(block, k_BxSxKxQ.shape[1])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _blockwise(q_BxKxGxTxQ, k_BxSxKxQ, v_BxSxKxV, mask: MaskInfo, scale: float, block: int):
  return _blockwise_fwd(q_BxKxGxTxQ, k_BxSxKxQ, v_BxSxKxV, mask, scale, block)[0]


def _blockwise_fwd(q, k, v, mask: MaskInfo, scale: float, block: int):
  b, kh, g, t, _ = q.shape
  tq, tk = _sizes(q, k, block)
  qp, kp, vp, mp = _padded(q, k, v, mask, tq, tk)

  def step(i, j, carry):
    o, m, l = (_cut(x, i, tq, 3) for x in carry)  # Query block i's running output, max and sum.
    s, _ = _block_scores(qp, kp, mp, i, j, tq, tk, scale)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    o = o * corr[..., None] + jnp.einsum('bkgtc,bckv->bkgtv', p.astype(v.dtype), _cut(vp, j, tk, 1),
                                         preferred_element_type=jnp.float32)
    return tuple(_put(x, y, i, 3) for x, y in zip(carry, (o, m_new, l * corr + jnp.sum(p, axis=-1))))

  tp = qp.shape[3]
  init = (jnp.zeros((b, kh, g, tp, v.shape[-1]), jnp.float32),
          jnp.full((b, kh, g, tp), -jnp.inf, jnp.float32), jnp.zeros((b, kh, g, tp), jnp.float32))
  (o, m, l), _ = _over_live(_live_blocks(mp, tq, tk), step, init)
  # Rows of a query block that meets no live key block keep l = 0: output 0, max logit NEG_INF.
  m, l = jnp.maximum(m[..., :t], NEG_INF), jnp.where(l[..., :t] > 0, l[..., :t], 1)
  out = (o[..., :t, :] / l[..., None]).astype(q.dtype)
  return (out, m), (q, k, v, mask, out, m + jnp.log(l))


def _blockwise_bwd(scale, block, res, cts):
  q, k, v, mask, out, lse = res
  tq, tk = _sizes(q, k, block)
  d_out = cts[0].astype(jnp.float32)  # The running max is a statistic: no gradient flows back.
  delta = jnp.sum(d_out * out.astype(jnp.float32), axis=-1)
  d_out, delta, lse = (_pad_to(x, 3, tq) for x in (d_out, delta, lse))
  qp, kp, vp, mp = _padded(q, k, v, mask, tq, tk)

  def step(i, j, carry):
    dq, dk, dv = carry
    add = lambda x, y, at, axis: _put(x, _cut(x, at, y.shape[axis], axis) + y, at, axis)
    qi, kj, vj = _cut(qp, i, tq, 3), _cut(kp, j, tk, 1), _cut(vp, j, tk, 1)
    do, delta_i, lse_i = (_cut(x, i, tq, 3) for x in (d_out, delta, lse))
    s, m = _block_scores(qp, kp, mp, i, j, tq, tk, scale)
    p = jnp.exp(s - lse_i[..., None])
    dv = add(dv, jnp.einsum('bkgtc,bkgtv->bckv', p, do), j, 1)
    dp = jnp.einsum('bkgtv,bckv->bkgtc', do, vj.astype(jnp.float32))
    ds = jnp.where(m, p * (dp - delta_i[..., None]), 0) * scale
    dq = add(dq, jnp.einsum('bkgtc,bckq->bkgtq', ds, kj.astype(jnp.float32)), i, 3)
    return dq, add(dk, jnp.einsum('bkgtc,bkgtq->bckq', ds, qi.astype(jnp.float32)), j, 1), dv

  zeros = lambda x: jnp.zeros(x.shape, jnp.float32)
  (dq, dk, dv), _ = _over_live(_live_blocks(mp, tq, tk), step, (zeros(qp), zeros(kp), zeros(vp)))
  t, s = q.shape[3], k.shape[1]
  return dq[..., :t, :].astype(q.dtype), dk[:, :s].astype(k.dtype), dv[:, :s].astype(v.dtype), None


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


def attend_blockwise(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask: MaskInfo, scale, block: int = 512):
  """`attend_dense` without the T x S arrays: returns (out, max logit per head)."""
  b, t, h, _ = q_BxTxHxQ.shape
  q = jnp.moveaxis(_split_heads(q_BxTxHxQ, k_BxSxKxQ.shape[2]), 1, 3)
  out, m = _blockwise(q, k_BxSxKxQ, v_BxSxKxV, mask, float(scale), block)
  max_logit_H = jnp.max(jax.lax.stop_gradient(m), axis=(0, 3)).reshape(h)
  return jnp.moveaxis(out, 3, 1).reshape(b, t, h, -1), max_logit_H


def resolve_impl(impl: str) -> str:
  if impl != 'auto':
    return impl
  if jax.default_backend() == 'gpu':
    return 'tokamax' if kernels.gpu_kernels('attention') else 'blockwise'
  return 'xla'


def attend(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask: MaskInfo, scale, impl: str, block: int = 512,
           cached: bool = False):
  """Softmax attention by `impl` (xla, blockwise or tokamax). Returns (out, max logit per head).

  cached: keys come from a KV cache (research/model/kernels.tokamax_mask says what tokamax assumes).
  """
  if impl == 'xla':
    return attend_dense(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask.dense(), scale)
  if impl == 'blockwise':
    return attend_blockwise(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask, scale, block)
  out = kernels.flash_attention(q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV, mask, scale, cached)
  # QK-clip's statistic: a forward-only blockwise pass, removed by XLA when nothing reads it.
  _, max_logit_H = attend_blockwise(*map(jax.lax.stop_gradient, (q_BxTxHxQ, k_BxSxKxQ, v_BxSxKxV)),
                                    mask, scale, block)
  return out, max_logit_H


def write_rows(cache_BxSx, new_BxTx, write_at_B, layer=None):
  """Writes each row's new entries at that row's own slots write_at..write_at+T-1 (of the stack's
  `layer` when given: cache L x B x S x ...); slots past the cache's end are dropped (a chunk's
  padding may overhang it; its real entries never do). One scatter: vmapping an update over the
  row axis would make XLA transpose, and copy, the whole cache."""
  b, t = new_BxTx.shape[:2]
  at = (jnp.arange(b)[:, None], write_at_B[:, None] + jnp.arange(t))
  at = at if layer is None else (layer, *at)
  return cache_BxSx.at[at].set(new_BxTx.astype(cache_BxSx.dtype), mode='drop')


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LayerCache:
  """One layer's view of a stack of layer caches (L x B x S x ...), as a scan over layers carries it.

  `write` puts the layer's new entries straight into the stack at each row's own slot and reads the
  layer back: the stack stays one buffer that XLA updates in place, where scanning the cache as a
  per-layer input and output would copy every layer's whole cache on every decoding step.
  """
  stack: dict                       # name -> L x B x S x ... (attention's cache_specs per layer).
  layer: jax.Array                  # This layer's index into the stack.
  write_at_B: jax.Array             # Each row's first slot to write.
  # Slots attention reads, from the first (None: all S): a short trajectory in a long cache reads
  # only the part it fills. Static: each span is a program of its own.
  span: int | None = dataclasses.field(default=None, metadata=dict(static=True))

  def write(self, new: dict) -> tuple['LayerCache', dict]:
    """new: name -> B x T x ... . Returns (the updated view, this layer's entries B x span x ...)."""
    stack = {**self.stack, **{name: write_rows(self.stack[name], x, self.write_at_B, self.layer)
                              for name, x in new.items()}}
    return dataclasses.replace(self, stack=stack), {name: stack[name][self.layer, :, :self.span]
                                                    for name in new}


def _rope(x, pos_BxT, cfg: ModelConfig):
  if cfg.rope_yarn_factor == 1.0:
    return layers.rope(x, pos_BxT, cfg.rope_theta, cfg.rope_interleaved)
  freq = layers.yarn_frequencies(cfg.rope_dim, cfg.rope_theta, cfg.rope_yarn_factor,
                                 cfg.rope_yarn_original_len, cfg.rope_yarn_beta_fast,
                                 cfg.rope_yarn_beta_slow)
  return layers.rope(x, pos_BxT, cfg.rope_theta, cfg.rope_interleaved, freq,
                     cfg.rope_yarn_attention_factor)


@functools.partial(jax.named_call, name='attention')
def attention(p: dict, x_BxTxD, pos_BxT, mask: MaskInfo, cfg: ModelConfig, cache: LayerCache | None = None):
  """Returns (out_BxTxD, the updated LayerCache or None, max_logit_H)."""
  dt = x_BxTxD.dtype
  w = lambda name: p[name].astype(dt)
  if cfg.attention == 'gqa':
    q = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('q'))
    k = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('k'))
    v = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('v'))
    if cfg.qk_norm:
      q, k = rms_norm(q, p['q_norm'], cfg.norm_eps), rms_norm(k, p['k_norm'], cfg.norm_eps)
    q, k = _rope(q, pos_BxT, cfg), _rope(k, pos_BxT, cfg)
    if cache is not None:
      cache, entries = cache.write({'k': k, 'v': v})
      k, v = entries['k'].astype(dt), entries['v'].astype(dt)
    scale = cfg.head_dim ** -0.5
  else:
    dn, r = cfg.qk_nope_head_dim, cfg.kv_lora_rank
    if cfg.q_lora_rank:
      q_lat = rms_norm(x_BxTxD @ w('q_a'), p['q_a_norm'], cfg.norm_eps)
      q = jnp.einsum('btr,rhq->bthq', q_lat, w('q_b'))
    else:
      q = jnp.einsum('btd,dhq->bthq', x_BxTxD, w('q'))
    q = jnp.concatenate([q[..., :dn], _rope(q[..., dn:], pos_BxT, cfg)], -1)
    kv_a = x_BxTxD @ w('kv_a')
    ckv_BxTxR = rms_norm(kv_a[..., :r], p['kv_a_norm'], cfg.norm_eps)
    kpe_BxTxR = _rope(kv_a[..., None, r:], pos_BxT, cfg)[:, :, 0]
    if cache is not None:
      cache, entries = cache.write({'ckv': ckv_BxTxR, 'kpe': kpe_BxTxR})
      ckv_BxTxR, kpe_BxTxR = entries['ckv'].astype(dt), entries['kpe'].astype(dt)
    kv = jnp.einsum('bsr,rhq->bshq', ckv_BxTxR, w('kv_b'))
    k_nope, v = kv[..., :dn], kv[..., dn:]
    kpe = jnp.broadcast_to(kpe_BxTxR[:, :, None], (*k_nope.shape[:3], kpe_BxTxR.shape[-1]))
    k = jnp.concatenate([k_nope, kpe], axis=-1)
    scale = cfg.qk_head_dim ** -0.5
  q = constrain(q, ('act_batch', 'act_seq', 'act_heads', None))
  out, max_logit_H = attend(q, k, v, mask, scale * cfg.attn_scale_mult, resolve_impl(cfg.attention_impl),
                            cfg.attention_block, cached=cache is not None)
  out = jnp.einsum('bthv,hvd->btd', out, w('o'))
  return out, cache, max_logit_H
