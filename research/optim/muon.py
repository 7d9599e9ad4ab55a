"""Muon that knows the mesh: optax.contrib.muon semantics, whole-matrix NS via all-to-all.

  muon(learning_rate, ns_coeffs='standard', ns_steps=None, beta=0.95, eps=1e-8,
       weight_decay=0.0, weight_decay_mask=None, mu_dtype=None, *, nesterov=True,
       adaptive=False, adam_b1=0.9, adam_b2=0.999, adam_eps_root=0.0, adam_weight_decay=0.0,
       adam_learning_rate=None, muon_weight_dimension_numbers=None, param_labels=None,
       consistent_rms=None, mesh=None, shardings=None, **ns_options: ns_dtype=None,
       spread_axes=None, exchange='all_to_all', chunk_bytes=64 MiB, topology=None)
       -> optax.GradientTransformation
  scale_by_muon(ns_coeffs, ns_steps, beta, eps, mu_dtype, *, nesterov, adaptive,
                weight_dimension_numbers, mesh, shardings, ns_dtype, spread_axes, exchange,
                chunk_bytes, topology) -> optax.GradientTransformation   (momentum + NS, no lr)
  state_shardings(state, params, shardings, mesh=None) -> pytree of NamedSharding

With the same hyperparameters `muon` computes what `optax.contrib.muon` computes (every
`preconditioning`, complex leaves; optax's own tests: tests/optim/test_optax_muon_parity.py). Additions: `mesh` + `shardings` (a pytree, or prefix, of NamedSharding,
PartitionSpec or logical-axis tuples, as the params are laid out; logical axes are mapped by the
rules current when traced: research/parallel/sharding.use_rules, which the Trainer enters) make NS
run on whole matrices spread over the devices (see exchange.py); `ns_dtype` (default bf16 on
accelerators, f32 on CPU) is the dtype exchanged and iterated; `ns_coeffs` takes presets
('standard', 'dion', 'polar_express') or per-step lists; `param_labels` ('muon' | 'adam' per leaf,
tree or callable) overrides the default labelling: Muon for leaves with dimension numbers (every 2-d leaf when `muon_weight_dimension_numbers` is None),
AdamW for the rest and for any leaf under a path component in ADAMW_NAMES (embeddings, output
head). The optimizer state is constrained to the params' shardings, so it saves and restores (with
`state_shardings` as the target) like the params.

Per-head NS is a choice of dimension numbers: move the head axis to the batch axes, e.g. for q of
shape (L, D, H, Dh): MuonDimensionNumbers(reduction_axis=1, output_axis=3).

Errors name the bad field: unknown presets, axis names missing from the mesh and malformed
dimension numbers fail when `muon` is called; dimension numbers that don't fit a leaf's rank and
shardings that don't divide a leaf fail in `init`, the first time shapes are known.
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from optax.contrib import MuonDimensionNumbers

from research.optim import cost as cost_lib
from research.optim import exchange as exchange_lib
from research.optim import newton_schulz
from research.parallel import sharding as sharding_lib

ADAMW_NAMES = ('embed', 'embedding', 'embeddings', 'lm_head', 'unembed')

_is_masked = lambda x: isinstance(x, optax.MaskedNode)
_is_dims = lambda x: x is None or _is_masked(x) or isinstance(x, MuonDimensionNumbers)
_is_spec = lambda x: (x is None or _is_masked(x) or isinstance(x, (P, NamedSharding))
                      or sharding_lib.is_axes(x))


class MuonState(NamedTuple):
  count: jax.Array  # int32 scalar.
  mu: optax.Updates


def path_str(path) -> str:
  return '/'.join(str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k)))) for k in path)


def _broadcast(prefix, tree, is_leaf):
  """Spreads each leaf of a prefix tree over the matching subtree of `tree` (masked stay masked)."""
  return jax.tree.map(
      lambda v, sub: jax.tree.map(lambda x: x if _is_masked(x) else v, sub, is_leaf=_is_masked),
      prefix, tree, is_leaf=is_leaf)


def _check_shardings(shardings, mesh: Mesh | None) -> Mesh | None:
  """Mesh to use (given, or the shardings'); fails naming the leaf on axes the mesh lacks."""
  if shardings is None:
    return mesh
  flat = jax.tree_util.tree_flatten_with_path(shardings, is_leaf=_is_spec)[0]
  if mesh is None:
    mesh = next((s.mesh for _, s in flat if isinstance(s, NamedSharding)), None)
  if mesh is None:
    raise ValueError('mesh: PartitionSpec and logical-axis shardings need a mesh')
  for path, s in flat:
    where = path_str(path) or '<root>'
    if not _is_spec(s):
      raise ValueError(f'shardings at {where}: expected NamedSharding, PartitionSpec or a tuple of '
                       f'logical axis names, got {type(s).__name__}')
    if not sharding_lib.is_axes(s):  # Logical axes are checked when the rules map them.
      spec = s.spec if isinstance(s, NamedSharding) else s or P()
      exchange_lib.spec_axes(spec, len(spec), dict(mesh.shape), where)
  return mesh


def _check_dims(dims) -> None:
  if dims is None or callable(dims):
    return
  for path, d in jax.tree_util.tree_flatten_with_path(dims, is_leaf=_is_dims)[0]:
    if not _is_dims(d):
      raise ValueError(f'weight_dimension_numbers at {path_str(path) or "<root>"}: expected '
                       f'MuonDimensionNumbers or None, got {type(d).__name__}')
    if isinstance(d, MuonDimensionNumbers):
      for field in d._fields:
        v = getattr(d, field)
        if not all(isinstance(a, (int, np.integer)) for a in ((v,) if np.isscalar(v) else v)):
          raise ValueError(f'weight_dimension_numbers at {path_str(path) or "<root>"}: {field} '
                           f'must be ints, got {v!r}')


def default_ns_dtype():
  return jnp.float32 if jax.default_backend() == 'cpu' else jnp.bfloat16


def _named_shardings(tree, shardings, mesh: Mesh):
  """Full tree of NamedSharding for `tree` (masked leaves stay masked). Logical axes are mapped
  by the current rules (sharding.use_rules) and dropped where they don't divide the leaf."""
  def named(s, x):
    if _is_masked(x):
      return x
    if isinstance(s, NamedSharding):
      return s
    if sharding_lib.is_axes(s):
      return NamedSharding(mesh, sharding_lib.fit_spec(sharding_lib.spec(s), x.shape, mesh))
    return NamedSharding(mesh, s or P())
  return jax.tree.map(named, _broadcast(shardings, tree, _is_spec), tree, is_leaf=_is_spec)


def state_shardings(state, params, shardings, mesh: Mesh | None = None):
  """NamedSharding for every array in an optimizer state built from `params`.

  Subtrees shaped like the params (moments; masked leaves allowed) take the params' shardings,
  everything else (counts) is replicated. Use it as the restore target on a new mesh.
  """
  mesh = _check_shardings(shardings, mesh)
  if mesh is None:
    raise ValueError('mesh: state_shardings needs a mesh or NamedSharding shardings')
  param_leaves, params_def = jax.tree.flatten(params, is_leaf=_is_masked)
  named = params_def.flatten_up_to(_named_shardings(params, shardings, mesh))
  replicated = NamedSharding(mesh, P())

  def visit(node):
    if node is None or _is_masked(node):
      return node
    leaves, treedef = jax.tree.flatten(node, is_leaf=_is_masked)
    if treedef == params_def and all(_is_masked(x) or np.shape(x) == np.shape(p)
                                     for x, p in zip(leaves, param_leaves)):
      return treedef.unflatten([x if _is_masked(x) else n for x, n in zip(leaves, named)])
    children, treedef = jax.tree.flatten(node, is_leaf=lambda x: x is not node)
    if len(children) == 1 and children[0] is node:  # An array.
      return replicated
    return treedef.unflatten([visit(c) for c in children])

  return visit(state)


def _constrain(tree, shardings):
  return jax.tree.map(
      lambda x, s: x if _is_masked(x) else jax.lax.with_sharding_constraint(x, s),
      tree, shardings, is_leaf=_is_masked)


def resolve_dimension_numbers(weight_dimension_numbers, tree):
  """Tree (prefix) or callable -> one MuonDimensionNumbers or None per leaf of `tree`."""
  dims = weight_dimension_numbers
  return _broadcast(dims(tree) if callable(dims) else dims, tree, _is_dims)


def leaf_dimension_numbers(d: MuonDimensionNumbers | None, ndim: int,
                           where: str) -> MuonDimensionNumbers:
  """None means a 2-d (reduction, output) matrix; other ranks need explicit dimension numbers."""
  if d is not None:
    return d
  if ndim != 2:
    raise ValueError(f'weight_dimension_numbers at {where}: none given for a rank-{ndim} leaf '
                     f'that Muon is asked to update')
  return MuonDimensionNumbers()


def default_param_labels(params, weight_dimension_numbers=None):
  """'muon' for leaves with dimension numbers (every 2-d leaf if `weight_dimension_numbers` is
  None) outside paths with a component in ADAMW_NAMES, 'adam' for the rest."""
  def label(path, x, d):
    is_matrix = len(x.shape) == 2 if weight_dimension_numbers is None else d is not None
    named = any(str(getattr(k, 'key', getattr(k, 'name', ''))) in ADAMW_NAMES for k in path)
    return 'muon' if is_matrix and not named else 'adam'
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  dims = treedef.flatten_up_to(resolve_dimension_numbers(weight_dimension_numbers, params))
  return treedef.unflatten([label(p, x, d) for (p, x), d in zip(flat, dims)])


class Layouts(NamedTuple):
  """A tree's leaves as Muon's NS sees them: the active (unmasked) ones with their layouts."""
  flat: list                             # (path, leaf) for every leaf, masked ones included.
  treedef: Any
  active: list[int]                      # Positions in `flat` of the unmasked leaves.
  leaves: list[exchange_lib.Leaf]        # Per active leaf.
  groups: list[exchange_lib.Group]       # Over `leaves`.
  shardings: list[NamedSharding] | None  # Per leaf of `flat`; None without a mesh.


@dataclasses.dataclass(frozen=True)
class _Orthogonalizer:
  """Whole-matrix Newton–Schulz on the leaves of a tree laid out on the mesh (scale_by_muon's
  arguments, validated)."""
  ns: Callable[[jax.Array], jax.Array]
  weight_dimension_numbers: Any
  mesh: Mesh | None
  shardings: Any
  ns_dtype: np.dtype
  spread_axes: exchange_lib.SpreadAxes
  exchange: str
  chunk_bytes: int
  steps: int                             # NS steps (what exchange='auto' prices).
  topology: cost_lib.Topology | None     # Hardware exchange='auto' chooses layouts for.

  def layouts(self, tree) -> Layouts:
    """Fails, naming the leaf, on dimension numbers or shardings that don't fit it."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_masked)
    dims = treedef.flatten_up_to(resolve_dimension_numbers(self.weight_dimension_numbers, tree))
    named = (None if self.mesh is None
             else treedef.flatten_up_to(_named_shardings(tree, self.shardings, self.mesh)))
    mesh_shape = dict(self.mesh.shape) if self.mesh is not None else {}
    active = [i for i, (_, x) in enumerate(flat) if not _is_masked(x)]
    leaves = []
    for i in active:
      path, x = flat[i]
      where = path_str(path) or '<root>'
      leaves.append(exchange_lib.leaf_layout(
          x.shape, named and named[i].spec, leaf_dimension_numbers(dims[i], x.ndim, where),
          mesh_shape, self.spread_axes, where, self.exchange))
    dtypes = [exchange_lib.exchange_dtype(self.ns_dtype, flat[i][1].dtype) for i in active]
    groups = exchange_lib.plan_groups(leaves, dtypes, mesh_shape, self.exchange, self.chunk_bytes,
                                      self.steps, self.topology)
    return Layouts(flat, treedef, active, leaves, groups, named)

  def __call__(self, tree):
    lay = self.layouts(tree)
    xs = [lay.flat[i][1] for i in lay.active]
    run = functools.partial(exchange_lib.run, leaves=lay.leaves, groups=lay.groups, ns=self.ns,
                            exchange=self.exchange)
    if self.mesh is None:
      ys = run(xs)
    else:
      in_specs = tuple(lay.shardings[i].spec for i in lay.active)
      ys = jax.shard_map(lambda xs: tuple(run(xs)), mesh=self.mesh, in_specs=(in_specs,),
                         out_specs=in_specs, check_vma=False)(tuple(xs))
    out = [x for _, x in lay.flat]
    for i, y in zip(lay.active, ys):
      out[i] = y
    return lay.treedef.unflatten(out)

  def constrain(self, tree):
    """`tree` (shaped like the params) laid out like the params."""
    if self.mesh is None:
      return tree
    return _constrain(tree, _named_shardings(tree, self.shardings, self.mesh))


def _momentum(updates, state: MuonState, beta: float, nesterov: bool):
  """(new momentum, the bias-corrected (Nesterov) momentum NS acts on, new count)."""
  mu = optax.tree.update_moment(updates, state.mu, beta, 1)
  count_inc = optax.safe_increment(state.count)
  if nesterov:
    mu_hat = jax.tree.map(
        lambda m, g: beta * m + (1 - beta) * g,
        optax.tree.bias_correction(mu, beta, optax.safe_increment(count_inc)),
        optax.tree.bias_correction(updates, beta, count_inc))
  else:
    mu_hat = optax.tree.bias_correction(mu, beta, count_inc)
  return mu, mu_hat, count_inc


def _orthogonalizer(ns_coeffs, ns_steps, eps, preconditioning, weight_dimension_numbers, mesh,
                    shardings, ns_dtype, spread_axes, exchange, chunk_bytes,
                    topology) -> _Orthogonalizer:
  """Checks scale_by_muon's arguments, failing on the first bad one by name."""
  coeffs = newton_schulz.schedule(ns_coeffs, ns_steps)
  if preconditioning not in newton_schulz.PRECONDITIONINGS:
    raise ValueError(f'preconditioning: expected one of {newton_schulz.PRECONDITIONINGS}, got '
                     f'{preconditioning!r}')
  _check_dims(weight_dimension_numbers)
  mesh = _check_shardings(shardings, mesh)
  if not callable(spread_axes):
    exchange_lib.resolve_spread_axes(spread_axes, '<all leaves>',
                                     dict(mesh.shape) if mesh is not None else {})
  if exchange not in exchange_lib.EXCHANGES:
    raise ValueError(f'exchange: expected one of {exchange_lib.EXCHANGES}, got {exchange!r}')
  if exchange in ('balanced',) + exchange_lib.CHOSEN and preconditioning == 'spectral':
    raise ValueError(f"exchange: {exchange!r} may split matrices; preconditioning 'spectral' "
                     "needs them whole")
  return _Orthogonalizer(
      ns=functools.partial(newton_schulz.orthogonalize, coeffs=coeffs, eps=eps,
                           preconditioning=preconditioning),
      weight_dimension_numbers=weight_dimension_numbers, mesh=mesh, shardings=shardings,
      ns_dtype=jnp.dtype(ns_dtype or default_ns_dtype()), spread_axes=spread_axes,
      exchange=exchange, chunk_bytes=chunk_bytes, steps=len(coeffs), topology=topology)


def scale_by_muon(
    ns_coeffs: Any = 'standard',
    ns_steps: int | None = None,
    beta: float = 0.95,
    eps: float = 1e-8,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = 'frobenius',
    weight_dimension_numbers: Any = None,
    mesh: Mesh | None = None,
    shardings: Any = None,
    ns_dtype: Any = None,
    spread_axes: exchange_lib.SpreadAxes = None,
    exchange: str = 'all_to_all',
    chunk_bytes: int = exchange_lib.DEFAULT_CHUNK_BYTES,
    topology: cost_lib.Topology | None = None,
) -> optax.GradientTransformation:
  """Momentum, then Newton–Schulz on every leaf it sees (as optax.contrib.scale_by_muon).

  Args:
    ns_coeffs: preset name, (a, b, c) or a per-step list of them (newton_schulz.schedule).
    ns_steps: NS steps; None: 5 for one triple, the list's length for a per-step list.
    beta, eps, mu_dtype, nesterov: momentum decay, added to norms, momentum dtype (default: the
      params'), Nesterov momentum.
    adaptive: scale each update by <momentum, update> (arXiv:2409.20325).
    preconditioning: 'frobenius', 'spectral', 'aol' or 'schatten' (newton_schulz.orthogonalize).
    weight_dimension_numbers: MuonDimensionNumbers per leaf (tree, prefix or callable); None: 2-d.
    mesh: the device mesh; None: single device, or taken from NamedSharding shardings.
    shardings: how the params are sharded (tree or prefix of NamedSharding / PartitionSpec, or of
      logical-axis tuples mapped by the rules current when traced); None with a mesh: replicated.
    ns_dtype: dtype exchanged and iterated; None: f32 on CPU, bf16 elsewhere (complex: c64 up).
    spread_axes: replicated mesh axes a leaf's matrices are split over, or a callable of the
      leaf's path returning them; None: automatic (docs/muon.md, Layouts).
    exchange: 'all_to_all' (the sharded design), 'balanced' (a few huge matrices split by
      columns), 'auto' / 'auto_fastest' (spread and split per group by the cost model on
      `topology`; 'auto': NS within 1.15x the balanced share if it can) or 'all_gather' (ZeRO-1).
    chunk_bytes: per-device payload of one exchange chunk; smaller chunks overlap more.
    topology: the cluster exchange='auto' plans for (cost.Topology; None: H100/H200 nodes of 8).
  """
  orthogonalize = _orthogonalizer(ns_coeffs, ns_steps, eps, preconditioning,
                                  weight_dimension_numbers, mesh, shardings, ns_dtype, spread_axes,
                                  exchange, chunk_bytes, topology)

  def init_fn(params):
    orthogonalize.layouts(params)  # Fails here, naming the leaf, on dims or shardings that misfit.
    mu = optax.tree.zeros_like(params, dtype=mu_dtype)
    return MuonState(count=jnp.zeros([], jnp.int32), mu=orthogonalize.constrain(mu))

  def update_fn(updates, state, params=None):
    del params
    mu, mu_hat, count = _momentum(updates, state, beta, nesterov)
    new_updates = orthogonalize(mu_hat)
    if adaptive:
      new_updates = jax.tree.map(lambda x, y: jnp.sum(x.conj() * y) * y, mu_hat, new_updates)
    mu = orthogonalize.constrain(optax.tree.cast(mu, mu_dtype))
    return new_updates, MuonState(count=count, mu=mu)

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_shape(weight_dimension_numbers: Any = None,
                   consistent_rms: float | None = None) -> optax.GradientTransformation:
  """sqrt(max(1, fan_out / fan_in)), or consistent_rms * sqrt(max(fan_in, fan_out)) (Moonlight)."""
  def scale(u, d):
    if _is_masked(u):
      return u
    d = leaf_dimension_numbers(d, u.ndim, 'update')
    red, out = exchange_lib.normalize_axes(d, u.ndim, 'update')
    fan_in = math.prod(u.shape[a] for a in red)
    fan_out = math.prod(u.shape[a] for a in out)
    if consistent_rms is None:
      return jnp.sqrt(jnp.maximum(1, fan_out / fan_in)) * u
    return jnp.sqrt(jnp.maximum(fan_in, fan_out)) * consistent_rms * u

  def update_fn(updates, state, params=None):
    del params
    dims = resolve_dimension_numbers(weight_dimension_numbers, updates)
    return jax.tree.map(scale, updates, dims, is_leaf=_is_masked), state

  return optax.GradientTransformation(optax.init_empty_state, update_fn)


def _shard_state(tx: optax.GradientTransformation, shardings, mesh: Mesh):
  def init_fn(params):
    state = tx.init(params)
    return _constrain(state, state_shardings(state, params, shardings, mesh))
  return optax.GradientTransformationExtraArgs(init_fn, tx.update)


def muon(
    learning_rate: optax.ScalarOrSchedule,
    ns_coeffs: Any = 'standard',
    ns_steps: int | None = None,
    beta: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    weight_decay_mask: Any = None,
    mu_dtype: Any = None,
    *,
    nesterov: bool = True,
    adaptive: bool = False,
    preconditioning: str = 'frobenius',
    adam_b1: float = 0.9,
    adam_b2: float = 0.999,
    adam_eps_root: float = 0.0,
    adam_weight_decay: float = 0.0,
    adam_learning_rate: optax.ScalarOrSchedule | None = None,
    muon_weight_dimension_numbers: Any = None,
    param_labels: Any = None,
    consistent_rms: float | None = None,
    mesh: Mesh | None = None,
    shardings: Any = None,
    **ns_options: Any,
) -> optax.GradientTransformation:
  """Muon for matrices, AdamW for the rest; arguments as optax.contrib.muon and scale_by_muon
  (`ns_options`: its ns_dtype, spread_axes, exchange, chunk_bytes, topology).

  `param_labels`: 'muon' / 'adam' per leaf (tree or callable of the params); None: Muon for leaves
  with dimension numbers (all 2-d leaves if `muon_weight_dimension_numbers` is None) outside paths
  containing a component in ADAMW_NAMES.
  """
  dims = muon_weight_dimension_numbers
  mesh = _check_shardings(shardings, mesh)
  tx = optax.partition(
      transforms={
          'muon': optax.chain(
              scale_by_muon(
                  ns_coeffs, ns_steps, beta, eps, mu_dtype, nesterov=nesterov,
                  adaptive=adaptive, preconditioning=preconditioning,
                  weight_dimension_numbers=dims, mesh=mesh, shardings=shardings, **ns_options),
              scale_by_shape(dims, consistent_rms),
              optax.add_decayed_weights(weight_decay, weight_decay_mask),
              optax.scale_by_learning_rate(learning_rate),
          ),
          'adam': optax.adamw(
              learning_rate=learning_rate if adam_learning_rate is None else adam_learning_rate,
              b1=adam_b1, b2=adam_b2, eps=eps, eps_root=adam_eps_root,
              weight_decay=adam_weight_decay, mu_dtype=mu_dtype, nesterov=nesterov),
      },
      param_labels=(functools.partial(default_param_labels, weight_dimension_numbers=dims)
                    if param_labels is None else param_labels))
  return tx if mesh is None else _shard_state(tx, shardings, mesh)
