"""A tiny Qwen3-MoE-like model (~3M parameters) on the synthetic corpus; trains on a CPU in minutes.

python -m launch.train --config=experiments/tiny_moe.py --workdir=/tmp/tiny_moe \
    --config.model.num_experts=16 --config.mesh=fsdp:2,expert:4
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.mesh = 'fsdp:2,expert:4'        # Axis sizes (data, fsdp, expert, tensor); product <= devices.

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 256                # Byte-level tokens.
  m.d_model = 256
  m.num_layers = 4
  m.num_heads = 4
  m.attention = 'gqa'               # 'gqa' (Qwen3) or 'mla' (DeepSeek-V3 / Kimi K2).
  m.num_kv_heads = 2
  m.head_dim = 64
  m.qk_norm = True
  m.d_ff = 512                      # Dense MLP width (first_k_dense layers).
  m.first_k_dense = 0
  m.num_experts = 8
  m.num_experts_per_tok = 2
  m.d_expert = 256
  m.router = 'softmax'              # 'softmax' (Qwen3) or 'sigmoid' (DeepSeek-V3).
  m.norm_topk_prob = True
  m.aux_loss_coef = 0.01            # Load balancing.
  m.z_loss_coef = 0.001
  m.moe_impl = 'auto'               # 'auto', 'dense', 'ragged' or 'blocked'.
  m.remat = 'none'                  # 'none', 'full' or 'dots'.

  c.data = d = ml_collections.ConfigDict()
  d.batch_size = 16                 # Global rows per step; divisible by data * fsdp * expert.
  d.seq_len = 128

  c.optimizer = o = ml_collections.ConfigDict()
  o.name = 'adamw'
  o.learning_rate = 3e-3
  o.warmup_steps = 20
  o.final_lr_fraction = 0.1
  o.b1 = 0.9
  o.b2 = 0.95
  o.weight_decay = 0.01
  o.grad_clip = 1.0

  c.train = t = ml_collections.ConfigDict()
  t.steps = 300
  t.log_every = 10                  # Host syncs happen only here.
  return c
