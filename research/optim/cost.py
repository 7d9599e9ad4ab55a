"""What one exchange group costs a device: NS FLOPs, bytes per link class and seconds.

Pure Python on a group's layout (exchange.Group) and a {axis: size} mesh. Both the layout chooser
(exchange.plan_groups with exchange='auto', which the runtime calls) and the analytic planner
(plan.py) price groups here, so what the code runs is what the model predicts.

Devices fill nodes of `devices_per_node` in the mesh's row-major order (innermost axis fastest, as
jax.make_mesh lays them out). Bytes are what a device sends (hlo_stats' convention): all-to-all and
all-gather over G devices (G-1)/G of the result, all-reduce 2 (G-1)/G; every peer of a collective
gets an equal part, so a collective's bytes split into intra- and inter-node by where the peers sit.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from research.optim import newton_schulz


@dataclasses.dataclass(frozen=True)
class Topology:
  """Nodes of `devices_per_node` devices; the mesh's devices fill them in row-major order (the
  last, innermost mesh axis varies fastest, as jax.make_mesh lays them). Bandwidths: bytes/s one
  device sends (per direction); latencies: seconds per collective; peak_flops: dense FLOP/s of one
  device in the NS dtype. Defaults: H100/H200 nodes (NVLink ~450 GB/s per direction, one 400 Gb/s
  NIC per GPU, 989 bf16 TFLOP/s)."""
  devices_per_node: int = 8
  intra_bandwidth: float = 450e9
  inter_bandwidth: float = 50e9
  intra_latency: float = 10e-6
  inter_latency: float = 30e-6
  peak_flops: float = 989e12


def peers(mesh_shape: Mapping[str, int], axes: Sequence[str],
          devices_per_node: int) -> tuple[int, int]:
  """(same-node, other-node) peers of device 0 in its collective group over mesh `axes`."""
  names = list(mesh_shape)
  ids = [0]
  for a in axes:
    stride = math.prod(mesh_shape[n] for n in names[names.index(a) + 1:])
    ids = [i + k * stride for i in ids for k in range(mesh_shape[a])]
  intra = sum(i // devices_per_node == 0 for i in ids) - 1
  return intra, len(ids) - 1 - intra


class GroupCost(NamedTuple):
  ns_flops: float      # Matmul FLOPs of one device's NS, padding included.
  intra_bytes: float   # Sent by one device to its own node.
  inter_bytes: float   # To other nodes.
  collectives: int
  inter_node: bool     # Whether any collective crosses nodes.

  def exchange_seconds(self, topology: Topology) -> float:
    """Intra- and inter-node traffic proceed in parallel; each collective pays the latency of the
    slowest link it crosses."""
    latency = topology.inter_latency if self.inter_node else topology.intra_latency
    return (max(self.intra_bytes / topology.intra_bandwidth,
                self.inter_bytes / topology.inter_bandwidth) + self.collectives * latency)


def group_cost(g, mesh_shape: Mapping[str, int], steps: int, devices_per_node: int,
               all_gather: bool = False) -> GroupCost:
  """Cost of exchange.Group `g` (`all_gather`: the ZeRO-1 baseline exchange)."""
  per_device = sum(g.chunks)
  s, r, item = g.exchange_size, g.spread_size, g.dtype.itemsize
  m_in, m_out = peers(mesh_shape, g.exchange_axes, devices_per_node)
  r_in, r_out = peers(mesh_shape, g.spread_axes, devices_per_node)
  if all_gather:  # Per peer: its shard of every matrix.
    per_m, per_r = g.padded * g.local_elems * item, 0
    collectives = sum(bool(d.axes) for d in g.dims)
  else:  # Per peer: 1/S of the payload each way; the spread's all-gather: the device's piece, or
    # its all-reduce: 2/R of the real (unpadded) local batch.
    payload = g.padded // r * g.local_elems * item
    per_m = 2 * payload / s
    real = g.split * sum(g.counts) * g.local_elems * item
    per_r = 2 * real / r if g.restore == 'psum' else payload
    collectives = 2 * len(g.chunks) * (s > 1) + (r > 1)
    if g.split > 1:  # All-reduces of X X^H every step and of the squared norms (f32 or wider).
      norm = np.finfo(np.promote_types(g.dtype, np.float32)).bits // 8
      per_m += 2 * per_device * (steps * g.shape[0] ** 2 * item + norm) / s
      collectives += steps + 1
  p, q = g.shape
  return GroupCost(per_device * newton_schulz.flops(p, q * g.split, steps, g.split),
                   per_m * m_in + per_r * r_in, per_m * m_out + per_r * r_out, collectives,
                   bool(m_out or r_out))


def step_seconds(costs: Sequence[GroupCost], chunks: int, topology: Topology) -> float:
  """max(NS, exchange) + min(NS, exchange) / chunks: chunked exchanges overlap NS except for the
  pipeline's fill and drain."""
  compute = sum(c.ns_flops for c in costs) / topology.peak_flops
  comm = sum(c.exchange_seconds(topology) for c in costs)
  return max(compute, comm) + min(compute, comm) / max(chunks, 1)
