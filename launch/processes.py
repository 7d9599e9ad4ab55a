"""The multi-host flags of the entry points that train, and the devices a run starts on."""

import math

from absl import flags

from research.parallel import distributed
from research.parallel import mesh as mesh_lib

_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'host:port of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in a multi-host run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1.')


def start(mesh_spec: str) -> None:
  """Joins the multi-host run the flags (or the environment) name; a one-process run on a CPU
  simulates as many devices as `mesh_spec` needs. Before anything touches a JAX device."""
  if not distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value):
    distributed.simulate_cpu_devices(math.prod(mesh_lib.parse_mesh_spec(mesh_spec).values()))
