"""Logical-axis rules: one table maps the model's named dimensions onto mesh axes.

Params and activations are annotated with logical names (`embed`, `experts`, ...). A rules table
decides how each is laid out: `RULES` by default, or another one made current with `use_rules`
(the `Trainer` enters its own around everything it traces). `spec`, `tree_shardings`,
`constrain`, the expert layer's shard_map and Muon's logical-axis shardings all read the current
table, so swapping it re-shards params, optimizer state and activations alike. The table is read
while a function is traced: a jitted function keeps the table it was traced under.
"""

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from research.parallel.mesh import BATCH_MESH_AXES

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
    'act_batch': BATCH_MESH_AXES,
    'act_seq': None,
    'act_embed': None,
    'act_heads': 'tensor',
    'act_vocab': 'tensor',
}

_CURRENT: contextvars.ContextVar[Rules] = contextvars.ContextVar('rules', default=RULES)


@contextlib.contextmanager
def use_rules(rules: Rules) -> Iterator[Rules]:
  """Makes `rules` the table that functions given no explicit rules read (while tracing)."""
  token = _CURRENT.set(rules)
  try:
    yield rules
  finally:
    _CURRENT.reset(token)


def current_rules() -> Rules:
  return _CURRENT.get()


def mesh_axes(name: str | None, rules: Rules | None = None) -> tuple[str, ...]:
  """The mesh axes one logical name maps to; () when it is replicated."""
  axes = None if name is None else (current_rules() if rules is None else rules).get(name)
  return (axes,) if isinstance(axes, str) else tuple(axes or ())


def spec(axes: Sequence[str | None], rules: Rules | None = None) -> P:
  """Logical names -> PartitionSpec, never using a mesh axis twice."""
  used, out = set(), []
  for name in axes:
    names = tuple(a for a in mesh_axes(name, rules) if a not in used)
    used.update(names)
    out.append(entry(names))
  return P(*out)


def entry(names: Sequence[str]) -> str | tuple[str, ...] | None:
  """Mesh axis names -> one PartitionSpec entry (None, a name, or a tuple of names)."""
  return None if not names else names[0] if len(names) == 1 else tuple(names)


def entry_axes(e: str | Sequence[str] | None) -> tuple[str, ...]:
  """One PartitionSpec entry -> its mesh axis names."""
  return () if e is None else (e,) if isinstance(e, str) else tuple(e)


def fit_spec(p: P, shape: Sequence[int], mesh: Mesh) -> P:
  """Drops mesh axes from dims they don't divide (e.g. 2 kv heads over tensor=4) -> replicated."""
  out = []
  for dim, e in zip(shape, tuple(p) + (None,) * (len(shape) - len(p))):
    keep, size = [], 1
    for a in entry_axes(e):
      if dim % (size * mesh.shape[a]) == 0:
        keep.append(a)
        size *= mesh.shape[a]
    out.append(entry(keep))
  return P(*out)


def is_axes(x) -> bool:
  """A tuple of logical names (the leaves of `param_axes` trees)."""
  return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def tree_shardings(axes_tree, shapes_tree, mesh: Mesh, rules: Rules | None = None):
  """Pytree of logical-axis tuples (+ matching shapes) -> pytree of NamedSharding."""
  return jax.tree.map(
      lambda axes, s: NamedSharding(mesh, fit_spec(spec(axes, rules), s.shape, mesh)),
      axes_tree, shapes_tree, is_leaf=is_axes)


def constrain(x: jax.Array, axes: Sequence[str | None], rules: Rules | None = None) -> jax.Array:
  """with_sharding_constraint by logical names; a no-op outside a mesh context."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  p = spec(axes, rules)
  p = fit_spec(p, x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, p)
