"""The repository environment's critic rules: they read the info keys its episodes write (env.py).

`import_error` and `name_error` give the texts of an error a `run` printed; `run_import_error` and
`run_name_error` place them before the edit that wrote the bad line.
"""
import re

from research.rl.feedback.critics import REGISTRY, Feedback, OnInfo, Rule, register
from research.rl.rollout.trajectory import Trajectory

register(OnInfo('import_error', lambda info: info.get('error_type') in ('ImportError', 'ModuleNotFoundError'),
                lambda info: 'Check the import statement here.'))


class UndefinedName(Rule):
  name = 'name_error'

  def hint(self, info, traj, i):
    if info.get('error_type') == 'NameError':
      m = re.search(r"name '(\w+)' is not defined", info.get('error', ''))
      return f'Check the names used here: {m.group(1)!r} is not defined.' if m else 'Check the names used here.'


register(UndefinedName())


# What the episodes' Step.info holds (env.py): call errors, edits, runs.
register(OnInfo('tool_call', lambda info: info.get('call_error'),
                lambda info: f'Reminder: make exactly one tool call per message, written as '
                             f'{info["syntax"]}; the tools are {info["tools"]}.'))
register(OnInfo('protected_edit', lambda info: info.get('protected'),
                lambda info: f'The tests are fixed; change the implementation, not {info["edited"]}.'))
register(OnInfo('syntax_error', lambda info: info.get('syntax_error'),
                lambda info: 'This edit leaves {path} with a syntax error at line {line}: '
                             '{message}.'.format(**info['syntax_error'])))
register(OnInfo('untested_submit', lambda info: info.get('tool') == 'submit' and not info['tested'],
                lambda info: 'Run the tests after your last edit before you submit.'))
register(OnInfo('repeated_failure', lambda info: info.get('failed_times', 0) >= 3,
                lambda info: f'{info["command"]!r} has failed {info["failed_times"]} times; change '
                             'the code or the command before running it again.'))
register(OnInfo('missing_path', lambda info: 'missing' in info,
                lambda info: f'{info["missing"]} does not exist; the nearest existing path is '
                             f'{info["nearest"]}.'))


class RunErrorAtEdit(Rule):
  """An error a `run` printed, with the `base` rule's text, placed before the edit that wrote the bad
  line: the latest earlier edit of a Python file whose message holds a name the error quotes; before
  the run itself when there is none (the command's own mistake)."""

  def __init__(self, name: str, base: str):
    self.name, self.base = name, base

  def __call__(self, traj: Trajectory) -> list[Feedback]:
    out = []
    for i, m in enumerate(traj.messages):
      err = m.info.get('run_error')
      if err and (h := REGISTRY[self.base].hint(err, traj, i)) is not None:
        out.append(Feedback(self.culprit(traj, i, err['error']), h, self.name, self.version))
    return out

  @staticmethod
  def culprit(traj: Trajectory, i: int, error: str) -> int:
    names = re.findall(r"'([\w.]+)'", error)
    for j in range(i - 1, -1, -1):
      m = traj.messages[j]
      if str(m.info.get('edited', '')).endswith('.py') and any(n in m.text for n in names):
        return j
    return i


register(RunErrorAtEdit('run_import_error', 'import_error'))
register(RunErrorAtEdit('run_name_error', 'name_error'))
