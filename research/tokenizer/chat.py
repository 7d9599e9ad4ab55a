"""Chat messages rendered directly to token ids: <role> content <eom>, per message.

Rendering is per message and concatenative, so a multi-turn trajectory can be extended with new
token ids (model output, environment observations) without ever re-tokenizing earlier turns.
"""

from collections.abc import Sequence

from research.tokenizer.base import ROLES, Tokenizer


def render_message(tok: Tokenizer, role: str, content: str) -> list[int]:
  if role not in ROLES:
    raise ValueError(f'unknown chat role {role!r}; roles are {ROLES}')
  return [tok.role_ids[role], *tok.encode(content), tok.end_of_message_id]


def render(tok: Tokenizer, messages: Sequence[dict], add_generation_prompt: bool = False
           ) -> tuple[list[int], list[str]]:
  """[{'role', 'content'}] -> (ids, role of each id). The generation prompt opens an assistant turn."""
  ids, roles = [tok.bos_id], ['system']
  for m in messages:
    part = render_message(tok, m['role'], m['content'])
    ids += part
    roles += [m['role']] * len(part)
  if add_generation_prompt:
    ids.append(tok.role_ids['assistant'])
    roles.append('assistant')
  return ids, roles
