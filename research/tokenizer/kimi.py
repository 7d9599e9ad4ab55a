"""Kimi K2 / K2.5's tiktoken tokenizer behind our Tokenizer interface, and its chat format with tools.

Files, as Moonshot ships them (tokenization_kimi.py): `tiktoken.model`, one `base64(token bytes) rank`
per line; `tokenizer_config.json`, whose `added_tokens_decoder` gives the special tokens and their ids
(ids from the number of ranks up that it leaves out are `<|reserved_token_{id}|>`) and whose
bos / eos / pad tokens name them. The split pattern is tokenization_kimi.py's `pat_str` (it is not in
the files); its `&&` class intersections are Rust regex syntax, which tiktoken compiles.

Chat (Kimi K2.5's template, as public renderers of it describe it): a message is
`<|im_{system,user,assistant}|>{name or role}<|im_middle|>{content}<|im_end|>`, tool results are
system-token messages `<|im_system|>{name or 'tool'}<|im_middle|>## Return of {tool_call_id}\n{content}`,
tools are declared first, before the system message, in
`<|im_system|>tool_declare<|im_middle|>{TypeScript-style declarations (kimi_tools)}<|im_end|>`, and a
system message is inserted when there is none. An assistant turn is `<think>{reasoning}</think>{content}`
then its tool calls: `<|tool_calls_section_begin|>` then per call `<|tool_call_begin|>functions.{name}:{index}
<|tool_call_argument_begin|>{JSON arguments}<|tool_call_end|>`, then `<|tool_calls_section_end|>`.
Special tokens inside any text are encoded as text, never as their ids.
"""

import base64
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import tiktoken

from research.tokenizer import kimi_tools
from research.tokenizer.base import ROLES

PAT_STR = '|'.join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
NUM_RESERVED = 256  # Special ids: the ranks' count up to + 256 (163584..163839 in Kimi K2 / K2.5).
DEFAULT_SYSTEM = 'You are Kimi, an AI assistant created by Moonshot AI.'
_ROLE_TOKEN = {'system': '<|im_system|>', 'user': '<|im_user|>', 'assistant': '<|im_assistant|>',
               'tool': '<|im_system|>'}


def load_ranks(path: str) -> dict[bytes, int]:
  """tiktoken.model: `base64(bytes) rank` per line."""
  ranks = {}
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      parts = line.split()
      if len(parts) != 2 or not parts[1].isdigit():
        raise ValueError(f'{path}:{n}: expected "base64 rank", got {line.strip()!r}')
      ranks[base64.b64decode(parts[0])] = int(parts[1])
  if sorted(ranks.values()) != list(range(len(ranks))):
    raise ValueError(f'{path}: ranks must be 0..{len(ranks) - 1}, each once')
  return ranks


def load_special_tokens(config_json: Mapping[str, Any], num_base: int) -> dict[str, int]:
  """added_tokens_decoder ({id: {content}}) plus reserved names for the ids it leaves out."""
  decoder_json = config_json.get('added_tokens_decoder') or {}
  named = {int(i): entry['content'] for i, entry in decoder_json.items()}
  bad = sorted(i for i in named if i < num_base)
  if bad:
    raise ValueError(f'tokenizer_config.json: special token id {bad[0]} ({named[bad[0]]!r}) is inside the '
                     f'{num_base} BPE ranks')
  top = max([num_base + NUM_RESERVED - 1, *named])
  return {named.get(i, f'<|reserved_token_{i}|>'): i for i in range(num_base, top + 1)}


class KimiTokenizer:
  """tiktoken.model + tokenizer_config.json from a Kimi K2 / K2.5 folder."""

  def __init__(self, path: str, pat_str: str = PAT_STR):
    config_file = os.path.join(path, 'tokenizer_config.json')
    if not os.path.exists(config_file):
      raise FileNotFoundError(f'{config_file} not found (special tokens and their ids come from it)')
    with open(config_file) as f:
      config_json = json.load(f)
    ranks = load_ranks(os.path.join(path, 'tiktoken.model'))
    self.special_ids = load_special_tokens(config_json, len(ranks))
    self._enc = tiktoken.Encoding(os.path.basename(os.path.abspath(path)), pat_str=pat_str,
                                  mergeable_ranks=ranks, special_tokens=self.special_ids)
    self.vocab_size = len(ranks) + len(self.special_ids)
    missing = sorted({*_ROLE_TOKEN.values(), '<|im_middle|>', '<|im_end|>'} - set(self.special_ids))
    if missing:
      raise ValueError(f'{config_file}: the Kimi chat format needs special tokens {missing}')
    self.end_of_message_id = self.special_ids['<|im_end|>']
    self.eos_id = self._configured(config_json, 'eos_token', self.end_of_message_id)
    self.bos_id = self._configured(config_json, 'bos_token', self.eos_id)
    self.pad_id = self._configured(config_json, 'pad_token', self.eos_id)
    self.role_ids = {r: self.special_ids[_ROLE_TOKEN[r]] for r in ROLES}
    self.chat_start = []

  def _configured(self, config_json: Mapping[str, Any], key: str, default: int) -> int:
    token = config_json.get(key)
    token = token.get('content') if isinstance(token, Mapping) else token
    if token is not None and token not in self.special_ids:
      raise ValueError(f'tokenizer_config.json {key}={token!r} is not a special token')
    return default if token is None else self.special_ids[token]

  def special(self, token: str) -> int:
    if token not in self.special_ids:
      raise KeyError(f'{token!r} is not a special token of this tokenizer')
    return self.special_ids[token]

  def encode(self, text: str) -> list[int]:
    return self._enc.encode(text, allowed_special=set(), disallowed_special=())

  def decode(self, ids: Sequence[int]) -> str:
    return self._enc.decode([int(i) for i in ids])

  def message_prefix(self, role: str, name: str | None = None) -> list[int]:
    return [self.role_ids[role], *self.encode(name or role), self.special('<|im_middle|>')]

  def message_suffix(self, role: str) -> list[int]:
    del role
    return [self.end_of_message_id]


@dataclasses.dataclass(frozen=True)
class ToolCall:
  id: str          # functions.{name}:{index}
  name: str
  arguments: str   # JSON text, as generated.


def tool_call_id(name: str, index: int) -> str:
  return f'functions.{name}:{index}'


def _tool_calls_ids(tok: KimiTokenizer, calls: Sequence[ToolCall]) -> list[int]:
  ids = [tok.special('<|tool_calls_section_begin|>')]
  for c in calls:
    ids += [tok.special('<|tool_call_begin|>'), *tok.encode(c.id), tok.special('<|tool_call_argument_begin|>'),
            *tok.encode(c.arguments), tok.special('<|tool_call_end|>')]
  return ids + [tok.special('<|tool_calls_section_end|>')]


def _body(tok: KimiTokenizer, m: Mapping[str, Any], keep_reasoning: bool) -> list[int]:
  """A message's ids between <|im_middle|> and <|im_end|>."""
  if m['role'] == 'tool':
    return tok.encode(f'## Return of {m["tool_call_id"]}\n{m["content"]}')
  if m['role'] != 'assistant':
    return tok.encode(m.get('content') or '')
  reasoning = (m.get('reasoning_content') or '') if keep_reasoning else ''
  ids = [tok.special('<think>'), *tok.encode(reasoning), tok.special('</think>'), *tok.encode(m.get('content') or '')]
  if m.get('tool_calls'):
    ids += _tool_calls_ids(tok, [ToolCall(c['id'], c['function']['name'], _arguments(c))
                                 for c in m['tool_calls']])
  return ids


def _arguments(call_json: Mapping[str, Any]) -> str:
  args = call_json['function']['arguments']
  return args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)  # The template's tojson.


def render(tok: KimiTokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping] = (),
           add_generation_prompt: bool = False, thinking: bool = True) -> list[int]:
  """OpenAI-style messages (content, optional name, tool_calls, tool_call_id, reasoning_content) -> ids.

  As K2.5's template: messages up to and including the last assistant message without tool calls are
  history, their reasoning dropped (`<think></think>`); later assistant turns (the tool-calling steps of
  the turn in progress) keep theirs, unless thinking=False (instant mode), which drops it everywhere.
  The generation prompt ends in `<think>` (thinking) or `<think></think>` (instant).
  """
  ids = []
  if tools:
    ids += [*tok.message_prefix('system', 'tool_declare'), *tok.encode(kimi_tools.declare(tools)),
            *tok.message_suffix('system')]
  if not messages or messages[0]['role'] != 'system':
    messages = [{'role': 'system', 'content': DEFAULT_SYSTEM}, *messages]
  final_answers = [i for i, m in enumerate(messages) if m['role'] == 'assistant' and not m.get('tool_calls')]
  history_end = final_answers[-1] + 1 if final_answers else 0
  for i, m in enumerate(messages):
    if m['role'] not in ROLES:
      raise ValueError(f'unknown chat role {m["role"]!r}; roles are {ROLES}')
    ids += [*tok.message_prefix(m['role'], m.get('name')), *_body(tok, m, thinking and i >= history_end),
            *tok.message_suffix(m['role'])]
  if add_generation_prompt:
    ids += generation_prompt(tok, thinking)
  return ids


def generation_prompt(tok: KimiTokenizer, thinking: bool = True) -> list[int]:
  think = [tok.special('<think>')] if thinking else [tok.special('<think>'), tok.special('</think>')]
  return tok.message_prefix('assistant') + think


@dataclasses.dataclass(frozen=True)
class Parsed:
  content: str
  reasoning: str | None
  tool_calls: tuple[ToolCall, ...]


def parse(tok: KimiTokenizer, ids: Sequence[int]) -> Parsed:
  """Generated assistant ids (after the generation prompt, up to <|im_end|>) -> content and tool calls.

  The leading `<think>` may be absent (it ended the generation prompt): reasoning is what precedes
  `</think>` either way. Reads special ids only, so text that spells a special token cannot forge a call. A call id is
  `functions.{name}:{index}` (name: between the last '.' and the ':', as vLLM's kimi_k2 parser reads it).
  """
  ids = [int(i) for i in ids]
  if tok.end_of_message_id in ids:
    ids = ids[:ids.index(tok.end_of_message_id)]
  reasoning = None
  if tok.special('</think>') in ids:
    end = ids.index(tok.special('</think>'))
    start = 1 if ids[:1] == [tok.special('<think>')] else 0
    reasoning, ids = tok.decode(ids[start:end]), ids[end + 1:]
  begin = tok.special('<|tool_calls_section_begin|>')
  if begin not in ids:
    return Parsed(tok.decode(ids), reasoning, ())
  content, section = ids[:ids.index(begin)], ids[ids.index(begin) + 1:]
  calls = []
  for chunk in _split(section, tok.special('<|tool_call_begin|>'))[1:]:
    chunk = _cut(_cut(chunk, tok.special('<|tool_call_end|>')), tok.special('<|tool_calls_section_end|>'))
    sep = tok.special('<|tool_call_argument_begin|>')
    if sep not in chunk:
      raise ValueError(f'tool call without <|tool_call_argument_begin|>: {tok.decode(chunk)!r}')
    call_id = tok.decode(chunk[:chunk.index(sep)]).strip()
    name = call_id.split(':')[0].split('.')[-1]
    calls.append(ToolCall(call_id, name, tok.decode(chunk[chunk.index(sep) + 1:])))
  return Parsed(tok.decode(content), reasoning, tuple(calls))


def _split(ids: list[int], sep: int) -> list[list[int]]:
  out = [[]]
  for i in ids:
    if i == sep:
      out.append([])
    else:
      out[-1].append(i)
  return out


def _cut(ids: list[int], stop: int) -> list[int]:
  return ids[:ids.index(stop)] if stop in ids else ids
