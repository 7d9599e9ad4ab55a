"""The oracle policy for the repository environment: the task's solution, delivered through tools.

It views the file, restores the deleted code hunk by hunk (str_replace where the hunk's old lines
are unique, insert at the hunk's line otherwise), runs the tests and submits. It reads the task's
solution record, so only tests, demonstrations and checks use it, never the environment.
"""

import dataclasses
from pathlib import Path
import re
import shlex

from research.rl.repo_tools import Call
from research.tasks import patch as patch_lib
from research.tasks import task as task_lib

_HUNK = re.compile(r'^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@')


@dataclasses.dataclass(frozen=True)
class Hunk:
  old_start: int                    # 1-based first line of `old` in the file (0 for an empty file).
  old: str                          # Context and removed lines, in order.
  new: str                          # Context and added lines, in order.
  lead: int                         # Context lines before the first change.
  removes: bool                     # Whether any line is removed (else `insert` can apply it).


def hunks(section: str) -> list[Hunk]:
  """The hunks of one file's section of a unified diff."""
  out, cur = [], None
  for line in section.splitlines(keepends=True):
    if m := _HUNK.match(line):
      cur = {'start': int(m.group(1)), 'old': [], 'new': [], 'lead': 0, 'changed': False,
             'removes': False}
      out.append(cur)
    elif cur is not None and line[:1] in (' ', '-', '+'):
      kind, text = line[0], line[1:]
      if kind != '+':
        cur['old'].append(text)
      if kind != '-':
        cur['new'].append(text)
      cur['changed'] |= kind != ' '
      cur['removes'] |= kind == '-'
      cur['lead'] += not cur['changed']
  return [Hunk(h['start'], ''.join(h['old']), ''.join(h['new']), h['lead'], h['removes'])
          for h in out]


def _edit(path: str, text: str, h: Hunk) -> Call:
  if h.old and text.count(h.old) == 1:
    return Call('str_replace', {'path': path, 'old': h.old, 'new': h.new})
  if h.removes:
    raise ValueError(f'oracle: a hunk of {path} removes lines whose context is not unique')
  new = h.new.splitlines(keepends=True)
  added = new[h.lead:h.lead + len(new) - len(h.old.splitlines())]
  line = max(h.old_start - 1, 0) + h.lead
  return Call('insert', {'path': path, 'line': line, 'text': ''.join(added)})


def calls(task: task_lib.Task, solution: task_lib.Solution, tree: Path) -> list[Call]:
  """The oracle's tool calls for a task whose pristine tree is `tree`."""
  out = [Call('view', {'path': task.file})]
  for section in patch_lib.parse(solution.patch):
    if section.old_path is None:
      out.append(Call('create', {'path': section.new_path,
                                 'text': ''.join(h.new for h in hunks(section.text))}))
      continue
    text = (tree / section.old_path).read_text()
    out += [_edit(section.old_path, text, h) for h in reversed(hunks(section.text))]
  return out + [Call('run', {'command': shlex.join(task.test_command)}), Call('submit', {})]
