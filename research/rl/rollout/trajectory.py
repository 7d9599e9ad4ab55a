"""Multi-turn trajectories kept as the exact token ids the model saw and produced.

A trajectory is appended to, never re-rendered: the prompt, each sampled model message and each
environment observation are token ids from the moment they exist (re-tokenizing text between turns
corrupts training). `policy` marks the tokens the policy sampled, `logp` holds the sampler's
log-probs of those tokens, `messages` the spans of the model messages. A hint is spliced in only for
the teacher pass (`with_hint`), which returns where the hint and the target message sit.

Training arrays use the next-token convention: position t of `to_batch` predicts token t+1.
"""

import dataclasses

import numpy as np

from research.tokenizer import chat
from research.tokenizer.base import Tokenizer


@dataclasses.dataclass
class Message:
  """A model message: its content tokens (sampled, ending in <eom> when stopped) are [start, end)."""
  start: int
  end: int
  text: str
  info: dict = dataclasses.field(default_factory=dict)  # What the environment made of it.


@dataclasses.dataclass
class Trajectory:
  tokens: list[int]
  policy: list[bool]
  logp: list[float]
  task: object = None
  prompt: list = dataclasses.field(default_factory=list)   # The initial chat messages.
  group: int = 0                    # Rollouts of one task share a group (the baseline).
  messages: list[Message] = dataclasses.field(default_factory=list)
  observations: list[str] = dataclasses.field(default_factory=list)
  routes: list | None = None        # Per token (L_moe x k) recorded at sampling, for router replay.
  reward: float = 0.0
  success: bool = False
  done: bool = False
  fault: str | None = None          # An environment error: masked from the loss, never scored.
  truncated: bool = False           # Hit the context limit before the episode ended.

  @classmethod
  def from_prompt(cls, prompt_ids, **kw) -> 'Trajectory':
    n = len(prompt_ids)
    return cls(tokens=list(prompt_ids), policy=[False] * n, logp=[0.0] * n, **kw)

  def add_model(self, ids, logp, text: str, routes=None) -> Message:
    m = Message(len(self.tokens), len(self.tokens) + len(ids), text)
    self._extend(ids, True, logp, routes)
    self.messages.append(m)
    return m

  def add_observation(self, ids, text: str, routes=None):
    self._extend(ids, False, [0.0] * len(ids), routes)
    self.observations.append(text)

  def _extend(self, ids, is_policy, logp, routes):
    self.tokens += [int(i) for i in ids]
    self.policy += [is_policy] * len(ids)
    self.logp += [float(x) for x in logp]
    if routes is not None:
      self.routes = (self.routes or []) + list(routes)

  @property
  def num_policy_tokens(self) -> int:
    return int(sum(self.policy))

  @property
  def transcript(self) -> list[tuple[str, str]]:
    """(role, text) per turn after the prompt: assistant messages and observations interleaved."""
    out = []
    for i, m in enumerate(self.messages):
      out.append(('assistant', m.text))
      if i < len(self.observations):
        out.append(('tool', self.observations[i]))
    return out


@dataclasses.dataclass(frozen=True)
class HintedContext:
  """The teacher's view: tokens[:end] = prefix + hint + target message."""
  tokens: list[int]
  hint: tuple[int, int]             # [start, end) of the hint message.
  target: tuple[int, int]           # [start, end) of the target message's content in `tokens`.


def with_hint(tok: Tokenizer, traj: Trajectory, message: int, hint: str,
              role: str = 'system') -> HintedContext:
  """Prefix + hint + target message: the hint is a whole message placed before the target's opener."""
  m = traj.messages[message]
  opener = len(chat.generation_prompt(tok))  # What opened the assistant turn (<assistant>, ChatML's 3).
  h0 = m.start - opener
  hint_ids = chat.render_message(tok, role, hint)
  ids = traj.tokens[:h0] + hint_ids + traj.tokens[h0:m.end]
  return HintedContext(ids, (h0, h0 + len(hint_ids)), (h0 + len(hint_ids) + opener, len(ids)))


def to_batch(trajs: list[Trajectory], seq_len: int, pad_id: int, rows: int | None = None) -> dict:
  """Right-padded training arrays, rows x seq_len, in the next-token convention.

  tokens, segment_ids (1 real / 0 pad), targets (token t+1), mask (target is a policy token),
  sampler_logp (the sampler's log-prob of the target). Trajectories longer than seq_len are cut
  (their tail leaves the loss; the rollout already keeps them within the limit).
  """
  rows = rows or len(trajs)
  tokens = np.full((rows, seq_len), pad_id, np.int32)
  seg = np.zeros((rows, seq_len), np.int32)
  targets = np.full((rows, seq_len), pad_id, np.int32)
  mask = np.zeros((rows, seq_len), np.float32)
  logp = np.zeros((rows, seq_len), np.float32)
  for r, t in enumerate(trajs):
    n = min(len(t.tokens), seq_len)
    tokens[r, :n] = t.tokens[:n]
    seg[r, :n] = 1
    targets[r, :n - 1] = t.tokens[1:n]
    mask[r, :n - 1] = t.policy[1:n]
    logp[r, :n - 1] = t.logp[1:n]
  return {'tokens': tokens, 'segment_ids': seg, 'targets': targets, 'mask': mask, 'sampler_logp': logp}


def routes_batch(trajs: list[Trajectory], seq_len: int, rows: int, num_layers: int, k: int):
  """Recorded routes, rows x seq_len x L_moe x k (pads route to 0): split by rows like the batch."""
  out = np.zeros((rows, seq_len, num_layers, k), np.int32)
  for r, t in enumerate(trajs):
    n = min(len(t.routes), seq_len)
    out[r, :n] = np.stack(t.routes[:n])
  return out
