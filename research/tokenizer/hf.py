"""A Hugging Face `tokenizers` tokenizer (tokenizer.json) behind our Tokenizer interface.

Chat messages render straight to ids through a ChatFormat: per role, a prefix and a suffix written
as text with special tokens, e.g. ChatML (Qwen): `<|im_start|>user\\n` ... `<|im_end|>\\n`. Special
tokens inside message content are encoded as plain text, never as their special ids, so a rendered
trajectory splits back into messages without ambiguity (and a user cannot forge a turn).
"""

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence

import tokenizers

from research.tokenizer.base import ROLES


@dataclasses.dataclass(frozen=True)
class ChatFormat:
  """Text around each message, with special tokens spelled out: a prefix per role, one suffix."""
  prefix: Mapping[str, str]
  suffix: str
  start: str = ''  # Before the first message (e.g. a BOS token).


# The plain ChatML wire format (Qwen). Qwen3's own Jinja template adds <think> handling and wraps
# tool results in a user turn with <tool_response> tags; we render the `tool` role as its own turn.
CHATML = ChatFormat({r: f'<|im_start|>{r}\n' for r in ROLES}, '<|im_end|>\n')
# Kimi K2: a role token, the role name, <|im_middle|>, the content, <|im_end|>.
KIMI_K2 = ChatFormat({'system': '<|im_system|>system<|im_middle|>', 'user': '<|im_user|>user<|im_middle|>',
                      'assistant': '<|im_assistant|>assistant<|im_middle|>',
                      'tool': '<|im_system|>tool<|im_middle|>'}, '<|im_end|>')
FORMATS = {'chatml': CHATML, 'kimi_k2': KIMI_K2}


class HFTokenizer:
  """tokenizer.json (+ tokenizer_config.json for bos / eos / pad) from a checkpoint folder."""

  def __init__(self, path: str, chat_format: str | ChatFormat | None = None):
    file = path if path.endswith('.json') else os.path.join(path, 'tokenizer.json')
    if not os.path.exists(file):
      raise FileNotFoundError(f'{file} not found (a Hugging Face fast tokenizer is needed)')
    self._tok = tokenizers.Tokenizer.from_file(file)
    self._tok.encode_special_tokens = True  # Content never produces special ids.
    special_tokens = {}  # tokenizer_config.json: bos_token, eos_token, pad_token and more.
    config_file = os.path.join(os.path.dirname(file), 'tokenizer_config.json')
    if os.path.exists(config_file):
      with open(config_file) as f:
        special_tokens = json.load(f)
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self.special_ids = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items()
                        if t.special}
    if chat_format is None:
      chat_format = 'kimi_k2' if '<|im_middle|>' in self.special_ids else 'chatml'
    self.chat_format = FORMATS[chat_format] if isinstance(chat_format, str) else chat_format
    self.end_of_message_id = self._special(self.chat_format.suffix, 'suffix')[0]
    self.eos_id = self._id(special_tokens.get('eos_token'), self.end_of_message_id)
    self.bos_id = self._id(special_tokens.get('bos_token'), self.eos_id)
    self.pad_id = self._id(special_tokens.get('pad_token'), self.eos_id)
    self._prefix = {r: self._special(self.chat_format.prefix[r], f'{r} prefix') for r in ROLES}
    self._suffix = self._special(self.chat_format.suffix, 'suffix')
    self.role_ids = {r: p[0] for r, p in self._prefix.items()}
    self.chat_start = self._special(self.chat_format.start, 'chat start') if self.chat_format.start else []

  def _id(self, token, default: int) -> int:
    """A tokenizer_config.json token (a string or an AddedToken dict) -> its id, else default."""
    token = token.get('content') if isinstance(token, dict) else token
    i = None if token is None else self._tok.token_to_id(token)
    return default if i is None else i

  def _special(self, text: str, what: str) -> list[int]:
    """Text with special tokens spelled out -> ids (special tokens recognised here, only here)."""
    self._tok.encode_special_tokens = False
    try:
      ids = self._tok.encode(text, add_special_tokens=False).ids
    finally:
      self._tok.encode_special_tokens = True
    if not ids or ids[0] not in self.special_ids.values():
      raise ValueError(f'chat format {what} {text!r} must start with a special token of the '
                       f'tokenizer; its special tokens are {sorted(self.special_ids)}')
    return ids

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def message_prefix(self, role: str) -> list[int]:
    return list(self._prefix[role])

  def message_suffix(self, role: str) -> list[int]:
    del role
    return list(self._suffix)
