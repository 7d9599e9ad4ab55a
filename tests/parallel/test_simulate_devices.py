"""launch entry points give a one-process CPU run as many simulated devices as its mesh needs."""

import os
import subprocess
import sys

from research.parallel import distributed


def test_flag_added_only_when_no_count_is_set(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=0')
  distributed.simulate_cpu_devices(8)
  assert os.environ['XLA_FLAGS'].split() == ['--xla_backend_optimization_level=0',
                                             '--xla_force_host_platform_device_count=8']
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=2')
  distributed.simulate_cpu_devices(8)
  assert os.environ['XLA_FLAGS'] == '--xla_force_host_platform_device_count=2'


def test_a_fresh_process_sees_the_devices():
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  code = ('from research.parallel import distributed; distributed.simulate_cpu_devices(4); '
          'import jax; print(jax.device_count())')
  out = subprocess.run([sys.executable, '-c', code], env={**env, 'JAX_PLATFORMS': 'cpu'},
                       capture_output=True, text=True, check=True, cwd=os.path.dirname(
                           os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.stdout.split()[-1] == '4'
