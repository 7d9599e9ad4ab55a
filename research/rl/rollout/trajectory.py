"""Multi-turn trajectories kept as the exact token ids the model saw and produced.

A trajectory is appended to, never re-rendered: the prompt, each sampled model message and each
environment observation are token ids from the moment they exist (re-tokenizing text between turns
corrupts training). `policy` marks the tokens the policy sampled, `logp` holds the sampler's
log-probs of those tokens, `messages` the spans of the model messages. A hint is spliced in only for
the teacher pass (`with_hint`), which returns where the hint and the target message sit.

Training arrays use the next-token convention: position t of `to_batch` predicts token t+1; `pack`
puts several trajectories in a row (one segment each) so that the update computes on real tokens.
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


Place = list[tuple[int, int]]      # Per item: (row, offset of its first token) in rows of seq_len.


def pack(lengths: list[int], seq_len: int) -> Place:
  """Items (cut to seq_len) packed into rows of seq_len: first fit, longest first. The rows used
  are 0 .. the largest row; an item of exactly seq_len has a row of its own."""
  place: Place = [(0, 0)] * len(lengths)
  free: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
    n = min(lengths[i], seq_len)
    r = next((r for r, f in enumerate(free) if f >= n), len(free))
    if r == len(free):
      free.append(seq_len)
    place[i] = (r, seq_len - free[r])
    free[r] -= n
  return place


def one_per_row(n: int) -> Place:
  return [(i, 0) for i in range(n)]


def to_batch(trajs: list[Trajectory], seq_len: int, pad_id: int, place: Place | None = None,
             rows: int | None = None) -> dict:
  """Training arrays, rows x seq_len, in the next-token convention: each trajectory at its `place`
  (default one per row; `pack` fills rows with several), the rest padding.

  tokens, segment_ids (1, 2, .. per trajectory of a row in order; 0 pad), targets (token t+1),
  mask (target is a policy token), sampler_logp (the sampler's log-prob of the target). A
  segment's last position has no target. Trajectories longer than seq_len are cut (their tail
  leaves the loss; the rollout already keeps them within the limit).
  """
  place = place or one_per_row(len(trajs))
  rows = rows or max((r + 1 for r, _ in place), default=0)
  tokens = np.full((rows, seq_len), pad_id, np.int32)
  seg = np.zeros((rows, seq_len), np.int32)
  targets = np.full((rows, seq_len), pad_id, np.int32)
  mask = np.zeros((rows, seq_len), np.float32)
  logp = np.zeros((rows, seq_len), np.float32)
  for i in sorted(range(len(trajs)), key=lambda i: place[i]):  # Segment ids in row order.
    t, (r, o) = trajs[i], place[i]
    n = min(len(t.tokens), seq_len)
    tokens[r, o:o + n] = t.tokens[:n]
    seg[r, o:o + n] = seg[r].max() + 1
    targets[r, o:o + n - 1] = t.tokens[1:n]
    mask[r, o:o + n - 1] = t.policy[1:n]
    logp[r, o:o + n - 1] = t.logp[1:n]
  return {'tokens': tokens, 'segment_ids': seg, 'targets': targets, 'mask': mask, 'sampler_logp': logp}


def routes_batch(trajs: list[Trajectory], seq_len: int, rows: int, num_layers: int, k: int,
                 place: Place | None = None):
  """Recorded routes, rows x seq_len x L_moe x k (pads route to 0), each trajectory at its place
  as in `to_batch`."""
  place = place or one_per_row(len(trajs))
  out = np.zeros((rows, seq_len, num_layers, k), np.int32)
  for t, (r, o) in zip(trajs, place):
    n = min(len(t.routes), seq_len)
    out[r, o:o + n] = np.stack(t.routes[:n])
  return out
