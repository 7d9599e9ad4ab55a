"""Optimizers from config: AdamW, or Muon (research/optim) laid out for the model and mesh.

  make_optimizer(config.optimizer, total_steps, model_cfg=None, mesh=None)

Muon needs `model_cfg` (its per-leaf dimension numbers come from the params' logical axes) and,
to run Newton-Schulz on whole matrices spread over the devices, the `mesh` the params live on.
This module is where the model's names meet the optimizer, which knows nothing of the model.
"""

import jax
import ml_collections
import optax
from optax.contrib import MuonDimensionNumbers

from research.model import transformer
from research.model.config import ModelConfig
from research.optim import muon as muon_lib
from research.optim.qk_clip import QKClipTarget

OPTIMIZERS = ('adamw', 'muon')
BATCH_AXES = ('layers', 'experts')   # Stacked matrices: each slice is orthogonalized on its own.
HEAD_AXES = ('heads', 'kv_heads')    # Batch axes too with optimizer.muon_per_head.
OUTPUT_AXES = ('embed', 'expert_embed')


def schedule(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, warmup, max(total_steps, warmup + 1),
                                            end_value=cfg.learning_rate * cfg.final_lr_fraction)


def dimension_numbers(axes: tuple, per_head: bool = False) -> MuonDimensionNumbers | None:
  """Muon's view of a leaf from its logical axes; None (AdamW) for vectors.

  Projections into the model dimension (`o`, `wo`) reduce over everything before it; the others
  reduce over their first matrix axis (the input) and output the rest (e.g. heads x head_dim).
  """
  batch = BATCH_AXES + (HEAD_AXES if per_head else ())
  rest = [i for i, a in enumerate(axes) if a not in batch]
  if len(rest) < 2:
    return None
  if axes[rest[-1]] in OUTPUT_AXES:
    return MuonDimensionNumbers(tuple(rest[:-1]), (rest[-1],))
  return MuonDimensionNumbers((rest[0],), tuple(rest[1:]))


def _muon(cfg: ml_collections.ConfigDict, lr, total_steps: int, model_cfg: ModelConfig | None, mesh):
  if model_cfg is None:
    raise ValueError("optimizer.name='muon' needs the model config (make_optimizer(..., model_cfg=))")
  axes = transformer.param_axes(model_cfg)
  is_axes = lambda x: isinstance(x, tuple)
  dims = jax.tree.map(lambda a: dimension_numbers(a, cfg.get('muon_per_head', False)), axes,
                      is_leaf=is_axes)
  return muon_lib.muon(
      lr, ns_coeffs=cfg.get('ns_coeffs', 'standard'), beta=cfg.get('beta', 0.95),
      weight_decay=cfg.weight_decay, adam_weight_decay=cfg.weight_decay,
      adam_b1=cfg.b1, adam_b2=cfg.b2, consistent_rms=cfg.get('consistent_rms', 0.2),
      adam_learning_rate=lr if not cfg.get('adam_learning_rate') else schedule(
          ml_collections.ConfigDict({**cfg.to_dict(), 'learning_rate': cfg.adam_learning_rate}), total_steps),
      muon_weight_dimension_numbers=dims, mesh=mesh,
      shardings=None if mesh is None else axes)  # Laid out by the rules the Trainer traces under.


def make_optimizer(cfg: ml_collections.ConfigDict, total_steps: int,
                   model_cfg: ModelConfig | None = None, mesh=None) -> optax.GradientTransformation:
  if cfg.name not in OPTIMIZERS:
    raise ValueError(f'optimizer.name={cfg.name!r}: unknown optimizer, expected one of {OPTIMIZERS}')
  lr = schedule(cfg, total_steps)
  if cfg.name == 'muon':
    tx = _muon(cfg, lr, total_steps, model_cfg, mesh)
  else:
    tx = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx) if cfg.grad_clip else tx


def qk_clip_targets(cfg: ModelConfig) -> dict:
  """QK-clip targets for one stack's attention params: the head-specific query/key parts."""
  if cfg.attention == 'gqa' and cfg.qk_norm:
    raise ValueError('optimizer.qk_clip_tau: QK-clip cannot act on a model with model.qk_norm=True '
                     '(q and k are normalized after their projections; the norm already bounds logits)')
  if cfg.attention == 'gqa':
    t = QKClipTarget(head_axis=2, layer_axis=0)
    return {'q': t, 'k': t}
  dn, dr = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
  # The rope part of q meets the rope key shared by all heads, so it takes all of gamma.
  q = (QKClipTarget(2, 0, 0.5, (3, 0, dn)), QKClipTarget(2, 0, 1.0, (3, dn, dn + dr)))
  return {'q_b' if cfg.q_lora_rank else 'q': q, 'kv_b': QKClipTarget(2, 0, 0.5, (3, 0, dn))}
