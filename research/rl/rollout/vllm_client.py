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

Routes: vLLM returns routed experts only with its Model Runner V2 (Triton, so not on the CPU), so
the trajectories carry none and the update routes every token itself (`records_routes` False).
"""

import dataclasses
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import weakref

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
  """The engine process and its two pipes; one request at a time."""

  def __init__(self, python: str, folder: str, engine_args: dict, env: dict, log_path: str, timeout_s: float):
    req_r, self._req_w = os.pipe()
    self._rep_r, rep_w = os.pipe()
    self.log_path = log_path
    with open(log_path, 'w') as log:
      self.proc = subprocess.Popen(
          [python, '-m', SERVER, f'--fds={req_r},{rep_w}', f'--model={folder}',
           f'--engine={json.dumps(engine_args)}'],
          cwd=ROOT, env={**os.environ, 'PYTHONPATH': ROOT, **env}, stdout=log, stderr=subprocess.STDOUT,
          pass_fds=(req_r, rep_w))
    os.close(req_r)
    os.close(rep_w)
    self._tx = os.fdopen(self._req_w, 'w')
    self._rx = os.fdopen(self._rep_r, 'r')
    self.version = self._read(timeout_s)['version']

  def _read(self, timeout_s: float | None = None) -> dict:
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not select.select([self._rx], [], [], 1.0)[0]:
      if self.proc.poll() is not None:
        raise EngineError(f'the vLLM engine exited ({self.proc.returncode}); its log ends:\n{self._log_tail()}')
      if deadline is not None and time.monotonic() > deadline:
        self.proc.kill()
        raise EngineError(f'the vLLM engine did not start in {timeout_s} s; its log ends:\n{self._log_tail()}')
    line = self._rx.readline()
    if not line:
      raise EngineError(f'the vLLM engine closed its pipe; its log ends:\n{self._log_tail()}')
    out = json.loads(line)
    if 'error' in out:
      raise EngineError(out['error'])
    return out

  def _log_tail(self, n: int = 4000) -> str:
    with open(self.log_path, errors='replace') as f:
      return f.read()[-n:]

  def call(self, op: str, **kw) -> dict:
    self._tx.write(json.dumps({'op': op, **kw}) + '\n')
    self._tx.flush()
    return self._read()

  def close(self) -> None:
    if self.proc.poll() is None:
      self.call('close')
      self.proc.wait(60)
    self._tx.close()
    self._rx.close()


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
  """Rollouts sampled by a vLLM engine (module docstring); a lock makes rollouts one at a time."""

  def __init__(self, cfg: ModelConfig, tok: Tokenizer, s: SamplerConfig, *, python: str, weights_dir: str,
               kv_cache_gib: int, eager: bool, start_timeout_s: float):
    super().__init__(cfg, tok, s)
    config_map.family_of(cfg)  # A model without Hugging Face names cannot be served: fail now.
    self.records_routes = False
    self.python, self.kv_cache_gib, self.eager, self.start_timeout_s = python, kv_cache_gib, eager, start_timeout_s
    self._dir = tempfile.mkdtemp(prefix='vllm_rollout_', dir=weights_dir)
    # Shared memory outlives the process: the folder goes with this object or at exit, whichever is
    # first (the engine exits by itself when its request pipe closes).
    self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, True)
    self._folder = os.path.join(self._dir, 'weights')
    self._single = [int(q[-1]) for q in self.stop_seqs if len(q) == 1]
    self._multi = [q for q in self.stop_seqs if len(q) > 1]
    self.engine: Engine | None = None
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
    """The params into the engine: written as a Hugging Face folder, then reloaded in place (the
    first push starts the engine from it)."""
    t0 = time.perf_counter()
    convert.params_to_hf(params, self._folder, cfg=self.cfg, overwrite=True)
    t1 = time.perf_counter()
    started = self.engine is None
    if started:
      self.engine = Engine(self.python, self._folder, self.engine_args(),
                           {'VLLM_CPU_KVCACHE_SPACE': str(self.kv_cache_gib)},
                           os.path.join(self._dir, 'engine.log'), self.start_timeout_s)
    else:
      self.engine.call('load', folder=self._folder)
    self._pushed = params
    push = Push(t1 - t0, time.perf_counter() - t1, started)
    self.pushes.append(push)
    return push

  def logprobs(self, params, rows: list[list[int]]) -> list[np.ndarray]:
    """The engine's log-prob of each token after the ones before it (the first's is 0), at
    temperature 1: what our forward computes on the same tokens."""
    with self.lock:
      self._push(params)
      return [np.asarray(x, np.float32) for x in self.engine.call('logprobs', prompts=rows)['logp']]

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
    rows = np.flatnonzero(live_B)
    seeds = np.asarray(_seeds(keys_Bx2))  # A request's seed is its row's message key's: the same in any batch.
    out = self.engine.call('generate', prompts=[trajs[r].tokens for r in rows],
                           max_tokens=[int(budget_B[r]) for r in rows], seeds=[int(seeds[r]) for r in rows],
                           temperature=self.s.temperature, top_k=self.s.top_k, top_p=self.s.top_p,
                           stop_ids=self._single)
    m = self.s.max_turn_tokens
    tokens = np.full((len(trajs), m), self.tok.pad_id, np.int32)
    logp = np.zeros((len(trajs), m), np.float32)
    n = np.zeros(len(trajs), np.int32)
    for r, ids, lp in zip(rows, out['ids'], out['logp']):
      # Multi-token stop sequences end the message here; the engine sampled past them.
      n[r] = cut_at_stops(ids, self._multi)
      tokens[r, :n[r]], logp[r, :n[r]] = ids[:n[r]], lp[:n[r]]
    return None, TurnOutput(tokens, logp, n, np.zeros((0, len(trajs), m, self.cfg.num_experts_per_tok), np.int32))

  def close(self) -> None:
    if self.engine is not None:
      self.engine.close()
      self.engine = None
    self._cleanup()
