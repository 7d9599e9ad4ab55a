"""Memory of one RL step on a mesh, per device, from shapes alone (no devices): launch.plan --rl_context.

  rl_memory(cfg, mesh_shape, rows=, context=, logit_chunk=, opt_state_bytes=) -> RLMemory

Rows (trajectories) split over the batch mesh axes (`act_batch`: data, fsdp, expert), so a device
holds rows / ways of them (at least 1). Terms, bytes per device:
  kv_cache     the sampler's cache at `context` slots per row: every layer's entries
               (attention.cache_specs: GQA k and v, MLA's compressed ckv and kpe), activation dtype.
  activations  the update's working set with per-layer remat (model.remat != 'none'; without it
               every layer keeps its working set): the residual stream saved at each layer's input
               (L x tokens x D), one layer's recompute (q, k, v and attention output; the MoE's
               dispatched tokens x top-k through gate, up and down; attention scores at
               `attn_block` keys per query, the T x S matrix when `attn_block` is 0), the final hidden
               states with the anchor's and the teacher's, and `logit_chunk` positions of float32
               logits with their log-softmax, probabilities and gradient (4 copies; the whole
               sequence when logit_chunk is 0).
Params and optimizer state come from research/model/stats.py and the optimizer's own plan. The model
is an estimate of XLA's temp memory (buffer reuse and fusion change constants, not the growth).
"""

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from research.model import attention as attn_lib
from research.model import stats
from research.model.config import ModelConfig
from research.parallel import mesh as mesh_lib
from research.parallel import sharding


@dataclasses.dataclass(frozen=True)
class RLMemory:
  """Bytes per device of one RL step's parts."""
  params: int
  opt_state: int
  kv_cache: int
  activations: int
  logits: int                       # Part of `activations`: the chunk of float32 logits and copies.

  @property
  def total(self) -> int:
    return self.params + self.opt_state + self.kv_cache + self.activations


def _full(mesh_shape: Mapping[str, int]) -> dict[str, int]:
  return {**{a: 1 for a in mesh_lib.AXES}, **mesh_shape}


def _ways(mesh_shape: Mapping[str, int], logical: str) -> int:
  return mesh_lib.axis_size(_full(mesh_shape), sharding.mesh_axes(logical))


def kv_cache_bytes(cfg: ModelConfig, mesh_shape: Mapping[str, int], rows: int, context: int) -> int:
  """The sampler's KV cache on one device: rows / batch ways of them, `context` slots each."""
  local = max(rows // _ways(mesh_shape, 'act_batch'), 1)
  per_layer = sum(math.prod(s) for s in attn_lib.cache_specs(cfg, local, context).values())
  return per_layer * cfg.num_layers * np.dtype(cfg.dtype).itemsize


def activation_bytes(cfg: ModelConfig, mesh_shape: Mapping[str, int], rows: int, context: int,
                     logit_chunk: int, attn_block: int) -> tuple[int, int]:
  """(the update's activations, of which logits) on one device; see the module docstring."""
  local = max(rows // _ways(mesh_shape, 'act_batch'), 1)
  n, tensor = local * context, _ways(mesh_shape, 'act_heads')
  act = np.dtype(cfg.dtype).itemsize
  heads = -(-cfg.num_heads // tensor)
  v_dim = cfg.v_head_dim if cfg.attention == 'mla' else cfg.head_dim
  attention = n * heads * (2 * cfg.qk_head_dim + 2 * v_dim) * act
  scores = local * heads * context * (attn_block or context) * 4
  moe = n * cfg.num_experts_per_tok * (3 * -(-cfg.d_expert // tensor) + 2 * cfg.d_model) * act
  layer = attention + scores + moe + 4 * n * cfg.d_model * act
  saved = cfg.num_layers * n * cfg.d_model * act
  working = layer if cfg.remat != 'none' else cfg.num_layers * layer
  hidden = 3 * n * cfg.d_model * 4  # Policy, anchor and teacher final hidden states (float32).
  logits = 4 * local * min(logit_chunk or context, context) * -(-cfg.vocab_size // _ways(mesh_shape, 'act_vocab')) * 4
  return saved + working + hidden + logits, logits


def rl_memory(cfg: ModelConfig, mesh_shape: Mapping[str, int], *, rows: int, context: int, logit_chunk: int,
              opt_state_bytes: int, attn_block: int = 512) -> RLMemory:
  """Every part of one RL step's memory per device (opt_state_bytes: the optimizer plan's)."""
  if rows < 1 or context < 1:
    raise ValueError(f'rows={rows} and context={context} must be positive')
  activations, logits = activation_bytes(cfg, mesh_shape, rows, context, logit_chunk, attn_block)
  return RLMemory(stats.bytes_per_device(cfg, _full(mesh_shape)), opt_state_bytes,
                  kv_cache_bytes(cfg, mesh_shape, rows, context), activations, logits)
