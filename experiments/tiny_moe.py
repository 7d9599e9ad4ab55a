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
  m.ep_exchange = 'auto'            # 'auto', 'all_to_all' or 'ragged' (GPU, TPU only).
  m.remat = 'none'                  # 'none', 'full' or 'dots'.

  c.data = d = ml_collections.ConfigDict()
  d.batch_size = 16                 # Global rows per step; divisible by data * fsdp * expert.
  d.seq_len = 128
  d.source = 'synthetic'            # 'synthetic', 'jsonl' or 'array_record' (research/data/pipeline.py).
  d.train_files = ''                # Comma-separated globs of JSONL / ArrayRecord files.
  d.eval_files = ''
  d.text_field = 'text'             # JSON key of a document's text in a line / record.
  d.shards = 8                      # Virtual data shards: divides batch_size, a multiple of the hosts.

  c.optimizer = o = ml_collections.ConfigDict()
  o.name = 'muon'                   # 'muon' (matrices; AdamW for the rest) or 'adamw'.
  o.learning_rate = 0.06            # Muon's (or AdamW's) peak learning rate.
  o.adam_learning_rate = 0.01       # With muon: AdamW's rate for embeddings, head, norms; 0 = same.
  o.consistent_rms = 0.2            # Muon update scale 0.2*sqrt(max(fan_in, fan_out)) (Moonlight).
  o.ns_coeffs = 'standard'          # Newton-Schulz: 'standard' quintic or 'polar_express'.
  o.muon_per_head = False           # Orthogonalize each attention head's matrix on its own.
  o.qk_clip_tau = 0.0               # MuonClip: rescale q/k of heads whose max logit > tau; 0 = off.
  o.warmup_steps = 20
  o.final_lr_fraction = 0.1
  o.b1 = 0.9
  o.b2 = 0.95
  o.weight_decay = 0.01
  o.grad_clip = 1.0

  c.train = t = ml_collections.ConfigDict()
  t.steps = 300
  t.log_every = 10                  # Host syncs happen only here (and at eval / checkpoint steps).
  t.eval_every = 50                 # Steps between evals on the held-out split; 0 disables.
  t.eval_steps = 4                  # Batches per eval.
  t.peak_tflops = 0.0               # Per-device peak for MFU; 0 looks it up (unknown on CPU: no MFU).

  c.checkpoint = k = ml_collections.ConfigDict()
  k.every = 100                     # Steps between (asynchronous) saves; the last step always saves.
  k.keep = 3                        # Most recent checkpoints kept ...
  k.best_metric = 'eval_loss'       # ... plus the best by this eval metric ('' for none).
  k.best_mode = 'min'               # 'min' or 'max'.
  return c
