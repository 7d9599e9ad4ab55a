"""The multi-host flags of the entry points that train, the devices a run starts on, and JAX's
persistent compilation cache."""

import math
import os

from absl import flags
import jax

from research.parallel import distributed
from research.parallel import mesh as mesh_lib

_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'host:port of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-host run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1.')
_COMPILE_CACHE = flags.DEFINE_string(
    'compilation_cache_dir', os.path.join(os.path.expanduser('~'), '.cache', 'research', 'jax_compile'),
    'JAX\'s persistent compilation cache for CPU runs (a second run of a config compiles nothing); '
    'empty: off. Accelerator runs use it only when JAX_COMPILATION_CACHE_DIR names one.')


def start(mesh_spec: str) -> None:
  """Joins the multi-host run the flags (or the environment) name; a one-process run on a CPU
  simulates as many devices as `mesh_spec` needs. Before anything touches a JAX device."""
  if not distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value):
    distributed.simulate_cpu_devices(math.prod(mesh_lib.parse_mesh_spec(mesh_spec).values()))
  if _COMPILE_CACHE.value and jax.default_backend() == 'cpu':
    enable_compilation_cache(_COMPILE_CACHE.value)


def enable_compilation_cache(path: str) -> None:
  """Every compiled program (even sub-second ones: a tiny model's are) is kept under `path`."""
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
