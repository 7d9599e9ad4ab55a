"""Model FLOPs per token and MFU.

Counts multiply-adds as 2 FLOPs in every matmul a token goes through: attention projections, the
router, the k routed experts it is sent to (not the idle ones), shared experts, dense MLPs and the
LM head; the embedding lookup is a gather (0 FLOPs). Attention scores and values add
2 * heads * context * (qk_head_dim + v_head_dim) per layer, with context (T + 1) / 2 for causal
attention (T with causal=False: what a kernel that computes the full masked matrix does). Training
is 3x the forward pass (backward = 2x); rematerialization is not counted, as MFU requires.
"""

import math

import jax

from research.model import transformer
from research.model.config import ModelConfig

_ROUTED = ('wi_gate', 'wi_up', 'wo')

# Dense bf16 peak FLOP/s per device, by a substring of jax.Device.device_kind (lower case).
PEAK_FLOPS = {
    'h100': 989e12, 'h200': 989e12, 'gh200': 989e12, 'b200': 2250e12, 'a100': 312e12,
    'tpu v4': 275e12, 'tpu v5 lite': 197e12, 'tpu v5e': 197e12, 'tpu v5p': 459e12, 'tpu v5': 459e12,
    'tpu v6 lite': 918e12, 'tpu v6e': 918e12,
}


def _keys(path) -> list[str]:
  return [str(getattr(k, 'key', k)) for k in path]


def matmul_params_per_token(cfg: ModelConfig) -> float:
  """Weights a token multiplies by in one forward pass (routed experts scaled by k / E)."""
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  total = 0.0
  for path, x in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    keys = _keys(path)
    if keys[-1] in ('embedding', 'router_bias') or any('norm' in k for k in keys):
      continue  # Gathers, elementwise scales and the bias-only routing term.
    n = math.prod(x.shape)
    if 'moe' in keys and 'shared' not in keys and keys[-1] in _ROUTED:
      n *= cfg.num_experts_per_tok / cfg.num_experts
    total += n
  return total


def flops_per_token(cfg: ModelConfig, seq_len: int, *, causal: bool = True) -> dict[str, float]:
  """{'forward', 'train'} FLOPs per token for sequences of seq_len tokens."""
  v_dim = cfg.v_head_dim if cfg.attention == 'mla' else cfg.head_dim
  context = (seq_len + 1) / 2 if causal else seq_len
  attn = 2 * cfg.num_layers * cfg.num_heads * context * (cfg.qk_head_dim + v_dim)
  fwd = 2 * matmul_params_per_token(cfg) + attn
  return {'forward': fwd, 'train': 3 * fwd}


def peak_flops(device: jax.Device | None = None) -> float | None:
  """The device's dense bf16 peak FLOP/s, or None when unknown (CPUs)."""
  kind = (device or jax.devices()[0]).device_kind.lower()
  for name, peak in sorted(PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])):
    if name in kind:
      return peak
  return None


def mfu(tokens_per_s: float, train_flops_per_token: float, num_devices: int, peak: float) -> float:
  """Model FLOPs utilization: achieved model FLOP/s over the devices' peak."""
  return tokens_per_s * train_flops_per_token / (num_devices * peak)
