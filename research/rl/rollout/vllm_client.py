"""Rollouts on vLLM: the engine runs in its own process and venv, token ids in and out.

The engine (research/rl/rollout/vllm_engine/server.py) is started by the first rollout from the
params it is given, written as a Hugging Face folder by research/hf (Qwen3-MoE or DeepSeek-V3
names). Each later rollout whose params are another object than the last pushed ones writes them
to the same folder (`weights_dir`: shared memory by default) and has the engine reload them in
place (no restart) and drop its prefix cache. Each turn sends every live row's whole trajectory as
a prompt: the engine's prefix cache holds what it saw, so only the new observation is prefilled,
as in ours; after a push, the next request of an episode running across it (sampler.Stream)
recomputes its context with the new params (ours keeps its cache). Each request is independent and
seeded from its episode's key, so a Stream's refilled rows need nothing of the engine. The log-prob of each sampled token is the engine's, from the tempered and truncated
distribution it sampled (ours: sampler.sample_logits), so the update's truncated importance
weights correct what differs between the engine and the trainer.

A fleet (`addresses`, rollout.vllm_engines): engine servers started apart (`--listen`) and sent
the folder's files over their connections at each push; each turn's rows are split among them, row
r to engine r % engines. Requests are seeded per episode, so a fleet samples what one engine does.

Routes: vLLM returns routed experts only with its Model Runner V2 (Triton, so not on the CPU), so
the trajectories carry none and the update routes every token itself (`records_routes` False).
"""

from concurrent import futures
import contextlib
import dataclasses
import json
import logging
import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from typing import Any

import jax
import numpy as np

from research.hf import config_map
from research.hf import convert
from research.model.config import ModelConfig
from research.rl.rollout.sampler import RolloutBackend, SamplerConfig, TurnOutput
from research.rl.rollout.trajectory import Trajectory
from research.tokenizer.base import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SERVER = 'research.rl.rollout.vllm_engine.server'


class EngineError(RuntimeError):
  """The engine process failed: its traceback, or the tail of its log."""


@dataclasses.dataclass(frozen=True)
class Push:
  """One weight push: writing the folder, then the engine's in-place reload (or its start)."""
  write_s: float
  load_s: float
  started: bool                     # The engine started from these weights (load_s is its start-up).


class Engine:
  """One engine behind a JSON-lines channel (vllm_engine/server.py), one request at a time: a
  process of the run's on two pipes (`spawn`), or a fleet's server on a socket (`connect`)."""

  def __init__(self, rx, tx, name: str, request_timeout_s: float, proc: subprocess.Popen | None = None,
               log_path: str | None = None, sock: socket.socket | None = None, address: str | None = None):
    self._rx, self._tx, self.name, self.proc, self.log_path, self._sock = rx, tx, name, proc, log_path, sock
    self.request_timeout_s = request_timeout_s  # (On a socket, also the socket's timeout once started.)
    self.address = address            # A fleet's server's (None: a process of the run's).
    self.version = None               # vLLM's, once it is up.

  @classmethod
  def spawn(cls, python: str, folder: str, engine_args: dict, env: dict, log_path: str,
            timeout_s: float, request_timeout_s: float) -> 'Engine':
    """Starts an engine on this host from the Hugging Face folder, within timeout_s; later
    requests time out after request_timeout_s (the engine is killed)."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    with open(log_path, 'w') as log:
      proc = subprocess.Popen(
          [python, '-m', SERVER, f'--fds={req_r},{rep_w}', f'--model={folder}',
           f'--engine={json.dumps(engine_args)}'],
          cwd=ROOT, env={**os.environ, 'PYTHONPATH': ROOT, **env}, stdout=log, stderr=subprocess.STDOUT,
          pass_fds=(req_r, rep_w))
    os.close(req_r)
    os.close(rep_w)
    e = cls(os.fdopen(rep_r, 'rb'), os.fdopen(req_w, 'wb'), f'the vLLM engine (pid {proc.pid})', request_timeout_s,
            proc, log_path)
    e.version = e._read(timeout_s)['version']
    return e

  @classmethod
  def connect(cls, address: str, folder: str, engine_args: dict, timeout_s: float,
              request_timeout_s: float, connect_s: float | None = None) -> 'Engine':
    """Connects to a fleet's server (retrying for connect_s, default timeout_s, while it comes up)
    and starts its engine from the folder's files, sent over the connection, within timeout_s;
    later requests time out after request_timeout_s."""
    host, port = address.rsplit(':', 1)
    connect_s = timeout_s if connect_s is None else connect_s
    deadline = time.monotonic() + connect_s
    while True:
      try:
        sock = socket.create_connection((host, int(port)), timeout=10)
        break
      except OSError as err:
        if time.monotonic() > deadline:
          raise EngineError(f'no vLLM engine server answers at {address} (rollout.vllm_engines) after '
                            f'{connect_s:g} s: {err}') from None
        time.sleep(1.0)
    sock.settimeout(timeout_s)  # For its start; a timeout there is an OSError, named by call().
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    e = cls(sock.makefile('rb'), sock.makefile('wb'), f'the vLLM engine at {address}', request_timeout_s,
            sock=sock, address=address)
    e.version = e.call('start', send=folder, engine=engine_args)['version']
    sock.settimeout(request_timeout_s)
    return e

  def _read(self, timeout_s: float | None = None) -> dict:
    """The next answer, within timeout_s (default: request_timeout_s)."""
    if self.proc is not None:  # (A fleet's server has no process here: its socket tells its end.)
      limit = self.request_timeout_s if timeout_s is None else timeout_s
      deadline = time.monotonic() + limit
      while not select.select([self._rx], [], [], 1.0)[0]:
        if self.proc.poll() is not None:
          raise EngineError(f'{self.name} exited ({self.proc.returncode}){self._log_tail()}')
        if time.monotonic() > deadline:
          self.proc.kill()
          raise EngineError(f'{self.name} did not answer in {limit} s{self._log_tail()}')
    try:
      line = self._rx.readline()
    except OSError as err:
      raise EngineError(f'{self.name} cannot be reached: {err}') from None
    if not line:
      raise EngineError(f'{self.name} closed its connection{self._log_tail()}')
    out = json.loads(line)
    if 'error' in out:
      raise EngineError(f'{self.name}: {out["error"]}')
    return out

  def _log_tail(self, n: int = 4000) -> str:
    if self.log_path is None:
      return ' (its log is on its host)'
    with open(self.log_path, errors='replace') as f:
      return '; its log ends:\n' + f.read()[-n:]

  def call(self, op: str, send: str | None = None, **kw) -> dict:
    """One request; with `send` (a folder), its files' bytes follow the line (a fleet's push or start)."""
    files = [] if send is None else sorted(os.listdir(send))
    if send is not None:
      kw['files'] = [[name, os.path.getsize(os.path.join(send, name))] for name in files]
    try:
      self._tx.write(json.dumps({'op': op, **kw}).encode() + b'\n')
      for name in files:
        with open(os.path.join(send, name), 'rb') as f:
          shutil.copyfileobj(f, self._tx, 1 << 22)
      self._tx.flush()
    except OSError as err:
      raise EngineError(f'{self.name} cannot be reached: {err}') from None
    return self._read()

  def load(self, folder: str) -> None:
    """The folder's weights, in place: read there (this host) or sent (a fleet's engine)."""
    if self.proc is not None:
      self.call('load', folder=folder)
    else:
      self.call('push', send=folder)

  def close(self) -> None:
    with contextlib.suppress(EngineError):  # Gone already.
      if self.proc is None or self.proc.poll() is None:
        self.call('close')
    if self.proc is not None:
      self.proc.wait(60)
    for f in (self._tx, self._rx, self._sock):
      with contextlib.suppress(OSError):  # (What a dead engine's socket had buffered.)
        if f is not None:
          f.close()


def start_server(python: str, address: str, env: dict, log_path: str) -> tuple[subprocess.Popen, str]:
  """Starts a fleet's engine server on this host (`--listen=address`; port 0 picks a free one),
  e.g. one per accelerator with its CUDA_VISIBLE_DEVICES in `env`. Returns the process and the
  address it listens on, once it does (the engine itself starts at a trainer's first request)."""
  with open(log_path, 'w') as log:
    proc = subprocess.Popen([python, '-m', SERVER, f'--listen={address}'], cwd=ROOT,
                            env={**os.environ, 'PYTHONPATH': ROOT, **env}, stdout=subprocess.PIPE,
                            stderr=log, text=True)
  line = proc.stdout.readline()
  if not line:
    raise EngineError(f'the engine server for {address} exited ({proc.wait()}); its log is {log_path}')
  return proc, json.loads(line)['listening']


def _result(fn, e):
  """fn(e), or the EngineError it raised."""
  try:
    return fn(e)
  except EngineError as err:
    return err


@jax.jit
def _seeds(keys_Bx2):
  return jax.vmap(lambda k: jax.random.randint(k, (), 0, 2**31 - 1))(jax.random.wrap_key_data(keys_Bx2))


def cut_at_stops(ids: list[int], stops: list[tuple[int, ...]]) -> int:
  """Tokens kept: up to the end of the first stop sequence in ids, else all of them."""
  for end in range(1, len(ids) + 1):
    if any(len(q) <= end and tuple(ids[end - len(q):end]) == q for q in stops):
      return end
  return len(ids)


class VllmBackend(RolloutBackend):
  """Rollouts sampled by vLLM engines (module docstring): one started by the run, or a fleet's
  servers (`addresses`), each live row's requests going to engine row % engines (so an episode's
  prefix stays cached where it ran) and every push to all; a lock makes rollouts one at a time."""

  def __init__(self, cfg: ModelConfig, tok: Tokenizer, s: SamplerConfig, *, python: str, weights_dir: str,
               kv_cache_gib: int, eager: bool, start_timeout_s: float, addresses: tuple[str, ...] = (),
               request_timeout_s: float = 600):
    super().__init__(cfg, tok, s)
    config_map.family_of(cfg)  # A model without Hugging Face names cannot be served: fail now.
    self.records_routes = False
    self.python, self.kv_cache_gib, self.eager, self.start_timeout_s = python, kv_cache_gib, eager, start_timeout_s
    self.addresses, self.request_timeout_s = addresses, request_timeout_s
    self._dir = tempfile.mkdtemp(prefix='vllm_rollout_', dir=weights_dir)
    # Shared memory outlives the process: the folder goes with this object or at exit, whichever is
    # first (the engine exits by itself when its request pipe closes).
    self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
    self._folder = os.path.join(self._dir, 'weights')
    self._single = [int(q[-1]) for q in self.stop_seqs if len(q) == 1]
    self._multi = [q for q in self.stop_seqs if len(q) > 1]
    self.engines: list[Engine] = []
    self.lost: list[str] = []         # The errors of engines dropped from the fleet.
    self._fan = futures.ThreadPoolExecutor(max(len(addresses), 1), thread_name_prefix='vllm')
    self._pushed = None               # The params the engine holds (kept: identity marks new ones).
    self.lock = threading.RLock()     # Rollouts and streams take turns on the engine (rollout, then its turns).
    self.pushes: list[Push] = []

  def engine_args(self) -> dict:
    """vllm.LLM's arguments: the params' dtype, the episode's length, the sampler's log-probs."""
    return {'dtype': self.cfg.param_dtype, 'max_model_len': self.s.max_len, 'enable_prefix_caching': True,
            'enforce_eager': self.eager, 'seed': 0,
            # Greedy reports the untempered policy's log-probs, sampling the tempered and truncated ones.
            'logprobs_mode': 'raw_logprobs' if self.s.temperature == 0 else 'processed_logprobs'}

  def push(self, params) -> Push:
    """The params into the engines: written as a Hugging Face folder, then reloaded in place, by
    every engine at once (the first push starts them from it)."""
    t0 = time.perf_counter()
    convert.params_to_hf(params, self._folder, cfg=self.cfg, overwrite=True)
    t1 = time.perf_counter()
    started = not self.engines
    if started and not self.addresses:
      self.engines = [Engine.spawn(self.python, self._folder, self.engine_args(),
                                   {'VLLM_CPU_KVCACHE_SPACE': str(self.kv_cache_gib)},
                                   os.path.join(self._dir, 'engine.log'), self.start_timeout_s,
                                   self.request_timeout_s)]
    elif started:
      self.engines = list(self._fan.map(
          lambda a: Engine.connect(a, self._folder, self.engine_args(), self.start_timeout_s, self.request_timeout_s),
          self.addresses))
    else:
      self._on_all(lambda e: e.load(self._folder), list(self.engines))
      self._rejoin()
    self._pushed = params
    push = Push(t1 - t0, time.perf_counter() - t1, started)
    self.pushes.append(push)
    return push

  def logprobs(self, params, rows: list[list[int]]) -> list[np.ndarray]:
    """The engine's log-prob of each token after the ones before it (the first's is 0), at
    temperature 1: what our forward computes on the same tokens."""
    with self.lock:
      self._push(params)
      out = self._each('logprobs', range(len(rows)), lambda i: {'prompts': [rows[j] for j in i]})
      return [np.asarray(out[j]['logp'], np.float32) for j in range(len(rows))]

  def _push(self, params) -> float:
    """Pushes params unless the engine holds them. Returns the seconds spent on the push (the
    engine's start-up excluded: it is no update)."""
    if params is self._pushed:
      return 0.0
    push = self.push(params)
    return push.write_s + (0.0 if push.started else push.load_s)

  def _begin(self, rows: int) -> None:
    return None  # Each request carries its row's whole trajectory: rows are independent requests.

  def _reset(self, state, free_B):
    return state

  def _extend(self, params, state, rows, trajs):
    return state  # The next request carries the whole trajectory; the prefix cache has the rest.

  def _sample(self, params, state, trajs: list[Trajectory | None], live_B: np.ndarray, budget_B: np.ndarray,
              keys_Bx2) -> tuple[None, TurnOutput]:
    seeds = np.asarray(_seeds(keys_Bx2))  # A request's seed is its row's message key's: the same in any batch.
    out = self._each('generate', np.flatnonzero(live_B), lambda rows: {
        'prompts': [trajs[r].tokens for r in rows], 'max_tokens': [int(budget_B[r]) for r in rows],
        'seeds': [int(seeds[r]) for r in rows], 'temperature': self.s.temperature, 'top_k': self.s.top_k,
        'top_p': self.s.top_p, 'stop_ids': self._single})
    m = self.s.max_turn_tokens
    tokens = np.full((len(trajs), m), self.tok.pad_id, np.int32)
    logp = np.zeros((len(trajs), m), np.float32)
    n = np.zeros(len(trajs), np.int32)
    for r, o in out.items():
      ids, lp = o['ids'], o['logp']
      # Multi-token stop sequences end the message here; the engine sampled past them.
      n[r] = cut_at_stops(ids, self._multi)
      tokens[r, :n[r]], logp[r, :n[r]] = ids[:n[r]], lp[:n[r]]
    return None, TurnOutput(tokens, logp, n, np.zeros((0, len(trajs), m, self.cfg.num_experts_per_tok), np.int32))

  def _rejoin(self) -> None:
    """Fleet servers dropped earlier that accept a connection again (a restarted pod) rejoin at a
    push, their engine started from (or reloaded with) the folder just written: one quick try each."""
    live = {e.address for e in self.engines}
    for a in [a for a in self.addresses if a not in live]:
      try:
        self.engines.append(Engine.connect(a, self._folder, self.engine_args(), self.start_timeout_s,
                                           self.request_timeout_s, connect_s=1.0))
      except EngineError:
        continue
      logging.warning('%s rejoined the fleet (%d engines)', a, len(self.engines))

  def _each(self, op: str, rows, request) -> dict[int, dict]:
    """One request for `rows`, row r's part sent to engine r % engines (`request(its rows)` makes
    each engine's), all engines at once. Returns each row's answer (its fields, that row's). The
    rows of an engine that fails go to the others (`_on_all`): requests are seeded, so they
    sample there what they would have sampled on it."""
    rows = [int(r) for r in rows]
    parts = {e: [r for r in rows if r % len(self.engines) == k] for k, e in enumerate(self.engines)}
    answers = self._on_all(lambda e: e.call(op, **request(parts[e])) if parts[e] else {},
                           [e for e in self.engines if parts[e]])
    out = {r: {k: v[i] for k, v in a.items()} for e, a in answers.items() for i, r in enumerate(parts[e])}
    lost = [r for r in rows if r not in out]
    return {**out, **(self._each(op, lost, request) if lost else {})}

  def _on_all(self, fn, engines: list[Engine]) -> dict[Engine, Any]:
    """fn(engine) for each of `engines` at once. An engine that fails (EngineError) is dropped from
    the fleet with a warning and left out of the answers; the run fails only when none is left."""
    done = dict(zip(engines, self._fan.map(lambda e: _result(fn, e), engines)))
    for e, out in done.items():
      if isinstance(out, EngineError):
        self.engines.remove(e)
        self.lost.append(str(out))
        e.close()
        logging.warning('dropped from the fleet (%d engines left): %s', len(self.engines), out)
    if not self.engines:
      raise EngineError('no vLLM engine is left: ' + ' | '.join(self.lost))
    return {e: out for e, out in done.items() if not isinstance(out, EngineError)}

  def close(self) -> None:
    for e in self.engines:
      e.close()
    self.engines = []
    self._fan.shutdown()
    self._cleanup()
