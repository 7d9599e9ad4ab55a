"""Warm-start batches: packing conversations into rows changes nothing but the compute."""
import jax
import numpy as np

from research.model import transformer
from research.model.config import ModelConfig
from research.rl.envs import toolcalc as env_toolcalc
from research.rl import sft
from research.tokenizer.base import ByteTokenizer
from research.train import step as step_lib

TOK = ByteTokenizer(env_toolcalc.WORDS)
CFG = ModelConfig(vocab_size=TOK.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=16, d_ff=64, num_experts=4, num_experts_per_tok=2, d_expert=32, moe_impl='dense')


def test_packed_rows_give_the_loss_of_one_conversation_per_row():
  convs = env_toolcalc.demonstrations(np.random.default_rng(0), 24, hint_fraction=0.5)
  packed = sft.batch(TOK, convs, 160)
  assert packed['tokens'].shape[0] < len(convs) and packed['tokens'].shape[0] % 4 == 0
  assert packed['segment_ids'].max() > 1  # Rows do hold several conversations.
  one_per_row = sft.batch(TOK, convs, 160, row_multiple=len(convs))
  params = transformer.init(CFG, jax.random.key(0))
  ce = lambda b: float(step_lib.loss_fn(params, b, CFG)[1]['ce'])
  np.testing.assert_allclose(ce(packed), ce(one_per_row), rtol=1e-5)
  assert packed['loss_mask'].sum() == sum(sum(sft.render(TOK, c)[1][1:]) for c in convs)


def test_rows_keep_segments_apart_and_cut_long_conversations():
  long = [{'role': 'user', 'content': 'x' * 200}, {'role': 'assistant', 'content': 'ans(1)', 'loss': True}]
  short = [{'role': 'user', 'content': '1+1'}, {'role': 'assistant', 'content': 'ans(2)', 'loss': True}]
  b = sft.batch(TOK, [long, short, short], 64)
  assert b['tokens'].shape == (4, 64)
  assert (b['segment_ids'][0] == 1).all()  # The long one, cut to the row.
  seg = b['segment_ids'][1]
  assert set(seg[seg > 0]) == {1, 2}  # The two short ones share a row.
  last = np.flatnonzero(seg == 1)[-1]
  assert b['loss_mask'][1, last] == 0  # No target across the segment boundary.
