"""Logical-axis rules: one table maps the model's named dimensions onto mesh axes.

Params and activations are annotated with logical names (`embed`, `experts`, ...). `RULES` is the
single place that decides how each is laid out; change it (or pass another table) to re-shard.
"""

from collections.abc import Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from research.parallel.mesh import BATCH_AXES

Rules = Mapping[str, str | tuple[str, ...] | None]

RULES: Rules = {
    # Params.
    'vocab': 'tensor',
    'embed': 'fsdp',          # FSDP: dense weights are gathered over the narrow fsdp axis.
    'heads': 'tensor',
    'kv_heads': 'tensor',
    'head_dim': None,
    'mlp': 'tensor',
    'experts': 'expert',
    'expert_embed': 'fsdp',
    'expert_mlp': 'tensor',
    'lora': 'fsdp',           # MLA's low-rank projections are FSDP-sharded like other weights.
    'layers': None,
    'norm': None,
    # Activations.
    'act_batch': BATCH_AXES,
    'act_seq': None,
    'act_embed': None,
    'act_heads': 'tensor',
    'act_vocab': 'tensor',
}


def spec(axes: Sequence[str | None], rules: Rules = RULES) -> P:
  """Logical names -> PartitionSpec, never using a mesh axis twice."""
  used, out = set(), []
  for name in axes:
    mesh_axes = None if name is None else rules.get(name)
    if isinstance(mesh_axes, str):
      mesh_axes = (mesh_axes,)
    mesh_axes = tuple(a for a in (mesh_axes or ()) if a not in used)
    used.update(mesh_axes)
    out.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return P(*out)


def fit_spec(p: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops mesh axes from dims they don't divide (e.g. 2 kv heads over tensor=4) -> replicated."""
  out = []
  for dim, entry in zip(shape, tuple(p) + (None,) * (len(shape) - len(p))):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    keep, size = [], 1
    for a in axes:
      if dim % (size * mesh.shape[a]) == 0:
        keep.append(a)
        size *= mesh.shape[a]
    out.append(None if not keep else keep[0] if len(keep) == 1 else tuple(keep))
  return P(*out)


def tree_shardings(axes_tree, shapes_tree, mesh: Mesh, rules: Rules = RULES):
  """Pytree of logical-axis tuples (+ matching shapes) -> pytree of NamedSharding."""
  is_axes = lambda x: isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)
  return jax.tree.map(
      lambda axes, s: NamedSharding(mesh, fit_spec(spec(axes, rules), s.shape, mesh)),
      axes_tree, shapes_tree, is_leaf=is_axes)


def constrain(x: jax.Array, axes: Sequence[str | None], rules: Rules = RULES) -> jax.Array:
  """with_sharding_constraint by logical names; a no-op outside a mesh context."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  p = spec(axes, rules)
  p = fit_spec(p, x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, p)
