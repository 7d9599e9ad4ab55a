"""toolcalc: arithmetic problems solved by calling tools, with drift between warm start and RL.

A task is a left-to-right chain such as `3+4*2` (= (3+4)*2). The prompt lists the tools as
`op:name`; the model calls one tool per message (`add(3,4)`), the environment answers with the
result (`7`), and the model ends with `ans(14)`. Warm-start data uses WARM_TOOLS; the RL default
renames `add` to `plus` (listed in the prompt), so a warm-started model's trajectories are right
except for one step: the call to a tool that no longer exists.

Reward (verifiable; each rule closes a known hack):
  +1 for the right answer,
  -1 once if any call was invalid (unknown tool, malformed message): an invalid call never scores
     better than a clean wrong answer, even when the answer is right,
  -0.5 if the episode ends without an answer (stalling, turn or context limit, empty message),
  -0.25 per repeated identical call.
`success` is a right answer with no invalid call.
"""

import dataclasses
import re

import numpy as np

from research import configs
from research.rl.envs.base import Environment, Step
from research.rl.feedback import critics

WARM_TOOLS = {'+': 'add', '-': 'sub', '*': 'mul'}
RL_TOOLS = {'+': 'plus', '-': 'sub', '*': 'mul'}
# Other names each operation may carry in warm-start data (the RL names among them). A reminder may
# rename an operation to one of them, and plain demonstrations list them for operations the problem
# does not use (a noisy tool list), so the policy learns to follow a reminder and to solve problems
# whatever the list says, but without a reminder it has only ever called WARM_TOOLS.
NAME_POOL = {'+': ('plus', 'sum'), '-': ('minus', 'diff'), '*': ('times', 'prod')}
_OPS = {'+': lambda a, b: a + b, '-': lambda a, b: a - b, '*': lambda a, b: a * b}
_CALL = re.compile(r'([a-z]+)\((-?\d+),(-?\d+)\)')
_ANS = re.compile(r'ans\((-?\d+)\)')

# Every tool name any tool set or reminder uses, and `ans`: the single tokens of `ToolCalc.words`.
WORDS = tuple(dict.fromkeys(['ans', *WARM_TOOLS.values(), *RL_TOOLS.values(), *sum(NAME_POOL.values(), ())]))

SOLVED, INVALID, NO_ANSWER, REPEAT = 1.0, -1.0, -0.5, -0.25
TOOLSETS = {'warm': WARM_TOOLS, 'rl': RL_TOOLS}

_REMINDER = 'Reminder: available tools are {tools}'
# toolcalc's critic rules, as data. The texts are what `demonstrations` teaches.
RULES = (
    # A call to a tool that does not exist (renamed since the warm start, or invented).
    critics.RuleSpec('unknown_tool', 1, {'error': 'unknown_tool'}, _REMINDER),
    # The same reminder for one renamed tool only (the library as written for add -> plus).
    critics.RuleSpec('renamed_add', 1, {'error': 'unknown_tool', 'name': 'add'}, _REMINDER),
    # A real tool, but not the operation the step it attempts needs (the critic knows the task).
    critics.RuleSpec('wrong_tool', 1, {'wrong_op': True}, _REMINDER),
    critics.RuleSpec('malformed_call', 1, {'error': 'malformed'}, 'Write name(a,b) or ans(x).'),
    # The same call again: no new information, a stall.
    critics.RuleSpec('repeated_call', 1, {'repeat': True}, '{message} was already called; use its result.'),
)
for _spec in RULES:
  critics.register(critics.Template(_spec))


def listing(tools: dict) -> str:
  return ' '.join(f'{op}:{name}' for op, name in tools.items())


@dataclasses.dataclass(frozen=True)
class Problem:
  numbers: tuple[int, ...]
  ops: tuple[str, ...]

  @property
  def question(self) -> str:
    return str(self.numbers[0]) + ''.join(f'{o}{n}' for o, n in zip(self.ops, self.numbers[1:]))

  @property
  def results(self) -> list[int]:
    out, x = [], self.numbers[0]
    for o, n in zip(self.ops, self.numbers[1:]):
      x = _OPS[o](x, n)
      out.append(x)
    return out

  @property
  def answer(self) -> int:
    return self.results[-1]


def solution(task: Problem, tools: dict) -> list[tuple[str, str]]:
  """The ideal transcript: (model message, observation or None) per turn."""
  out, x = [], task.numbers[0]
  for o, n, y in zip(task.ops, task.numbers[1:], task.results):
    out.append((f'{tools[o]}({x},{n})', str(y)))
    x = y
  out.append((f'ans({x})', None))
  return out


def prompt(task: Problem, tools: dict) -> list[dict]:
  return [{'role': 'user', 'content': f'tools {listing(tools)}\n{task.question}'}]


class Episode:
  def __init__(self, task: Problem, tools: dict, max_messages: int):
    self.task, self.tools, self.max_messages = task, tools, max_messages
    self.by_name = {name: op for op, name in tools.items()}
    self.prompt = prompt(task, tools)
    self.calls: list[str] = []
    self.invalid = self.repeats = self.messages = self.done_ops = 0

  def _score(self, answer: int | None, **info) -> Step:
    right = answer is not None and answer == self.task.answer
    reward = (SOLVED * right + INVALID * (self.invalid > 0) + NO_ANSWER * (answer is None)
              + REPEAT * self.repeats)
    return Step(None, True, reward, right and not self.invalid, {**info, 'grade': self._grade(answer, right)})

  def _grade(self, answer: int | None, right: bool) -> str:
    """Why the episode scored what it did, in words (the rollout viewer shows it)."""
    said = ('no answer' if answer is None else
            f'answer {answer} ' + ('right' if right else f'wrong (expected {self.task.answer})'))
    costs = ([f'{self.invalid} invalid message(s)'] * bool(self.invalid)
             + [f'{self.repeats} repeated call(s)'] * bool(self.repeats))
    return '; '.join([said, *costs])

  def _step_of(self, b: int) -> int:
    """The problem step a call attempts: the first from the current one on whose operand it uses
    (a wrong-operation call leaves the current step where it was), else the current step."""
    later = [k for k in range(self.done_ops, len(self.task.ops)) if self.task.numbers[k + 1] == b]
    return later[0] if later else self.done_ops

  def step(self, message: str) -> Step:
    text = message.strip()
    self.messages += 1
    info = {'tools': listing(self.tools), 'message': text}
    if m := _ANS.fullmatch(text):
      return self._score(int(m.group(1)), kind='answer', **info)
    m = _CALL.fullmatch(text)
    if m is None:
      self.invalid += 1
      info.update(kind='malformed', error='malformed')
      obs = 'error: malformed'
    else:
      name, a, b = m.group(1), int(m.group(2)), int(m.group(3))
      info.update(kind='call', name=name, args=(a, b), repeat=text in self.calls)
      self.repeats += text in self.calls
      self.calls.append(text)
      if name not in self.by_name:
        self.invalid += 1
        info['error'] = 'unknown_tool'
        obs = f'error: unknown tool {name}'
      else:
        info['wrong_op'] = self._wrong_op(self.by_name[name], b, info['repeat'])
        obs = str(_OPS[self.by_name[name]](a, b))
    if self.messages >= self.max_messages:
      return self._score(None, **info)
    return Step(obs, False, 0.0, False, info)

  def _wrong_op(self, op: str, b: int, repeat: bool) -> bool:
    """A real tool for another operation than the step it attempts needs; a repeat is not one
    (repeated_call's case), and only a right call moves the step on."""
    if repeat:
      return False
    k = self._step_of(b)
    wrong = k >= len(self.task.ops) or op != self.task.ops[k]
    if not wrong:
      self.done_ops = k + 1
    return wrong

  def from_here(self):
    """Forgets the penalties so far (an efficacy probe scores the continuation of a replayed prefix)."""
    self.invalid = self.repeats = 0

  def close(self, reason: str) -> Step:
    return self._score(None, kind='closed', reason=reason)


def parse_rename(spec: str) -> tuple[int, str, str]:
  """'STEP:OP:NAME' (e.g. '12:*:times'): from RL step STEP on, operation OP is called NAME."""
  parts = spec.split(':')
  if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in _OPS or parts[2] not in WORDS:
    raise ValueError(f'toolcalc rename {spec!r}: expected STEP:OP:NAME with OP in {sorted(_OPS)} and '
                     f'NAME one of the tool words {WORDS}')
  return int(parts[0]), parts[1], parts[2]


@dataclasses.dataclass(frozen=True)
class Settings:
  """env.toolcalc: the problems and the tools."""
  tools: str = 'rl'                 # 'rl' (add renamed to plus: drift) or 'warm' (the warm-start tools).
  max_ops: int = 2                  # Operations per problem (1..max_ops).
  max_operand: int = 9              # Largest operand.
  renames: tuple[str, ...] = ()     # Drift mid-run, 'STEP:OP:NAME' (e.g. '12:*:times').

  def validate(self, path: str = 'toolcalc.') -> 'Settings':
    if self.tools not in TOOLSETS:
      raise configs.invalid(path + 'tools', self.tools, f'expected one of {tuple(TOOLSETS)}')
    for f in ('max_ops', 'max_operand'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be positive')
    for spec in self.renames:
      try:
        parse_rename(spec)
      except ValueError as e:
        raise configs.invalid(path + 'renames', spec, str(e)) from None
    return self


class ToolCalc(Environment):
  """Tasks with 1..max_ops operations on operands 1..max_operand; `tools` maps op -> tool name.

  `renames` ('STEP:OP:NAME', parse_rename) drift the tools mid-run: `at_step(step)` sets the tools of
  that RL step (the loop calls it before each step's rollouts, so evaluations see them too).
  """
  name = 'toolcalc'
  words = WORDS  # Whole-word tokens for a tokenizer that wants them (`env.word_tokens`).

  def __init__(self, tools: dict | None = None, max_ops: int = 3, max_operand: int = 9,
               extra_messages: int = 2, renames: tuple[str, ...] = ()):
    self.tools = dict(RL_TOOLS if tools is None else tools)
    unknown = sorted(set(self.tools) - set(_OPS))
    if unknown:
      raise ValueError(f'toolcalc tools: unknown operation(s) {unknown}; known: {sorted(_OPS)}')
    self.max_ops, self.max_operand, self.extra = max_ops, max_operand, extra_messages
    self.base_tools, self.renames = dict(self.tools), sorted(parse_rename(r) for r in renames)

  def at_step(self, step: int) -> dict:
    """The tools from RL step `step` on: the base tools with every rename due by then."""
    self.tools = {**self.base_tools, **{op: name for at, op, name in self.renames if at <= step}}
    return self.tools

  def sample_task(self, rng: np.random.Generator) -> Problem:
    k = int(rng.integers(1, self.max_ops + 1))
    ops = tuple(str(o) for o in rng.choice(list(self.tools), size=k))
    return Problem(tuple(int(x) for x in rng.integers(1, self.max_operand + 1, size=k + 1)), ops)

  def reset(self, task: Problem) -> Episode:
    return Episode(task, self.tools, len(task.ops) + 1 + self.extra)

  def demonstrations(self, hint_fraction: float):
    """The warm start's conversations, with the warm-start tools (`demonstrations`)."""
    return lambda rng, n: demonstrations(rng, n, hint_fraction=hint_fraction, max_ops=self.max_ops,
                                         max_operand=self.max_operand)


def make(s: Settings, workdir: str) -> ToolCalc:
  """The environment of `env.toolcalc` (the workdir holds nothing of it)."""
  del workdir
  return ToolCalc(TOOLSETS[s.tools], s.max_ops, s.max_operand, renames=s.renames)


def _turns(conv, turns, upto, loss):
  for msg, obs in turns[:upto]:
    conv.append({'role': 'assistant', 'content': msg, 'loss': loss})
    if obs is not None:
      conv.append({'role': 'tool', 'content': obs})


def demonstrations(rng: np.random.Generator, n: int, *, tools: dict = WARM_TOOLS,
                   hint_fraction: float = 0.3, max_ops: int = 3, max_operand: int = 9) -> list[list[dict]]:
  """Warm-start conversations: ideal solutions with `tools`, and hint-conditioned examples.

  A hinted example ends with a hint (the exact text the critic rule writes; the message names the
  rule@version it was made with, key 'rule') and the message the hint asks for, the only trained message: `rename` (the reminder lists tools renamed from NAME_POOL; the
  prompt lists either the old or the new names), `malformed`, and `repeat` (after a stall). Half of
  them show the failed attempt and the environment's error before the hint. Half of the plain
  demonstrations list NAME_POOL names for the operations their problem does not use.
  """
  rules = critics.REGISTRY  # The hint texts the rules write, so demonstrations match them.
  env = ToolCalc(tools, max_ops, max_operand)
  out = []
  for _ in range(n):
    task = env.sample_task(rng)
    turns = solution(task, tools)
    conv = prompt(task, tools)
    if rng.random() >= hint_fraction:
      if rng.random() < 0.5:
        conv = prompt(task, {o: nm if o in task.ops else str(rng.choice(NAME_POOL[o])) for o, nm in tools.items()})
      _turns(conv, turns, len(turns), True)
      out.append(conv)
      continue
    kind = rng.choice(['rename', 'malformed', 'repeat'], p=[0.6, 0.2, 0.2])
    show_failure = rng.random() < 0.5
    if kind == 'rename':
      renamed = {o for o in dict.fromkeys(task.ops) if rng.random() < 0.5} or {task.ops[int(rng.integers(len(task.ops)))]}
      new = {o: str(rng.choice(NAME_POOL[o])) if o in renamed else nm for o, nm in tools.items()}
      if rng.random() < 0.5:
        conv = prompt(task, new)
      k = min(i for i, o in enumerate(task.ops) if o in renamed)
      _turns(conv, turns, k, False)
      if show_failure:
        old = turns[k][0]
        conv += [{'role': 'assistant', 'content': old},
                 {'role': 'tool', 'content': f'error: unknown tool {tools[task.ops[k]]}'}]
      rule, info = rules['unknown_tool'], {'error': 'unknown_tool', 'tools': listing(new)}
      target = solution(task, new)[k][0]
    elif kind == 'malformed':
      k = int(rng.integers(len(turns)))
      _turns(conv, turns, k, False)
      if show_failure:
        good = turns[k][0]
        bad = rng.choice([good.replace(',', ' '), good.replace('(', ' '), good[:-1], ''])
        conv += [{'role': 'assistant', 'content': str(bad)},
                 {'role': 'tool', 'content': 'error: malformed'}]
      rule, info = rules['malformed_call'], {'error': 'malformed'}
      target = turns[k][0]
    else:
      k = int(rng.integers(1, len(turns)))
      _turns(conv, turns, k, False)
      prev, obs = turns[k - 1]
      conv += [{'role': 'assistant', 'content': prev}, {'role': 'tool', 'content': obs}]
      rule, info = rules['repeated_call'], {'repeat': True, 'message': prev}
      target = turns[k][0]
    conv += [{'role': 'system', 'content': rule.hint(info, None, k), 'rule': f'{rule.name}@{rule.version}'},
             {'role': 'assistant', 'content': target, 'loss': True}]
    out.append(conv)
  return out
