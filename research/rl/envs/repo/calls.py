"""The repository environment's tool calls: the tools' signatures and the call syntax.

Tools are named and shaped after the editor-plus-shell interfaces public coding models are trained
on (SWE-agent / OpenHands: view, str_replace, insert, create, a shell, submit). A call is parsed
from the model's message in the tool-call syntax of its chat format (`FORMATS`: ChatML's
`<tool_call>{json}</tool_call>` as Qwen writes it, Kimi's section tokens). Bad input raises
`CallError` (the call itself) or `ToolError` (what it asked for), whose text is the observation.
Standard library only: the experiment config validates against it (research/rl/config.py).
"""

import dataclasses
import json
import re
from typing import Callable


class CallError(ValueError):
  """A message that is not one valid tool call; `kind` is malformed, unknown_tool or bad_arguments."""

  def __init__(self, kind: str, detail: str):
    super().__init__(detail)
    self.kind = kind


class ToolError(ValueError):
  """A valid call the tool refuses (no such text, a path outside the work area, ...)."""


class Missing(ToolError):
  """A path that does not exist; `nearest` is the closest one that does."""

  def __init__(self, path: str, nearest: str):
    super().__init__(f'{path} does not exist; the nearest existing path is {nearest}')
    self.path, self.nearest = path, nearest


@dataclasses.dataclass(frozen=True)
class Call:
  name: str
  arguments: dict


@dataclasses.dataclass(frozen=True)
class ToolSpec:
  params: tuple[tuple[str, type], ...]   # (name, type) in call order.
  optional: frozenset[str]
  usage: str


TOOLS = {
    'view': ToolSpec((('path', str), ('start', int), ('end', int)), frozenset({'start', 'end'}),
                     "a file's numbered lines (start..end, 1-based, inclusive; end -1: to the end) "
                     "or a directory's files"),
    'search': ToolSpec((('pattern', str), ('path', str)), frozenset({'path'}),
                       'lines matching a Python regular expression, as path:line: text'),
    'str_replace': ToolSpec((('path', str), ('old', str), ('new', str)), frozenset(),
                            'replaces the only occurrence of old (exact text, several lines '
                            'allowed) in the file with new'),
    'insert': ToolSpec((('path', str), ('line', int), ('text', str)), frozenset(),
                       'inserts text after line `line` of the file (0: at the top)'),
    'create': ToolSpec((('path', str), ('text', str)), frozenset(), 'creates a new file'),
    'run': ToolSpec((('command', str),), frozenset(),
                    'runs a shell command in the repository root, e.g. python -m pytest -q'),
    'submit': ToolSpec((), frozenset(), 'ends the episode; the changes are graded by the tests'),
}
EDITS = ('str_replace', 'insert', 'create')
# Names a tool may be renamed to: the warm start's hinted variants use them, RL's rename is one.
NAME_POOL = {'view': ('open', 'show', 'read'), 'run': ('shell', 'bash', 'execute')}


def signature(name: str, shown: str | None = None) -> str:
  """`name(arg, optional?)`, written with the name the environment shows (a renamed tool)."""
  spec = TOOLS[name]
  return f'{shown or name}(' + ', '.join(p + '?' * (p in spec.optional) for p, _ in spec.params) + ')'


def check(call: Call, names: dict[str, str] | None = None) -> Call:
  """The call with the tool's own name; CallError unless it names a tool (`names`: shown -> tool,
  default each tool its own name) and gives it the arguments it takes."""
  names = names or {n: n for n in TOOLS}
  if call.name not in names:
    raise CallError('unknown_tool', f'unknown tool {call.name!r}; tools are {", ".join(names)}')
  name = names[call.name]
  spec = TOOLS[name]
  types = dict(spec.params)
  extra = sorted(set(call.arguments) - set(types))
  missing = [p for p in types if p not in call.arguments and p not in spec.optional]
  if extra or missing:
    raise CallError('bad_arguments',
                    f'{signature(name, call.name)}: unexpected {extra}, missing {missing}')
  for p, value in call.arguments.items():
    if type(value) is not types[p]:  # bool is not an int here.
      raise CallError('bad_arguments', f'{signature(name, call.name)}: {p} must be a '
                                       f'{types[p].__name__}, got {value!r:.40}')
  return Call(name, call.arguments)


def _decode(name: str, arguments: str) -> Call:
  try:
    args = json.loads(arguments) if arguments.strip() else {}
  except json.JSONDecodeError as e:
    raise CallError('malformed', f'the arguments are not valid JSON ({e})') from None
  if not isinstance(args, dict):
    raise CallError('malformed', 'the arguments must be a JSON object')
  return Call(name, args)


_CHATML = re.compile(r'<tool_call>(.*?)</tool_call>', re.S)


def parse_chatml(message: str) -> Call:
  """One `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen's chat templates)."""
  blocks = _CHATML.findall(message)
  if len(blocks) != 1:
    raise CallError('malformed', f'found {len(blocks)} <tool_call> blocks; write exactly one')
  try:
    obj = json.loads(blocks[0])
  except json.JSONDecodeError as e:
    raise CallError('malformed', f'the tool call is not valid JSON ({e})') from None
  if not (isinstance(obj, dict) and isinstance(obj.get('name'), str)
          and set(obj) <= {'name', 'arguments'}):
    raise CallError('malformed', 'a tool call is {"name": "...", "arguments": {...}}')
  return _decode(obj['name'], json.dumps(obj.get('arguments', {})))


def render_chatml(call: Call) -> str:
  body = json.dumps({'name': call.name, 'arguments': call.arguments})
  return f'<tool_call>\n{body}\n</tool_call>'


_KIMI = re.compile(r'<\|tool_call_begin\|>\s*(?:functions\.)?([^:<\s]+)(?::\d+)?\s*'
                   r'<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>', re.S)


def parse_kimi(message: str) -> Call:
  """One call in Kimi's section: <|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{..}."""
  calls = _KIMI.findall(message)
  if len(calls) != 1:
    raise CallError('malformed', f'found {len(calls)} tool calls; write exactly one')
  return _decode(*calls[0])


def render_kimi(call: Call) -> str:
  return ('<|tool_calls_section_begin|><|tool_call_begin|>functions.' + call.name
          + ':0<|tool_call_argument_begin|>' + json.dumps(call.arguments)
          + '<|tool_call_end|><|tool_calls_section_end|>')


@dataclasses.dataclass(frozen=True)
class Format:
  parse: Callable[[str], Call]
  render: Callable[[Call], str]


FORMATS = {'chatml': Format(parse_chatml, render_chatml), 'kimi': Format(parse_kimi, render_kimi)}


def cap(text: str, limit: int) -> str:
  """Keeps the head and tail of an observation, with a visible marker of what was cut."""
  if len(text) <= limit:
    return text
  half = limit // 2
  return f'{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[len(text) - half:]}'
