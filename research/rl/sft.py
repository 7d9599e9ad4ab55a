"""Warm start: supervised training on generated demonstrations, before RL.

A demonstration is a chat conversation, [{'role', 'content', 'loss'}]: the assistant messages with
`loss` set are trained on (content and <eom>), everything else is context. Environments generate
their own (research/rl/envs/toolcalc.py `demonstrations`), including hint-conditioned examples, a
hint message followed by the message it asks for, so that the policy can act as its own teacher.
The step is research/train/step.py's `train_step` (next-token CE over loss_mask + router losses).
"""

import dataclasses
import math
from collections.abc import Callable

import jax
import numpy as np
import tqdm

from research import configs
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.rl.rollout.trajectory import pack
from research.tokenizer import chat
from research.tokenizer.base import Tokenizer
from research.train import optimizer as optim
from research.train import step as step_lib


def _sft_optimizer() -> optim.OptimizerConfig:
  return optim.OptimizerConfig(name='adamw', learning_rate=3e-3, warmup_steps=20)


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """sft: the warm start (supervised, on the environment's demonstrations) before RL."""
  steps: int = 600                  # Steps on fresh demonstrations; 0 starts RL from the init.
  batch_size: int = 32              # Conversations per step (packed into rows of sampler.max_len).
  hint_fraction: float = 0.4        # Share of hint-conditioned demonstrations.
  optimizer: optim.OptimizerConfig = dataclasses.field(default_factory=_sft_optimizer)

  def validate(self, path: str = 'sft.') -> 'SFTConfig':
    for f, low in (('steps', 0), ('batch_size', 1)):
      if getattr(self, f) < low:
        raise configs.invalid(path + f, getattr(self, f), f'must be >= {low}')
    if not 0 <= self.hint_fraction <= 1:
      raise configs.invalid(path + 'hint_fraction', self.hint_fraction, 'must be in [0, 1]')
    return self


def render(tok: Tokenizer, conv: list[dict]) -> tuple[list[int], list[bool]]:
  """Ids and, per id, whether it is a trained token (content and <eom> of `loss` messages)."""
  ids, loss = list(tok.chat_start), [False] * len(tok.chat_start)
  for m in conv:
    part = chat.render_message(tok, m['role'], m['content'])
    opener = len(tok.message_prefix(m['role']))
    ids += part
    loss += [False] * opener + [bool(m.get('loss'))] * (len(part) - opener)
  return ids, loss


def batch(tok: Tokenizer, convs: list[list[dict]], seq_len: int, row_multiple: int = 4) -> dict:
  """Conversations packed into rows of seq_len (first fit, longest first; one segment id each).

  Packing keeps the loss what it is per conversation (attention stays inside a segment, RoPE is
  relative, a segment's last token has no target) and spends no compute on padding: toolcalc's
  demonstrations average half a row. The row count is rounded up to `row_multiple`, so a run
  compiles a few shapes. Conversations longer than seq_len are cut.
  """
  rendered = [(ids[:seq_len], loss[:seq_len]) for ids, loss in (render(tok, conv) for conv in convs)]
  place = pack([len(ids) for ids, _ in rendered], seq_len)
  b = -(-max((r + 1 for r, _ in place), default=0) // row_multiple) * row_multiple
  out = {k: np.zeros((b, seq_len), np.int32) for k in ('tokens', 'targets', 'segment_ids', 'loss_mask')}
  out['tokens'][:] = tok.pad_id
  for i in sorted(range(len(rendered)), key=lambda i: place[i]):  # Segment ids in row order.
    (ids, loss), (r, off) = rendered[i], place[i]
    n = len(ids)
    out['tokens'][r, off:off + n] = ids
    out['segment_ids'][r, off:off + n] = out['segment_ids'][r].max() + 1
    out['targets'][r, off:off + n - 1] = ids[1:]
    out['loss_mask'][r, off:off + n - 1] = loss[1:]
  return out


def train(params, trainer: step_lib.Trainer, tok: Tokenizer,
          demos: Callable[[np.random.Generator, int], list[list[dict]]], *, steps: int, batch_size: int,
          seq_len: int, seed: int, log: Callable[[int, dict], None] | None = None, log_every: int = 25,
          evaluate: Callable[[dict], dict] | None = None, eval_every: int = 0):
  """Trains on fresh demonstrations each step with the trainer's step (and mesh). Returns (params,
  history of logged rows).

  `evaluate(params) -> dict` runs every `eval_every` steps (and at the end); its row is logged.
  """
  state = trainer.start(params)
  fn = trainer.step_fn()
  rows = mesh_lib.axis_size(trainer.mesh, sharding.mesh_axes('act_batch', trainer.rules))
  rng, history, pending = np.random.default_rng(seed), [], []
  for i in tqdm.trange(1, steps + 1, desc='warm start', unit='step', leave=False):
    rows_BxT = batch(tok, demos(rng, batch_size), seq_len, row_multiple=math.lcm(4, rows))
    state, m = fn(state, trainer.put_global(rows_BxT), None)
    pending.append(m)
    if i % log_every == 0 or i == steps:
      fetched = jax.device_get(pending)
      row = {'sft_step': i, 'sft_loss': float(np.mean([f['ce'] for f in fetched]))}
      if evaluate and eval_every and (i % eval_every == 0 or i == steps):
        row.update(evaluate(state.params))
      history.append(row)
      if log:
        log(i, row)
      pending = []
  return state.params, history
