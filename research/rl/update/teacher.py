"""The teacher pass: the policy conditioned on a hint, one forward over prefix + hint + target.

For each feedback (trajectory, target message, hint) the context is rebuilt with the hint message
spliced in before the target message (research/rl/rollout/trajectory.py `with_hint`); one batched forward
with the teacher's weights gives hidden states at the target message's tokens (the update turns
them into log-probs a chunk at a time), aligned position by position with the student's (the same
tokens in the original context). Teacher weights:
  live    the current policy under stop-gradient,
  ema     an exponential moving average of the policy (regularized; starts at the warm start),
  frozen  the warm start.
A context that no longer fits `seq_len` with its hint is dropped from distillation and counted.
"""

from collections.abc import Mapping
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from research import configs
from research.model.config import ModelConfig
from research.model.transformer import forward
from research.rl.feedback.critics import Feedback
from research.rl.rollout.trajectory import Trajectory, with_hint
from research.tokenizer.base import Tokenizer

TEACHERS = ('live', 'ema', 'frozen')


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """teacher: the weights the hinted teacher pass runs with."""
  kind: str = 'frozen'              # 'live' (the policy), 'ema' (its moving average) or 'frozen' (the warm start).
  ema_decay: float = 0.99           # For 'ema': weight of the old average per step.

  def validate(self, path: str = 'teacher.') -> 'TeacherConfig':
    if self.kind not in TEACHERS:
      raise configs.invalid(path + 'kind', self.kind, f'expected one of {TEACHERS}')
    if not 0 <= self.ema_decay <= 1:
      raise configs.invalid(path + 'ema_decay', self.ema_decay, 'must be in [0, 1]')
    return self


@dataclasses.dataclass
class Targets:
  """Distillation targets: the teacher's inputs and the student's matching positions."""
  t_tokens: np.ndarray              # N x T teacher contexts.
  t_seg: np.ndarray
  t_pos: np.ndarray                 # N x S positions predicting each target token (teacher).
  d_row: np.ndarray                 # N: the student's batch row.
  d_pos: np.ndarray                 # N x S positions in that row predicting each target token (student).
  d_tok: np.ndarray                 # N x S the target tokens.
  d_mask: np.ndarray                # N x S real target tokens.
  feedback: list                    # (trajectory index, Feedback) kept, in row order.
  overflow: int                     # Dropped: the hinted context did not fit.


def build_targets(tok: Tokenizer, trajs: list[Trajectory], feedback: list[tuple[int, Feedback]],
                  place: Mapping[int, tuple[int, int]], seq_len: int, span: int, rows: int) -> Targets:
  """Teacher contexts (padded to seq_len) in `rows` >= len(feedback) slots.

  `place` maps a trajectory index to where it sits in the student batch: (row, offset of its first
  token), as research/rl/rollout/trajectory.py's `to_batch` lays it out.
  """
  ctxs, kept, overflow = [], [], 0
  for i, fb in feedback:
    ctx = with_hint(tok, trajs[i], fb.message, fb.hint)
    if len(ctx.tokens) > seq_len or trajs[i].messages[fb.message].end > seq_len:
      overflow += 1
    else:
      ctxs.append(ctx)
      kept.append((i, fb))
  t_tokens = np.full((rows, seq_len), tok.pad_id, np.int32)
  t_seg = np.zeros((rows, seq_len), np.int32)
  t_pos, d_pos = np.zeros((rows, span), np.int32), np.zeros((rows, span), np.int32)
  d_tok, d_mask = np.zeros((rows, span), np.int32), np.zeros((rows, span), np.float32)
  d_row = np.zeros((rows,), np.int32)
  for j, (ctx, (i, fb)) in enumerate(zip(ctxs, kept)):
    m = trajs[i].messages[fb.message]
    n = min(m.end - m.start, span)
    t_tokens[j, :len(ctx.tokens)], t_seg[j, :len(ctx.tokens)] = ctx.tokens, 1
    t_pos[j, :n] = np.arange(ctx.target[0] - 1, ctx.target[0] - 1 + n)
    d_row[j], off = place[i]
    d_pos[j, :n] = np.arange(off + m.start - 1, off + m.start - 1 + n)
    d_tok[j, :n] = trajs[i].tokens[m.start:m.start + n]
    d_mask[j, :n] = 1
  return Targets(t_tokens, t_seg, t_pos, d_row, d_pos, d_tok, d_mask, kept, overflow)


def teacher_hidden(params, t_tokens, t_seg, t_pos, *, cfg: ModelConfig):
  """The teacher's final hidden states at the target positions, N x S x D (no gradient); the
  update unembeds them a chunk at a time with the teacher's head (research/rl/update/logprobs.py)."""
  h, _, _ = forward(jax.lax.stop_gradient(params), t_tokens, cfg, segment_ids_BxT=t_seg, head=False)
  return jnp.take_along_axis(h, t_pos[..., None], axis=1)


class TeacherWeights:
  """Which weights the teacher runs with; `update` after every optimizer step."""

  def __init__(self, kind: str, params, ema_decay: float = 0.99):
    if kind not in TEACHERS:
      raise ValueError(f'teacher.kind={kind!r}: expected one of {TEACHERS}')
    self.kind, self.decay = kind, ema_decay
    self.fixed = None if kind == 'live' else jax.tree.map(jnp.copy, params)
    self._ema = jax.jit(lambda e, p: jax.tree.map(lambda a, b: a * ema_decay + b * (1 - ema_decay), e, p))

  def params(self, live):
    return live if self.kind == 'live' else self.fixed

  def update(self, live):
    if self.kind == 'ema':
      self.fixed = self._ema(self.fixed, live)


def reference_hidden(params, tokens, seg, *, cfg: ModelConfig):
  """The teacher weights' hidden states over a whole batch without a hint (the anchor term), B x T x D."""
  return forward(jax.lax.stop_gradient(params), tokens, cfg, segment_ids_BxT=seg, head=False)[0]
