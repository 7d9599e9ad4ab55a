"""Environments by name: `make(config.env, workdir)` builds the one `env.name` names from its section,
its episodes run where `env.executor` says."""
import functools

from research.rl.envs import toolcalc
from research.rl.envs.base import Environment
from research.rl.envs.repo import env as repo

MAKERS = {'toolcalc': toolcalc.make, 'repo': repo.make}


def make(c, workdir: str) -> Environment:
  """`c` is the config's EnvConfig; its section `c.<name>` configures the environment."""
  maker = functools.partial(MAKERS[c.name], getattr(c, c.name), workdir)
  if c.executor == 'local':
    return maker()
  from research.rl.envs import ray_env  # Imports Ray: only runs with executor='ray' need it.
  return ray_env.RayEnv(maker, address=c.ray_address, workers=c.ray_workers,
                        worker_calls=c.ray_worker_calls, warm=c.ray_warm,
                        episode_timeout_s=c.ray_episode_timeout_s)
