"""Warm start: supervised training on generated demonstrations, before RL.

A demonstration is a chat conversation, [{'role', 'content', 'loss'}]: the assistant messages with
`loss` set are trained on (content and <eom>), everything else is context. Environments generate
their own (research/rl/env_toolcalc.py `demonstrations`), including hint-conditioned examples, a
hint message followed by the message it asks for, so that the policy can act as its own teacher.
The step is research/train/step.py's `train_step` (next-token CE over loss_mask + router losses).
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from research.model.config import ModelConfig
from research.tokenizer import chat
from research.tokenizer.base import Tokenizer
from research.train import step as step_lib


def render(tok: Tokenizer, conv: list[dict]) -> tuple[list[int], list[bool]]:
  """Ids and, per id, whether it is a trained token (content and <eom> of `loss` messages)."""
  ids, loss = list(tok.chat_start), [False] * len(tok.chat_start)
  for m in conv:
    part = chat.render_message(tok, m['role'], m['content'])
    opener = len(tok.message_prefix(m['role']))
    ids += part
    loss += [False] * opener + [bool(m.get('loss'))] * (len(part) - opener)
  return ids, loss


def batch(tok: Tokenizer, convs: list[list[dict]], seq_len: int) -> dict:
  """One conversation per row, right-padded to a multiple of 32; rows longer than seq_len are cut."""
  b, rendered = len(convs), [render(tok, conv) for conv in convs]
  t = min(seq_len, -(-max(len(ids) for ids, _ in rendered) // 32) * 32)
  out = {k: np.zeros((b, t), np.int32) for k in ('tokens', 'targets', 'segment_ids', 'loss_mask')}
  out['tokens'][:] = tok.pad_id
  for r, (ids, loss) in enumerate(rendered):
    n = min(len(ids), t)
    out['tokens'][r, :n] = ids[:n]
    out['segment_ids'][r, :n] = 1
    out['targets'][r, :n - 1] = ids[1:n]
    out['loss_mask'][r, :n - 1] = loss[1:n]
  return out


def train(params, cfg: ModelConfig, tok: Tokenizer, tx: optax.GradientTransformation,
          demos: Callable[[np.random.Generator, int], list[list[dict]]], *, steps: int, batch_size: int,
          seq_len: int, seed: int, log: Callable[[int, dict], None] | None = None, log_every: int = 25,
          evaluate: Callable[[dict], dict] | None = None, eval_every: int = 0):
  """Trains on fresh demonstrations each step. Returns (params, history of logged rows).

  `evaluate(params) -> dict` runs every `eval_every` steps (and at the end); its row is logged.
  """
  tx = step_lib.freeze_untrainable(tx)
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  fn = jax.jit(lambda s, b: step_lib.train_step(s, b, None, cfg=cfg, tx=tx), donate_argnums=0)
  rng, history, pending = np.random.default_rng(seed), [], []
  for i in tqdm.trange(1, steps + 1, desc='warm start', unit='step', leave=False):
    state, m = fn(state, batch(tok, demos(rng, batch_size), seq_len))
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
