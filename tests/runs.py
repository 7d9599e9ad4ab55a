"""A tiny experiment config and launch.train subprocesses, shared by the tests that train it."""

import json
import os
import subprocess
import sys

import ml_collections

from experiments import tiny_moe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# d_model 64, 2 layers, 4 experts, seq 32: a step takes milliseconds, compiling it seconds.
TINY = {
    'model.d_model': 64, 'model.num_layers': 2, 'model.num_heads': 4, 'model.num_kv_heads': 2,
    'model.head_dim': 16, 'model.num_experts': 4, 'model.d_expert': 64, 'model.d_ff': 128,
    'data.seq_len': 32, 'data.batch_size': 8, 'data.shards': 8, 'mesh': 'fsdp:2,expert:4',
    'train.steps': 8, 'train.log_every': 1, 'train.eval_every': 4, 'train.eval_steps': 1,
    'checkpoint.every': 4, 'checkpoint.keep': 2,
}


def config(**overrides) -> ml_collections.ConfigDict:
  """tiny_moe with TINY and `overrides` (dots as '__': train__steps=4)."""
  c = tiny_moe.get_config()
  for k, v in {**TINY, **{k.replace('__', '.'): v for k, v in overrides.items()}}.items():
    node, *path, leaf = [c] + k.split('.')
    for p in path:
      node = node[p]
    node[leaf] = v
  return c


def flags(**overrides) -> list[str]:
  merged = {**TINY, **{k.replace('__', '.'): v for k, v in overrides.items()}}
  return [f'--config.{k}={v}' for k, v in merged.items()]


def env(devices: int = 8, cache_dir: str | None = None) -> dict:
  """A subprocess environment with `devices` CPU devices and a shared compilation cache."""
  e = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=ROOT,
           XLA_FLAGS=' '.join([f'--xla_force_host_platform_device_count={devices}'] + [
               f for f in os.environ['XLA_FLAGS'].split()  # conftest.py's compile flags.
               if not f.startswith('--xla_force_host_platform_device_count')]))
  if cache_dir:
    e.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0')
  return e


def launch(workdir: str, *args: str, devices: int = 8, cache_dir: str | None = None,
           **overrides) -> subprocess.Popen:
  """Starts `python -m launch.train` on the tiny config."""
  cmd = [sys.executable, '-m', 'launch.train', f'--config={ROOT}/experiments/tiny_moe.py',
         f'--workdir={workdir}', *flags(**overrides), *args]
  return subprocess.Popen(cmd, cwd=ROOT, env=env(devices, cache_dir), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def metrics(workdir) -> list[dict]:
  """The rows of workdir/metrics.jsonl."""
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(l) for l in f]


def finish(p: subprocess.Popen, timeout: float = 240) -> str:
  out, _ = p.communicate(timeout=timeout)
  assert p.returncode == 0, out[-4000:]
  return out
