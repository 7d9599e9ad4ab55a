"""The RL loop end to end (tiny model, few steps), resume, streaming (rl.stream), and that each
objective term learns."""
from concurrent import futures
import functools
import json
import os
import threading

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import torch
import transformers

import chatml
from experiments import toolcalc_rl
from experiments.benchmarks import rl_scale
from research import configs
from research.hf import convert
from research.model import transformer
from research.rl import loop
from research.rl.update import teacher as teacher_lib
from research.rl.feedback.critics import Feedback
from research.rl.rollout.trajectory import Trajectory, to_batch
from research.tokenizer import chat
from research.tokenizer.hf import HFTokenizer
from research.train import step as step_lib
from research.rl import config as rl_config
from research.rl.update import objective

REQUIRED = ('step', 'reward_mean', 'success_rate', 'feedback_count', 'distill_kl', 'pg_loss',
            'rollout_tokens_per_s', 'logp_mismatch', 'time_sample', 'time_teacher', 'time_update')


def _tiny(steps=2, stream=False) -> ml_collections.ConfigDict:
  c = toolcalc_rl.get_config()
  c.rl.stream = stream
  m = c.model
  m.d_model, m.head_dim, m.num_heads, m.num_kv_heads, m.d_expert, m.num_experts = 32, 16, 2, 1, 32, 4
  c.sft.steps, c.sft.batch_size = 4, 8
  c.rl.steps, c.rl.tasks_per_step, c.rl.group_size, c.sampler.record_routes = steps, 4, 2, True
  c.sampler.max_turns, c.sampler.max_turn_tokens, c.sampler.max_len = 3, 12, 96
  c.eval.every, c.eval.num_tasks = 2, 8
  c.checkpoint_every, c.tensorboard = 1, False
  c.env.toolcalc.max_ops = 1
  c.critic.rules = ('unknown_tool', 'wrong_tool', 'malformed_call')  # An untrained model is malformed.
  return c


@pytest.mark.parametrize('stream', [False, True])
def test_loop_end_to_end_and_resume(tmp_path, stream):
  """Batch rollouts, or rl.stream (episodes carried over between updates, refilled rows)."""
  wd = str(tmp_path)
  summary = loop.run(_tiny(2, stream), wd)
  rows = [json.loads(l) for l in open(os.path.join(wd, 'metrics.jsonl'))]
  steps = [r for r in rows if r['step'] > 0]
  assert [r['step'] for r in steps] == [1, 2]
  for r in steps:
    assert all(k in r for k in REQUIRED), sorted(set(REQUIRED) - set(r))
    assert r['rollouts'] == 8 * r['step'] and np.isfinite(r['pg_loss'])
    if not r.get('episodes_carried'):  # (Carried episodes were sampled by older params.)
      assert r['logp_mismatch'] < 1e-3  # Router replay: the trainer sees the sampler's routes.
  assert 'eval_success' in steps[-1] and set(summary['by_rule']) == set(_tiny().critic.rules)
  assert os.path.exists(os.path.join(wd, 'warmstart')) and os.path.exists(os.path.join(wd, 'summary.json'))
  # Resume: two more steps continue from the checkpoint; the warm start is not repeated.
  loop.run(_tiny(4, stream), wd)
  rows = [json.loads(l) for l in open(os.path.join(wd, 'metrics.jsonl'))]
  assert [r['step'] for r in rows if r['step'] > 0] == [1, 2, 3, 4]


def _fixture(tmp_path):
  c = _tiny()
  c.loss.anchor_coef, c.loss.is_cap = 0.0, 0.0  # The fixture's sampler log-probs are placeholders.
  r = loop.Runner(c, str(tmp_path))
  params = transformer.init(r.cfg, jax.random.key(0))
  prompt, _ = chat.render(r.tok, [{'role': 'user', 'content': 'tools +:plus\n3+4'}], add_generation_prompt=True)
  t = Trajectory.from_prompt(prompt)
  t.add_model(r.tok.encode('add(3,4)') + [r.tok.end_of_message_id], [0.0] * 9, 'add(3,4)')
  return c, r, params, t


def _run_updates(c, r, params, t, feedback, adv, n, teacher_params=None):
  """n train steps (research/train/step.py) on the RL objective for one trajectory."""
  lc = configs.from_dict(rl_config.LossConfig, c.loss, 'loss')
  tx = optax.adam(1e-2)
  frozen = jax.tree.map(jnp.copy, params if teacher_params is None else teacher_params)
  state = step_lib.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
  step = jax.jit(functools.partial(step_lib.train_step, cfg=r.cfg, tx=tx, loss=functools.partial(
      objective.objective, lc=lc, temperature=1.0)))
  rows = to_batch([t], 64, r.tok.pad_id)
  rows.update(adv=np.full((1, 64), adv, np.float32), valid=np.ones(1, np.float32))
  tg = teacher_lib.build_targets(r.tok, [t], feedback, {0: (0, 0)}, 96, 12, 1)
  t_hidden = teacher_lib.teacher_hidden(frozen, tg.t_tokens, tg.t_seg, tg.t_pos, cfg=r.cfg)
  batch = {'rows': rows, 'teacher_head': frozen['lm_head']['kernel'], 'targets': {
      'd_row': tg.d_row, 'd_pos': tg.d_pos, 'd_tok': tg.d_tok, 'd_mask': tg.d_mask, 't_hidden': t_hidden}}
  hist = []
  for _ in range(n):
    state, m = step(state, batch, None)
    hist.append(jax.device_get(m))
  return hist


def test_distillation_pulls_student_to_hinted_teacher(tmp_path):
  """The student's distributions on the target message move to the teacher's on the hinted context.

  A random-init model barely reads the hint, so the teacher is another init: a misaligned target
  (wrong rows or positions) would not bring the KL down.
  """
  c, r, params, t = _fixture(tmp_path)
  c.loss.pg_coef, c.loss.distill_coef, c.loss.until_divergence = 0.0, 1.0, False
  other = transformer.init(r.cfg, jax.random.key(1))
  hist = _run_updates(c, r, params, t, [(0, Feedback(0, 'Reminder: available tools are +:plus', 'x'))], 0.0, 15,
                      teacher_params=other)
  kl = [float(h['kl_N'][0]) for h in hist]
  assert kl[0] > 1e-4 and kl[-1] < 0.3 * kl[0], kl


def test_policy_gradient_raises_positive_advantage_tokens(tmp_path):
  c, r, params, t = _fixture(tmp_path)
  c.loss.distill_coef = 0.0
  hist = _run_updates(c, r, params, t, [], 1.0, 5)
  pg = [float(h['pg_loss']) for h in hist]  # -A * sum log p / denom: falls as log p of the tokens rises.
  assert pg[-1] < pg[0] - 0.1, pg


def test_rl_starts_from_a_converted_hf_checkpoint_with_its_tokenizer(tmp_path):
  """launch.convert's output and a ChatML tokenizer: the loop starts from those weights and runs."""
  tok_dir = chatml.tokenizer_folder(tmp_path / 'tok')
  vocab = HFTokenizer(str(tok_dir)).vocab_size
  torch.manual_seed(0)
  transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
      vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1,
      num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
  )).save_pretrained(tmp_path / 'hf')
  convert.hf_to_orbax(str(tmp_path / 'hf'), str(tmp_path / 'ckpt'))
  c = _tiny(1)
  c.base.checkpoint, c.base.tokenizer = str(tmp_path / 'ckpt'), str(tok_dir)
  c.sft.steps, c.eval.num_tasks, c.sampler.max_len = 0, 4, 160
  r = loop.Runner(c, str(tmp_path / 'run'))
  assert isinstance(r.tok, HFTokenizer) and r.cfg.vocab_size == vocab and r.cfg.d_model == 32
  start = r.warm_start(lambda i, row: None)
  base, _ = convert.load_params(str(tmp_path / 'ckpt'))
  jax.tree.map(np.testing.assert_array_equal, start, base)  # sft.steps=0: the base itself.
  summary = loop.run(c, str(tmp_path / 'run'))
  rows = [json.loads(l) for l in open(tmp_path / 'run' / 'metrics.jsonl')]
  assert rows[-1]['step'] == 1 and np.isfinite(rows[-1]['pg_loss']) and summary['rollouts'] == 8


def test_rl_on_eight_devices_matches_one(tmp_path):
  """Rollouts token for token, then the objective and its gradients, on a data x fsdp x expert mesh."""
  out = rl_scale.sharded(str(tmp_path))
  assert out['rollouts_identical'] and out['rollout_tokens'] > 8 * 40
  assert out['sharded_max_abs_diff'] <= 1e-5, out


def test_one_step_off_samples_with_the_previous_params_and_weights_tokens(tmp_path):
  """rl.staleness=1: step 2's rollouts come from the params before update 1; the ratio shows it."""
  c = _tiny(3)
  c.rl.staleness, c.optimizer.warmup_steps = 1, 0  # Warmup would make update 1 a no-op (learning rate 0).
  r = loop.Runner(c, str(tmp_path))
  state = r.fresh_state(r.trainer.init(jax.random.key(0)).params)
  before = jax.tree.map(np.array, state.params)
  pending = {}
  with futures.ThreadPoolExecutor(1) as pool:
    state, row1 = r.train_step(1, state, r._ahead(1, state.params, pending, pool))
    assert set(pending) == {2}  # Started with the params of step 1, before its update.
    ro2 = r._ahead(2, state.params, pending, pool)
  assert row1['rows_trained'] > 0
  assert [t.tokens for t in ro2.trajs] == [t.tokens for t in r.rollouts(2, before).trajs]
  state, row2 = r.train_step(2, state, ro2)
  assert abs(row1['is_log_ratio']) < 1e-4 and row1['is_ess'] > 0.999  # On-policy.
  assert abs(row2['is_log_ratio']) > 10 * abs(row1['is_log_ratio']) and row2['is_ess'] < row1['is_ess']


class _Broken:
  """An episode whose environment fails at its first step (a harness fault: masked)."""

  def __init__(self, episode):
    self.prompt = episode.prompt

  def step(self, message):
    raise RuntimeError('the sandbox is gone')

  def close(self, reason):
    raise RuntimeError('the sandbox is gone')


def test_a_run_whose_mask_rate_passes_the_limit_stops(tmp_path):
  c = _tiny(3)
  c.rl.mask_rate_after = 8  # One step's episodes.
  r = loop.Runner(c, str(tmp_path))
  reset = r.env.reset
  calls = []

  def reset_some_broken(task):
    calls.append(task)
    return _Broken(reset(task)) if len(calls) % 4 == 0 else reset(task)
  r.env.reset = reset_some_broken
  try:
    r.run()
  except loop.MaskRateError as e:
    message = str(e)
  else:
    raise AssertionError('the run went on with a quarter of its episodes masked')
  assert message.startswith('step 1: ') and 'rl.max_mask_rate=2.0%' in message, message
  rows = [json.loads(l) for l in open(os.path.join(tmp_path, 'metrics.jsonl'))]
  last = rows[-1]
  assert last['step'] == 1 and last['env_faults'] >= 1 and last['mask_rate'] == last['env_faults'] / 8


def test_a_run_whose_environment_hangs_goes_on(tmp_path):
  """Every eighth episode's first step never answers (until the test ends): with
  sampler.env_call_timeout_s=2 each faults after 2 s and is masked (counted against
  rl.max_mask_rate, here 0.5), and the streamed run ends its 3 steps instead of waiting (its eval
  rollouts, in batches, too; test_sampler.py times out calls of a batch)."""
  c = _tiny(3, stream=True)
  c.sampler.env_call_timeout_s, c.rl.max_mask_rate = 2.0, 0.5
  r = loop.Runner(c, str(tmp_path))
  reset, release, resets = r.env.reset, threading.Event(), []

  def reset_some_hung(task):
    ep = reset(task)
    resets.append(ep)
    if len(resets) % 8 == 5:
      step = ep.step
      ep.step = lambda m: (release.wait(), step(m))[1]
    return ep
  r.env.reset = reset_some_hung
  run = threading.Thread(target=r.run, daemon=True)
  run.start()
  run.join(timeout=300)
  release.set()
  assert not run.is_alive(), 'the run waited on a hung environment'
  rows = [json.loads(l) for l in open(os.path.join(tmp_path, 'metrics.jsonl'))]
  steps = [x for x in rows if x['step'] > 0]
  assert [x['step'] for x in steps] == [1, 2, 3] and sum(x['env_faults'] for x in steps) >= 1, steps


def test_stale_drops_count_as_masked():
  """An attack on rl.stream: an episode that stalls until its group is dropped as stale escapes a
  reward of 0 as a masked fault does; the run's count takes both, and its error names the drops."""
  count = loop.MaskCount(0.02, after=0)
  count.add(0, 16)
  count.check(1)
  count.add(0, 16, dropped=2)
  with pytest.raises(loop.MaskRateError, match=r'^step 2: 2 of 34 episodes masked \(5.9%\) by environment '
                     r'faults or dropped as stale \(2: their groups ran past rl.stream_max_staleness\)'):
    count.check(2)


def test_mask_count_judges_the_run_so_far_after_enough_episodes():
  count = loop.MaskCount(0.02, after=50)
  count.add(1, 16)
  count.check(1)  # 6%, but only 16 episodes.
  for step in range(2, 5):
    count.add(0, 16)
  count.check(4)  # 1 of 64: 1.6%.
  count.add(1, 16)
  try:
    count.check(5)
  except loop.MaskRateError as e:
    assert str(e).startswith('step 5: 2 of 80 episodes masked (2.5%)')
  else:
    raise AssertionError('2.5% masked passed a 2% limit')


def test_stream_config_is_checked():
  with pytest.raises(ValueError, match='rl.staleness'):
    configs.from_dict(rl_config.RLConfig, {'stream': True, 'staleness': 1}, 'rl')
  with pytest.raises(ValueError, match='stream_max_staleness'):
    configs.from_dict(rl_config.RLConfig, {'stream': True, 'stream_max_staleness': -1}, 'rl')


def test_streamed_steps_train_on_groups_as_they_finish(tmp_path):
  """rl.stream on toolcalc, the first group's episodes held at their first message until the third
  update: updates train on other groups meanwhile and count the held group as running; it trains in
  a later update, its episodes begun under older params (carried, staleness >= 1), each episode in
  one update only. (Held by an event, not a delay, so that a loaded machine cannot finish it early.)"""
  c = _tiny(12)
  c.rl.stream, c.rl.stream_max_staleness, c.optimizer.warmup_steps = True, 100, 0
  r = loop.Runner(c, str(tmp_path))
  state = r.fresh_state(r.trainer.init(jax.random.key(0)).params)
  reset, held, release = r.env.reset, [], threading.Event()

  def reset_first_group_held(task):
    ep = reset(task)
    if len(held) < c.rl.group_size:
      held.append(ep)
      step = ep.step
      ep.step = lambda m: (release.wait(120), step(m))[1]
    return ep
  r.env.reset = reset_first_group_held
  stream, used, rows = r.group_stream(), [], []
  for step in range(1, 13):
    if step == 3:
      release.set()
    ro = r.streamed(step, state.params, stream)
    used += ro.trajs  # The objects, kept alive: a freed one's id() can be reused.
    state, row = r.train_step(step, state, ro)
    rows.append(row)
    if 0 in [g.gid for g in ro.taken.groups]:
      break
  stream.close()
  assert step >= 3 and rows[0]['episodes_running'] >= c.rl.group_size, rows[0]
  assert rows[-1]['episodes_carried'] >= c.rl.group_size and rows[-1]['staleness_mean'] >= 1, rows[-1]
  assert len(used) == len({id(t) for t in used}) == step * r.batch_rows
  assert all(np.isfinite(x['pg_loss']) and x['stale_dropped'] == 0 for x in rows)
