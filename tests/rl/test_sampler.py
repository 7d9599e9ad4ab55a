"""The sampler: cache equals recompute, sampling filters, stops, multi-turn, faults and limits;
streaming: rows refilled as episodes end (Stream), groups taken as they complete (rollout/groups.py)
and the staleness bound."""
import contextlib
import dataclasses
import logging
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.model import transformer
from research.model.config import ModelConfig
from research.rl.envs.base import Step
from research.rl.update import losses
from research.rl.rollout.groups import GroupStream
from research.rl.rollout.sampler import Sampler, SamplerConfig, Stream, episode_keys, sample_logits
from research.rl.rollout.trajectory import to_batch
from research.tokenizer.base import ByteTokenizer

TOK = ByteTokenizer()
CFG = ModelConfig(vocab_size=TOK.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
                  head_dim=16, d_ff=64, num_experts=4, num_experts_per_tok=2, d_expert=32, moe_impl='dense')


@pytest.fixture(scope='module')
def params():
  return transformer.init(CFG, jax.random.key(0))


class Echo:
  """Answers `turns` messages with an observation of the given length, then ends; may raise."""

  def __init__(self, turns=2, obs='ok', raise_at=None, prompt='hi there'):
    self.prompt = [{'role': 'user', 'content': prompt}]
    self.turns, self.obs, self.raise_at, self.n, self.closed = turns, obs, raise_at, 0, None

  def step(self, message):
    self.n += 1
    if self.n == self.raise_at:
      raise RuntimeError('environment broke')
    if self.n >= self.turns:
      return Step(None, True, 1.0, True, {})
    return Step(self.obs, False)

  def close(self, reason):
    self.closed = reason
    return Step(None, True, -0.5, False, {})


_forward = jax.jit(lambda p, x, seg: transformer.forward(p, x, CFG, segment_ids_BxT=seg)[:2])


def _full_logp(params, trajs, temperature=1.0):
  b = to_batch(trajs, max(len(t.tokens) for t in trajs), TOK.pad_id)
  logits, _ = _forward(params, b['tokens'], b['segment_ids'])
  lp = jax.nn.log_softmax(logits / temperature)
  return np.take_along_axis(np.asarray(lp), b['targets'][..., None], -1)[..., 0], b


def test_multiturn_cache_equals_recompute(params):
  """Sampled log-probs from the cache equal a full forward over the final trajectory, every turn."""
  s = SamplerConfig(temperature=0.7, max_turn_tokens=6, max_turns=3, max_len=96, record_routes=True)
  eps = [Echo(turns=3, obs='result ' * (i + 1)) for i in range(3)]
  trajs, st = Sampler(CFG, TOK, s).rollout(params, eps, jax.random.key(1))
  lp, b = _full_logp(params, trajs, 0.7)
  assert b['mask'].sum() == sum(t.num_policy_tokens for t in trajs) == st.new_tokens
  np.testing.assert_allclose(b['sampler_logp'] * b['mask'], lp * b['mask'], atol=2e-4)
  for t, e in zip(trajs, eps):  # Observations sit in the tokens exactly as rendered, never policy tokens.
    assert len(t.messages) == 3 and t.done and t.reward == 1.0
    for m in t.messages[:2]:
      j = m.end + (t.tokens[m.end - 1] != TOK.end_of_message_id)  # A cut message is closed for it.
      assert t.tokens[j - 1] == TOK.end_of_message_id and not t.policy[j - 1]
      assert t.tokens[j] == TOK.role_ids['tool'] and not any(t.policy[j:j + len(e.obs) + 3])
    assert len(t.routes) == len(t.tokens)


def test_short_spans_sample_what_the_whole_cache_samples(params):
  """Prefills and turns that read only the cache's first part (sampler.spans) write the same
  messages with the same log-probs as those reading all of it; each span is compiled at the first
  call of its program."""
  s = SamplerConfig(temperature=0.0, max_turn_tokens=6, max_turns=4, max_len=128, spans=4)
  assert s.span_sizes == (32, 64, 96, 128)
  runs = {}
  for spans in (4, 1):
    sampler = Sampler(CFG, TOK, dataclasses.replace(s, spans=spans))
    eps = [Echo(turns=4, obs='result ' * (i + 2)) for i in range(3)]
    runs[spans] = sampler.rollout(params, eps, jax.random.key(5))[0]
    assert sorted(sampler._compiled) == [(p, 3, n) for p in ('extend', 'generate') for n in sampler.s.span_sizes] + [
        ('reset', 3, sampler.s.cache_len)]
  lens = [len(t.tokens) for t in runs[4]]
  assert min(lens) > 64  # The later turns need more than the first span.
  for a, b in zip(runs[4], runs[1]):
    assert a.tokens == b.tokens
    np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)


def test_prompts_longer_than_a_chunk_prefill_in_pieces(params):
  """Prompts of 1 to 4 prefill chunks (sampler.chunk = 32 here) and observations as long as a chunk:
  the cache still equals a full forward, and every token's routes are recorded once."""
  s = SamplerConfig(temperature=0.9, max_turn_tokens=5, max_turns=2, max_len=192, max_obs_tokens=8,
                    record_routes=True)
  assert Sampler(CFG, TOK, s).s.chunk == 32
  eps = [Echo(turns=2, obs='x' * 30, prompt='word ' * n) for n in (1, 9, 20)]
  trajs, _ = Sampler(CFG, TOK, s).rollout(params, eps, jax.random.key(3))
  assert max(t.messages[0].start for t in trajs) > 3 * s.chunk
  lp, b = _full_logp(params, trajs, 0.9)
  np.testing.assert_allclose(b['sampler_logp'] * b['mask'], lp * b['mask'], atol=2e-4)
  assert [len(t.routes) for t in trajs] == [len(t.tokens) for t in trajs]


def test_router_replay_reproduces_sampler_routes(params):
  s = SamplerConfig(temperature=1.0, max_turn_tokens=5, max_turns=2, max_len=64, record_routes=True)
  trajs, _ = Sampler(CFG, TOK, s).rollout(params, [Echo(), Echo()], jax.random.key(2))
  b = to_batch(trajs, max(len(t.tokens) for t in trajs), TOK.pad_id)
  _, aux = _forward(params, b['tokens'], b['segment_ids'])
  got = np.asarray(aux['routes']).reshape(CFG.num_moe_layers, 2, -1, 2)
  for r, t in enumerate(trajs):
    rec = np.stack(t.routes, 1)
    np.testing.assert_array_equal(np.sort(got[:, r, :len(t.tokens)], -1), np.sort(rec, -1))


def test_greedy_equals_recompute_and_stops(params):
  """Greedy tokens equal argmax of a full forward per step; a stop sequence ends the message."""
  s = SamplerConfig(temperature=0.0, max_turn_tokens=8, max_turns=1, max_len=64)
  trajs, _ = Sampler(CFG, TOK, s).rollout(params, [Echo(turns=1)], jax.random.key(0))
  t = trajs[0]
  seq = list(t.tokens[:t.messages[0].start])
  fwd = jax.jit(lambda p, x: transformer.forward(p, x, CFG)[0])
  for _ in range(8):
    buf = np.zeros((1, 48), np.int32)
    buf[0, :len(seq)] = seq  # Causal: the padding after the sequence does not change its logits.
    seq.append(int(jnp.argmax(fwd(params, buf)[0, len(seq) - 1])))
  assert t.tokens[t.messages[0].start:] == seq[t.messages[0].start:]
  # Make the third greedy token a stop sequence (with its predecessor): the message ends right there.
  stop = tuple(seq[t.messages[0].start + 1:t.messages[0].start + 3])
  s2 = SamplerConfig(temperature=0.0, max_turn_tokens=8, max_turns=1, max_len=64, stop_seqs=(stop,))
  t2 = Sampler(CFG, TOK, s2).rollout(params, [Echo(turns=1)], jax.random.key(0))[0][0]
  assert t2.tokens[t2.messages[0].start:] == seq[t.messages[0].start:t.messages[0].start + 3]


def test_sample_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000))
  keys = jax.random.split(jax.random.key(3), 4000)  # One per row.
  tok, lp = sample_logits(keys, logits, 1.0, top_k=2)
  freq = np.bincount(np.asarray(tok), minlength=4) / 4000
  assert freq[2] == freq[3] == 0 and abs(freq[0] - 0.625) < 0.03
  # The sampler's log-prob is the behaviour policy's: renormalized over the kept tokens.
  np.testing.assert_allclose(lp, np.log(np.array([0.625, 0.375])[np.asarray(tok)]), rtol=1e-5)
  tok, lp = sample_logits(keys, logits, 1.0, top_p=0.7)  # Smallest set reaching 0.7: {0, 1}.
  assert set(np.unique(np.asarray(tok))) == {0, 1}
  np.testing.assert_allclose(lp, np.log(np.array([0.625, 0.375])[np.asarray(tok)]), rtol=1e-5)
  tok, lp = sample_logits(keys, logits, 2.0, top_k=3)  # Tempered, then truncated.
  p = np.array([0.5, 0.3, 0.15]) ** 0.5
  np.testing.assert_allclose(lp, np.log(p / p.sum())[np.asarray(tok)], rtol=1e-5)
  tok, lp = sample_logits(keys, logits, 0.0)
  assert (np.asarray(tok) == 0).all()
  np.testing.assert_allclose(lp, np.log(0.5), rtol=1e-5)


def test_greedy_temperature_gives_finite_update_and_teacher_log_probs():
  """Temperature 0 (greedy) used to divide logits by zero in the update and the teacher pass."""
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
  greedy = losses.tempered_log_softmax(logits, 0.0)
  np.testing.assert_allclose(greedy, np.log([[0.5, 0.3, 0.15, 0.05]]), rtol=1e-5)
  np.testing.assert_allclose(losses.tempered_log_softmax(logits, 0.5),
                             np.log(np.array([[25, 9, 2.25, 0.25]]) / 36.5), rtol=1e-5)


def test_faults_masked_and_limits(params):
  """A raising episode is a fault (no reward, no crash); the context limit truncates and scores."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=8, max_turns=4, max_len=40)
  eps = [Echo(turns=4, raise_at=1), Echo(turns=4, obs='x' * 20), Echo(turns=1)]
  trajs, st = Sampler(CFG, TOK, s).rollout(params, eps, jax.random.key(4))
  assert trajs[0].fault.startswith('RuntimeError') and not trajs[0].done
  assert trajs[1].truncated and eps[1].closed == 'context' and trajs[1].reward == -0.5
  assert len(trajs[1].tokens) <= 40
  assert trajs[2].done and trajs[2].fault is None and not trajs[2].truncated
  assert st.faults == 1 and st.truncated == 1


def test_prompt_over_limit_is_named(params):
  s = SamplerConfig(max_len=8)
  with pytest.raises(ValueError, match='max_len'):
    Sampler(CFG, TOK, s).rollout(params, [Echo()], jax.random.key(0))


def test_word_tokens_are_text_but_specials_are_malformed():
  tok = ByteTokenizer(('plus',))
  sampler = Sampler(CFG, tok, SamplerConfig())
  assert sampler._text([tok.word_ids['plus'], *b'(3,4)', tok.end_of_message_id]) == ('plus(3,4)', False)
  text, bad = sampler._text([*b'ans(', tok.role_ids['user'], *b'1)'])
  assert bad and text.endswith('<special>')


class Slow(Echo):
  """Echo whose every step and close takes `delay` seconds (a sandboxed command)."""

  def __init__(self, delay, **kw):
    super().__init__(**kw)
    self.delay = delay

  def step(self, message):
    time.sleep(self.delay)
    return super().step(message)

  def close(self, reason):
    time.sleep(self.delay)
    return super().close(reason)


def test_episodes_step_at_once_with_the_sequential_result(params):
  """8 episodes whose steps sleep take about one step's time per turn, and give the trajectories
  (tokens, messages, rewards, faults) the one-thread sampler gives."""
  delay, turns = 0.3, 3

  def rollout(workers):
    s = SamplerConfig(temperature=1.0, max_turn_tokens=6, max_turns=turns, max_len=96, env_workers=workers)
    eps = [Slow(delay, turns=2 + i % 3, obs='o' * i, raise_at=2 if i == 5 else None) for i in range(8)]
    trajs, st = Sampler(CFG, TOK, s).rollout(params, eps, jax.random.key(7))
    return trajs, st, sum(e.n + (e.closed is not None) for e in eps)

  seq, seq_st, calls = rollout(1)
  par, par_st, _ = rollout(8)
  assert calls >= 16 and seq_st.env_s >= calls * delay  # One episode at a time: every call waits its turn.
  assert par_st.env_s < (turns + 1) * delay * 1.5       # All at once: a step per turn (and a close).
  assert par_st.faults == seq_st.faults == 1 and par[5].fault.startswith('RuntimeError')
  for a, b in zip(seq, par):
    assert (a.tokens, a.policy, a.logp, a.reward, a.done, a.truncated, a.fault) == (
        b.tokens, b.policy, b.logp, b.reward, b.done, b.truncated, b.fault)
    assert [(m.text, m.info) for m in a.messages] == [(m.text, m.info) for m in b.messages]


class Hung(Echo):
  """Echo whose step number `step_at`, or else its close, waits for `release`: a hung environment."""

  def __init__(self, release, step_at=None, **kw):
    super().__init__(**kw)
    self.release, self.step_at = release, step_at

  def step(self, message):
    if self.n + 1 == self.step_at:
      self.release.wait()
    return super().step(message)

  def close(self, reason):
    if self.step_at is None:
      self.release.wait()
    return super().close(reason)


def test_a_call_that_never_answers_faults_its_episode_and_holds_no_thread(params):
  """sampler.env_call_timeout_s=1: a step and a close that hang fault their episodes (unscored) and
  the others end as they would; the step's episode is closed unscored once the step returns. With
  3 env threads, 2 held by the hung calls, a second rollout runs on the third: nothing else waits
  on a hung call (a close queued behind the hung step would take the last thread)."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=4, max_turns=2, max_len=96, env_workers=3,
                    env_call_timeout_s=1.0)
  sampler, release = Sampler(CFG, TOK, s), threading.Event()
  hung = [Hung(release, step_at=1, turns=2), Hung(release, turns=5)]  # The second hangs in its 'turns' close.
  t0 = time.perf_counter()
  trajs, st = sampler.rollout(params, [Echo(turns=2), *hung], jax.random.key(3))
  assert time.perf_counter() - t0 < 30
  assert trajs[0].done and trajs[0].reward == 1.0 and trajs[0].fault is None
  assert trajs[1].fault.startswith('EnvCallTimeout: its step did not answer in 1 s') and not trajs[1].done
  assert trajs[2].fault.startswith('EnvCallTimeout: its close') and len(trajs[2].messages) == 2
  assert st.faults == 2
  trajs, st = sampler.rollout(params, [Echo(turns=2), Echo(turns=2)], jax.random.key(4))
  assert st.faults == 0 and all(t.done for t in trajs)
  assert hung[0].closed is None
  release.set()
  sampler._pool.shutdown(wait=True)
  assert hung[0].closed == 'dropped' and hung[1].closed == 'turns'


def test_env_call_timeout_is_checked():
  with pytest.raises(ValueError, match=r'sampler.env_call_timeout_s=0: must be positive'):
    SamplerConfig(env_call_timeout_s=0).validate()


def _same(a, b):
  assert (a.tokens, a.policy, a.reward, a.done, a.truncated, a.fault) == (
      b.tokens, b.policy, b.reward, b.done, b.truncated, b.fault)
  np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)
  assert [m.text for m in a.messages] == [m.text for m in b.messages]
  np.testing.assert_array_equal(np.sort(a.routes, -1), np.sort(b.routes, -1))


def test_refilled_rows_sample_what_the_batch_samples(params):
  """8 episodes of 1 to 4 turns through 3 rows: a row whose episode ends takes the next one at the
  next turn, so all 3 rows sample while episodes wait, in fewer turns than batches of 3; each
  episode's trajectory (tokens, log-probs, routes, messages, reward, cut) is the one it has in a
  batch of all 8, whose rows never refill: an episode samples with its own key in any row."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=6, max_turns=4, max_len=96, record_routes=True)
  sampler = Sampler(CFG, TOK, s)
  make = lambda: [Echo(turns=1 + (i * 3) % 5, obs='o' * i) for i in range(8)]  # 5 turns: cut at 4.
  key = jax.random.key(11)
  batch, _ = sampler.rollout(params, make(), key)
  stream = Stream(sampler, 3, wait_s=None)
  running = stream.submit(make(), episode_keys(key, 8), groups=range(8))
  trace = []  # (episodes queued before the turn, rows that sampled in it)
  while stream.busy:
    queued = len(stream.queue)
    trace.append((queued, stream.advance(params).sampled))
  for b, e in zip(batch, running):
    _same(b, e.traj)
  assert any(t.truncated is False and len(t.messages) == 4 and t.reward == -0.5 for t in batch)  # A 'turns' cut.
  assert all(n == 3 for q, n in trace if q >= 3) and sum(n for _, n in trace) == sum(len(t.messages) for t in batch)
  in_batches_of_3 = sum(max(len(t.messages) for t in batch[i:i + 3]) for i in range(0, 8, 3))
  assert len(trace) < in_batches_of_3, (trace, in_batches_of_3)
  assert ('reset', 3, s.cache_len) in sampler._compiled  # Compiled with the cache, at the first turn.


def _groups(sampler, rows, wait_s, make_group, max_staleness):
  """A GroupStream whose group `gid` is make_group(gid): its episodes, two per group."""
  def new_group(gid):
    eps = make_group(gid)
    return eps, [gid] * len(eps), episode_keys(jax.random.key(gid), len(eps))
  return GroupStream(Stream(sampler, rows, wait_s), new_group, max_staleness)


def _takes(gs, params, n_takes):
  """One group per take, the learner one update further each time."""
  return [gs.take(params, v, 1) for v in range(n_takes)]


@contextlib.contextmanager
def _compiles():
  """The programs jax compiles inside the block (their log lines)."""
  seen, logger = [], logging.getLogger('jax')
  handler = logging.Handler()
  handler.emit = lambda rec: seen.append(rec.getMessage()) if rec.getMessage().startswith('Compiling') else None
  logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      yield seen
  finally:
    logger.removeHandler(handler)


def test_a_long_group_carries_over_and_is_used_once(params):
  """Group 0's episodes take 4 turns, the others' 1: updates take the short groups first, group 0
  joins a later update (3 updates behind), and every episode taken is taken once, ended. Nothing
  compiles after the first take (rows reset, refilled, sampled on every span)."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=4, max_turns=4, max_len=96)
  gs = _groups(Sampler(CFG, TOK, s), 4, None, lambda g: [Echo(turns=4 if g == 0 else 1) for _ in range(2)], 5)
  takes = [gs.take(params, 0, 1)]
  with _compiles() as compiled:
    takes += [gs.take(params, v, 1) for v in range(1, 5)]
  assert not compiled, compiled
  gids = [t.groups[0].gid for t in takes]
  assert gids[0] != 0 and 0 in gids, gids
  zero = takes[gids.index(0)]
  assert list(zero.staleness_B) == [3, 3] and all(len(e.traj.messages) == 4 for e in zero.groups[0].members)
  assert takes[0].running == 2  # Group 0 carried on.
  eps = [e for t in takes for g in t.groups for e in g.members]
  assert len({id(e) for e in eps}) == len(eps) and all(e.traj.done for e in eps)
  gs.close()


def test_a_slow_tool_call_holds_up_no_update(params):
  """Group 0's episodes wait 1.5 s per call: updates are taken without them meanwhile (their rows
  wait, the others sample on), and group 0 is taken once it has ended."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=4, max_turns=2, max_len=96)
  sampler = Sampler(CFG, TOK, s)
  sampler.rollout(params, [Echo(turns=1) for _ in range(4)], jax.random.key(0))  # Compiles for 4 rows.
  gs = _groups(sampler, 4, 0.01, lambda g: [Slow(1.5, turns=2) if g == 0 else Echo(turns=1) for _ in range(2)], 10**6)
  t0 = time.perf_counter()
  first = gs.take(params, 0, 1)
  assert time.perf_counter() - t0 < 1.5 and first.groups[0].gid != 0
  seen, v = [first.groups[0].gid], 1
  while 0 not in seen and time.perf_counter() - t0 < 30:
    seen.append(gs.take(params, v, 1).groups[0].gid)
    v += 1
  assert len(seen) == len(set(seen)) and v > 2
  gs.close()


def test_groups_past_the_staleness_bound_are_dropped_unscored(params):
  """stream_max_staleness=1: group 0 (4 turns) began 2 updates before the third take, so it is
  dropped there (counted, closed as 'dropped', never scored) and no update takes it."""
  s = SamplerConfig(temperature=1.0, max_turn_tokens=4, max_turns=4, max_len=96)
  made, sampler = {}, Sampler(CFG, TOK, s)
  gs = _groups(sampler, 4, None, lambda g: made.setdefault(g, [Echo(turns=4 if g == 0 else 1) for _ in range(2)]), 1)
  takes = _takes(gs, params, 5)
  sampler._pool.shutdown(wait=True)  # The dropped episodes' closes run there.
  assert [t.dropped for t in takes] == [0, 0, 2, 0, 0]
  assert 0 not in [t.groups[0].gid for t in takes]
  assert [e.closed for e in made[0]] == ['dropped', 'dropped'] and all(e.n == 2 for e in made[0])
  assert all(int(t.staleness_B.max()) <= 1 for t in takes)
