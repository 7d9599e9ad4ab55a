"""The environment protocol: a task in, chat messages out, one model message per step.

An `Environment` samples tasks and starts an `Episode` per rollout. The episode answers every model
message with a `Step`: the observation to show next, or `done` with the verifiable reward. The loop
may cut an episode short (turn or context limit) with `close(reason)`, which must also score it, so
running out the clock is never a way around the reward. `Step.info` tells critics what the
environment made of the message (an unknown tool, a traceback, a failed assertion).
An episode that raises is an environment fault: the rollout masks it from the loss and counts it.
"""

import dataclasses
from typing import Any, Protocol

import numpy as np


@dataclasses.dataclass
class Step:
  observation: str | None = None    # Shown to the model next (None when done).
  done: bool = False
  reward: float = 0.0               # Meaningful when done.
  success: bool = False             # Task solved cleanly (for success rates).
  info: dict = dataclasses.field(default_factory=dict)


class Episode(Protocol):
  prompt: list[dict]                # Initial chat messages ({'role', 'content'}).

  def step(self, message: str) -> Step: ...

  def close(self, reason: str) -> Step: ...


class Environment(Protocol):
  name: str

  def sample_task(self, rng: np.random.Generator) -> Any: ...

  def reset(self, task: Any) -> Episode: ...
