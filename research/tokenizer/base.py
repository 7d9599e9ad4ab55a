"""The tokenizer interface and the byte-level tokenizer (the embedded default).

Special tokens are ids of their own, never produced by encoding text, so a chat rendering can be
split back into messages without ambiguity.
"""

import re
from collections.abc import Sequence
from typing import Protocol

ROLES = ('system', 'user', 'assistant', 'tool')


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int
  end_of_message_id: int        # Ends every chat message; the sampler stops on it.
  role_ids: dict[str, int]      # First id of a message of that role (may be shared, e.g. ChatML).
  chat_start: list[int]         # Ids before the first chat message.

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def message_prefix(self, role: str) -> list[int]: ...  # Opens a message; starts with role_ids[role].

  def message_suffix(self, role: str) -> list[int]: ...  # Closes it; starts with end_of_message_id.


class ByteTokenizer:
  """UTF-8 bytes are ids 0..255; specials follow, then optional whole-word tokens.

  `words` (e.g. an environment's tool names) become one id each wherever they stand as a whole word,
  as a BPE vocabulary would have them; everything else is bytes.
  """

  def __init__(self, words: Sequence[str] = ()):
    specials = ['<pad>', '<bos>', '<eos>', '<eom>', *(f'<{r}>' for r in ROLES)]
    self.special_ids = {name: 256 + i for i, name in enumerate(specials)}
    self.words = tuple(dict.fromkeys(words))
    bad = [w for w in self.words if not re.fullmatch(r'\w+', w)]
    if bad:
      raise ValueError(f'ByteTokenizer words must be non-empty runs of word characters: {bad}')
    first = 256 + len(specials)
    self.word_ids = {w: first + i for i, w in enumerate(self.words)}
    self._word_bytes = {i: w.encode() for w, i in self.word_ids.items()}
    longest_first = sorted(self.words, key=len, reverse=True)
    self._word_re = re.compile(r'\b(' + '|'.join(map(re.escape, longest_first)) + r')\b') if self.words else None
    self.vocab_size = first + len(self.words)
    self.pad_id = self.special_ids['<pad>']
    self.bos_id = self.special_ids['<bos>']
    self.eos_id = self.special_ids['<eos>']
    self.end_of_message_id = self.special_ids['<eom>']
    self.role_ids = {r: self.special_ids[f'<{r}>'] for r in ROLES}
    self.chat_start = [self.bos_id]

  def encode(self, text: str) -> list[int]:
    if self._word_re is None:
      return list(text.encode('utf-8'))
    ids, pos = [], 0
    for m in self._word_re.finditer(text):
      ids += list(text[pos:m.start()].encode('utf-8')) + [self.word_ids[m.group(1)]]
      pos = m.end()
    return ids + list(text[pos:].encode('utf-8'))

  def decode(self, ids: Sequence[int]) -> str:
    out = b''.join(bytes([i]) if 0 <= i < 256 else self._word_bytes.get(i, b'') for i in map(int, ids))
    return out.decode('utf-8', errors='replace')

  def message_prefix(self, role: str) -> list[int]:
    return [self.role_ids[role]]

  def message_suffix(self, role: str) -> list[int]:
    del role
    return [self.end_of_message_id]
