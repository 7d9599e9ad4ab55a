"""A tiny Qwen3-MoE-like model (~3M parameters) on the synthetic corpus; trains on a CPU in minutes.

python -m launch.train --config=experiments/tiny_moe.py --workdir=/tmp/tiny_moe \
    --config.model.num_experts=16 --config.mesh=fsdp:2,expert:4

Every field of research/train/loop.py's ExperimentConfig is here (docs/training.md lists them), so
any of them can be set from the command line; below are only the ones that differ from the defaults.
"""

import ml_collections

from research import configs
from research.train import loop


def get_config() -> ml_collections.ConfigDict:
  c = configs.to_config_dict(loop.ExperimentConfig())
  c.mesh = 'fsdp:2,expert:4'        # 8 simulated CPU devices.

  m = c.model
  m.d_model = 256
  m.num_layers = 4
  m.head_dim = 64
  m.d_ff = 512                      # Dense MLP width (first_k_dense layers; none here).
  m.d_expert = 256
  m.aux_loss_coef = 0.01            # Load balancing.
  m.z_loss_coef = 0.001

  o = c.optimizer
  o.learning_rate = 0.06            # Muon's peak rate at consistent-RMS scale.
  o.muon.adam_learning_rate = 0.01  # AdamW's rate for embeddings, head, norms.
  o.weight_decay = 0.01
  return c
