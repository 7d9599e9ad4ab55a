"""env.repo: how repository episodes run (a config section; research/rl/config.py holds it).

Imports the call syntax (calls.py) and the sandbox's `Limits`, nothing that grades.
"""
import dataclasses
import re

from research import configs
from research.rl.envs.repo import calls
from research.tasks import sandbox

SPLITS = ('all', 'train', 'held_out')


@dataclasses.dataclass(frozen=True)
class Settings:
  """How episodes run: the tasks, call syntax, limits on turns, observations and shell commands."""
  # A task file of launch.make_tasks, or its output directory (a --repos run's shards); empty:
  # the fixture's (research/tasks/testing.py), made once under the workdir.
  tasks: str = ''
  call_format: str = 'chatml'
  max_turns: int = 30
  observation_chars: int = 6000
  # Small files: the work area is diffed at the end, and a huge edited file would stall that.
  run_limits: sandbox.Limits = sandbox.Limits(cpu_s=20, wall_s=30.0, fsize_mb=8, output_kb=32)
  # What the work area may hold beyond its pristine tree (entries, MiB), watched while a command
  # runs (the file-size limit bounds each file, not how many); more ends the episode with reward 0.
  work_entries: int = 20_000
  work_mb: int = 256
  # An interpreter for every task's `run` commands; None: each task's own (as grading runs it).
  python: str | None = None
  # Grade identical (task, diff) pairs once (GradeMemo); off: every episode pays its own grading.
  memoize_grades: bool = True
  # (tool, new name): drift since the warm start; the tool is listed and called only by the new name.
  rename: tuple[str, ...] = ()
  # 'train' or 'held_out': a fixed quarter of the tasks (by a hash of the id) is held out.
  split: str = 'all'

  def validate(self, path: str = 'repo.') -> 'Settings':
    if self.call_format not in calls.FORMATS:
      raise configs.invalid(path + 'call_format', self.call_format,
                            f'expected one of {sorted(calls.FORMATS)}')
    if self.max_turns < 1:
      raise configs.invalid(path + 'max_turns', self.max_turns, 'must be >= 1')
    if self.observation_chars < 100:
      raise configs.invalid(path + 'observation_chars', self.observation_chars, 'must be >= 100')
    if self.split not in SPLITS:
      raise configs.invalid(path + 'split', self.split, f'expected one of {SPLITS}')
    if self.rename and not (len(self.rename) == 2 and self.rename[0] in calls.TOOLS
                            and re.fullmatch(r'[A-Za-z_]\w*', self.rename[1])
                            and self.rename[1] not in calls.TOOLS):
      raise configs.invalid(path + 'rename', self.rename, f'expected (tool, new name) with a tool '
                            f'of {list(calls.TOOLS)} and a new identifier that is not a tool')
    return self

  def shown(self) -> dict[str, str]:
    """Each tool's name as the episode lists and accepts it."""
    return {n: self.rename[1] if self.rename[:1] == (n,) else n for n in calls.TOOLS}
