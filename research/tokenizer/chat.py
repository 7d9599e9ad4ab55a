"""Chat messages rendered directly to token ids: prefix(role) content suffix(role), per message.

Rendering is per message and concatenative, so a multi-turn trajectory can be extended with new
token ids (model output, environment observations) without ever re-tokenizing earlier turns.
The byte tokenizer's prefix / suffix are <role> / <eom>; a Hugging Face tokenizer's come from its
chat format (research/tokenizer/hf.py), e.g. ChatML's `<|im_start|>role\n` / `<|im_end|>\n`.
"""

from collections.abc import Sequence

from research.tokenizer.base import ROLES, Tokenizer


def render_message(tok: Tokenizer, role: str, content: str) -> list[int]:
  if role not in ROLES:
    raise ValueError(f'unknown chat role {role!r}; roles are {ROLES}')
  return [*tok.message_prefix(role), *tok.encode(content), *tok.message_suffix(role)]


def generation_prompt(tok: Tokenizer) -> list[int]:
  """Ids that open the assistant's turn (append after a rendered observation, then sample)."""
  return tok.message_prefix('assistant')


def render(tok: Tokenizer, messages: Sequence[dict], add_generation_prompt: bool = False
           ) -> tuple[list[int], list[str]]:
  """[{'role', 'content'}] -> (ids, role of each id). The generation prompt opens an assistant turn."""
  ids = list(tok.chat_start)
  roles = ['system'] * len(ids)
  for m in messages:
    part = render_message(tok, m['role'], m['content'])
    ids += part
    roles += [m['role']] * len(part)
  if add_generation_prompt:
    prompt = generation_prompt(tok)
    ids += prompt
    roles += ['assistant'] * len(prompt)
  return ids, roles
