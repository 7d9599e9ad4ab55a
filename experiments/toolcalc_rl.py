"""Targeted-feedback RL on toolcalc with a tiny MoE: warm start, then RL; runs on a CPU in minutes.

python -m launch.rl --config=experiments/toolcalc_rl.py --workdir=/tmp/toolcalc_rl
python -m launch.rl --config=experiments/toolcalc_rl.py --workdir=/tmp/outcome_only \
    --config.loss.distill_coef=0 --config.init_checkpoint=/tmp/toolcalc_rl

Every field of research/rl/config.py's RLExperimentConfig is here (docs/training.md lists them), so
any of them can be set from the command line; below are only the ones that differ from the defaults.
"""

import ml_collections

from research import configs
from research.rl import config as rl_config


def get_config() -> ml_collections.ConfigDict:
  c = configs.to_config_dict(rl_config.RLExperimentConfig())

  m = c.model
  m.vocab_size = 280                # ByteTokenizer: 256 bytes + 8 specials + 10 tool words, padded.
  m.d_model = 96
  m.num_heads = 4
  m.head_dim = 24
  m.num_experts = 4
  m.d_expert = 96
  m.aux_loss_coef = 0.01            # Load balancing.
  m.z_loss_coef = 0.001
  m.moe_impl = 'blocked'            # The CPU path.

  c.sampler.max_turn_tokens = 16    # Per model message.
  c.sampler.max_obs_tokens = 32

  # The RL update. At consistent-RMS scale Muon's step on a low-rank gradient (a few distilled
  # tokens) is small (its RMS grows with the rank): ~10x AdamW's rate (2e-4) moves it alike (docs/rl.md).
  o = c.optimizer
  o.learning_rate = 2e-3
  o.warmup_steps = 5
  o.muon.adam_learning_rate = 2e-4
  return c
