"""The RL update on packed rows (several rollouts per row, one segment each) gives the loss, metrics
and gradients of one rollout per row padded to max_len, the layout before packing."""
import dataclasses

import jax
import numpy as np

from experiments.benchmarks import rl_scale
from research.model import transformer
from research.rl import loop
from research.rl.feedback.critics import Feedback
from research.rl.rollout.trajectory import Trajectory, routes_batch, to_batch
from research.rl.update import teacher as teacher_lib
from research.train import step as step_lib


def _cut(t: Trajectory, messages: int) -> Trajectory:
  """t up to the end of its first `messages` model messages (mixed lengths from one rollout)."""
  n = t.messages[messages - 1].end
  return dataclasses.replace(t, tokens=t.tokens[:n], policy=t.policy[:n], logp=t.logp[:n], routes=t.routes[:n],
                             messages=t.messages[:messages], observations=t.observations[:messages - 1])


def _padded(r: loop.Runner, ro: loop.Rollouts, teacher) -> dict:
  """The update's batch built as before packing: one rollout per row, its advantage on every token."""
  seq, n = r.c.sampler.max_len, len(ro.trajs)
  rows = to_batch(ro.trajs, seq, r.tok.pad_id)
  rows['mask'] *= ro.valid[:, None]
  rows['adv'] = np.repeat(np.where(ro.valid, ro.adv, 0.0)[:, None], seq, 1).astype(np.float32)
  rows['valid'] = ro.valid.astype(np.float32)
  rows['routes'] = routes_batch(ro.trajs, seq, n, r.cfg.num_moe_layers, r.cfg.num_experts_per_tok)
  rows['ref_hidden'] = teacher_lib.reference_hidden(teacher, rows['tokens'], rows['segment_ids'], cfg=r.cfg)
  tg = teacher_lib.build_targets(r.tok, ro.trajs, ro.targets, {i: (i, 0) for i in range(n)}, seq,
                                 r.c.sampler.max_turn_tokens, r.c.rl.max_targets)
  t_hidden = teacher_lib.teacher_hidden(teacher, tg.t_tokens, tg.t_seg, tg.t_pos, cfg=r.cfg)
  targets = {'d_row': tg.d_row, 'd_pos': tg.d_pos, 'd_tok': tg.d_tok, 'd_mask': tg.d_mask, 't_hidden': t_hidden}
  return {'rows': rows, 'targets': targets, 'teacher_head': teacher['lm_head']['kernel']}


def test_packed_update_equals_one_rollout_per_row(tmp_path):
  c = rl_scale.tiny()  # Routes replayed, anchor and distillation on.
  c.sampler.max_len, c.rl.row_buckets = 256, 2
  r = loop.Runner(c, str(tmp_path))
  assert r.replay_routes and r.lc.anchor_coef > 0 and r.lc.distill_coef > 0
  state = r.fresh_state(r.trainer.init(jax.random.key(0)).params)
  ro = r.rollouts(1, state.params)
  ro.trajs = [_cut(t, 1 + i % 3) for i, t in enumerate(ro.trajs)]
  rng = np.random.default_rng(0)
  ro.adv = rng.normal(size=len(ro.trajs)).astype(np.float32)
  ro.valid[3] = False  # A fault: masked, and out of the normalisation.
  ro.targets = [(i, Feedback(i % 3, 'Reminder: available tools are +:plus', 'unknown_tool')) for i in (2, 4, 5)]
  ro.active[:] = True
  teacher = transformer.init(r.cfg, jax.random.key(1))  # Another init: the KLs are far from 0.

  packed, tg = r.update_batch(ro, teacher)
  seg = packed['rows']['segment_ids']
  assert len(seg) == 4 < len(ro.trajs) and (seg.max(1) > 1).any()  # Several rollouts share a row.
  assert len(tg.feedback) == 3

  def total(params, batch):
    value, aux = r.loss(params, batch, r.cfg)
    return value + step_lib.router_loss(aux, r.cfg), aux
  grad = jax.jit(jax.value_and_grad(total, has_aux=True))
  (v_packed, aux_packed), g_packed = jax.device_get(grad(state.params, packed))
  (v_padded, aux_padded), g_padded = jax.device_get(grad(state.params, _padded(r, ro, teacher)))
  np.testing.assert_allclose(v_packed, v_padded, rtol=1e-5)
  assert set(aux_packed) == set(aux_padded)
  for k in set(aux_packed) - {'routes'}:  # The forward's routes are per position of the layout.
    np.testing.assert_allclose(aux_packed[k], aux_padded[k], rtol=1e-4, atol=1e-6, err_msg=k)
  for terms in ('pg_loss', 'distill_loss', 'anchor_kl'):
    assert abs(float(aux_packed[terms])) > 1e-4, terms  # Each term is in the comparison.
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g_packed), jax.tree.leaves(g_padded)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))

  # The train step: compiled for every row count at the first update, logged rows as packed.
  _, row = r._update(ro, state)
  assert set(r._programs) == {(p, n) for p in ('step', 'reference') for n in r.row_counts} and r.row_counts == [4, 8]
  assert row['update_rows'] == 4 and np.isclose(row['pg_loss'], aux_packed['pg_loss'], rtol=1e-5)


def test_row_counts_are_equal_steps_in_multiples_of_the_row_devices():
  assert loop.row_counts(16, 4, 1) == [4, 8, 12, 16]
  assert loop.row_counts(64, 3, 8) == [24, 48, 64]  # 22 and 43 rounded up to the 8 devices.
  assert loop.row_counts(4, 8, 1) == [1, 2, 3, 4]   # More buckets than rollouts: one per count.
  assert loop.row_counts(16, 0, 2) == [16]          # Unpacked: one rollout per row.
