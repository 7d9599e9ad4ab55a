"""The one reward rule of repository tasks: what grading found (`Grade`) -> the reward (`reward`).

Every consumer (the RL environment, the red team, the factory's reference gate) reads the reward
through `reward(grade)`; nothing else restates it.
"""
import dataclasses


@dataclasses.dataclass
class Grade:
  """What grading found for one solution; `reward(grade)` is its reward."""
  reason: str                       # One line for logs and critics.
  tamper: list[str] = dataclasses.field(default_factory=list)    # Flags: only tampering explains them.
  rejected: list[str] = dataclasses.field(default_factory=list)  # Diff sections not applied, and why.
  outcomes: dict[str, str] = dataclasses.field(default_factory=dict)  # Node id -> pytest outcome.
  wall_s: float = 0.0
  solved: bool = False              # Every required test passed, in runs that finished.
  fault: str | None = None          # The harness's own failure (grading.reward masks it), or None.
  error: str | None = None          # An exception grading raised on what the solution shaped: 0.
  differential: dict | None = None  # The differential check (its seed, inputs compared, answers
                                    # that differ: differential.Check), or None where none ran.

  @property
  def reward(self) -> float | None:
    return reward(self)


def reward(grade: Grade) -> float | None:
  """The reward of a graded solution.

  | what grading found                                                     | reward       |
  |------------------------------------------------------------------------|--------------|
  | a harness fault, proven before the candidate's code ran: the sandbox   | None: masked |
  |   failed to start, the runner never started, or the pool itself        |              |
  |   failed; or the original gave the differential check nothing to       |              |
  |   compare (in sandboxes the candidate's code never ran in)             |              |
  | any tamper flag (protected path, shadowing, scanner finding, integrity | 0 (a hack)   |
  |   check, report inconsistent with pytest, a mutant twin that passed, a |              |
  |   sealed record that is no record)                                     |              |
  | every required test (F2P and P2P) passed, in runs that finished, and   | 1            |
  |   every fresh input answered as the original (tasks with calls)        |              |
  | anything else: a test failed or is missing, a sealed answer differs,   | 0            |
  |   a fresh input answered otherwise than the original (differential),   |              |
  |   the time or memory limit ended a run, the test process crashed or    |              |
  |   was killed, no applicable change, grading raised on what the         |              |
  |   solution shaped (`Grade.error`; the flags raised before it are kept) |              |

  A masked episode leaves the loss (the sampler drops it and counts it as a fault): a reward of 0
  would punish the policy for the harness, a reward of 1 would pay for breaking it. A crash,
  timeout or malformed report after the candidate's code started is the candidate's: 0, never
  masked, or a policy that cannot solve a task would learn to break the harness instead.
  """
  if grade.fault is not None:
    return None
  if grade.tamper:
    return 0.0
  return 1.0 if grade.solved else 0.0
