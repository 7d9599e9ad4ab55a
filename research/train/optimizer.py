"""Optimizers from config: AdamW, or Muon (research/optim) laid out for the model and mesh.

  make_optimizer(config.optimizer, total_steps, model_cfg=None, mesh=None)   # an OptimizerConfig

Muon needs `model_cfg` (its per-leaf dimension numbers come from the params' logical axes) and,
to run Newton-Schulz on whole matrices spread over the devices, the `mesh` the params live on.
This module is where the model's names meet the optimizer, which knows nothing of the model.
"""

import dataclasses

import jax
import optax
from optax.contrib import MuonDimensionNumbers

from research import configs
from research.model import transformer
from research.model.config import ModelConfig
from research.optim import exchange as exchange_lib
from research.optim import muon as muon_lib
from research.optim import newton_schulz
from research.optim.qk_clip import QKClipTarget

OPTIMIZERS = ('adamw', 'muon')
NS_DTYPES = ('auto', 'float32', 'bfloat16')
STACKED_AXES = ('layers', 'experts')  # Logical axes of stacked matrices: each slice is orthogonalized on its own.
HEAD_AXES = ('heads', 'kv_heads')     # Stacked too with optimizer.muon.per_head.
OUTPUT_AXES = ('embed', 'expert_embed')


@dataclasses.dataclass(frozen=True)
class MuonConfig:
  """optimizer.muon: Muon's settings (used when optimizer.name='muon'; qk_clip_tau always)."""
  ns_coeffs: str = 'standard'       # Newton-Schulz coefficients: 'standard' quintic, 'dion' or 'polar_express'.
  beta: float = 0.95                # Momentum decay.
  preconditioning: str = 'frobenius'  # Before/in NS's first step: 'frobenius', 'spectral', 'aol' or 'schatten' (optax's).
  consistent_rms: float = 0.2       # Update scale: this * sqrt(max(fan_in, fan_out)) (Moonlight's 0.2).
  per_head: bool = False            # Orthogonalize each attention head's matrix on its own.
  adam_learning_rate: float = 0.0   # AdamW's peak rate for embeddings, head, norms; 0 = optimizer.learning_rate.
  ns_dtype: str = 'auto'            # Dtype exchanged and iterated: 'auto' (float32 on CPU, else bfloat16).
  exchange: str = 'all_to_all'      # 'all_to_all' (whole matrices spread over devices), 'balanced' (huge ones split by columns), 'auto' / 'auto_fastest' (chosen per group by the cost model, H100 nodes) or 'all_gather' (ZeRO-1).
  chunk_bytes: int = exchange_lib.DEFAULT_CHUNK_BYTES  # Per-device payload of one exchange chunk.
  spread_axes: tuple[str, ...] | None = None  # Mesh axes matrices are split over; None: automatic.
  qk_clip_tau: float = 0.0          # MuonClip: rescale q/k of heads whose max logit > tau; 0 = off.

  def validate(self, path: str = 'optimizer.muon.') -> 'MuonConfig':
    if self.ns_coeffs not in newton_schulz.PRESETS:
      raise configs.invalid(path + 'ns_coeffs', self.ns_coeffs, f'expected one of {tuple(newton_schulz.PRESETS)}')
    if self.preconditioning not in newton_schulz.PRECONDITIONINGS:
      raise configs.invalid(path + 'preconditioning', self.preconditioning,
                            f'expected one of {newton_schulz.PRECONDITIONINGS}')
    if self.ns_dtype not in NS_DTYPES:
      raise configs.invalid(path + 'ns_dtype', self.ns_dtype, f'expected one of {NS_DTYPES}')
    if self.exchange not in exchange_lib.EXCHANGES:
      raise configs.invalid(path + 'exchange', self.exchange, f'expected one of {exchange_lib.EXCHANGES}')
    if self.chunk_bytes <= 0:
      raise configs.invalid(path + 'chunk_bytes', self.chunk_bytes, 'must be positive')
    if self.consistent_rms <= 0:
      raise configs.invalid(path + 'consistent_rms', self.consistent_rms, 'must be positive')
    for f in ('beta', 'adam_learning_rate', 'qk_clip_tau'):
      if getattr(self, f) < 0:
        raise configs.invalid(path + f, getattr(self, f), 'must be >= 0')
    return self


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """optimizer (and sft.optimizer in RL): the rule, its warmup-cosine schedule and clipping."""
  name: str = 'muon'                # 'muon' (matrices; AdamW for the rest) or 'adamw'.
  learning_rate: float = 0.02       # Peak rate (Muon's for matrices; AdamW's for everything with adamw).
  warmup_steps: int = 20            # Linear warmup from 0 (capped at total steps - 1).
  final_lr_fraction: float = 0.1    # The cosine decays to learning_rate * this.
  b1: float = 0.9                   # AdamW's first-moment decay (Muon's AdamW part too).
  b2: float = 0.95                  # AdamW's second-moment decay.
  weight_decay: float = 0.0         # Decoupled weight decay (Muon and AdamW parts).
  grad_clip: float = 1.0            # Global gradient-norm clip; 0 = off.
  muon: MuonConfig = dataclasses.field(default_factory=MuonConfig)

  def validate(self, path: str = 'optimizer.') -> 'OptimizerConfig':
    if self.name not in OPTIMIZERS:
      raise configs.invalid(path + 'name', self.name, f'unknown optimizer, expected one of {OPTIMIZERS}')
    for f in ('learning_rate', 'warmup_steps', 'final_lr_fraction', 'weight_decay', 'grad_clip'):
      if getattr(self, f) < 0:
        raise configs.invalid(path + f, getattr(self, f), 'must be >= 0')
    return self


def schedule(cfg: OptimizerConfig, total_steps: int, peak: float | None = None) -> optax.Schedule:
  """Warmup then cosine to peak * final_lr_fraction; peak defaults to cfg.learning_rate."""
  peak = cfg.learning_rate if peak is None else peak
  warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, max(total_steps, warmup + 1),
                                            end_value=peak * cfg.final_lr_fraction)


def dimension_numbers(axes: tuple, per_head: bool = False) -> MuonDimensionNumbers | None:
  """Muon's view of a leaf from its logical axes; None (AdamW) for vectors.

  Projections into the model dimension (`o`, `wo`) reduce over everything before it; the others
  reduce over their first matrix axis (the input) and output the rest (e.g. heads x head_dim).
  """
  batch = STACKED_AXES + (HEAD_AXES if per_head else ())
  rest = [i for i, a in enumerate(axes) if a not in batch]
  if len(rest) < 2:
    return None
  if axes[rest[-1]] in OUTPUT_AXES:
    return MuonDimensionNumbers(tuple(rest[:-1]), (rest[-1],))
  return MuonDimensionNumbers((rest[0],), tuple(rest[1:]))


def _muon(cfg: OptimizerConfig, lr, total_steps: int, model_cfg: ModelConfig | None, mesh):
  if model_cfg is None:
    raise ValueError("optimizer.name='muon' needs the model config (make_optimizer(..., model_cfg=))")
  m = cfg.muon
  axes = transformer.param_axes(model_cfg)
  dims = jax.tree.map(lambda a: dimension_numbers(a, m.per_head), axes, is_leaf=lambda x: isinstance(x, tuple))
  return muon_lib.muon(
      lr, ns_coeffs=m.ns_coeffs, beta=m.beta, preconditioning=m.preconditioning,
      weight_decay=cfg.weight_decay,
      adam_weight_decay=cfg.weight_decay, adam_b1=cfg.b1, adam_b2=cfg.b2,
      consistent_rms=m.consistent_rms,
      adam_learning_rate=schedule(cfg, total_steps, m.adam_learning_rate) if m.adam_learning_rate else lr,
      muon_weight_dimension_numbers=dims, mesh=mesh,
      shardings=None if mesh is None else axes,  # Laid out by the rules the Trainer traces under.
      ns_dtype=None if m.ns_dtype == 'auto' else m.ns_dtype, spread_axes=m.spread_axes,
      exchange=m.exchange, chunk_bytes=m.chunk_bytes)


def make_optimizer(cfg: OptimizerConfig, total_steps: int,
                   model_cfg: ModelConfig | None = None, mesh=None) -> optax.GradientTransformation:
  cfg = configs.from_dict(OptimizerConfig, cfg, 'optimizer')
  lr = schedule(cfg, total_steps)
  if cfg.name == 'muon':
    tx = _muon(cfg, lr, total_steps, model_cfg, mesh)
  else:
    tx = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
  return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), tx) if cfg.grad_clip else tx


def qk_clip_targets(cfg: ModelConfig) -> dict:
  """QK-clip targets for one stack's attention params: the head-specific query/key parts."""
  if cfg.attention == 'gqa' and cfg.qk_norm:
    raise ValueError('optimizer.muon.qk_clip_tau: QK-clip cannot act on a model with model.qk_norm=True '
                     '(q and k are normalized after their projections; the norm already bounds logits)')
  if cfg.attention == 'gqa':
    t = QKClipTarget(head_axis=2, layer_axis=0)
    return {'q': t, 'k': t}
  dn, dr = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
  # The rope part of q meets the rope key shared by all heads, so it takes all of gamma.
  q = (QKClipTarget(2, 0, 0.5, (3, 0, dn)), QKClipTarget(2, 0, 1.0, (3, dn, dn + dr)))
  return {'q_b' if cfg.q_lora_rank else 'q': q, 'kv_b': QKClipTarget(2, 0, 0.5, (3, 0, dn))}
