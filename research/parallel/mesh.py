"""Device meshes with the four standard axes.

Axes, outermost to innermost: `data` (pure data parallel, params replicated), `fsdp` (data parallel
with params sharded; the narrow axis dense weights are gathered over), `expert` (experts sharded;
also data parallel for non-expert layers), `tensor` (heads and hidden units).

All axes are `AxisType.Auto`: model code states shardings through logical-axis constraints and the
compiler propagates the rest, while the expert layer drops to `jax.shard_map` where it must control
communication itself. Explicit mode would require a sharding on every intermediate.
"""

from collections.abc import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

AXES = ('data', 'fsdp', 'expert', 'tensor')
BATCH_MESH_AXES = ('data', 'fsdp', 'expert')  # Mesh axes that split the tokens of dense layers.


def parse_mesh_spec(spec: str | Mapping[str, int]) -> dict[str, int]:
  """'data:2,expert:4' -> {'data': 2, 'fsdp': 1, 'expert': 4, 'tensor': 1}."""
  if isinstance(spec, Mapping):
    items = dict(spec)
  else:
    items = {}
    for part in filter(None, (p.strip() for p in spec.split(','))):
      name, sep, size = part.partition(':')
      if not sep or not size.strip().isdigit():
        raise ValueError(f'mesh spec {spec!r}: expected "axis:size" pairs, got {part!r}')
      items[name.strip()] = int(size)
  unknown = sorted(set(items) - set(AXES))
  if unknown:
    raise ValueError(f'mesh spec {spec!r}: unknown axis {unknown}; axes are {AXES}')
  bad = {k: v for k, v in items.items() if v < 1}
  if bad:
    raise ValueError(f'mesh spec {spec!r}: axis sizes must be >= 1, got {bad}')
  return {a: int(items.get(a, 1)) for a in AXES}


def make_mesh(spec: str | Mapping[str, int],
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh with axes AXES; fails naming the sizes if there are too few devices."""
  shape = parse_mesh_spec(spec)
  devices = list(jax.devices() if devices is None else devices)
  need = int(np.prod(list(shape.values())))
  if need > len(devices):
    raise ValueError(f'mesh {shape} needs {need} devices but only {len(devices)} are available '
                     '(on a CPU, simulate more with XLA_FLAGS=--xla_force_host_platform_device_count=8)')
  return jax.make_mesh(tuple(shape.values()), AXES, axis_types=(AxisType.Auto,) * len(AXES),
                       devices=devices[:need])


def axis_size(mesh: Mesh | Mapping[str, int], axes: str | Sequence[str] | None) -> int:
  """Devices along `axes` of a mesh (or a {axis: size} shape)."""
  shape = mesh if isinstance(mesh, Mapping) else mesh.shape
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return int(np.prod([shape[a] for a in axes]))
