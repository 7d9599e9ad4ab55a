"""Optimizers from config. AdamW with warmup + cosine decay; the Muon issue adds `muon`."""

import ml_collections
import optax

OPTIMIZERS = ('adamw',)


def schedule(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(total_steps, warmup + 1),
                                            end_value=cfg.learning_rate * cfg.final_lr_fraction)


def make_optimizer(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  if cfg.name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={cfg.name!r}: unknown optimizer, expected one of {OPTIMIZERS}')
  lr = schedule(cfg, total_steps)
  tx = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx) if cfg.grad_clip else tx
