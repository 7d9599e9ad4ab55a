"""Targeted-feedback RL on toolcalc with a tiny MoE: warm start, then RL; runs on a CPU in minutes.

python -m launch.rl --config=experiments/toolcalc_rl.py --workdir=/tmp/toolcalc_rl
python -m launch.rl --config=experiments/toolcalc_rl.py --workdir=/tmp/outcome_only \
    --config.loss.distill_coef=0 --config.init_checkpoint=/tmp/toolcalc_rl
"""

import ml_collections


def _optimizer(name: str, lr: float, warmup: int, adam_lr: float = 0.0) -> ml_collections.ConfigDict:
  o = ml_collections.ConfigDict()
  o.name = name                     # 'muon' (matrices; AdamW for the rest) or 'adamw'.
  o.learning_rate = lr
  o.adam_learning_rate = adam_lr    # With muon: AdamW's rate for embeddings, head, norms; 0 = same.
  o.consistent_rms = 0.2            # Muon update scale 0.2*sqrt(max(fan_in, fan_out)) (Moonlight).
  o.warmup_steps = warmup
  o.final_lr_fraction = 0.1
  o.b1 = 0.9
  o.b2 = 0.95
  o.weight_decay = 0.0
  o.grad_clip = 1.0
  return o


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.init_checkpoint = ''            # A workdir holding warmstart/; empty: run the warm start here.
  c.base = b = ml_collections.ConfigDict()
  b.checkpoint = ''                 # `launch.convert --from_hf` output: start from it, not `model`.
  b.tokenizer = ''                  # Its Hugging Face folder (tokenizer.json, chat template).
  c.checkpoint_every = 50           # RL steps between checkpoints (the run resumes from the last).
  c.tensorboard = True              # Also write TensorBoard events next to metrics.jsonl.

  c.model = m = ml_collections.ConfigDict()
  m.vocab_size = 280                # ByteTokenizer: 256 bytes + 8 specials + 10 tool words, padded.
  m.d_model = 96
  m.num_layers = 2
  m.num_heads = 4
  m.attention = 'gqa'
  m.num_kv_heads = 2
  m.head_dim = 24
  m.qk_norm = True
  m.d_ff = 256
  m.first_k_dense = 0
  m.num_experts = 4
  m.num_experts_per_tok = 2
  m.d_expert = 96
  m.router = 'softmax'
  m.aux_loss_coef = 0.01            # Load balancing.
  m.z_loss_coef = 0.001
  m.moe_impl = 'blocked'            # The CPU path.

  c.env = e = ml_collections.ConfigDict()
  e.name = 'toolcalc'
  e.tools = 'rl'                    # 'rl': add renamed to plus (drift); 'warm': the warm-start tools.
  e.max_ops = 2                     # Operations per problem (1..max_ops).
  e.max_operand = 9
  e.word_tokens = True              # Tool names are one token each (as in a BPE vocabulary), not bytes.

  c.sft = s = ml_collections.ConfigDict()
  s.steps = 600                     # Warm-start steps on fresh demonstrations.
  s.batch_size = 32
  s.hint_fraction = 0.4             # Share of hint-conditioned demonstrations.
  s.optimizer = _optimizer('adamw', 3e-3, 20)

  c.sampler = p = ml_collections.ConfigDict()
  p.temperature = 1.0
  p.top_k = 0
  p.top_p = 1.0
  p.max_turn_tokens = 16            # Per model message.
  p.max_turns = 5
  p.max_len = 160                   # Trajectory (and training sequence) length limit.
  p.max_obs_tokens = 32

  c.rl = r = ml_collections.ConfigDict()
  r.steps = 40
  r.tasks_per_step = 16
  r.group_size = 4                  # Rollouts per task (the group baseline).
  r.max_targets = 32                # Distillation slots per step (more hints: a random subset).
  r.router_replay = False           # Reuse the sampler's MoE routes in the update.

  c.loss = l = ml_collections.ConfigDict()
  l.pg_coef = 1.0                   # 0: distillation alone.
  l.distill_coef = 1.0              # 0: outcome reward alone.
  l.clip_eps = 0.0                  # > 0: PPO-clipped ratio to the sampler's log-probs.
  l.std_norm = False                # GRPO's std normalization (Dr.GRPO: off).
  l.norm_tokens = 32                # Dr.GRPO's constant: loss = sum over tokens / (rollouts * this).
  l.distill_kind = 'forward_kl'     # reverse_kl | forward_kl | jsd | topk | sampled (docs/rl.md)
  l.distill_top_k = 8               # For topk.
  l.gate = 'none'                   # none | confident
  l.gate_margin = 0.0
  l.until_divergence = True         # Distill a target only up to where it leaves the teacher's argmax.
  l.pg_on_targets = False           # False: hinted messages get the distillation signal, not the PG.
  l.anchor_coef = 10.0              # KL to the teacher weights (no hint) on all other policy tokens.

  c.teacher = t = ml_collections.ConfigDict()
  t.kind = 'frozen'                 # live | ema | frozen
  t.ema_decay = 0.99

  c.critic = k = ml_collections.ConfigDict()
  k.rules = ('unknown_tool', 'wrong_tool')  # In priority order (see docs/rl.md: why not malformed_call).

  c.eval = v = ml_collections.ConfigDict()
  v.every = 10                      # RL steps between evaluations.
  v.num_tasks = 64                  # Fixed held-out tasks, one sampled rollout each.

  # The RL update. At consistent-RMS scale Muon's step on a low-rank gradient (a few distilled
  # tokens) is small (its RMS grows with the rank): ~10x AdamW's rate (2e-4) moves it alike (docs/rl.md).
  c.optimizer = _optimizer('muon', 2e-3, 5, adam_lr=2e-4)
  return c
