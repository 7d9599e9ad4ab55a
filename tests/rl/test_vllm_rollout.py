"""Rollouts on vLLM (research/rl/rollout/vllm_client.py) against our JAX forward: the engine's
log-probs on the same tokens, weights pushed in place, multi-turn trajectories.

The engine's tests need the vLLM venv (`make vllm-venv`) and are skipped without it.
"""
import itertools
import json
import os
import socket
import threading

import jax
import numpy as np
import pytest

from research.model import transformer
from research.model.config import ModelConfig
from research.rl.envs.base import Step
from research.rl.rollout import backends
from research.rl.rollout import vllm_client
from research.rl.rollout.sampler import SamplerConfig, Stream, episode_keys
from research.rl.rollout.trajectory import Trajectory, to_batch
from research.tokenizer.base import ByteTokenizer

RC = backends.RolloutConfig(backend='vllm')
needs_vllm = pytest.mark.skipif(not os.access(RC.python_path, os.X_OK),
                                reason=f'no vLLM venv at {RC.python_path} (make vllm-venv)')

TOK = ByteTokenizer()
# Qwen3-MoE (config_map.family_of), float32; O(1) weights so that the log-probs spread widely.
CFG = ModelConfig(vocab_size=TOK.vocab_size, d_model=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                  d_ff=128, num_experts=4, num_experts_per_tok=2, d_expert=64, moe_impl='dense', init_std=0.3)
S = SamplerConfig(temperature=0.8, top_k=0, top_p=1.0, max_turn_tokens=6, max_turns=3, max_len=96)
TOL = 1e-3  # The acceptance bound in float32 (measured: ~1e-6).


@pytest.fixture(scope='module')
def backend(tmp_path_factory):
  b = backends.make(backends.RolloutConfig(backend='vllm', weights_dir=str(tmp_path_factory.mktemp('w'))),
                    CFG, TOK, S)
  yield b
  b.close()


_forward = jax.jit(lambda p, x, seg: transformer.forward(p, x, CFG, segment_ids_BxT=seg)[0])


def _ours(params, rows, forward=_forward):
  """Our log-prob of each token after the ones before it (0 for the first), per row."""
  b = to_batch([Trajectory.from_prompt(r) for r in rows], max(map(len, rows)), TOK.pad_id)
  lp = jax.nn.log_softmax(forward(params, b['tokens'], b['segment_ids']))
  tgt = np.take_along_axis(np.asarray(lp), b['targets'][..., None], -1)[..., 0]
  return [np.concatenate([[0.0], tgt[i, :len(r) - 1]]) for i, r in enumerate(rows)]


def _rows(seed, n=3):
  rng = np.random.default_rng(seed)
  return [rng.integers(3, TOK.vocab_size, size=int(rng.integers(8, 40))).tolist() for _ in range(n)]


@needs_vllm
def test_engine_logprobs_match_our_forward_and_follow_pushes(backend):
  """The engine's log-probs equal our forward's on the same tokens; after a push (in place, the same
  process) they equal the new params' and not the old ones'."""
  old, new = transformer.init(CFG, jax.random.key(0)), transformer.init(CFG, jax.random.key(1))
  rows = _rows(0)
  for got, want in zip(backend.logprobs(old, rows), _ours(old, rows)):
    assert np.abs(got - want).max() <= TOL
  pid = backend.engines[0].proc.pid
  got_new = backend.logprobs(new, rows)
  assert backend.engines[0].proc.pid == pid and not backend.pushes[-1].started
  for got, want, was in zip(got_new, _ours(new, rows), _ours(old, rows)):
    assert np.abs(got - want).max() <= TOL
    assert np.abs(got - was).max() > 100 * TOL


# DeepSeek-V3 (MLA, sigmoid router, a dense first layer, a shared expert). vLLM's CPU MLA kernel
# takes one latent size only, kv_lora_rank + qk_rope_head_dim = 576 (DeepSeek-V3's own 512 + 64).
DS_CFG = ModelConfig(vocab_size=TOK.vocab_size, d_model=64, num_layers=2, attention='mla', num_heads=2,
                     q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32,
                     rope_interleaved=True, first_k_dense=1, d_ff=128, router='sigmoid', num_experts=4,
                     num_experts_per_tok=2, d_expert=64, num_shared_experts=1, moe_impl='dense', init_std=0.3)
# vLLM's CPU MLA agrees with our forward less closely than its GQA (measured at these weights: max
# 9.0e-4 and 1.2e-3, mean 2.3e-4, against ~1e-6), so this test checks the mapping and the pushes
# (the new params' log-probs, not the old ones'), not the float32 bound.
DS_TOL = 3e-3


@needs_vllm
def test_deepseek_v3_family_serves_and_follows_pushes(tmp_path):
  b = backends.make(backends.RolloutConfig(backend='vllm', weights_dir=str(tmp_path)), DS_CFG, TOK, S)
  fwd = jax.jit(lambda p, x, seg: transformer.forward(p, x, DS_CFG, segment_ids_BxT=seg)[0])
  rows = _rows(1)
  params = [transformer.init(DS_CFG, jax.random.key(k)) for k in (0, 1, 0)]
  try:
    for i, p in enumerate(params):
      got, want, other = b.logprobs(p, rows), _ours(p, rows, fwd), _ours(params[1 - i % 2], rows, fwd)
      assert max(np.abs(g - w).max() for g, w in zip(got, want)) <= DS_TOL
      assert max(np.abs(g - o).max() for g, o in zip(got, other)) > 0.1
    assert len(b.pushes) == 3 and not any(push.started for push in b.pushes[1:])
  finally:
    b.close()


class Echo:
  """Answers `turns` messages with an observation, then ends."""

  def __init__(self, turns, obs):
    self.prompt = [{'role': 'user', 'content': 'say something'}]
    self.turns, self.obs, self.n = turns, obs, 0

  def step(self, message):
    self.n += 1
    return Step(None, True, 1.0, True, {}) if self.n >= self.turns else Step(self.obs, False)

  def close(self, reason):
    return Step(None, True, -0.5, False, {})


@needs_vllm
def test_multiturn_rollout_logprobs_are_our_tempered_forward(backend):
  """Trajectories sampled by the engine over several turns: every policy token's recorded log-prob
  is our tempered forward's on the final trajectory (the prompt, observations and closings are ids
  as ours renders them), messages end at <eom> or at their budget."""
  params = transformer.init(CFG, jax.random.key(2))
  eps = [Echo(3, 'result ' * (i + 1)) for i in range(4)]
  trajs, st = backend.rollout(params, eps, jax.random.key(3))
  assert st.new_tokens == sum(t.num_policy_tokens for t in trajs) > 0 and st.push_s > 0
  b = to_batch(trajs, max(len(t.tokens) for t in trajs), TOK.pad_id)
  lp = jax.nn.log_softmax(_forward(params, b['tokens'], b['segment_ids']) / S.temperature)
  want = np.take_along_axis(np.asarray(lp), b['targets'][..., None], -1)[..., 0]
  assert np.abs((b['sampler_logp'] - want) * b['mask']).max() <= TOL
  for t in trajs:
    assert t.done and len(t.messages) == 3 and t.routes is None
    for m in t.messages:
      budget = min(S.max_turn_tokens, S.max_len - m.start)
      assert m.end - m.start == budget or t.tokens[m.end - 1] == TOK.end_of_message_id
      assert TOK.end_of_message_id not in t.tokens[m.start:m.end - 1]
  again, st2 = backend.rollout(params, [Echo(3, 'ok') for _ in range(4)], jax.random.key(3))
  assert st2.push_s == 0  # The engine holds these params already.


def _refilled(backend, params, make, key, rows):
  """make()'s episodes through `rows` rows refilled as they end: their trajectories."""
  stream = Stream(backend, rows, wait_s=None)
  eps = make()
  running = stream.submit(eps, episode_keys(key, len(eps)), groups=range(len(eps)))
  while stream.busy:
    stream.advance(params)
  return [e.traj for e in running]


def _same_trajectories(a, b):
  for x, y in zip(a, b):
    assert (x.tokens, x.logp, x.reward, x.done) == (y.tokens, y.logp, y.reward, y.done)


@needs_vllm
def test_refilled_rows_sample_what_the_batch_samples_on_the_engine(backend):
  """Each request is seeded from its episode's message key: 6 episodes through 2 refilled rows
  sample what they sample in one batch of 6."""
  params = transformer.init(CFG, jax.random.key(4))
  make = lambda: [Echo(1 + i % 3, 'o' * i) for i in range(6)]
  batch, _ = backend.rollout(params, make(), jax.random.key(5))
  _same_trajectories(batch, _refilled(backend, params, make, jax.random.key(5), 2))


@needs_vllm
def test_a_fleet_samples_what_one_engine_samples_and_takes_every_push(backend, tmp_path):
  """Two engine servers (rollout.vllm_engines), each sent the weights over its connection, rows
  split between them: the trajectories of the engine the run starts, token for token; after a push
  both serve the new params (rows 0, 2 on one, 1, 3 on the other); a trainer that connects again
  gets the running engines, in place; when a server dies its rows go to the other, which samples
  what it would have (requests are seeded); with none left the run fails, naming them."""
  servers = [vllm_client.start_server(RC.python_path, '127.0.0.1:0', {'VLLM_CPU_KVCACHE_SPACE': '1'},
                                      str(tmp_path / f'server{i}.log')) for i in range(2)]
  rc = backends.RolloutConfig(backend='vllm', weights_dir=str(tmp_path), vllm_engines=tuple(a for _, a in servers))
  fleet = backends.make(rc.validate(), CFG, TOK, S)
  try:
    params, new = transformer.init(CFG, jax.random.key(4)), transformer.init(CFG, jax.random.key(1))
    make = lambda: [Echo(1 + i % 3, 'o' * i) for i in range(6)]
    _same_trajectories(backend.rollout(params, make(), jax.random.key(5))[0],
                       fleet.rollout(params, make(), jax.random.key(5))[0])
    rows = _rows(0, 4)
    for got, want in zip(fleet.logprobs(new, rows), _ours(new, rows)):
      assert np.abs(got - want).max() <= TOL
    assert len(fleet.engines) == 2 and [p.started for p in fleet.pushes] == [True, False]
    fleet.close()
    fleet = backends.make(rc, CFG, TOK, S)
    for got, want in zip(fleet.logprobs(params, rows), _ours(params, rows)):
      assert np.abs(got - want).max() <= TOL
    servers[1][0].kill()
    servers[1][0].wait()
    _same_trajectories(backend.rollout(params, make(), jax.random.key(6))[0],
                       fleet.rollout(params, make(), jax.random.key(6))[0])
    assert len(fleet.engines) == 1 and servers[1][1] in fleet.lost[0]
    servers[0][0].kill()
    servers[0][0].wait()
    with pytest.raises(vllm_client.EngineError, match=f'no vLLM engine is left: .*at {servers[1][1]}'):
      fleet.logprobs(params, rows)
  finally:
    fleet.close()
    for proc, _ in servers:
      proc.kill()


def test_fleet_addresses_are_checked():
  with pytest.raises(ValueError, match=r"^rollout.vllm_engines=.*'gpu7' is not HOST:PORT"):
    backends.RolloutConfig(vllm_engines=('gpu7',)).validate()
  backends.RolloutConfig(backend='vllm', vllm_python='/nonexistent', vllm_engines=('gpu7:8000',)).validate()


class _FakeEngine:
  """The engine's `generate` without vLLM: a request's tokens and log-probs follow from its seed
  and prompt alone (as a seeded request's do), ending at the first stop id."""

  def call(self, op, *, prompts, max_tokens, seeds, stop_ids, **_):
    assert op == 'generate'
    ids, logp = [], []
    for prompt, n, seed in zip(prompts, max_tokens, seeds):
      rng = np.random.default_rng([seed, len(prompt)])
      out = [int(i) for i in rng.choice([*range(97, 123), *stop_ids], n)]
      out = out[:next((k + 1 for k, i in enumerate(out) if i in stop_ids), n)]
      ids.append(out)
      logp.append(list(-rng.random(len(out))))
    return {'ids': ids, 'logp': logp}

  def close(self):
    pass


def test_the_vllm_backend_refills_rows_through_the_shared_stream(tmp_path):
  """Without vLLM: VllmBackend on a fake engine, 6 episodes through 2 refilled rows give the
  trajectories of one batch of 6 (requests are independent and seeded per episode)."""
  b = vllm_client.VllmBackend(CFG, TOK, S, python='unused', weights_dir=str(tmp_path), kv_cache_gib=1,
                              eager=True, start_timeout_s=1)
  params = object()
  b.engines, b._pushed = [_FakeEngine()], params  # The engine holds these params: no push.
  make = lambda: [Echo(1 + i % 3, 'o' * i) for i in range(6)]
  batch, _ = b.rollout(params, make(), jax.random.key(5))
  assert sorted(len(t.messages) for t in batch) == [1, 1, 2, 2, 3, 3]
  _same_trajectories(batch, _refilled(b, params, make, jax.random.key(5), 2))
  b.close()


class _DyingEngine(_FakeEngine):
  """A fleet's engine whose server dies after `after` requests."""

  def __init__(self, after):
    self.after, self.calls, self.closed = after, 0, False

  def call(self, op, **kw):
    self.calls += 1
    if self.calls > self.after:
      raise vllm_client.EngineError('the vLLM engine at gpu7:8100 closed its connection')
    return super().call(op, **kw)

  def close(self):
    self.closed = True


def _fake_backend(tmp_path, engines, params):
  b = vllm_client.VllmBackend(CFG, TOK, S, python='unused', weights_dir=str(tmp_path), kv_cache_gib=1,
                              eager=True, start_timeout_s=1, addresses=('gpu6:8100', 'gpu7:8100')[:len(engines)])
  b.engines, b._pushed = engines, params  # The engines hold these params: no push.
  return b


def test_a_fleet_engine_that_dies_leaves_its_rows_to_the_others(tmp_path):
  """Without vLLM: of two fake engines, the second dies after its first request; its rows go to
  the first, and the trajectories are those of one engine (requests are seeded). It is closed and
  named in `lost`; with no engine left the rollout fails, naming them."""
  make = lambda: [Echo(1 + i % 3, 'o' * i) for i in range(6)]
  params, first, dying = object(), _FakeEngine(), _DyingEngine(after=1)
  one, fleet = _fake_backend(tmp_path, [_FakeEngine()], params), _fake_backend(tmp_path, [first, dying], params)
  _same_trajectories(one.rollout(params, make(), jax.random.key(5))[0],
                     fleet.rollout(params, make(), jax.random.key(5))[0])
  assert fleet.engines == [first] and dying.closed and dying.calls == 2 and 'gpu7:8100' in fleet.lost[0]
  fleet.engines = [_DyingEngine(after=0)]
  with pytest.raises(vllm_client.EngineError, match='no vLLM engine is left: the vLLM engine at gpu7:8100'):
    fleet.rollout(params, make(), jax.random.key(5))
  one.close()
  fleet.close()


def _protocol_server(hang_after_start=False):
  """An engine server's protocol on loopback without vLLM, one connection after another: reads
  each request and the files that follow it, answers 'start' and 'push', and 'generate' as
  _FakeEngine does, or, with hang_after_start, nothing after its first connection's 'start' (a
  server that hangs, then is restarted). Returns its 'HOST:PORT' and the files it was sent, by
  request."""
  srv, received = socket.create_server(('127.0.0.1', 0)), []

  def serve(conn, hang):
    rx, tx = conn.makefile('rb'), conn.makefile('wb')
    for line in rx:
      req = json.loads(line)
      received.append({name: len(rx.read(size)) for name, size in req.get('files', [])})
      if req['op'] != 'start' and hang:
        return  # Never answers; the connection stays open.
      out = ({'ready': True, 'version': 'fake'} if req['op'] == 'start' else {'seconds': 0.0} if req['op'] == 'push'
             else {} if req['op'] == 'close' else _FakeEngine().call(**req))
      tx.write(json.dumps(out).encode() + b'\n')
      tx.flush()

  def run():
    conns = []  # Kept, so that a hung one stays open.
    for k in itertools.count():
      conn, _ = srv.accept()
      conns.append(conn)
      serve(conn, hang_after_start and k == 0)
  threading.Thread(target=run, daemon=True).start()
  return '%s:%d' % srv.getsockname()[:2], received


def test_a_fleet_on_sockets_sends_the_weights_and_drops_a_server_that_hangs(tmp_path):
  """Without vLLM, the client's side of a fleet on real sockets: each server is sent the folder's
  files at the start and at a push (every byte: the next request line parses); a server that
  stops answering after its start is dropped after rollout.vllm_request_timeout_s (1 s) and its
  rows sample on the other what one engine samples; restarted, it rejoins at the next push."""
  (good, got), (hung, _) = _protocol_server(), _protocol_server(hang_after_start=True)
  rc = backends.RolloutConfig(backend='vllm', weights_dir=str(tmp_path), vllm_engines=(good, hung),
                              vllm_request_timeout_s=1)
  fleet = backends.make(rc.validate(), CFG, TOK, S)
  params = transformer.init(CFG, jax.random.key(0))
  make = lambda: [Echo(1 + i % 3, 'o' * i) for i in range(6)]
  one = _fake_backend(tmp_path, [_FakeEngine()], params)
  _same_trajectories(one.rollout(params, make(), jax.random.key(5))[0],
                     fleet.rollout(params, make(), jax.random.key(5))[0])
  assert len(fleet.engines) == 1 and f'the vLLM engine at {hung} cannot be reached: timed out' in fleet.lost[0]
  folder = {n: os.path.getsize(os.path.join(fleet._folder, n)) for n in os.listdir(fleet._folder)}
  assert got[0] == folder and 'config.json' in folder and any(n.endswith('.safetensors') for n in folder)
  new = transformer.init(CFG, jax.random.key(1))
  fleet.rollout(new, make(), jax.random.key(5))  # A push.
  assert [r for r in got if r][1] == folder and fleet.pushes[-1].started is False
  assert [e.address for e in fleet.engines] == [good, hung]  # Rejoined at the push (its 'start').
  one._pushed = new
  _same_trajectories(one.rollout(new, make(), jax.random.key(7))[0], fleet.rollout(new, make(), jax.random.key(7))[0])
  fleet.close()
  one.close()


def test_the_runs_engine_that_stops_answering_is_killed_and_named(tmp_path):
  """Without vLLM: an engine process that starts and then never answers fails the request after
  rollout.vllm_request_timeout_s, killed, instead of holding the run."""
  fake = tmp_path / 'python'  # Answers the start on the reply pipe (--fds=R,W), then sleeps.
  fake.write_text('#!/bin/bash\nfor a in "$@"; do case $a in --fds=*) w=${a#*,};; esac; done\n'
                  'echo \'{"ready": true, "version": "fake"}\' >&"$w"\nexec sleep 600\n')
  fake.chmod(0o755)
  e = vllm_client.Engine.spawn(str(fake), str(tmp_path), {}, {}, str(tmp_path / 'engine.log'), 10, request_timeout_s=1)
  assert e.version == 'fake'
  with pytest.raises(vllm_client.EngineError, match=r'^the vLLM engine \(pid \d+\) did not answer in 1 s'):
    e.call('generate', prompts=[[1]])
  assert e.proc.wait(5) is not None
  e.close()


def test_cut_at_stops():
  assert vllm_client.cut_at_stops([5, 1, 2, 7, 1, 2], [(1, 2)]) == 3
  assert vllm_client.cut_at_stops([5, 6], [(1, 2)]) == 2


def test_config_names_a_bad_backend_and_a_missing_venv(tmp_path):
  with pytest.raises(ValueError, match=r"^rollout.backend='sglang': expected one of"):
    backends.RolloutConfig(backend='sglang').validate()
  with pytest.raises(ValueError, match=r'^rollout.vllm_python=.*make vllm-venv'):
    backends.RolloutConfig(backend='vllm', vllm_python=str(tmp_path / 'python')).validate()
  backends.RolloutConfig(vllm_python=str(tmp_path / 'python')).validate()  # Ours needs no venv.
