"""The oracle policy for the repository environment: the task's solution, delivered through tools.

It views the file, restores the deleted code hunk by hunk (str_replace, with as much of the file
around the hunk as makes the text unique; insert into an empty file), runs the tests and submits.
It reads the task's solution record, so only tests, the warm start's demonstrations
(`RepoEnv.demonstrations`) and checks use it, never an episode. `edit_calls` turns any diff of a task's tree into tool calls (experiments/repo_env_check.py
delivers the red team's attacks with it). `Demonstrations` makes the warm start's conversations from
the oracle's episodes; `tokens_per_episode` measures a tokenizer on them.
"""

import dataclasses
from pathlib import Path
import re
import shlex

import numpy as np

from research.rl.envs.base import Step
from research.rl.envs.repo import calls
from research.rl.envs.repo.calls import Call
from research.rl.envs.repo.tools import matches
from research.rl.feedback import critics
from research.tasks import patch as patch_lib
from research.tasks import task as task_lib
from research.tokenizer import chat
from research.tokenizer.base import Tokenizer

_HUNK = re.compile(r'^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@')


@dataclasses.dataclass(frozen=True)
class Hunk:
  old_start: int                    # 1-based first line of `old` in the file (0 when `old` is empty).
  old: list[str]                    # Context and removed lines, in order.
  new: list[str]                    # Context and added lines, in order.


def hunks(section: str) -> list[Hunk]:
  """The hunks of one file's section of a unified diff."""
  out = []
  for line in section.splitlines(keepends=True):
    if m := _HUNK.match(line):
      out.append(Hunk(int(m.group(1)), [], []))
    elif out and line[:1] in (' ', '-', '+'):
      if line[0] != '+':
        out[-1].old.append(line[1:])
      if line[0] != '-':
        out[-1].new.append(line[1:])
  return out


def _edit(path: str, lines: list[str], h: Hunk) -> tuple[Call, list[str]]:
  """The call that applies one hunk to the file's lines, and the lines after it.

  A str_replace of the hunk's old lines, widened by lines of the file around them until the text
  is unique; an insert at the top of an empty file.
  """
  i = max(h.old_start - 1, 0)
  j = i + len(h.old)
  if lines[i:j] != h.old:
    raise ValueError(f'oracle: a hunk of {path} does not match the file at line {h.old_start}')
  if not lines:
    return Call('insert', {'path': path, 'line': 0, 'text': ''.join(h.new)}), list(h.new)
  text = ''.join(lines)
  k = 0
  while matches(text, ''.join(lines[max(i - k, 0):j + k])) != 1:
    k += 1
  a, b = max(i - k, 0), j + k
  new = lines[a:i] + h.new + lines[j:b]
  call = Call('str_replace', {'path': path, 'old': ''.join(lines[a:b]), 'new': ''.join(new)})
  return call, lines[:a] + new + lines[b:]


def edit_calls(patch: str, tree: Path) -> list[Call]:
  """Tool calls that turn `tree` into `tree` with the patch applied: create a new file, str_replace
  (or insert) each hunk of a changed one, `run` rm for a deleted one. Binary sections have no call."""
  out = []
  for section in patch_lib.parse(patch):
    if section.binary:
      continue
    if section.old_path is None:
      out.append(Call('create', {'path': section.new_path,
                                 'text': ''.join(''.join(h.new) for h in hunks(section.text))}))
    elif section.new_path is None:
      out.append(Call('run', {'command': shlex.join(['rm', '-f', '--', section.old_path])}))
    else:
      lines = (tree / section.old_path).read_text().splitlines(keepends=True)
      # Bottom up: the lines above a hunk keep their numbers while the ones below change.
      for h in reversed(hunks(section.text)):
        call, lines = _edit(section.old_path, lines, h)
        out.append(call)
  return out


def solution_calls(task: task_lib.Task, solution: task_lib.Solution, tree: Path) -> list[Call]:
  """The oracle's tool calls for a task whose pristine tree is `tree`."""
  return [Call('view', {'path': task.file}), *edit_calls(solution.patch, tree),
          Call('run', {'command': shlex.join(task.test_command)}), Call('submit', {})]


def conversation(env, task: task_lib.Task, solution: task_lib.Solution) -> list[dict]:
  """The oracle's episode on `task` as a chat: the prompt, then each call (trained) and its result."""
  episode = env.reset(task)
  fmt = calls.FORMATS[env.settings.call_format]
  conv = [dict(m) for m in episode.prompt]
  for call in solution_calls(task, solution, env.task_dir / task.tree):
    message = fmt.render(call)
    step = episode.step(message)
    conv.append({'role': 'assistant', 'content': message, 'loss': True})
    if step.done:
      if not step.success or step.info['reason'] != 'submit':
        raise RuntimeError(f'oracle: {task.id} ended by {step.info["reason"]} ({step.info["grade"]}), '
                           f'not solved at submit (repo.max_turns={env.settings.max_turns})')
      return conv
    conv.append({'role': 'tool', 'content': step.observation})
  raise RuntimeError(f'oracle: {task.id} did not end at submit')


def episodes(env) -> list[list[dict]]:
  """The oracle's episode on each of the env's tasks, as chats (`conversation`)."""
  solutions = task_lib.read_solutions(env.task_dir)
  return [conversation(env, t, solutions[t.id]) for t in env.tasks]


def tokens_per_episode(tok: Tokenizer, convs: list[list[dict]]) -> float:
  """Mean ids of the chats rendered by `tok` (as the warm start renders them, before packing).

  Render one `episodes(env)` with each tokenizer to compare them: `run` output differs between
  episodes (timings), so episodes recorded twice are not the same text.
  """
  return float(np.mean([len(chat.render(tok, conv)[0]) for conv in convs]))


def _reply(env, task: task_lib.Task, message: str) -> tuple[list[dict], Step]:
  """A fresh episode's prompt and its answer to `message` (closed ungraded: no edits)."""
  episode = env.reset(task)
  step = episode.step(message)
  episode.close('context')
  if step.info['kind'] != 'bad_call':
    raise RuntimeError(f'demonstrations: {message!r} parsed as a call')
  return episode.prompt, step


class Demonstrations:
  """Warm-start conversations (research/rl/sft.py): the oracle's episodes with the tools' own names,
  recorded once per task, and hint-conditioned variants that end with a hint (the text the critic
  rule writes) and the message it asks for, the only trained message. `tool_call`: a malformed
  call, shown with the environment's error half the time, then the right call; `untested_submit`:
  after the last edit, the test run rather than a submit; `renamed_tool`: the environment renamed a
  tool (a name of calls.NAME_POOL, listed in the prompt and the reminder), the policy called it
  by its old name (shown with the error half the time), then the call by the new name.

  Half of the other conversations are `recovered`: one or two failed calls (malformed, an unknown
  tool or bad arguments) and the environment's errors before one of the oracle's calls, which follows
  trained as before. Without them every trained call follows a successful one, so a policy's first
  error leads it where no demonstration went (sampled warm starts wrote malformed messages there)."""

  KINDS = ('tool_call', 'untested_submit', 'renamed_tool')
  RECOVERED = 0.5                   # Share of the unhinted conversations with a failed call.
  FAILURES = ('malformed', 'unknown_tool', 'bad_arguments')
  # The unknown tools' names: no tool's and no renamed tool's (NAME_POOL), since calling a renamed
  # tool by its old name is the drift RL measures, and is left to the hinted variants.
  WRONG_NAMES = ('cat', 'edit', 'replace', 'write', 'python', 'ls')

  def __init__(self, env, hint_fraction: float):
    self.env, self.hint_fraction = env.renamed(()), hint_fraction  # RL may rename a tool: drift.
    self.fmt = calls.FORMATS[env.settings.call_format]
    self.solutions = task_lib.read_solutions(env.task_dir)
    self.recorded: dict[str, list[dict]] = {}

  def __call__(self, rng: np.random.Generator, n: int) -> list[list[dict]]:
    out = []
    for _ in range(n):
      task = self.env.sample_task(rng)
      if task.id not in self.recorded:
        self.recorded[task.id] = conversation(self.env, task, self.solutions[task.id])
      conv = self.recorded[task.id]
      if rng.random() < self.hint_fraction:
        out.append(self.hinted(task, conv, rng))
      else:
        out.append(self.recovered(task, conv, rng) if rng.random() < self.RECOVERED else conv)
    return out

  def recovered(self, task: task_lib.Task, conv: list[dict], rng: np.random.Generator) -> list[dict]:
    """`conv` with a failed call and its error (context, not trained) before a random oracle call;
    `conv` itself where one more turn would pass the environment's turn limit."""
    turns = [i for i, m in enumerate(conv) if m['role'] == 'assistant']
    room = self.env.settings.max_turns - len(turns)
    if room < 1:
      return conv
    k = turns[int(rng.integers(len(turns)))]
    failed = []
    for _ in range(int(rng.integers(1, min(room, 2) + 1))):  # One or two in a row.
      bad = self._failure(task, conv[k]['content'], rng)
      _, step = _reply(self.env, task, bad)
      failed += [{'role': 'assistant', 'content': bad, 'loss': False},
                 {'role': 'tool', 'content': step.observation}]
    return conv[:k] + failed + conv[k:]

  def _failure(self, task: task_lib.Task, message: str, rng: np.random.Generator) -> str:
    """A failed attempt at `message`: cut short, an unknown tool's name, or wrong arguments."""
    right = self.fmt.parse(message)
    kind = rng.choice(self.FAILURES)
    if kind == 'malformed':
      return message[:int(rng.integers(1, len(message)))]
    if kind == 'unknown_tool':
      return self.fmt.render(Call(str(rng.choice(self.WRONG_NAMES)), right.arguments))
    args = dict(right.arguments)  # A required argument dropped, or one a tool without any does not take.
    if args:
      args.pop(str(rng.choice(list(args))))
    else:
      args['path'] = task.file
    return self.fmt.render(Call(right.name, args))

  def hinted(self, task: task_lib.Task, conv: list[dict], rng: np.random.Generator) -> list[dict]:
    turns = [i for i, m in enumerate(conv) if m['role'] == 'assistant']
    kind = rng.choice(self.KINDS)
    prompt, context, target = conv[:turns[0]], [], None
    if kind == 'untested_submit':
      k = turns[-2]  # The test run, where the erring policy submitted.
      hint = critics.REGISTRY['untested_submit'].hint({'tool': 'submit', 'tested': False}, None, 0)
    else:
      if kind == 'renamed_tool':
        tool = str(rng.choice(list(calls.NAME_POOL)))
        new = str(rng.choice(calls.NAME_POOL[tool]))
        k = next(i for i in turns if self.fmt.parse(conv[i]['content']).name == tool)
        bad = conv[k]['content']
        prompt, step = _reply(self.env.renamed((tool, new)), task, bad)
        target = self.fmt.render(Call(new, self.fmt.parse(bad).arguments))
      else:
        k = turns[int(rng.integers(len(turns)))]
        bad = conv[k]['content'][:int(rng.integers(1, len(conv[k]['content'])))]
        _, step = _reply(self.env, task, bad)
      if rng.random() < 0.5:
        context = [{'role': 'assistant', 'content': bad}, {'role': 'tool', 'content': step.observation}]
      hint = critics.REGISTRY['tool_call'].hint(step.info, None, 0)
    prefix = [{**m, 'loss': False} for m in prompt + conv[turns[0]:k]]
    last = conv[k] if target is None else {'role': 'assistant', 'content': target, 'loss': True}
    return [*prefix, *context, {'role': 'system', 'content': hint}, last]
