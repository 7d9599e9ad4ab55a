"""One config type for both MoE families.

Qwen3-MoE-like: `attention='gqa'`, `router='softmax'`. DeepSeek-V3 / Kimi-K2-like: `attention='mla'`,
`router='sigmoid'`, shared experts, the first `first_k_dense` layers dense.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

from research import configs

ATTENTION_TYPES = ('gqa', 'mla')
ROUTER_TYPES = ('softmax', 'sigmoid')
MOE_IMPLS = ('auto', 'dense', 'ragged', 'blocked', 'tokamax', 'padded')
ATTENTION_IMPLS = ('auto', 'xla', 'blockwise', 'tokamax')
EP_EXCHANGES = ('auto', 'all_to_all', 'ragged')
REMAT_POLICIES = ('none', 'full', 'dots')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2
  attention: str = 'gqa'            # 'gqa' (Qwen3) or 'mla' (DeepSeek-V3, Kimi K2).
  num_heads: int = 4
  # GQA attention.
  num_kv_heads: int = 2
  head_dim: int = 32
  qk_norm: bool = True              # Qwen3: RMSNorm on each query/key head before RoPE.
  # MLA attention (DeepSeek-V3). q_lora_rank=0 projects queries directly.
  q_lora_rank: int = 0
  kv_lora_rank: int = 64
  qk_nope_head_dim: int = 32
  qk_rope_head_dim: int = 16
  v_head_dim: int = 32
  rope_interleaved: bool = False    # DeepSeek rotates (2i, 2i+1) pairs; Qwen rotates halves.
  rope_theta: float = 10_000.0
  # YaRN context extension (HF rope_type 'yarn'; DeepSeek-V3, Kimi K2). factor 1.0 is plain RoPE.
  rope_yarn_factor: float = 1.0
  rope_yarn_original_len: int = 4096
  rope_yarn_beta_fast: float = 32.0
  rope_yarn_beta_slow: float = 1.0
  rope_yarn_attention_factor: float = 1.0  # Multiplies cos and sin (so the rotated dims of q and k).
  attn_scale_mult: float = 1.0      # Multiplies the head_dim**-0.5 softmax scale (DeepSeek's YaRN mscale**2).
  attention_impl: str = 'auto'      # auto: tokamax flash kernels on GPU, xla elsewhere (attention.py).
  attention_block: int = 512        # Queries and keys per block of the blockwise path (scores ~ block^2 per head).
  norm_eps: float = 1e-6
  # Feed-forward. The first `first_k_dense` layers use a dense MLP of width d_ff.
  d_ff: int = 256
  first_k_dense: int = 0
  # Experts.
  router: str = 'softmax'
  num_experts: int = 8
  num_experts_per_tok: int = 2
  d_expert: int = 64
  num_shared_experts: int = 0
  norm_topk_prob: bool = True
  n_group: int = 1                  # Group-limited routing: keep the best topk_group of n_group.
  topk_group: int = 1
  routed_scaling_factor: float = 1.0
  aux_loss_coef: float = 0.0        # Load-balancing loss (softmax router).
  z_loss_coef: float = 0.0
  bias_update_rate: float = 0.0     # Aux-loss-free balancing (sigmoid router), applied per step.
  moe_impl: str = 'auto'            # auto: tokamax grouped GEMM on GPU, ragged_dot on TPU, blocked on CPU.
  moe_block_size: int = 0           # Rows per block of the blocked path; 0 picks one (<= 25% pad).
  moe_capacity_factor: float = 1.25  # Padded path: slots per expert over the mean group size.
  moe_fallback_impl: str = 'auto'    # Padded path: where a layer whose largest group exceeds its
                                     # slots runs (dropless either way); not dense or padded.
  expert_parallel: bool = True      # shard_map + all-to-all over `expert` when that axis is > 1.
  ep_exchange: str = 'auto'         # auto: ragged_all_to_all on GPU/TPU, padded all_to_all on CPU.
  # Numerics and memory.
  dtype: str = 'float32'            # Activations.
  param_dtype: str = 'float32'
  remat: str = 'none'
  init_std: float = 0.02

  @property
  def num_moe_layers(self) -> int:
    return self.num_layers - self.first_k_dense

  @property
  def qk_head_dim(self) -> int:
    return self.qk_nope_head_dim + self.qk_rope_head_dim if self.attention == 'mla' else self.head_dim

  @property
  def rope_dim(self) -> int:
    return self.qk_rope_head_dim if self.attention == 'mla' else self.head_dim

  def validate(self, path: str = 'model.') -> 'ModelConfig':
    """Raises ValueError naming the offending field (below `path`)."""
    def need(ok, field, msg):
      if not ok:
        raise configs.invalid(path + field, getattr(self, field), msg)
    need(self.attention in ATTENTION_TYPES, 'attention', f'unknown attention type, expected one of {ATTENTION_TYPES}')
    need(self.router in ROUTER_TYPES, 'router', f'unknown router type, expected one of {ROUTER_TYPES}')
    need(self.moe_impl in MOE_IMPLS, 'moe_impl', f'expected one of {MOE_IMPLS}')
    need(self.attention_impl in ATTENTION_IMPLS, 'attention_impl', f'expected one of {ATTENTION_IMPLS}')
    need(self.ep_exchange in EP_EXCHANGES, 'ep_exchange', f'expected one of {EP_EXCHANGES}')
    need(self.remat in REMAT_POLICIES, 'remat', f'expected one of {REMAT_POLICIES}')
    for f in ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'head_dim', 'd_ff', 'num_experts',
              'num_experts_per_tok', 'd_expert', 'n_group', 'topk_group', 'attention_block'):
      need(getattr(self, f) > 0, f, 'must be positive')
    need(0 <= self.first_k_dense <= self.num_layers, 'first_k_dense', f'must be in [0, num_layers={self.num_layers}]')
    need(self.num_experts_per_tok <= self.num_experts, 'num_experts_per_tok',
         f'cannot exceed num_experts={self.num_experts}')
    need(self.num_experts % self.n_group == 0, 'n_group', f'must divide num_experts={self.num_experts}')
    need(self.topk_group <= self.n_group, 'topk_group', f'cannot exceed n_group={self.n_group}')
    if self.attention == 'gqa':
      need(self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads == 0, 'num_kv_heads',
           f'must divide num_heads={self.num_heads}')
    need(self.moe_fallback_impl in set(MOE_IMPLS) - {'dense', 'padded'}, 'moe_fallback_impl',
         f'expected one of {tuple(i for i in MOE_IMPLS if i not in ("dense", "padded"))}')
    need(self.moe_capacity_factor >= 1.0, 'moe_capacity_factor',
         'must be >= 1 (below the mean group size every layer would fall back)')
    need(self.rope_yarn_factor >= 1.0, 'rope_yarn_factor', 'must be >= 1 (1 disables YaRN)')
    need(self.rope_dim % 2 == 0, 'qk_rope_head_dim' if self.attention == 'mla' else 'head_dim',
         'RoPE needs an even dimension')
    return self


def from_dict(d: Mapping[str, Any]) -> ModelConfig:
  """Builds a config from a dict (e.g. an ml_collections ConfigDict), rejecting unknown fields."""
  return configs.from_dict(ModelConfig, d, 'model')
