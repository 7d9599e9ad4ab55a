"""Every test process (and the subprocesses it starts) sees 8 simulated CPU devices.

The backend optimization level is lowered: the suite's programs are tiny, so compilation dominates
their cost and LLVM's optimizations halve the suite's wall time for nothing. Tests compare runs
made under the same flags, or against references with tolerances.
"""
import os

for _flag in ('--xla_force_host_platform_device_count=8', '--xla_backend_optimization_level=0'):
  if _flag.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + _flag).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
