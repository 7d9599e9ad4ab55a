"""Every test process (and the subprocesses it starts) sees 8 simulated CPU devices.

The suite's programs are tiny, so compiling them costs far more than running them; COMPILE_FLAGS
make XLA's CPU backend compile fast (tests compare runs made under the same flags, or against
references with tolerances): LLVM at optimization level 0, XLA's legacy emitters instead of its
MLIR fusion emitters, one codegen piece (the two test workers fill the cores).
The MLA train step of tests/model/test_sharding.py compiles in 14 s at level 0 alone, 6 s so
(docs/benchmarks.md, "The test suite's compile time").
"""
import os

COMPILE_FLAGS = ('--xla_backend_optimization_level=0', '--xla_cpu_use_fusion_emitters=false',
                 '--xla_cpu_parallel_codegen_split_count=1')

for _flag in ('--xla_force_host_platform_device_count=8', *COMPILE_FLAGS):
  if _flag.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + _flag).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
