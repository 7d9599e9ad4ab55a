"""Multi-host setup: jax.distributed.initialize from flags or the environment; each host's rows.

Flags win over the environment: JAX_COORDINATOR_ADDRESS (host:port of process 0, reachable by
all), JAX_NUM_PROCESSES, JAX_PROCESS_ID. Under SLURM, Open MPI or a multi-worker Cloud TPU slice
none is needed: JAX reads the cluster's own variables. On CPUs, collectives across processes use
gloo. docs/cluster.md has the recipes.
"""

import os

import jax
from jax.sharding import Sharding

# Variables by which a scheduler announces more than one process (JAX then detects the rest).
_CLUSTER_SIZE_VARS = ('SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE')


def _env_int(name: str) -> int | None:
  value = os.environ.get(name, '').strip()
  if not value:
    return None
  if not value.isdigit():
    raise ValueError(f'environment variable {name}={value!r}: expected a non-negative integer')
  return int(value)


def _cluster_detected() -> bool:
  multi = any((_env_int(v) or 1) > 1 for v in _CLUSTER_SIZE_VARS)
  return multi or ',' in os.environ.get('TPU_WORKER_HOSTNAMES', '')


def simulate_cpu_devices(n: int) -> None:
  """Lets a one-process run on a CPU-only machine build a mesh of n devices (entry points only).

  Adds XLA's flag for n simulated host devices unless XLA_FLAGS already sets a count; it only
  affects the CPU platform, so accelerators are untouched. Must run before JAX's backends start.
  """
  flags = os.environ.get('XLA_FLAGS', '')
  if '--xla_force_host_platform_device_count' not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} --xla_force_host_platform_device_count={n}'.strip()


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Joins the processes of a multi-host run; returns False (and does nothing) for one process.

  Must run before anything touches a JAX device.
  """
  address = coordinator_address or os.environ.get('JAX_COORDINATOR_ADDRESS') or None
  n = num_processes if num_processes is not None else _env_int('JAX_NUM_PROCESSES')
  pid = process_id if process_id is not None else _env_int('JAX_PROCESS_ID')
  if address is None and n is None and pid is None:
    if not _cluster_detected():
      return False
  elif n == 1:
    return False
  elif None in (address, n, pid):
    raise ValueError(f'multi-host run needs a coordinator address, process count and process id; '
                     f'got coordinator_address={address!r}, num_processes={n!r}, process_id={pid!r} '
                     f'(flags or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID)')
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(address, n, pid)
  return True


def host_rows(sharding: Sharding, batch_size: int) -> tuple[int, int]:
  """The block [lo, hi) of global batch rows that this process's devices hold."""
  spans = {(s[0].start or 0, batch_size if s[0].stop is None else s[0].stop)
           for s in sharding.addressable_devices_indices_map((batch_size,)).values()}
  lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
  if sum(b - a for a, b in spans) != hi - lo:
    raise ValueError(f'process {jax.process_index()} holds batch rows {sorted(spans)}, not one '
                     'contiguous block: order the mesh devices by process')
  return lo, hi
