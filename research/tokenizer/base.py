"""The tokenizer interface and the byte-level tokenizer (the embedded default).

Special tokens are ids of their own, never produced by encoding text, so a chat rendering can be
split back into messages without ambiguity.
"""

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
  """UTF-8 bytes are ids 0..255; specials follow."""

  def __init__(self):
    specials = ['<pad>', '<bos>', '<eos>', '<eom>', *(f'<{r}>' for r in ROLES)]
    self.special_ids = {name: 256 + i for i, name in enumerate(specials)}
    self.vocab_size = 256 + len(specials)
    self.pad_id = self.special_ids['<pad>']
    self.bos_id = self.special_ids['<bos>']
    self.eos_id = self.special_ids['<eos>']
    self.end_of_message_id = self.special_ids['<eom>']
    self.role_ids = {r: self.special_ids[f'<{r}>'] for r in ROLES}
    self.chat_start = [self.bos_id]

  def encode(self, text: str) -> list[int]:
    return list(text.encode('utf-8'))

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode('utf-8', errors='replace')

  def message_prefix(self, role: str) -> list[int]:
    return [self.role_ids[role]]

  def message_suffix(self, role: str) -> list[int]:
    del role
    return [self.end_of_message_id]
