"""Layouts and collectives that give each device whole matrices for Newton–Schulz.

Every Muon leaf is viewed as a batch of matrices: its batch axes (all but the reduction and output
axes of its dimension numbers) index the matrices, its reduction x output axes form each matrix,
oriented wide (rows <= cols, what NS works on; square ones keep reduction as rows, as optax does).
Mesh axes fall into three roles per leaf:

  batch axes     split the batch axes: matrices already whole, nothing to do;
  exchange axes  split the matrix axes (M, S devices): one all-to-all turns "S shards of every local
                 matrix" into "S-th of the local matrices, whole" and one all-to-all returns them;
  spread axes    the leaf is replicated over them (R): each replica takes an R-th of the matrices
                 before the exchange (no traffic) and an all-gather over R restores the replicas.

Leaves with the same local matrix layout (sizes and mesh axes of every matrix axis), exchange dtype
and spread axes form a group: their batches are concatenated and padded with zero matrices to a
multiple of R*S (NS maps zero to zero), so padding is paid once per group, not per leaf. A group is
cut into chunks of about `chunk_bytes` per device, each with its own all-to-alls, so that the
scheduler can run one chunk's exchange while another's NS computes. Normalization happens inside
NS, after the exchange, on whole matrices.

Spread replicas get every result back by an all-gather of their padded pieces, or, when padding
is more than half of what it would gather (a few matrices spread over many replicas), by an
all-reduce of the real matrices with zeros where a replica did not compute.

exchange='balanced' splits each matrix's columns over the exchange group when that lowers NS
FLOPs (a few huge matrices); exchange='auto' chooses, per group, the spread axes (any subset of
the replicated axes) and whether to split, by the predicted step (research/optim/cost.py) on a
cost.Topology: the fastest whose busiest device's NS FLOPs are within BALANCE of the balanced
share, when one is ('auto_fastest': the fastest).

`plan_groups` is pure Python on shapes, specs and a {axis: size} mesh: the runtime (`run`, inside
`jax.shard_map` over the full mesh) and the analytic planner (research/optim/plan.py) share it.
"""

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from optax.contrib import MuonDimensionNumbers

from research.optim import cost as cost_lib
from research.optim import newton_schulz

EXCHANGES = ('all_to_all', 'all_gather', 'balanced', 'auto', 'auto_fastest')
CHOSEN = ('auto', 'auto_fastest')  # Exchanges whose per-group layouts the cost model chooses.
DEFAULT_CHUNK_BYTES = 64 * 2**20
BALANCE = 1.15  # exchange='auto': the busiest device's NS FLOPs over the balanced share it aims
                # at ('auto_fastest': none, the fastest predicted step).
EXCHANGE_WEIGHTS = tuple(2.0**k for k in range(-8, 9))  # Exchange- vs NS-seconds trade-offs.


@dataclasses.dataclass(frozen=True)
class Dim:
  size: int                # Global extent.
  axes: tuple[str, ...]    # Mesh axes splitting it, major to minor (size-1 axes dropped).
  local: int               # Extent on one device.


@dataclasses.dataclass(frozen=True)
class Leaf:
  """How one leaf's local block maps to a batch of local matrix blocks."""
  perm: tuple[int, ...]          # Leaf axes -> (batch..., rows..., cols...).
  local_shape: tuple[int, ...]   # Local block after `perm`.
  count: int                     # Matrices in the local block.
  dims: tuple[Dim, ...]          # Row dims then column dims.
  n_rows: int                    # How many of `dims` are rows.
  spread: tuple[str, ...]        # Replicated mesh axes its matrices are split over.
  total: int = 0                 # Matrices in the whole leaf (all devices).


@dataclasses.dataclass(frozen=True)
class Group:
  """Leaves orthogonalized together: one padded batch, exchanged in chunks."""
  leaves: tuple[int, ...]        # Positions in the flat list of Muon leaves.
  counts: tuple[int, ...]        # Local matrices per leaf.
  dims: tuple[Dim, ...]
  n_rows: int
  exchange_axes: tuple[str, ...]  # M, in mesh order.
  exchange_sizes: tuple[int, ...]
  spread_axes: tuple[str, ...]    # R, in mesh order.
  spread_size: int
  padded: int                    # Local batch after padding: a multiple of R * S.
  chunks: tuple[int, ...]        # Whole matrices per device in each chunk.
  dtype: np.dtype                # Dtype exchanged and iterated.
  split: int = 1                 # S when each matrix's columns are split over M (`dims` then
                                 # describe one column set); 1: whole matrices.
  restore: str = 'all_gather'    # How spread replicas get every result: 'all_gather' of the
                                 # padded pieces, or 'psum' of the real matrices (zeros elsewhere).

  @property
  def exchange_size(self) -> int:
    return math.prod(self.exchange_sizes)

  @property
  def shape(self) -> tuple[int, int]:
    """(p, q) of one whole matrix, p <= q."""
    return (math.prod(d.size for d in self.dims[:self.n_rows]),
            math.prod(d.size for d in self.dims[self.n_rows:]))

  @property
  def local_elems(self) -> int:
    """Elements of one matrix's local shard."""
    return math.prod(d.local for d in self.dims)


def exchange_dtype(ns_dtype, param_dtype) -> np.dtype:
  """What a leaf is exchanged and iterated in: `ns_dtype`, or for a complex leaf the complex dtype
  that holds it (complex64 at least: there is no complex bf16)."""
  if jnp.issubdtype(param_dtype, jnp.complexfloating):
    return np.dtype(jnp.promote_types(ns_dtype, jnp.complex64))
  return np.dtype(ns_dtype)


def normalize_axes(dim_nums: MuonDimensionNumbers, ndim: int,
                   where: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """Non-negative (reduction, output) axes; fails naming the leaf if they don't fit its rank."""
  def norm(field):
    axes = getattr(dim_nums, field)
    axes = (axes,) if isinstance(axes, (int, np.integer)) else tuple(axes)
    if not axes:
      raise ValueError(f'weight_dimension_numbers at {where}: {field} is empty')
    for a in axes:
      if not -ndim <= a < ndim:
        raise ValueError(f'weight_dimension_numbers at {where}: {field} {a} is out of range for a '
                         f'rank-{ndim} leaf')
    out = tuple(int(a) % ndim for a in axes)
    if len(set(out)) != len(out):
      raise ValueError(f'weight_dimension_numbers at {where}: {field} {axes} repeats an axis')
    return out
  if ndim < 2:
    raise ValueError(f'weight_dimension_numbers at {where}: Muon needs a leaf of rank >= 2, got '
                     f'rank {ndim}')
  red, out = norm('reduction_axis'), norm('output_axis')
  if set(red) & set(out):
    raise ValueError(f'weight_dimension_numbers at {where}: reduction_axis {red} and output_axis '
                     f'{out} overlap')
  return red, out


def spec_axes(spec: P | None, ndim: int, mesh_shape: Mapping[str, int],
              where: str) -> tuple[tuple[str, ...], ...]:
  """PartitionSpec -> mesh axes per leaf axis (size-1 axes dropped); fails on unknown axes."""
  entries = tuple(spec or ())
  if len(entries) > ndim:
    raise ValueError(f'shardings at {where}: spec {spec} has more entries than the leaf rank '
                     f'{ndim}')
  out = []
  for e in entries + (None,) * (ndim - len(entries)):
    names = () if e is None else (e,) if isinstance(e, str) else tuple(e)
    for n in names:
      if n not in mesh_shape:
        raise ValueError(f'shardings at {where}: mesh axis {n!r} is not in the mesh '
                         f'{dict(mesh_shape)}')
    out.append(tuple(n for n in names if mesh_shape[n] > 1))
  return tuple(out)


SpreadAxes = Sequence[str] | Callable[[str], Sequence[str] | None] | None


def resolve_spread_axes(spread_axes: SpreadAxes, where: str,
                        mesh_shape: Mapping[str, int]) -> tuple[str, ...] | None:
  """The leaf's spread axes (None: automatic); a callable gets the leaf's path."""
  axes = spread_axes(where) if callable(spread_axes) else spread_axes
  for n in axes or ():
    if n not in mesh_shape:
      raise ValueError(f'spread_axes at {where}: mesh axis {n!r} is not in the mesh '
                       f'{dict(mesh_shape)}')
  return None if axes is None else tuple(axes)


def leaf_layout(shape: Sequence[int], spec: P | None, dim_nums: MuonDimensionNumbers,
                mesh_shape: Mapping[str, int], spread_axes: SpreadAxes, where: str,
                exchange: str = 'all_to_all') -> Leaf:
  """Layout of one leaf. Spread axes: the given ones the leaf is replicated over; None (or a
  callable returning None): all its replicated axes if it needs an exchange (or with
  an exchange in CHOSEN, which chooses among them), else none."""
  ndim = len(shape)
  red, out = normalize_axes(dim_nums, ndim, where)
  axes = spec_axes(spec, ndim, mesh_shape, where)
  for i, names in enumerate(axes):
    split = math.prod(mesh_shape[n] for n in names)
    if shape[i] % split:
      raise ValueError(f'shardings at {where}: axis {i} of size {shape[i]} is not divisible by '
                       f'mesh axes {names} ({split} devices)')
  if math.prod(shape[a] for a in red) > math.prod(shape[a] for a in out):
    red, out = out, red  # NS runs on the wide side (rows <= cols).
  batch = tuple(a for a in range(ndim) if a not in red and a not in out)
  dim = lambda a: Dim(shape[a], axes[a], shape[a] // math.prod(mesh_shape[n] for n in axes[a]))
  dims = tuple(dim(a) for a in red + out)
  local = tuple(dim(a).local for a in batch) + tuple(d.local for d in dims)
  used = {n for names in axes for n in names}
  replicated = tuple(n for n, s in mesh_shape.items() if s > 1 and n not in used)
  spread_axes = resolve_spread_axes(spread_axes, where, mesh_shape)
  if spread_axes is None:
    spread = replicated if exchange in CHOSEN or any(d.axes for d in dims) else ()
  else:
    spread = tuple(n for n in replicated if n in spread_axes)
  return Leaf(perm=batch + red + out, local_shape=local,
              count=math.prod(local[:len(batch)]), dims=dims, n_rows=len(red), spread=spread,
              total=math.prod(shape[a] for a in batch))


def _splits(dims: Sequence[Dim], n_rows: int, count: int, s: int) -> bool:
  """Whether splitting each matrix's columns over the S exchange devices (X X^T and B X split,
  A A repeated) lowers a device's NS FLOPs below whole matrices padded to a multiple of S: the
  case of a few huge matrices on a wide group."""
  p = math.prod(d.size for d in dims[:n_rows])
  q = math.prod(d.size for d in dims[n_rows:])
  if not _can_split(dims, s):
    return False
  return count * (2 * q / s + p) < -(-count // s) * (2 * q + p)


def _can_split(dims: Sequence[Dim], s: int) -> bool:
  return s > 1 and dims[-1].local % s == 0


def _useful_spread(spread: Sequence[str], count: int, s_size: int,
                   mesh_shape: Mapping[str, int]) -> tuple[str, ...]:
  """The spread axes that lower each device's share: past that, padding and the all-gather grow
  with the mesh (a few large matrices on thousands of devices) for nothing."""
  kept, r_size = [], 1
  for n in spread:
    if -(-count // (s_size * r_size * mesh_shape[n])) < -(-count // (s_size * r_size)):
      kept.append(n)
      r_size *= mesh_shape[n]
  return tuple(kept)


def _group(idx: Sequence[int], counts: tuple[int, ...], dims: tuple[Dim, ...], n_rows: int,
           dt: np.dtype, spread: tuple[str, ...], split: int, mesh_shape: Mapping[str, int],
           exchange: str, chunk_bytes: int) -> Group:
  """One group with its spread axes and split decided: padding, chunks and how replicas are
  restored (an all-reduce of the real matrices when the all-gather would carry mostly padding)."""
  order = list(mesh_shape)
  m_axes = tuple(sorted({n for d in dims for n in d.axes}, key=order.index))
  s_size = math.prod(mesh_shape[n] for n in m_axes)
  r_size = math.prod(mesh_shape[n] for n in spread)
  if exchange == 'all_gather':  # Every device runs NS on all its matrices, whole.
    spread, r_size, padded, per_device = (), 1, sum(counts), sum(counts)
  elif split > 1:  # Column set k of every matrix goes to device k; replicas share matrices.
    last = dims[-1]
    dims = dims[:-1] + (Dim(last.size // split, last.axes, last.local // split),)
    per_device = -(-sum(counts) // r_size)
    padded = split * per_device * r_size
  else:
    unit = r_size * s_size
    padded = -(-sum(counts) // unit) * unit
    per_device = padded // unit
  step = max(1, chunk_bytes // (math.prod(d.size for d in dims) * dt.itemsize))
  if exchange == 'all_gather' or s_size == 1 or split > 1:  # One batched NS.
    step = max(per_device, 1)
  chunks = tuple(min(step, per_device - s) for s in range(0, per_device, step))
  restore = 'psum' if r_size > 1 and 2 * split * sum(counts) < padded else 'all_gather'
  return Group(
      leaves=tuple(idx), counts=counts, dims=dims, n_rows=n_rows, exchange_axes=m_axes,
      exchange_sizes=tuple(mesh_shape[n] for n in m_axes), spread_axes=spread,
      spread_size=r_size, padded=padded, chunks=chunks, dtype=dt, split=split, restore=restore)


def _options(idx, counts, dims, n_rows, dt, spread, mesh_shape, chunk_bytes) -> list[Group]:
  """exchange='auto''s candidates for one group: every subset of its replicated axes to spread
  over, with whole matrices or (too big to share) their columns split over the exchange group."""
  s_size = math.prod(mesh_shape[n] for d in dims for n in d.axes)
  subsets = [tuple(n for i, n in enumerate(spread) if mask >> i & 1)
             for mask in range(2 ** len(spread))]
  splits = (1, s_size) if _can_split(dims, s_size) else (1,)
  return [_group(idx, counts, dims, n_rows, dt, sub, split, mesh_shape, 'auto', chunk_bytes)
          for sub in subsets for split in splits]


def _choose(options: Sequence[Sequence[Group]], leaves: Sequence[Leaf],
            mesh_shape: Mapping[str, int], steps: int, topology: cost_lib.Topology,
            balance: float) -> list[Group]:
  """Per group, the option minimizing NS seconds + mu x exchange seconds, for each mu in
  EXCHANGE_WEIGHTS (the trade-offs between the two totals); of these, the fastest predicted step
  (cost.step_seconds) whose busiest device's NS FLOPs are within `balance` x the balanced share
  (NS keeps the compute units busy; an exchange can also hide behind other work), or if none is,
  the fastest."""
  costs = [[cost_lib.group_cost(g, mesh_shape, steps, topology.devices_per_node) for g in opts]
           for opts in options]
  balanced = sum(leaves[i].total * newton_schulz.flops(*opts[0].shape, steps)  # opts[0]: whole.
                 for opts in options for i in opts[0].leaves) / math.prod(mesh_shape.values())
  ranked = []
  for mu in EXCHANGE_WEIGHTS:
    pick = [min(range(len(cs)), key=lambda k: (cs[k].ns_flops / topology.peak_flops
                                               + mu * cs[k].exchange_seconds(topology)))
            for cs in costs]
    chosen = [options[i][k] for i, k in enumerate(pick)]
    picked = [costs[i][k] for i, k in enumerate(pick)]
    step = cost_lib.step_seconds(picked, sum(len(g.chunks) for g in chosen), topology)
    ranked.append((sum(c.ns_flops for c in picked) > balance * balanced, step, chosen))
  return min(ranked, key=lambda r: r[:2])[2]


def plan_groups(leaves: Sequence[Leaf], dtypes: Sequence[np.dtype], mesh_shape: Mapping[str, int],
                exchange: str = 'all_to_all', chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                steps: int = 5, topology: cost_lib.Topology | None = None) -> list[Group]:
  """Groups leaves with equal local matrix layout, dtype and spread axes; pads and chunks them.
  With exchange='balanced', a group whose matrices are better split (`_splits`) is; with 'auto'
  ('auto_fastest'), each group's spread axes and split are chosen by the predicted step on
  `topology` (default: H100 nodes) for NS of `steps` steps, within BALANCE where reachable (not)."""
  if exchange not in EXCHANGES:
    raise ValueError(f'exchange: expected one of {EXCHANGES}, got {exchange!r}')
  keyed: dict[tuple, list[int]] = {}
  for i, (leaf, dt) in enumerate(zip(leaves, dtypes)):
    keyed.setdefault((leaf.dims, leaf.n_rows, np.dtype(dt), leaf.spread), []).append(i)
  options = []
  for (dims, n_rows, dt, spread), idx in keyed.items():
    counts = tuple(leaves[i].count for i in idx)
    if exchange in CHOSEN:
      options.append(_options(idx, counts, dims, n_rows, dt, spread, mesh_shape, chunk_bytes))
      continue
    s_size = math.prod(mesh_shape[n] for d in dims for n in d.axes)
    split = s_size if exchange == 'balanced' and _splits(dims, n_rows, sum(counts), s_size) else 1
    spread = () if split > 1 else _useful_spread(spread, sum(counts), s_size, mesh_shape)
    options.append([_group(idx, counts, dims, n_rows, dt, spread, split, mesh_shape, exchange,
                           chunk_bytes)])
  if exchange in CHOSEN:
    return _choose(options, leaves, mesh_shape, steps, topology or cost_lib.Topology(),
                   BALANCE if exchange == 'auto' else math.inf)
  return [opts[0] for opts in options]


def _expanded(g: Group) -> tuple[tuple[int, ...], list[int]]:
  """Whole-matrix shape with each dim split into (mesh pieces..., local), and the transpose that
  takes (M pieces in `exchange_axes` order, batch, local dims...) to it."""
  shape, perm = [], [len(g.exchange_axes)]
  for i, d in enumerate(g.dims):
    shape += [g.exchange_sizes[g.exchange_axes.index(n)] for n in d.axes] + [d.local]
    perm += [g.exchange_axes.index(n) for n in d.axes] + [len(g.exchange_axes) + 1 + i]
  return tuple(shape), perm


def _whole(x: jax.Array, g: Group) -> jax.Array:
  """(S * c, local dims...) shards -> (c, p, q) whole matrices, c = this device's share."""
  c = x.shape[0] // g.exchange_size
  if g.exchange_size > 1:
    x = x.reshape((g.exchange_size, c) + x.shape[1:])
    x = jax.lax.all_to_all(x, g.exchange_axes, 0, 0, tiled=True)  # Axis 0 now: the source.
    x = x.reshape(g.exchange_sizes + (c,) + x.shape[2:]).transpose(_expanded(g)[1])
  return x.reshape((c,) + g.shape)


def _shards(y: jax.Array, g: Group) -> jax.Array:
  """Inverse of `_whole`."""
  c = y.shape[0]
  local = tuple(d.local for d in g.dims)
  if g.exchange_size == 1:
    return y.reshape((c,) + local)
  shape, perm = _expanded(g)
  y = y.reshape((c,) + shape).transpose(np.argsort(perm))
  y = y.reshape((g.exchange_size, c) + local)
  y = jax.lax.all_to_all(y, g.exchange_axes, 0, 0, tiled=True)
  return y.reshape((g.exchange_size * c,) + local)


def _all_to_all_group(x: jax.Array, g: Group, ns: Callable[..., jax.Array]) -> jax.Array:
  """Rows of `x` are (column set, matrix) shards; split groups have more than one column set."""
  if g.split > 1:  # Each device holds one column set of every matrix: NS sums X X^T over M.
    ns = functools.partial(ns, axis_name=g.exchange_axes)
  sub = x.shape[1:]
  x = x.reshape((g.split, -1) + sub)
  real = x.shape[1]
  x = jnp.pad(x, [(0, 0), (0, g.padded // g.split - real)] + [(0, 0)] * len(sub))
  if g.spread_size > 1:  # Replicas each take their share; no traffic.
    x = x.reshape((g.split, g.spread_size, -1) + sub)
    x = jax.lax.dynamic_index_in_dim(x, jax.lax.axis_index(g.spread_axes), 1, keepdims=False)
  x = x.reshape((-1,) + sub)
  outs, start = [], 0
  for c in g.chunks:
    n = c * g.exchange_size
    outs.append(_shards(ns(_whole(x[start:start + n], g)), g))
    start += n
  y = (jnp.concatenate(outs) if len(outs) > 1 else outs[0]).reshape((g.split, -1) + sub)
  if g.restore == 'psum':  # Each replica's results in place, zeros elsewhere, summed.
    full = jnp.zeros((g.split, g.padded // g.split) + sub, y.dtype)
    full = jax.lax.dynamic_update_slice_in_dim(
        full, y, jax.lax.axis_index(g.spread_axes) * y.shape[1], 1)
    y = jax.lax.psum(full[:, :real], g.spread_axes)
  elif g.spread_size > 1:
    y = jax.lax.all_gather(y, g.spread_axes, axis=1, tiled=True)
  return y.reshape((-1,) + sub)


def _all_gather_group(x: jax.Array, g: Group, ns: Callable[[jax.Array], jax.Array]) -> jax.Array:
  """ZeRO-1 style baseline: gather whole matrices everywhere, NS all of them, keep the shard."""
  for i, d in enumerate(g.dims):
    if d.axes:
      x = jax.lax.all_gather(x, d.axes, axis=1 + i, tiled=True)
  y = ns(x.reshape((x.shape[0],) + g.shape)).reshape(x.shape)
  for i, d in enumerate(g.dims):
    if d.axes:
      y = jax.lax.dynamic_slice_in_dim(y, jax.lax.axis_index(d.axes) * d.local, d.local, 1 + i)
  return y


def run(xs: Sequence[jax.Array], leaves: Sequence[Leaf], groups: Sequence[Group],
        ns: Callable[..., jax.Array], exchange: str = 'all_to_all') -> list[jax.Array]:
  """Orthogonalizes local blocks `xs` (inside shard_map over the full mesh, or unsharded).

  `ns` maps (c, p, q) whole matrices to their orthogonalization in the same dtype; with
  `axis_name`, (c, p, q') column sets of matrices whose other columns are on those mesh axes.
  Split groups order their batch (column set, matrix), so device k receives column set k.
  """
  group_fn = _all_gather_group if exchange == 'all_gather' else _all_to_all_group
  out = [None] * len(xs)
  for g in groups:
    sub = tuple(d.local for d in g.dims)
    blocks = [xs[i].transpose(leaves[i].perm).reshape(
        (leaves[i].count,) + sub[:-1] + (g.split, sub[-1])) for i in g.leaves]
    x = jnp.moveaxis(jnp.concatenate(blocks) if len(blocks) > 1 else blocks[0], -2, 0)
    y = group_fn(x.reshape((-1,) + sub).astype(g.dtype), g, ns)
    y = y.reshape((g.split, -1) + sub)
    start = 0
    for i, n in zip(g.leaves, g.counts):
      leaf = leaves[i]
      block = jnp.moveaxis(y[:, start:start + n], 0, -2).reshape(leaf.local_shape)
      out[i] = block.transpose(np.argsort(leaf.perm)).astype(xs[i].dtype)
      start += n
  return out
