"""Dropless Mixture-of-Experts: router, grouped expert FFN on three paths, expert parallelism.

Paths (same math, chosen by `moe_impl`):
  dense   - every token through every expert, combined with a sparse weight matrix. Test reference.
  ragged  - sort token copies by expert, `jax.lax.ragged_dot`, unsort. A grouped GEMM kernel on TPU;
            on CPU XLA lowers it to a product over all experts (E/k times the FLOPs), and on an
            H200 with jax 0.11.2 it ran 2-19x slower than `blocked` (docs/benchmarks.md).
  blocked - sort by expert, pad each expert's group to a multiple of a block size, one batched matmul
            over blocks with each block's expert weights. Compiled FLOPs stay within
            1 + E * (block - 1) / (N * k) of the ideal; the `auto` choice on CPU.
  tokamax - sort by expert, tokamax's grouped GEMM (research/model/kernels.py: Mosaic GPU kernels on
            Hopper, Triton, else XLA's ragged_dot), with its own backward kernels; `auto` on GPU.
  padded  - sort by expert, each expert's rows in a fixed number of zero-padded slots
            (`moe_capacity_factor` x the mean group), one batched matmul per projection: the
            device's dense GEMM (cuBLAS on a GPU), at the price of the padding's FLOPs. A layer whose
            largest group exceeds the slots runs `moe_fallback_impl` instead (`jax.lax.cond`), so no
            token is dropped.
Expert parallelism: `jax.shard_map` over the mesh; token copies travel to the devices that own their
experts and come back through `jax.lax.ragged_all_to_all` (`ep_exchange='ragged'`, GPU and TPU), or
through its emulation by a dense all-to-all of padded chunks (`'all_to_all'`, runs everywhere).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from research.model import kernels
from research.model.config import ModelConfig
from research.model.layers import ParamSpec, swiglu, swiglu_specs, take_rows
from research.parallel import sharding
from research.parallel.mesh import axis_size


def moe_specs(cfg: ModelConfig) -> dict:
  e, d, f = cfg.num_experts, cfg.d_model, cfg.d_expert
  out_std = cfg.init_std / (2 * cfg.num_layers) ** 0.5
  specs = {
      'router': ParamSpec((d, e), ('embed', None)),
      'wi_gate': ParamSpec((e, d, f), ('experts', 'expert_embed', 'expert_mlp')),
      'wi_up': ParamSpec((e, d, f), ('experts', 'expert_embed', 'expert_mlp')),
      'wo': ParamSpec((e, f, d), ('experts', 'expert_mlp', 'expert_embed'), std=out_std),
  }
  if cfg.router == 'sigmoid':
    specs['router_bias'] = ParamSpec((e,), (None,), 'zeros')
  if cfg.num_shared_experts:
    specs['shared'] = swiglu_specs(d, cfg.num_shared_experts * f)
  return specs


# ----------------------------------------------------------------------------------------------
# Router.


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
def _router_logits(x_NxD, router_DxE):
  """float32 logits; the backward casts x again rather than keep a float32 copy of it."""
  return x_NxD.astype(jnp.float32) @ router_DxE.astype(jnp.float32)


@functools.partial(jax.named_call, name='router')
def route(p: dict, x_NxD, valid_N, cfg: ModelConfig, experts_NxK=None):
  """Top-k routing in float32. Returns (weights_NxK, experts_NxK, stats).

  softmax: probs over all experts, top-k, optional renormalisation (Qwen3-MoE).
  sigmoid: scores s; selection by s + bias (bias only for selection), optional group limit;
           combine weights from the unbiased s, normalised, times routed_scaling_factor (DeepSeek-V3).
  Given experts_NxK (router replay), selection is skipped and only the weights are recomputed.
  """
  e, k = cfg.num_experts, cfg.num_experts_per_tok
  logits_NxE = _router_logits(x_NxD, p['router'])
  if cfg.router == 'softmax':
    score_NxE = probs_NxE = jax.nn.softmax(logits_NxE, axis=-1)
    choice_NxE = score_NxE
  else:
    score_NxE = jax.nn.sigmoid(logits_NxE)
    probs_NxE = score_NxE / jnp.sum(score_NxE, axis=-1, keepdims=True)
    choice_NxE = score_NxE + jax.lax.stop_gradient(p['router_bias'].astype(jnp.float32))
    if cfg.n_group > 1:
      groups = choice_NxE.reshape(-1, cfg.n_group, e // cfg.n_group)
      group_score = jnp.sum(jax.lax.top_k(groups, min(2, e // cfg.n_group))[0], axis=-1)
      _, keep = jax.lax.top_k(group_score, cfg.topk_group)
      keep_NxG = jnp.zeros_like(group_score, bool).at[jnp.arange(keep.shape[0])[:, None], keep].set(True)
      choice_NxE = jnp.where(jnp.repeat(keep_NxG, e // cfg.n_group, axis=1), choice_NxE, -jnp.inf)
  if experts_NxK is None:
    _, experts_NxK = jax.lax.top_k(choice_NxE, k)
  experts = experts_NxK
  weights = jnp.take_along_axis(score_NxE, experts, axis=-1)
  if cfg.norm_topk_prob:
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
  if cfg.router == 'sigmoid':
    weights = weights * cfg.routed_scaling_factor
  # Statistics over real (non-padding) tokens.
  v = valid_N.astype(jnp.float32)
  n_valid = jnp.maximum(jnp.sum(v), 1.0)
  counts_E = jnp.zeros((e,), jnp.float32).at[experts.reshape(-1)].add(jnp.repeat(v, k))
  load_E = counts_E / (n_valid * k)  # Fraction of routed copies per expert; sums to 1.
  mean_prob_E = jnp.sum(probs_NxE * v[:, None], axis=0) / n_valid
  stats = {
      'load': load_E,
      'aux_loss': e * jnp.sum(jax.lax.stop_gradient(load_E) * mean_prob_E),
      'z_loss': jnp.sum(jax.nn.logsumexp(logits_NxE, axis=-1) ** 2 * v) / n_valid,
      'routes': experts.astype(jnp.int32),
  }
  return weights, experts, stats


def update_router_bias(bias_E, load_E, rate: float):
  """Aux-loss-free balancing: raise the bias of under-loaded experts, lower over-loaded ones."""
  return bias_E + rate * jnp.sign(jnp.mean(load_E) - load_E).astype(bias_E.dtype)


# ----------------------------------------------------------------------------------------------
# Expert FFN paths. Weights: wi_gate, wi_up (E, D, F), wo (E, F, D).


@functools.partial(jax.named_call, name='experts')
def experts_dense(p, x_NxD, weights_NxK, experts_NxK):
  """Reference: every expert on every token."""
  dt = x_NxD.dtype
  h = jax.nn.silu(jnp.einsum('nd,edf->nef', x_NxD, p['wi_gate'].astype(dt)))
  h = h * jnp.einsum('nd,edf->nef', x_NxD, p['wi_up'].astype(dt))
  y_NxExD = jnp.einsum('nef,efd->ned', h, p['wo'].astype(dt))
  n = x_NxD.shape[0]
  combine_NxE = jnp.zeros((n, p['wo'].shape[0]), dt).at[jnp.arange(n)[:, None], experts_NxK].add(
      weights_NxK.astype(dt))
  return jnp.einsum('ned,ne->nd', y_NxExD, combine_NxE)


class ExpertPath(NamedTuple):
  """How the routed experts run: ModelConfig's `moe_*` fields with `auto` resolved (`expert_path`)."""
  impl: str                      # dense, ragged, blocked, tokamax or padded.
  block: int = 0                 # blocked: rows per block (0 picks one).
  capacity_factor: float = ModelConfig.moe_capacity_factor  # padded: slots per expert over the mean group.
  fallback: str = 'blocked'      # padded: the path of a layer whose largest group exceeds its slots.


def expert_path(cfg: ModelConfig) -> ExpertPath:
  return ExpertPath(resolve_impl(cfg.moe_impl), cfg.moe_block_size, cfg.moe_capacity_factor,
                    resolve_impl(cfg.moe_fallback_impl))


def capacity(num_rows: int, num_experts: int, factor: float) -> int:
  """Slots per expert of the padded path: factor x the mean group, rounded up to a multiple of 8
  (of 128, a GEMM tile, from 512 up), at most num_rows."""
  slots = -(-int(factor * num_rows) // num_experts)
  align = 128 if slots >= 512 else 8
  return min(num_rows, -(-slots // align) * align)


def block_size(num_rows: int, num_experts: int, requested: int = 0) -> int:
  """Largest power of two whose padding (< E * block rows) stays under 25% of the rows."""
  if requested:
    return requested
  target = max(1, num_rows // (4 * num_experts))
  return min(256, 1 << (target.bit_length() - 1))


# What the expert FFN's backward keeps (`dispatched_ffn`'s checkpoint): the gate and up projections and
# the weights cast to the compute dtype (when parameters are stored wider). The rows in expert order
# are gathered again from the token rows (kept anyway: the router's input), silu(gate) * up is
# recomputed, and the routing weights, applied to the hidden units before the down projection, take
# their gradient from M x F values the backward has (no M x D output is kept for them). Left to
# itself the backward also keeps the sorted rows, the output rows and four more M x F arrays per
# layer. Recomputing the casts too makes it worse: XLA then transposes the float32 parameter stacks
# for the backward's W^T (docs/benchmarks.md).
_FFN_SAVED = jax.checkpoint_policies.save_only_these_names('expert_gate', 'expert_up', 'expert_weight')


def _swiglu_hidden(gate, up, scale_M):
  """silu(gate) * up, each row scaled by scale_M (None: 1). gate and up are named for the checkpoint."""
  h = (jax.nn.silu(jax.ad_checkpoint.checkpoint_name(gate, 'expert_gate'))
       * jax.ad_checkpoint.checkpoint_name(up, 'expert_up'))
  return h if scale_M is None else h * scale_M.astype(h.dtype)[..., None]


def _compute_weights(p, dtype) -> dict:
  """The expert weights in the compute dtype; casts are named for the checkpoint."""
  cast = lambda w: w if w.dtype == dtype else jax.ad_checkpoint.checkpoint_name(w.astype(dtype), 'expert_weight')
  return {k: cast(p[k]) for k in ('wi_gate', 'wi_up', 'wo')}


def _ffn_grouped(p, xs_MxD, grouped_dot, scale_M, fuse_gate_up: bool = False):
  """SwiGLU through a grouped matmul grouped_dot(rows, weights E x K x N). fuse_gate_up: gate and up
  as one product against [W_gate W_up] (one input gradient in the backward instead of two to add),
  for a copy of those weights and of their gradient (+36 GiB for 384 experts of Kimi K2's shape on
  one device; gpu_aot)."""
  w = _compute_weights(p, xs_MxD.dtype)
  if fuse_gate_up:
    gate_up_MxG = grouped_dot(xs_MxD, jnp.concatenate([w['wi_gate'], w['wi_up']], axis=-1))
    gate, up = jnp.split(gate_up_MxG, 2, axis=-1)
  else:
    gate, up = grouped_dot(xs_MxD, w['wi_gate']), grouped_dot(xs_MxD, w['wi_up'])
  return grouped_dot(_swiglu_hidden(gate, up, scale_M), w['wo'])


def _ffn_blocked(p, xs_MxD, group_sizes_E, block: int, scale_M):
  """Grouped matmul over blocks; rows past sum(group_sizes) are ignored (their output is zero)."""
  m, d = xs_MxD.shape
  e = group_sizes_E.shape[0]
  n_blocks = (m + e * (block - 1)) // block  # Upper bound on sum_e ceil(g_e / block).
  padded_E = -(-group_sizes_E // block) * block
  padded_end_E = jnp.cumsum(padded_E)
  start_E = jnp.cumsum(group_sizes_E) - group_sizes_E
  row_expert_M = jnp.searchsorted(jnp.cumsum(group_sizes_E), jnp.arange(m), side='right')
  real_M = row_expert_M < e
  row_expert_M = jnp.minimum(row_expert_M, e - 1)
  dest_M = padded_end_E[row_expert_M] - padded_E[row_expert_M] + jnp.arange(m) - start_E[row_expert_M]
  dest_M = jnp.where(real_M, dest_M, n_blocks * block)  # Out of range: dropped by the scatter.
  to_blocks = lambda a_M: jnp.zeros((n_blocks * block, *a_M.shape[1:]), a_M.dtype).at[dest_M].set(
      a_M, mode='drop').reshape(n_blocks, block, *a_M.shape[1:])
  xb_BxRxD = to_blocks(xs_MxD)
  block_expert_B = jnp.minimum(
      jnp.searchsorted(padded_end_E, jnp.arange(n_blocks) * block, side='right'), e - 1)
  dt = xs_MxD.dtype
  w = lambda name: take_rows(p[name], block_expert_B, dt)
  h = _swiglu_hidden(jnp.einsum('brd,bdf->brf', xb_BxRxD, w('wi_gate')),
                     jnp.einsum('brd,bdf->brf', xb_BxRxD, w('wi_up')),
                     None if scale_M is None else to_blocks(scale_M))
  yb = jnp.einsum('brf,bfd->brd', h, w('wo')).reshape(-1, d)
  return jnp.where(real_M[:, None], yb.at[dest_M].get(mode='fill', fill_value=0), 0)


def _ffn_padded(p, xs_MxD, group_sizes_E, slots: int, scale_M, fallback):
  """Each expert's rows in `slots` zero-padded slots and one batched matmul per projection, if every
  group fits; otherwise fallback(weights, xs_MxD, scale_M). Rows past sum(group_sizes) give zeros."""
  m, e = xs_MxD.shape[0], group_sizes_E.shape[0]
  end_E = jnp.cumsum(group_sizes_E)
  start_E = end_E - group_sizes_E
  slot_C = jnp.arange(slots)
  # Slot (e, c) holds row start_E[e] + c; row r sits in slot expert_r * slots + (r - start_E[expert_r]).
  # Out-of-range entries (empty slots, rows past the groups) read as zeros.
  row_of_slot = jnp.where(slot_C < group_sizes_E[:, None], start_E[:, None] + slot_C, m).reshape(-1)
  row_M = jnp.arange(m)
  expert_M = jnp.minimum(jnp.searchsorted(end_E, row_M, side='right'), e - 1)
  slot_of_row = jnp.where(row_M < end_E[-1], expert_M * slots + row_M - start_E[expert_M], e * slots)
  # Cast once, outside the cond: each branch's own cast would be a residual of its own.
  w = _compute_weights(p, xs_MxD.dtype)

  # Each product takes rows and gives rows: the backward keeps gate and up as M x F, the fallback's
  # layout, so the cond's two branches share those residuals instead of keeping both (+13 GiB at
  # gpu_kernels' wide shape), for three more gathers of M x F each way. Gate and up fused: with
  # two products XLA computed their two E x slots x D input gradients twice a layer to fit the wide
  # step (about 50 TFLOP a step; gpu_aot).
  def slotted_dot(x_MxK, w_ExKxN):
    x_ExCxK = permute_rows(x_MxK, row_of_slot, slot_of_row).reshape(e, slots, -1)
    y_ExCxN = jnp.einsum('eck,ekn->ecn', x_ExCxK, w_ExKxN)
    return permute_rows(y_ExCxN.reshape(e * slots, -1), slot_of_row, row_of_slot)
  padded = lambda w, xs_MxD, scale_M: _ffn_grouped(w, xs_MxD, slotted_dot, scale_M, fuse_gate_up=True)
  return jax.lax.cond(jnp.max(group_sizes_E) <= slots, padded, fallback, w, xs_MxD, scale_M)


@functools.partial(jax.named_call, name='experts')
def grouped_ffn(p, xs_MxD, group_sizes_E, path: ExpertPath, scale_M=None, slots: int = 0):
  """SwiGLU experts over rows sorted by expert (group_sizes_E rows each, the rest ignored); row m's
  hidden units (so its output) scaled by scale_M[m] if given. slots: the padded path's slots per
  expert (0: sized for the M rows given, all real; expert parallelism's buffers are not)."""
  if path.impl != 'padded':
    return _grouped(p, xs_MxD, group_sizes_E, path.impl, path.block, scale_M)
  # The fallback fuses gate and up too: branches of one shape share XLA's buffers (384 experts of
  # Kimi K2's shape on one device: 132.9 GiB fused both, 155.9 with the fallback's two products).
  fallback = lambda w, xs, scale: _grouped(w, xs, group_sizes_E, path.fallback, path.block, scale,
                                           fuse_gate_up=True)
  slots = slots or capacity(xs_MxD.shape[0], group_sizes_E.shape[0], path.capacity_factor)
  return _ffn_padded(p, xs_MxD, group_sizes_E, slots, scale_M, fallback)


def _grouped(p, xs_MxD, group_sizes_E, impl: str, block: int, scale_M, fuse_gate_up: bool = False):
  """grouped_ffn on one of the grouped paths (ragged, tokamax, blocked: it never fuses)."""
  if impl == 'ragged':
    return _ffn_grouped(p, xs_MxD, lambda x, w: jax.lax.ragged_dot(x, w, group_sizes_E), scale_M, fuse_gate_up)
  if impl == 'tokamax':
    return _ffn_grouped(p, xs_MxD, lambda x, w: kernels.ragged_dot(x, w, group_sizes_E), scale_M, fuse_gate_up)
  return _ffn_blocked(p, xs_MxD, group_sizes_E, block_size(xs_MxD.shape[0], group_sizes_E.shape[0], block),
                      scale_M)


def dispatched_ffn(p, src_SxD, repeats: int, perm_M, inverse_M, group_sizes_E, path: ExpertPath,
                   scale_M=None, slots: int = 0):
  """grouped_ffn on the rows jnp.repeat(src, repeats)[perm_M] (in expert order; inverse_M the
  inverse permutation), under the checkpoint that keeps `_FFN_SAVED` only."""
  @functools.partial(jax.checkpoint, policy=_FFN_SAVED)
  def run(p, src_SxD, scale_M):
    with jax.named_scope('dispatch'):
      xs_MxD = permute_rows(jnp.repeat(src_SxD, repeats, axis=0), perm_M, inverse_M)
    return grouped_ffn(p, xs_MxD, group_sizes_E, path, scale_M, slots)
  return run(p, src_SxD, scale_M)


# Moving rows into and out of expert order, by gathers only, forward and backward. jax transposes
# a gather into a scatter-add (atomics on a GPU, and for a `.set` a second, u32 scatter to find
# which write won); the transpose of a permutation is the inverse permutation, another gather. A
# token's k copies are jnp.repeat's rows permuted (XLA fuses the repeat into the gather; its
# transpose adds the copies back).


@functools.partial(jax.named_call, name='dispatch')
def sort_order(ids_M):
  """(order, inverse): ids_M[order] ascending (stable), order[inverse] = arange."""
  order = jnp.argsort(ids_M, stable=True)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype),
                                                unique_indices=True)
  return order, inverse


def _take(x, idx):
  return x.at[idx].get(mode='fill', fill_value=0)


@jax.custom_vjp
def permute_rows(x_MxD, perm_M, inverse_M):
  """x_MxD[perm_M] for a permutation perm_M whose inverse is inverse_M. Also for a partial one
  (the padded path's slots): an out-of-range perm_M[i] gives a zero row i, an out-of-range
  inverse_M[j] says row j goes nowhere."""
  return _take(x_MxD, perm_M)


def _permute_fwd(x_MxD, perm_M, inverse_M):
  return _take(x_MxD, perm_M), (perm_M, inverse_M)


def _permute_bwd(res, g_MxD):
  perm_M, inverse_M = res
  return _take(g_MxD, inverse_M), None, None


permute_rows.defvjp(_permute_fwd, _permute_bwd)


@functools.partial(jax.named_call, name='combine')
def _combine(ys_MxD, order, inverse, n: int, k: int):
  """Token n's output: the sum of its k (already weighted) copies, rows ys_MxD in expert order."""
  y_NxKxD = permute_rows(ys_MxD, inverse, order).reshape(n, k, -1)
  return jnp.sum(y_NxKxD, axis=1, dtype=jnp.float32).astype(ys_MxD.dtype)


def experts_sorted(p, x_NxD, weights_NxK, experts_NxK, path: ExpertPath):
  """Sort token copies by expert, grouped FFN, unsort and combine. No token is dropped."""
  n, k = experts_NxK.shape
  e = p['wo'].shape[0]
  flat_e = experts_NxK.reshape(-1)
  order, inverse = sort_order(flat_e)
  group_sizes = jnp.bincount(flat_e, length=e).astype(jnp.int32)
  with jax.named_scope('dispatch'):
    scale_M = permute_rows(weights_NxK.reshape(-1), order, inverse)
  ys = dispatched_ffn(p, x_NxD, k, order, inverse, group_sizes, path, scale_M)
  return _combine(ys, order, inverse, n, k)


def resolve_impl(impl: str) -> str:
  if impl != 'auto':
    return impl
  if jax.default_backend() == 'gpu':
    return 'tokamax' if kernels.gpu_kernels('ragged_dot') else 'blocked'
  return 'ragged' if jax.default_backend() == 'tpu' else 'blocked'


def _local_experts(p, x_NxD, weights_NxK, experts_NxK, path: ExpertPath):
  if path.impl == 'dense':
    return experts_dense(p, x_NxD, weights_NxK, experts_NxK)
  return experts_sorted(p, x_NxD, weights_NxK, experts_NxK, path)


# ----------------------------------------------------------------------------------------------
# Expert parallelism.


def _ragged_all_to_all_emulated(operand, output, input_offsets, send_sizes, output_offsets,
                                recv_sizes, axis_name):
  """`jax.lax.ragged_all_to_all`'s semantics from a dense all_to_all (XLA:CPU lacks the primitive).

  Every slice travels padded to min(len(operand), len(output)) rows, the longest a slice can be;
  rows of `output` that receive nothing keep their values.
  """
  rows = min(operand.shape[0], output.shape[0])
  r = jnp.arange(rows)
  src_KxR = jnp.where(r < send_sizes[:, None], input_offsets[:, None] + r, operand.shape[0])
  chunks = jnp.take(operand, src_KxR, axis=0, mode='fill', fill_value=0)
  a2a = lambda a: jax.lax.all_to_all(a, axis_name, 0, 0, tiled=True)
  dst_KxR = jnp.where(r < recv_sizes[:, None], a2a(output_offsets)[:, None] + r, output.shape[0])
  recv = a2a(chunks).reshape(-1, *operand.shape[1:])
  # Scatter row numbers, then gather rows: on XLA:CPU this beats scattering the rows themselves.
  from_M = jnp.full(output.shape[0], -1).at[dst_KxR.reshape(-1)].set(
      jnp.arange(recv.shape[0]), mode='drop')
  got = jnp.expand_dims(from_M >= 0, tuple(range(1, output.ndim)))
  return jnp.where(got, recv[jnp.maximum(from_M, 0)], output)


def resolve_exchange(exchange: str) -> str:
  if exchange != 'auto':
    return exchange
  return 'all_to_all' if jax.default_backend() == 'cpu' else 'ragged'


# Expert weights inside the shard_map: the model dimension whole (gathered over FSDP first).
_EP_WEIGHT_AXES = {'wi_gate': ('experts', None, 'expert_mlp'),
                   'wi_up': ('experts', None, 'expert_mlp'),
                   'wo': ('experts', 'expert_mlp', None)}


def _collective_axes(names: tuple[str, ...]):
  return names[0] if len(names) == 1 else names


def _expert_axes(num_experts: int, mesh) -> tuple[str, ...]:
  """The mesh axes the rules spread the experts over (those that divide them)."""
  p = sharding.fit_spec(sharding.spec(('experts',)), (num_experts,), mesh)
  return sharding.entry_axes(p[0])


def _received_experts(pw, recv_x, recv_w, recv_e, sizes_L, e_local: int, c: int, path: ExpertPath):
  """The local experts on the rows a device received (expert id `e_local` marks padding), each
  row's output times its routing weight."""
  if path.impl == 'dense':
    real = jnp.where(recv_e < e_local, recv_w, 0).astype(recv_x.dtype)[:, None]
    return experts_dense(pw, recv_x, real, jnp.minimum(recv_e, e_local - 1)[:, None])
  r_order, r_inverse = sort_order(recv_e)  # Padding sorts last, past every group.
  ys = dispatched_ffn(pw, recv_x, 1, r_order, r_inverse, sizes_L, path,
                      permute_rows(recv_w, r_order, r_inverse), capacity(c, e_local, path.capacity_factor))
  return permute_rows(ys, r_inverse, r_order)


def _expert_parallel(p, x_NxD, weights_NxK, experts_NxK, path: ExpertPath, mesh, transport):
  """shard_map over the mesh, laid out by the rules: tokens split as `act_batch`, experts as
  `experts`, the expert hidden units F as `expert_mlp` (by default the mesh axes `data, fsdp,
  expert`, `expert` and `tensor`).

  Each device sorts its C = N_local * k token copies by expert (hence by owning device), sends each
  owner its rows and their routing weights with `transport` (`jax.lax.ragged_all_to_all` or its
  emulation), runs its local experts on what it receives (weights applied to the hidden units) and
  sends the results back the same way. Offsets come from the all-gathered counts. The receive buffer
  has the static worst case of ep * C rows (every peer routing everything here), so nothing is
  dropped; the real primitive moves only the real rows. Sharding F leaves partial sums of the
  down-projection, added with a psum. The padded path sizes its slots for the C rows a device
  receives when routing is balanced, not for the buffer.
  """
  wspec = {k: sharding.fit_spec(sharding.spec(axes), p[k].shape, mesh)
           for k, axes in _EP_WEIGHT_AXES.items()}
  tok = sharding.fit_spec(sharding.spec(('act_batch', None)), x_NxD.shape, mesh)
  ep_names, f_names = (sharding.entry_axes(a) for a in wspec['wo'][:2])
  ep_axis = _collective_axes(ep_names)
  ep = axis_size(mesh, ep_names)
  e = p['wo'].shape[0]
  e_local = e // ep
  pw = {k: p[k] for k in wspec}

  def body(pw, x_NxD, weights_NxK, experts_NxK):
    n, k = experts_NxK.shape
    c, d = n * k, x_NxD.shape[1]
    flat_e = experts_NxK.reshape(-1)
    order, inverse = sort_order(flat_e)
    # counts[i, j, l]: copies device i sends to local expert l of device j.
    counts_PxPxL = jax.lax.all_gather(
        jnp.bincount(flat_e, length=e).astype(jnp.int32).reshape(ep, e_local), ep_axis)
    me = jax.lax.axis_index(ep_axis)
    sizes_PxP = jnp.sum(counts_PxPxL, axis=-1)
    send_start_PxP = jnp.cumsum(sizes_PxP, axis=1) - sizes_PxP  # In the sender's sorted rows.
    recv_start_PxP = jnp.cumsum(sizes_PxP, axis=0) - sizes_PxP  # In the receiver's buffer.
    transport_ = jax.named_call(transport, name='exchange')
    exchange = lambda a_C: transport_(a_C, jnp.zeros((ep * c, *a_C.shape[1:]), a_C.dtype), send_start_PxP[me],
                                      sizes_PxP[me], recv_start_PxP[me], sizes_PxP[:, me], axis_name=ep_axis)
    with jax.named_scope('dispatch'):
      sent_x = permute_rows(jnp.repeat(x_NxD, k, axis=0), order, inverse)
      sent_w = permute_rows(weights_NxK.reshape(-1), order, inverse)
    recv_x, recv_w = exchange(sent_x), exchange(sent_w)  # The weights are applied where computed.
    # Received rows: by sender, then by local expert; the rest is padding (id e_local).
    recv_PxL = counts_PxPxL[:, me]
    recv_e = jnp.repeat(jnp.append(jnp.tile(jnp.arange(e_local), ep), e_local),
                        jnp.append(recv_PxL.reshape(-1), ep * c - jnp.sum(recv_PxL)),
                        total_repeat_length=ep * c)
    y = _received_experts(pw, recv_x, recv_w, recv_e, jnp.sum(recv_PxL, axis=0), e_local, c, path)
    if f_names:
      y = jax.lax.psum(y, _collective_axes(f_names))
    back = transport_(y, jnp.zeros((c, d), y.dtype), recv_start_PxP[:, me], sizes_PxP[:, me],
                      send_start_PxP[:, me], sizes_PxP[me], axis_name=ep_axis)
    return _combine(back, order, inverse, n, k)

  return jax.shard_map(body, mesh=mesh, in_specs=(wspec, tok, tok, tok), out_specs=tok,
                       check_vma=False)(pw, x_NxD, weights_NxK, experts_NxK)


def moe(p: dict, x_BxTxD, valid_BxT, cfg: ModelConfig, routes_NxK=None):
  """Returns (y_BxTxD, stats): load (E,), aux_loss, z_loss, routes (N x k chosen experts).

  routes_NxK replays a recorded routing (e.g. the sampler's, in RL) instead of selecting anew.
  """
  b, t, d = x_BxTxD.shape
  x_NxD = x_BxTxD.reshape(b * t, d)
  weights, experts, stats = route(p, x_NxD, valid_BxT.reshape(-1), cfg, routes_NxK)
  path = expert_path(cfg)
  mesh = jax.sharding.get_abstract_mesh()
  if (cfg.expert_parallel and not mesh.empty
      and axis_size(mesh, _expert_axes(cfg.num_experts, mesh)) > 1):
    transport = (jax.lax.ragged_all_to_all if resolve_exchange(cfg.ep_exchange) == 'ragged'
                 else _ragged_all_to_all_emulated)
    y = _expert_parallel(p, x_NxD, weights, experts, path, mesh, transport)
  else:
    y = _local_experts(p, x_NxD, weights, experts, path)
  if cfg.num_shared_experts:
    y = y + swiglu(p['shared'], x_NxD)
  return y.reshape(b, t, d), stats


def ideal_flops(num_tokens: int, cfg: ModelConfig) -> float:
  """FLOPs of the routed experts with exactly k experts per token (the grouped paths' target)."""
  return 6.0 * num_tokens * cfg.num_experts_per_tok * cfg.d_model * cfg.d_expert

