"""launch/processes.py: a CPU run keeps its compiled programs in --compilation_cache_dir, and a second
run of the same program takes it from there instead of compiling."""
import json
import os
import subprocess
import sys

_RUN = '''
import json, sys
from absl import app
import jax, jax.numpy as jnp
from launch import processes

def main(argv):
  processes.start('data:1')
  hits = []
  jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
  jax.jit(lambda x: jnp.sin(x) * 3)(jnp.arange(5.0)).block_until_ready()
  print(json.dumps(hits.count('/jax/compilation_cache/cache_hits')))

app.run(main)
'''


def _run(cache_dir: str) -> int:
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  out = subprocess.run([sys.executable, '-c', _RUN, f'--compilation_cache_dir={cache_dir}'], env=env,
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_run_takes_its_programs_from_the_cache(tmp_path):
  cache = tmp_path / 'cache'
  assert _run(str(cache)) == 0 and any(cache.iterdir())  # Compiled, and kept.
  assert _run(str(cache)) >= 1                            # Read back, not compiled.


def test_empty_flag_turns_it_off():
  assert _run('') == _run('') == 0  # The second run compiles again.
