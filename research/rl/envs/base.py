"""The environment protocol: a task in, chat messages out, one model message per step.

An `Environment` samples tasks and starts an `Episode` per rollout. The episode answers every model
message with a `Step`: the observation to show next, or `done` with the verifiable reward. The loop
may cut an episode short (turn or context limit) with `close(reason)`, which must also score it, so
running out the clock is never a way around the reward. `Step.info` tells critics what the
environment made of the message (an unknown tool, a traceback, a failed assertion).
An episode that raises is an environment fault: the rollout masks it from the loss and counts it.
"""

import dataclasses
from typing import Any, Callable, Protocol

import numpy as np


@dataclasses.dataclass
class Step:
  observation: str | None = None    # Shown to the model next (None when done).
  done: bool = False
  reward: float = 0.0               # Meaningful when done.
  success: bool = False             # Task solved cleanly (for success rates).
  info: dict = dataclasses.field(default_factory=dict)


# close()'s reason for an episode the learner dropped (sampler.Stream.drop): its Step is never read,
# so an environment may free what the episode holds without scoring it.
DROPPED = 'dropped'


class Episode(Protocol):
  prompt: list[dict]                # Initial chat messages ({'role', 'content'}).

  def step(self, message: str) -> Step: ...

  def close(self, reason: str) -> Step: ...  # reason: 'context', 'turns' (scored) or DROPPED.


Demonstrations = Callable[[np.random.Generator, int], list[list[dict]]]


class Environment:
  """Every environment's base: the protocol, with defaults for its optional parts.

  Required: `name`, `sample_task(rng)`, `reset(task) -> Episode`. Optional: `words` (whole-word
  tokens for a byte tokenizer, `env.word_tokens`), `at_step(step)` (drift: called before each RL
  step's rollouts), `metrics(episodes)` (the environment's own per-step metrics) and
  `demonstrations(hint_fraction)` (the warm start's conversations, [{'role', 'content', 'loss'}]).
  """
  name: str = ''
  words: tuple[str, ...] = ()

  def sample_task(self, rng: np.random.Generator) -> Any:
    raise NotImplementedError

  def reset(self, task: Any) -> Episode:
    raise NotImplementedError

  def at_step(self, step: int) -> None:
    """The environment as of RL step `step` (no drift by default)."""
    del step

  def metrics(self, episodes: list[Episode]) -> dict[str, float]:
    """Per-step metrics of the step's episodes (none by default)."""
    del episodes
    return {}

  def demonstrations(self, hint_fraction: float) -> Demonstrations:
    """`(rng, n) -> n conversations` for the warm start, `hint_fraction` of them hinted."""
    raise ValueError(f'env {self.name!r} has no demonstrations for the warm start; give init_checkpoint')
