"""Every test process (and the subprocesses it starts) sees 8 simulated CPU devices.

The suite's programs are tiny, so compiling them costs far more than running them; COMPILE_FLAGS
make XLA's CPU backend compile fast (tests compare runs made under the same flags, or against
references with tolerances): LLVM at optimization level 0, XLA's legacy emitters instead of its
MLIR fusion emitters, one codegen piece (the two test workers fill the cores).
The MLA train step of tests/model/test_sharding.py compiles in 14 s at level 0 alone, 6 s so
(docs/benchmarks.md, "The test suite's compile time").

Tests compile again what an earlier test of their process compiled (a new Runner, Sampler or jitted
closure each, with the same shapes): each test process keeps JAX's persistent compilation cache, as
CPU runs do (launch/processes.py), in a directory of its own (the cache's writes are not atomic),
so such a program compiles once.
"""
import atexit
import os
import shutil
import tempfile

COMPILE_FLAGS = ('--xla_backend_optimization_level=0', '--xla_cpu_use_fusion_emitters=false',
                 '--xla_cpu_parallel_codegen_split_count=1')

for _flag in ('--xla_force_host_platform_device_count=8', *COMPILE_FLAGS):
  if _flag.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + _flag).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # pylint: disable=g-import-not-at-top  (After XLA_FLAGS.)

_COMPILE_CACHE = tempfile.mkdtemp(prefix='jax-compile-cache-')
atexit.register(shutil.rmtree, _COMPILE_CACHE, ignore_errors=True)
jax.config.update('jax_compilation_cache_dir', _COMPILE_CACHE)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)  # A tiny model's programs too.
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)


# The slowest test files first (their seconds on 2 cores, docs/benchmarks.md "The suite's file
# order"): with `--dist loadfile` a long file handed out last runs alone at the end while the other
# worker idles.
# The two builders of the shared task sets (tests/shared.py) lead, one per worker: both build at
# once, and no worker waits on the other's lock.
SLOWEST_FIRST = (
    'tests/tasks/test_redteam.py',       # 103 s, fixture_tasks' build (39 s) included
    'tests/rl/test_env_repo.py',         # 58 s, repo_task_dir's build (29 s) included
    'tests/rl/test_loop.py',             # 105 s
    'tests/model/test_kernels.py',       # 85 s
    'tests/rl/test_rl_multihost.py',     # 54 s
    'tests/tasks/test_beam_pipeline.py', # 43 s
    'tests/rl/test_sampler.py',          # 38 s
    'tests/tasks/test_factory.py',       # 33 s
    'tests/tasks/test_twin_runs.py',     # 32 s
    'tests/tasks/test_twins.py',         # 30 s
    'tests/rl/test_ray_env.py',          # 30 s
    'tests/model/test_sharding.py',      # 30 s
    'tests/parallel/test_multihost.py',  # 26 s
    'tests/rl/test_repo_rl.py',          # 24 s
    'tests/model/test_moe.py',           # 24 s
    'tests/rl/test_governance.py',       # 21 s
)


def pytest_configure(config):
  # xdist hands out the files with the most tests first unless told not to (--loadscope-reorder is
  # its default), which would undo SLOWEST_FIRST: a one-test file of a minute ran last.
  if hasattr(config.option, 'loadscopereorder'):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  del config
  rank = {f: i for i, f in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.nodeid.split('::', 1)[0], len(rank)))  # Stable.
