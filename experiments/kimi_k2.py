"""The Kimi K2 language model's shape (DeepSeek-V3 architecture, ~1.03e12 parameters, ~3.3e10 active).

Too big to initialize here; plan it without memory:
python -m launch.plan --config=experiments/kimi_k2.py --mesh=data:8,fsdp:64,expert:32
"""

import ml_collections

from experiments import tiny_moe
from research import configs
from research.model.config import ModelConfig


def get_config() -> ml_collections.ConfigDict:
  c = tiny_moe.get_config()
  c.mesh = 'data:8,fsdp:64,expert:32'
  c.model = m = configs.to_config_dict(ModelConfig())  # The defaults, not tiny_moe's model.
  m.vocab_size = 163840
  m.d_model = 7168
  m.num_layers = 61
  m.num_heads = 64
  m.attention = 'mla'
  m.q_lora_rank = 1536              # Queries through a 1536-rank bottleneck.
  m.kv_lora_rank = 512              # Cached latent per token.
  m.qk_nope_head_dim = 128
  m.qk_rope_head_dim = 64
  m.v_head_dim = 128
  m.rope_theta = 50000.0
  m.rope_interleaved = True
  m.d_ff = 18432                    # The one dense layer.
  m.first_k_dense = 1
  m.num_experts = 384
  m.num_experts_per_tok = 8
  m.d_expert = 2048
  m.num_shared_experts = 1
  m.router = 'sigmoid'
  m.norm_topk_prob = True
  m.n_group = 1
  m.topk_group = 1
  m.routed_scaling_factor = 2.827
  m.bias_update_rate = 1e-3
  m.dtype = 'bfloat16'
  m.param_dtype = 'bfloat16'
  m.remat = 'full'
  c.optimizer.muon.per_head = True  # NS per attention head: 64 small matrices, not one 8192 x 7168.
  c.data.batch_size = 4096
  c.data.seq_len = 4096
  return c
