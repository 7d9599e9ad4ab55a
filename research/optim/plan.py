"""Analytic cost of the sharded Muon step: pure Python on shapes, no devices needed.

  plan(shapes, shardings, mesh_shape, *, weight_dimension_numbers=None, param_labels=None,
       ns_coeffs='standard', ns_steps=None, ns_dtype='float32', mu_dtype=None,
       spread_axes=None, exchange='all_to_all', chunk_bytes=64 MiB, rules=None,
       peak_flops=None, link_bandwidth=None, topology=None) -> Plan

  shapes        pytree of objects with .shape and .dtype (e.g. jax.eval_shape(init_params, ...)).
  shardings     matching pytree (or prefix) of PartitionSpec / NamedSharding, or of logical-axis
                tuples such as ('layers', 'embed', 'heads', 'head_dim'), mapped through `rules`
                (default: the current table, research/parallel/sharding.py) and dropped where
                they don't divide, as `tree_shardings` does.
  mesh_shape    {axis: size}, any size (e.g. {'data': 8, 'fsdp': 64, 'expert': 32}); standard axes
                left out have size 1.
  other args    as research.optim.muon.muon; peak_flops (FLOP/s per device) and
                link_bandwidth (bytes/s one device sends, one flat link), or a Topology (nodes of
                N devices filled by the mesh in row-major order, innermost axis fastest; intra-
                and inter-node bandwidth and latency; its peak_flops unless peak_flops is given)
                give the predicted seconds.

Plan fields, per device unless noted: ns_flops_per_device (matmul FLOPs of NS, padding and
redundant copies included), ns_flops_total (every matrix once, whole mesh),
exchange_bytes_per_device (bytes sent: all-to-all (S-1)/S of its payload, each way; all-gather
over spread axes (R-1)/R of its result), split into intra_bytes_per_device and
inter_bytes_per_device by where device 0's peers sit (all inter without a topology),
local_shard_bytes (the Muon leaves' shards, param
dtype), state_bytes_per_device (Muon momentum and AdamW moments), num_chunks, and with hardware
numbers compute_seconds, exchange_seconds and
step_seconds = max(compute, exchange) + min(compute, exchange) / num_chunks, where with a topology
exchange = sum over groups of max(intra / intra_bw, inter / inter_bw) + collectives x latency
(chunked exchanges overlap NS except for the pipeline's fill and drain; research/optim/cost.py).
The same layout code as the runtime (exchange.plan_groups) decides groups, padding, chunks and,
with exchange='auto', each group's spread axes and split (priced by cost.py on `topology`, its
peak_flops replaced by `peak_flops` when both are given), so FLOPs and bytes match the compiled
program's cost_analysis() and HLO collectives (tests/optim/test_plan.py).
"""

import dataclasses
import math
import types
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from research.optim import cost as cost_lib
from research.optim import exchange as exchange_lib
from research.optim import muon as muon_lib
from research.optim import newton_schulz
from research.parallel import mesh as mesh_lib
from research.parallel import sharding as sharding_lib


Topology = cost_lib.Topology
peers = cost_lib.peers


@dataclasses.dataclass(frozen=True)
class GroupPlan:
  shape: tuple[int, int]       # (p, q) of one matrix.
  matrices: int                # In the group, whole mesh (no padding).
  per_device: int              # NS'd by one device, padding included.
  exchange_size: int           # S.
  spread_size: int             # R.
  exchange_bytes: float        # Sent by one device.
  intra_bytes: float = 0.0     # Of which to its own node (with a topology).
  inter_bytes: float = 0.0     # To other nodes.
  collectives: int = 0         # All-to-alls, all-gathers and all-reduces.
  inter_node: bool = False     # Whether any of them crosses nodes.
  split: int = 1               # Column sets each matrix is split into (exchange.Group.split).
  restore: str = 'all_gather'  # How spread replicas get the results (exchange.Group.restore).


@dataclasses.dataclass(frozen=True)
class Plan:
  num_devices: int
  ns_flops_per_device: float
  ns_flops_total: float
  exchange_bytes_per_device: float
  intra_bytes_per_device: float
  inter_bytes_per_device: float
  local_shard_bytes: float
  state_bytes_per_device: float
  num_chunks: int
  groups: tuple[GroupPlan, ...]
  compute_seconds: float | None = None
  exchange_seconds: float | None = None
  step_seconds: float | None = None

  @property
  def flops_balance(self) -> float:
    """Per-device NS FLOPs over the perfectly balanced share (1.0 = no waste)."""
    return self.ns_flops_per_device * self.num_devices / max(self.ns_flops_total, 1)

  @property
  def exchange_ratio(self) -> float:
    """Bytes sent over the local Muon shard."""
    return self.exchange_bytes_per_device / max(self.local_shard_bytes, 1)


def _spec(s, shape: Sequence[int], mesh_shape: Mapping[str, int], rules) -> P:
  if isinstance(s, NamedSharding):
    return s.spec
  if sharding_lib.is_axes(s):  # Logical axes: sharding.fit_spec only reads mesh.shape.
    return sharding_lib.fit_spec(sharding_lib.spec(s, rules), shape,
                                 types.SimpleNamespace(shape=mesh_shape))
  return s or P()


def _local_elems(shape, spec: P, mesh_shape, where: str) -> int:
  axes = exchange_lib.spec_axes(spec, len(shape), mesh_shape, where)
  return math.prod(n // math.prod(mesh_shape[a] for a in names) for n, names in zip(shape, axes))


class _MuonLeaves(NamedTuple):
  """The Muon leaves' layouts, with what the per-leaf pass measures."""
  leaves: list[exchange_lib.Leaf]
  dtypes: list[np.dtype]                 # NS dtype of each.
  global_counts: list[int]               # Matrices in each, whole mesh.
  local_bytes: float                     # Muon leaves' shards, param dtype.
  state_bytes: float                     # Muon momentum and AdamW moments.


def _muon_leaves(shapes, shardings, mesh_shape, weight_dimension_numbers, param_labels, ns_dtype,
                 mu_dtype, spread_axes, exchange, rules) -> _MuonLeaves:
  """Layouts of the Muon leaves, their shard bytes and every leaf's optimizer-state bytes."""
  flat, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  sh_flat = treedef.flatten_up_to(jax.tree.map(
      lambda s, sub: jax.tree.map(lambda _: s, sub), shardings, shapes,
      is_leaf=lambda x: x is None or sharding_lib.is_axes(x) or isinstance(x, (P, NamedSharding))))
  dims = treedef.flatten_up_to(
      muon_lib.resolve_dimension_numbers(weight_dimension_numbers, shapes))
  labels = param_labels if param_labels is not None else muon_lib.default_param_labels(
      shapes, weight_dimension_numbers)
  labels = treedef.flatten_up_to(labels(shapes) if callable(labels) else labels)
  leaves, dtypes, global_counts, local_bytes, state_bytes = [], [], [], 0, 0
  for (path, x), s, d, label in zip(flat, sh_flat, dims, labels):
    where = muon_lib.path_str(path) or '<root>'
    spec = _spec(s, x.shape, mesh_shape, rules)
    local = _local_elems(x.shape, spec, mesh_shape, where)
    itemsize = np.dtype(x.dtype).itemsize
    moment = np.dtype(mu_dtype or x.dtype).itemsize
    if label == 'muon':
      d = muon_lib.leaf_dimension_numbers(d, len(x.shape), where)
      leaf = exchange_lib.leaf_layout(x.shape, spec, d, mesh_shape, spread_axes, where, exchange)
      leaves.append(leaf)
      dtypes.append(exchange_lib.exchange_dtype(ns_dtype, x.dtype))
      local_bytes += local * itemsize
      state_bytes += local * moment
      global_counts.append(leaf.total)
    else:
      state_bytes += local * (moment + itemsize)
  return _MuonLeaves(leaves, dtypes, global_counts, local_bytes, state_bytes)


def _group_plans(muon: _MuonLeaves, mesh_shape, exchange: str, chunk_bytes: int, steps: int,
                 topology: Topology | None) -> list[tuple[GroupPlan, cost_lib.GroupCost, int]]:
  """Each exchange group as the runtime lays it out: (plan, cost, chunks)."""
  out = []
  for g in exchange_lib.plan_groups(muon.leaves, muon.dtypes, mesh_shape, exchange, chunk_bytes,
                                    steps, topology):
    c = cost_lib.group_cost(g, mesh_shape, steps, topology.devices_per_node if topology else 1,
                            exchange == 'all_gather')
    shape = (g.shape[0], g.shape[1] * g.split)
    out.append((GroupPlan(shape, sum(muon.global_counts[i] for i in g.leaves), sum(g.chunks),
                          g.exchange_size, g.spread_size, c.intra_bytes + c.inter_bytes,
                          c.intra_bytes, c.inter_bytes, c.collectives, c.inter_node, g.split,
                          g.restore), c, len(g.chunks)))
  return out


def _with_seconds(out: Plan, costs: Sequence[cost_lib.GroupCost], peak_flops: float,
                  link_bandwidth: float | None, topology: Topology | None) -> Plan:
  compute = out.ns_flops_per_device / peak_flops
  comm = (sum(c.exchange_seconds(topology) for c in costs) if topology is not None
          else out.exchange_bytes_per_device / link_bandwidth)
  return dataclasses.replace(
      out, compute_seconds=compute, exchange_seconds=comm,
      step_seconds=max(compute, comm) + min(compute, comm) / out.num_chunks)


def plan(shapes: Any, shardings: Any, mesh_shape: Mapping[str, int], *,
         weight_dimension_numbers: Any = None, param_labels: Any = None,
         ns_coeffs: Any = 'standard', ns_steps: int | None = None, ns_dtype: Any = 'float32',
         mu_dtype: Any = None, spread_axes: exchange_lib.SpreadAxes = None,
         exchange: str = 'all_to_all', chunk_bytes: int = exchange_lib.DEFAULT_CHUNK_BYTES,
         rules: sharding_lib.Rules | None = None, peak_flops: float | None = None,
         link_bandwidth: float | None = None, topology: Topology | None = None) -> Plan:
  """Per-device NS FLOPs, exchange bytes and state bytes of one step (module docstring)."""
  # The standard axes the rules may name default to size 1.
  mesh_shape = {a: 1 for a in mesh_lib.AXES} | {a: int(n) for a, n in mesh_shape.items()}
  for a, n in mesh_shape.items():
    if n < 1:
      raise ValueError(f'mesh_shape: axis {a!r} has size {n}')
  steps = len(newton_schulz.schedule(ns_coeffs, ns_steps))
  muon = _muon_leaves(shapes, shardings, mesh_shape, weight_dimension_numbers, param_labels,
                      np.dtype(ns_dtype), mu_dtype, spread_axes, exchange, rules)
  if topology is not None and peak_flops:
    topology = dataclasses.replace(topology, peak_flops=peak_flops)
  planned = _group_plans(muon, mesh_shape, exchange, chunk_bytes, steps, topology)
  groups = tuple(g for g, _, _ in planned)
  out = Plan(num_devices=math.prod(mesh_shape.values()),
             ns_flops_per_device=sum(c.ns_flops for _, c, _ in planned),
             ns_flops_total=sum(g.matrices * newton_schulz.flops(*g.shape, steps) for g in groups),
             exchange_bytes_per_device=sum((g.exchange_bytes for g in groups), 0.0),
             intra_bytes_per_device=sum((g.intra_bytes for g in groups), 0.0),
             inter_bytes_per_device=sum((g.inter_bytes for g in groups), 0.0),
             local_shard_bytes=muon.local_bytes, state_bytes_per_device=muon.state_bytes,
             num_chunks=max(sum(n for _, _, n in planned), 1), groups=groups)
  peak = topology.peak_flops if topology is not None else peak_flops
  if peak and (link_bandwidth or topology):
    return _with_seconds(out, [c for _, c, _ in planned], peak, link_bandwidth, topology)
  return out
