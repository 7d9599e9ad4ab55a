"""Tokens in/out: masks cover only policy tokens; hint contexts and teacher targets line up."""
import numpy as np

from research.rl.feedback.critics import Feedback
from research.rl.update.teacher import build_targets
from research.rl.rollout.trajectory import Trajectory, pack, routes_batch, to_batch, with_hint
from research.tokenizer import chat
from research.tokenizer.base import ByteTokenizer

TOK = ByteTokenizer()
A, EOM = TOK.role_ids['assistant'], TOK.end_of_message_id


def _traj():
  prompt, _ = chat.render(TOK, [{'role': 'user', 'content': '3+4'}], add_generation_prompt=True)
  t = Trajectory.from_prompt(prompt)
  t.add_model(TOK.encode('add(3,4)') + [EOM], [-0.5] * 9, 'add(3,4)')
  t.add_observation(chat.render_message(TOK, 'tool', 'error') + [A], 'error')
  t.add_model(TOK.encode('ans(7)') + [EOM], [-0.25] * 7, 'ans(7)')
  return t, len(prompt)


def test_masks_exclude_prompt_observation_and_hint():
  t, p = _traj()
  b = to_batch([t, t], 48, TOK.pad_id, rows=3)
  n = len(t.tokens)
  want = np.zeros(48)
  want[p - 1:p + 8] = 1                       # Predicting add(3,4)<eom>: targets p .. p+8.
  o = p + 9 + 7 + 1                           # Past <tool>error<eom><assistant>.
  want[o - 1:o + 6] = 1
  np.testing.assert_array_equal(b['mask'][0], want)
  np.testing.assert_array_equal(b['targets'][0, :n - 1], t.tokens[1:])
  assert b['mask'][2].sum() == 0 and b['segment_ids'][0].sum() == n
  np.testing.assert_allclose(b['sampler_logp'][0][want > 0], [-0.5] * 9 + [-0.25] * 7)
  # Everything the policy did not produce is outside the mask: prompt, observation, role tokens.
  for pos in np.flatnonzero(want):
    assert t.policy[pos + 1]
  assert sum(t.policy) == 16


def test_with_hint_and_teacher_alignment():
  t, p = _traj()
  ctx = with_hint(TOK, t, 1, 'Reminder: use plus')
  h0, h1 = ctx.hint
  assert ctx.tokens[h0] == TOK.role_ids['system'] and ctx.tokens[h1 - 1] == EOM
  assert TOK.decode(ctx.tokens[h0:h1]) == 'Reminder: use plus'
  assert ctx.tokens[h1] == A and ctx.tokens[ctx.target[0]:ctx.target[1]] == t.tokens[t.messages[1].start:]
  assert ctx.tokens[:h0] == t.tokens[:t.messages[1].start - 1]
  tg = build_targets(TOK, [t], [(0, Feedback(1, 'Reminder: use plus', 'r'))], {0: (2, 0)}, 96, 10, 4)
  n = int(tg.d_mask[0].sum())
  assert n == 7 and tg.d_row[0] == 2 and tg.d_mask[1:].sum() == 0
  # Teacher position t predicts the same token that student position d_pos predicts.
  np.testing.assert_array_equal(tg.t_tokens[0][tg.t_pos[0, :n] + 1], tg.d_tok[0, :n])
  np.testing.assert_array_equal(np.array(t.tokens)[tg.d_pos[0, :n] + 1], tg.d_tok[0, :n])
  # The hint itself is never a target: the teacher's targets lie after the hint.
  assert tg.t_pos[0, 0] + 1 >= h1 + 1


def test_hint_overflow_is_dropped_and_counted():
  t, _ = _traj()
  tg = build_targets(TOK, [t], [(0, Feedback(1, 'x' * 200, 'r'))], {0: (0, 0)}, 96, 10, 8)
  assert tg.overflow == 1 and tg.feedback == [] and tg.d_mask.sum() == 0


def test_routes_batch_layout():
  t, _ = _traj()
  t.routes = [np.array([[i, i + 1]] * 2) for i in range(len(t.tokens))]
  r = routes_batch([t], 40, 2, 2, 2)
  assert r.shape == (2, 40, 2, 2)
  np.testing.assert_array_equal(r[0, :len(t.tokens), 1, 0], np.arange(len(t.tokens)))
  assert (r[1] == 0).all()


def test_pack_first_fit_longest_first_and_a_full_row_alone():
  place = pack([30, 96, 20, 50, 100, 10], 96)
  assert place[4] == (0, 0) and place[1] == (1, 0)  # One cut to max_len, and one of exactly it: rows alone.
  assert place[3] == (2, 0) and place[0] == (2, 50) and place[5] == (2, 80)  # Longest first, first fit.
  assert place[2] == (3, 0)  # 20 fits no earlier row (6 left in row 2).


def test_packed_rows_keep_each_trajectory_in_its_segment():
  t, p = _traj()
  n = len(t.tokens)
  t.routes = [np.array([[i, i + 1]] * 2) for i in range(n)]
  trajs, seq = [t, t, t], 2 * n + 3
  place = pack([n] * 3, seq)
  assert place == [(0, 0), (0, n), (1, 0)]  # Two share a row, the third starts the next.
  b = to_batch(trajs, seq, TOK.pad_id, place)
  one = to_batch([t], seq, TOK.pad_id)
  assert b['tokens'].shape == (2, seq)
  np.testing.assert_array_equal(b['segment_ids'][0], [1] * n + [2] * n + [0] * 3)
  for k in ('tokens', 'targets', 'mask', 'sampler_logp'):  # Each segment as the trajectory alone.
    np.testing.assert_array_equal(b[k][0, n:2 * n], one[k][0, :n])
    np.testing.assert_array_equal(b[k][1], one[k][0])
  assert b['mask'][0, n - 1] == 0 and b['targets'][0, n - 1] == TOK.pad_id  # No target across segments.
  r = routes_batch(trajs, seq, 2, 2, 2, place)
  np.testing.assert_array_equal(r[0, n:2 * n, 1, 0], np.arange(n))
  # A target of the second trajectory in the row points past the first one.
  tg = build_targets(TOK, trajs, [(1, Feedback(1, 'Reminder: use plus', 'r'))], dict(enumerate(place)), seq, 10, 2)
  m = int(tg.d_mask[0].sum())
  assert tg.d_row[0] == 0 and tg.d_pos[0, 0] == n + t.messages[1].start - 1
  np.testing.assert_array_equal(b['targets'][0, tg.d_pos[0, :m]], tg.d_tok[0, :m])
