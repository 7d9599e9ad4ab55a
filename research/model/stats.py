"""Parameter counts and per-device bytes from abstract shapes (no memory is allocated)."""

import math
import types

import jax
import numpy as np

from research.model import transformer
from research.model.config import ModelConfig
from research.parallel import sharding


def param_counts(cfg: ModelConfig) -> dict[str, int]:
  """Total parameters, and active ones (k routed experts per token instead of all of them)."""
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
  idle_experts = cfg.num_moe_layers * (cfg.num_experts - cfg.num_experts_per_tok)
  active = total - idle_experts * 3 * cfg.d_model * cfg.d_expert
  return {'total_params': total, 'active_params': active}


def bytes_per_device(cfg: ModelConfig, mesh_shape: dict[str, int],
                     rules: sharding.Rules | None = None) -> int:
  """Parameter bytes on the most loaded device for a mesh given as {axis: size}; rules: the
  current table by default."""
  shapes = jax.eval_shape(lambda: transformer.init(cfg, jax.random.key(0)))
  axes = transformer.param_axes(cfg)

  mesh = types.SimpleNamespace(shape=mesh_shape)  # fit_spec reads only .shape: no devices needed.

  def one(ax, x):
    p = sharding.fit_spec(sharding.spec(ax, rules), x.shape, mesh)
    ways = [mesh_shape[a] for e in p for a in sharding.entry_axes(e)]
    return math.prod(x.shape) * np.dtype(x.dtype).itemsize / math.prod(ways)
  return int(sum(jax.tree.leaves(jax.tree.map(one, axes, shapes, is_leaf=sharding.is_axes))))
