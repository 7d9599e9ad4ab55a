"""Which engine samples the rollouts: ours (the embedded JAX sampler) or vLLM in its own process.

    backend = backends.make(config.rollout, cfg, tok, config.sampler, jit=trainer.jit)
    trajs, stats = backend.rollout(params, episodes, key, tasks=tasks, groups=groups)

Both are a sampler.RolloutBackend: the same environment protocol, the same Trajectory objects
(token ids, the behaviour policy's log-prob of every sampled token), the same RolloutStats.
"""

import dataclasses
import os
from collections.abc import Callable

import jax

from research import configs
from research.model.config import ModelConfig
from research.rl.rollout import vllm_client
from research.rl.rollout.sampler import RolloutBackend, Sampler, SamplerConfig
from research.tokenizer.base import Tokenizer

BACKENDS = ('ours', 'vllm')


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """rollout: the engine that samples the rollouts (research/rl/rollout/backends.py)."""
  backend: str = 'ours'             # 'ours' (the JAX sampler, in process) or 'vllm' (its own process and venv).
  vllm_python: str = '.venv-vllm/bin/python'  # The vLLM venv's interpreter (`make vllm-venv`), from the repo root.
  weights_dir: str = '/dev/shm'     # Local directory the pushed weights are written to (shared memory on Linux).
  vllm_kv_cache_gib: int = 2        # The engine's KV cache on the CPU (VLLM_CPU_KVCACHE_SPACE); unused on GPU.
  vllm_eager: bool = True           # No torch.compile / CUDA graphs: starts in seconds, decodes slower.
  vllm_start_timeout_s: int = 900   # Seconds the engine may take to start before the run fails.
  # A fleet: 'HOST:PORT' of engine servers started apart (`python -m research.rl.rollout.vllm_engine.server
  # --listen=HOST:PORT` in a vLLM venv, on their own hosts or accelerators; docs/cluster.md), sent the
  # weights over the connection; rows are split among them. Empty: one engine started by the run here.
  vllm_engines: tuple[str, ...] = ()
  vllm_request_timeout_s: int = 600  # An engine that has not answered a request (a push, a turn) in this long is
                                    # dropped (a fleet's) or killed, failing the run (the run's own).

  def validate(self, path: str = 'rollout.') -> 'RolloutConfig':
    if self.backend not in BACKENDS:
      raise configs.invalid(path + 'backend', self.backend, f'expected one of {BACKENDS}')
    for a in self.vllm_engines:
      host, _, port = a.rpartition(':')
      if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise configs.invalid(path + 'vllm_engines', self.vllm_engines, f'{a!r} is not HOST:PORT')
    if self.backend == 'vllm':
      if not self.vllm_engines and not os.access(self.python_path, os.X_OK):
        raise configs.invalid(path + 'vllm_python', self.vllm_python,
                              f'{self.python_path} is not an executable (run `make vllm-venv`)')
      if not os.path.isdir(self.weights_dir):
        raise configs.invalid(path + 'weights_dir', self.weights_dir, 'is not a directory')
    for f in ('vllm_kv_cache_gib', 'vllm_start_timeout_s', 'vllm_request_timeout_s'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be >= 1')
    return self

  @property
  def python_path(self) -> str:
    return os.path.join(vllm_client.ROOT, self.vllm_python)


def make(rc: RolloutConfig, cfg: ModelConfig, tok: Tokenizer, s: SamplerConfig,
         jit: Callable = jax.jit) -> RolloutBackend:
  """The configured backend (`jit` compiles ours; vLLM compiles its own)."""
  if rc.backend == 'ours':
    return Sampler(cfg, tok, s, jit=jit)
  return vllm_client.VllmBackend(cfg, tok, s, python=rc.python_path, weights_dir=rc.weights_dir,
                                 kv_cache_gib=rc.vllm_kv_cache_gib, eager=rc.vllm_eager,
                                 start_timeout_s=rc.vllm_start_timeout_s, addresses=tuple(rc.vllm_engines),
                                 request_timeout_s=rc.vllm_request_timeout_s)
