"""Environments by name: `make(config.env, workdir)` builds the one `env.name` names from its section."""
from research.rl.envs import toolcalc
from research.rl.envs.base import Environment
from research.rl.envs.repo import env as repo

MAKERS = {'toolcalc': toolcalc.make, 'repo': repo.make}


def make(c, workdir: str) -> Environment:
  """`c` is the config's EnvConfig; its section `c.<name>` configures the environment."""
  return MAKERS[c.name](getattr(c, c.name), workdir)
