"""Batched multi-turn sampling on the KV cache (research/model/decode.py): ours, one RolloutBackend.

RolloutBackend holds what every rollout engine shares (turns, environments, limits, statistics);
Sampler, below, samples on our KV cache, research/rl/rollout/vllm_client.py on a vLLM engine.

One jitted `generate` call samples a model message for every live row: temperature / top-k / top-p,
stops at a stop sequence (the tokenizer's end-of-message id by default) or at the row's own token
budget, and exits as soon as every row has stopped. Between turns the host hands each message to
its environment episode, renders the observation to ids once, and prefills it into the same cache
(`extend`, always sampler.chunk wide: prompts go in several chunks), so no earlier token is ever
recomputed or re-tokenized. Both programs' attention reads the cache's first `span` slots, the
fewest of `sampler.spans` equal parts that hold every row they write (generate: with its budget):
early turns do not pay for the whole episode's cache. Each (program, span) is compiled ahead of
time at a batch size's first call, so a run compiles nothing after its first turn.

A `Stream` drives any engine's rows: `rollout` gives each episode a row and samples every row's
message of a turn at once; a narrower Stream refills a row with a queued episode as soon as its
episode ends (continuous batching: `reset_rows` empties the row's cache, compiled with the cache)
and lets rows whose tool call is slow wait without holding up the others (rl.stream). Every
episode samples with its own key (message k with fold_in(its key, k)), so its trajectory does not
depend on its row or on the episodes beside it.

The episodes of a turn step at once on a pool of threads (sandboxed episodes mostly wait on their
subprocesses, which use the cores): results are taken back in row order, so a rollout is the same
whatever the timing, and a raising episode takes the one fault path however it ran.

Each row writes the cache from its own index (research/model/decode.py), which advances by the row's
real tokens only: a row holds its trajectory back to back (its cache end is its trajectory's
length), so the cache holds one episode (sampler.max_len slots), and each row sees exactly the
contiguous sequence a full forward over its trajectory sees.
"""

import abc
import collections
from concurrent import futures
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from research import configs
from research.model import decode
from research.model.config import ModelConfig
from research.model.transformer import forward
from research.parallel.sharding import constrain
from research.rl.update import losses
from research.rl.envs.base import DROPPED, Step
from research.rl.rollout.trajectory import Trajectory
from research.tokenizer import chat
from research.tokenizer.base import Tokenizer


# Ids around an observation: the message's closing, the tool turn's prefix and suffix, '...' of a
# cut, the next assistant turn's opening (ChatML's, the largest of our formats, is under 16).
_OBS_FRAME = 16


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """sampler: how rollouts are sampled, and their token budgets."""
  temperature: float = 1.0          # 0 = greedy.
  top_k: int = 0                    # 0 = off.
  top_p: float = 1.0                # 1 = off.
  max_turn_tokens: int = 24         # Tokens per model message (a row's budget within a turn).
  max_turns: int = 5                # Model messages per episode.
  max_len: int = 160                # Trajectory length limit (the training sequence length).
  max_obs_tokens: int = 48          # Longer observations keep their tail (tracebacks end there).
  bucket: int = 16                  # Prefill chunks are padded to a multiple (bounds recompiles).
  stop_seqs: tuple[tuple[int, ...], ...] = ()  # Extra stop sequences (tuples of ids); <eom> always stops.
  record_routes: bool = False       # Keep the MoE routes of every token; RL then replays them in the update.
  env_workers: int = 64             # Episodes stepped at once (threads: they wait on sandboxes, not cores).
  env_call_timeout_s: float = 3600.0  # A call into an episode (a step, the close that grades) not answered
                                    # in this long faults it (masked): a hung environment stalls no run.
  spans: int = 4                    # Programs by the cache slots they read (module docstring).

  def validate(self, path: str = 'sampler.') -> 'SamplerConfig':
    for f, low in (('temperature', 0), ('top_k', 0), ('max_turn_tokens', 1), ('max_turns', 1),
                   ('max_len', 1), ('max_obs_tokens', 1), ('bucket', 1), ('env_workers', 1),
                   ('spans', 1)):
      if getattr(self, f) < low:
        raise configs.invalid(path + f, getattr(self, f), f'must be >= {low}')
    if not 0 < self.top_p <= 1:
      raise configs.invalid(path + 'top_p', self.top_p, 'must be in (0, 1]')
    if self.env_call_timeout_s <= 0:
      raise configs.invalid(path + 'env_call_timeout_s', self.env_call_timeout_s, 'must be positive')
    return self

  @property
  def cache_len(self) -> int:
    """Slots per row: one episode's (a row holds its trajectory back to back, at most max_len ids;
    a chunk's padding past the end is dropped). Attention reads every slot, so this sets the cost
    of decoding."""
    return _round_up(self.max_len, self.bucket)

  @property
  def span_sizes(self) -> tuple[int, ...]:
    """The slots each prefill and generate program reads: `spans` equal parts of the cache,
    rounded up to the bucket (fewer where they round alike)."""
    return tuple(sorted({min(self.cache_len, _round_up(-(-self.cache_len * i // self.spans), self.bucket))
                         for i in range(1, self.spans + 1)}))

  @property
  def chunk(self) -> int:
    """Width of every prefill: the widest observation with the chat template's ids around it, so
    a whole run prefills through one compiled program (prompts go in chunks of it)."""
    return _round_up(self.max_obs_tokens + _OBS_FRAME, self.bucket)


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def sample_logits(keys_B, logits_BxV, temperature: float, top_k: int = 0, top_p: float = 1.0):
  """Samples one token per row, row b with keys_B[b] (so a row samples the same whatever rows are
  beside it). Returns (tokens B, log-prob B of each token under the sampler).

  The log-prob is the behaviour policy's: the tempered distribution after top-k/top-p truncation
  (renormalized over the kept tokens), so that importance ratios against the trainer's
  untruncated log-probs are unbiased. Greedy (temperature 0) reports the untempered policy's
  log-prob (losses.tempered_log_softmax).
  """
  logits = logits_BxV.astype(jnp.float32)
  if temperature == 0:
    tok = jnp.argmax(logits, axis=-1)
    return tok, jnp.take_along_axis(losses.tempered_log_softmax(logits, 0.0), tok[:, None], -1)[:, 0]
  logits = logits / temperature
  masked = logits
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    masked = jnp.where(logits < kth, -jnp.inf, masked)
  if top_p < 1.0:
    srt = jnp.sort(masked, axis=-1)[:, ::-1]
    cum = jnp.cumsum(jax.nn.softmax(srt), axis=-1)
    # The smallest prefix whose mass reaches top_p: keep a token if the mass before it is < top_p.
    cutoff_idx = jnp.sum(cum - jax.nn.softmax(srt) < top_p, axis=-1, keepdims=True) - 1
    cutoff = jnp.take_along_axis(srt, cutoff_idx, axis=-1)
    masked = jnp.where(masked < cutoff, -jnp.inf, masked)
  tok = jax.vmap(jax.random.categorical)(keys_B, masked)
  return tok, jnp.take_along_axis(jax.nn.log_softmax(masked), tok[:, None], -1)[:, 0]


def _routes(aux, cfg: ModelConfig, b: int, t: int):
  """The forward's routes (L_moe x B*T x k) as L x B x T x k; zeros when there are no MoE layers."""
  if 'routes' not in aux:
    return jnp.zeros((0, b, t, cfg.num_experts_per_tok), jnp.int32)
  return aux['routes'].reshape(-1, b, t, cfg.num_experts_per_tok)


def _shard_cache(cache):
  """Lays the cache out by rows over the batch mesh axes (a no-op outside a mesh): valid, pos and end
  are B x ..., the layer stacks L x B x ...."""
  out = {k: constrain(cache[k], ('act_batch',)) for k in ('valid', 'pos', 'end')}
  for k in cache.keys() - {'valid', 'pos', 'end'}:
    out[k] = jax.tree.map(lambda x: constrain(x, (None, 'act_batch')), cache[k])
  return out


def _replicated(x):
  """What the host reads back: whole on every device, so every process of a multi-host run can."""
  return constrain(x, (None,) * x.ndim)


def extend(params, tokens_BxT, mask_BxT, cache, logits_BxV, *, cfg: ModelConfig, span: int):
  """Prefills a right-padded chunk, attending to the cache's first `span` slots (every row with
  real tokens must end below it). Returns (logits at each row's last real token, or logits_BxV
  for a row without one; cache; routes)."""
  logits, aux, cache = forward(params, tokens_BxT, cfg, segment_ids_BxT=mask_BxT.astype(jnp.int32),
                               cache=_shard_cache(cache), cache_span=span)
  b, t = tokens_BxT.shape
  last = t - 1 - jnp.argmax(mask_BxT[:, ::-1], axis=1)
  logits = jnp.where(jnp.any(mask_BxT, axis=1)[:, None], logits[jnp.arange(b), last], logits_BxV)
  return _replicated(logits), _shard_cache(cache), _replicated(_routes(aux, cfg, b, t))


def generate(params, cache, logits_BxV, done_B, budget_B, keys_Bx2, stops_NxS, *, cfg: ModelConfig,
             s: SamplerConfig, pad_id: int, span: int):
  """Samples one message per live row (done_B False) on the cache, attending to its first `span`
  slots (every live row's end plus budget must fit). Row b's i-th token samples with
  fold_in(keys_Bx2[b], i) (raw key data): a message depends on its row's key only.

  stops_NxS: stop sequences right-aligned, -1 = any token (left padding), -2 = never matches.
  Returns dict: tokens B x max_turn_tokens, logp, n (tokens sampled per row), stopped (ended on a
  stop sequence), routes (L x B x max_turn_tokens x k), cache.
  """
  b, m, w = logits_BxV.shape[0], s.max_turn_tokens, stops_NxS.shape[1]
  n_moe = cfg.num_moe_layers if s.record_routes else 0

  keys_B = jax.random.wrap_key_data(keys_Bx2)

  def body(c):
    i = c['i']
    tok, lp = sample_logits(jax.vmap(jax.random.fold_in, (0, None))(keys_B, i), c['logits'], s.temperature,
                            s.top_k, s.top_p)
    live = ~c['done']
    tok = jnp.where(live, tok, pad_id).astype(jnp.int32)
    logits, aux, cache = forward(params, tok[:, None], cfg, segment_ids_BxT=live[:, None].astype(jnp.int32),
                                 cache=c['cache'], cache_span=span)
    window = jnp.where(live[:, None], jnp.concatenate([c['window'][:, 1:], tok[:, None]], 1), c['window'])
    hit = jnp.any(jnp.all((stops_NxS[None] == -1) | (stops_NxS[None] == window[:, None]), -1), -1)
    n = c['n'] + live
    out = dict(
        i=i + 1, logits=logits[:, 0], cache=cache, n=n, window=window,
        tokens=c['tokens'].at[:, i].set(tok), logp=c['logp'].at[:, i].set(jnp.where(live, lp, 0.0)),
        stopped=c['stopped'] | (live & hit), done=c['done'] | (live & (hit | (n >= budget_B))))
    if n_moe:
      out['routes'] = c['routes'].at[:, :, i].set(_routes(aux, cfg, b, 1)[:, :, 0])
    else:
      out['routes'] = c['routes']
    return out

  init = dict(i=jnp.zeros((), jnp.int32), logits=logits_BxV, cache=cache,
              n=jnp.zeros((b,), jnp.int32), window=jnp.full((b, w), -1, jnp.int32),
              tokens=jnp.full((b, m), pad_id, jnp.int32), logp=jnp.zeros((b, m), jnp.float32),
              stopped=jnp.zeros((b,), bool), done=done_B | (budget_B <= 0),
              routes=jnp.zeros((n_moe, b, m, cfg.num_experts_per_tok), jnp.int32))
  out = jax.lax.while_loop(lambda c: (c['i'] < m) & ~jnp.all(c['done']), body, init)
  return {**{k: _replicated(out[k]) for k in ('tokens', 'logp', 'n', 'stopped', 'routes')},
          'cache': _shard_cache(out['cache'])}


def reset_rows(cache, free_B):
  """The cache with rows free_B emptied for new episodes: no valid slot, writes and positions from
  0. Their old keys and values stay, masked (invalid), until the new episode overwrites them."""
  return _shard_cache({**cache, 'valid': cache['valid'] & ~free_B[:, None],
                       'end': jnp.where(free_B, 0, cache['end']), 'pos': jnp.where(free_B, 0, cache['pos'])})


@functools.cache  # Every Sampler with the same configs and jit (mesh) shares the compiled programs.
def _programs(jit: Callable, cfg: ModelConfig, s: 'SamplerConfig', pad_id: int):
  return {'extend': jit(functools.partial(extend, cfg=cfg), donate_argnums=(3, 4), static_argnames='span'),
          'generate': jit(functools.partial(generate, cfg=cfg, s=s, pad_id=pad_id), donate_argnums=1,
                          static_argnames='span'),
          'reset': jit(reset_rows, donate_argnums=0)}


@jax.jit
def _fold_keys(episode_keys_Bx2, turn_B):
  return jax.random.key_data(jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(episode_keys_Bx2), turn_B))


def message_keys(episode_keys_Bx2: np.ndarray, turn_B: np.ndarray) -> np.ndarray:
  """Each row's key for its next message (raw key data, on the host: any program's input): its
  episode's key folded with the message's index in the episode, so an episode samples the same in
  whatever row and batch."""
  return np.asarray(_fold_keys(episode_keys_Bx2, turn_B))


def episode_keys(key, n: int) -> np.ndarray:
  """n episodes' keys (raw key data, n x 2) from one key: episode i's is the i-th split."""
  return np.asarray(jax.random.key_data(jax.random.split(key, n)))


@dataclasses.dataclass(frozen=True)
class RolloutStats:
  """Where a rollout's time went (sampling vs the environments) and what it counted."""
  sample_s: float
  env_s: float
  push_s: float                     # Pushing new weights into the engine (0 for ours: it reads the params).
  new_tokens: int
  faults: int
  truncated: int
  obs_truncated: int
  malformed_tokens: int             # Messages carrying special tokens inside their content.


@dataclasses.dataclass(frozen=True)
class _EnvCall:
  """One call into an episode: the Step it returned, or the fault it raised (masked, never a crash)."""
  step: Step | None
  fault: str | None
  seconds: float


def _call_env(method: Callable[[str], Step], arg: str) -> _EnvCall:
  t0 = time.perf_counter()
  try:
    step = method(arg)
  except Exception as e:  # noqa: BLE001 - an environment fault is masked, never a crash.
    return _EnvCall(None, f'{type(e).__name__}: {e}', time.perf_counter() - t0)
  return _EnvCall(step, None, time.perf_counter() - t0)


def _end(traj: Trajectory, call: _EnvCall) -> None:
  """Scores a trajectory on its final Step, or records the fault that ended it."""
  if call.fault is not None:
    traj.fault = call.fault
  else:
    traj.reward, traj.success, traj.done = float(call.step.reward), bool(call.step.success), True


@dataclasses.dataclass(frozen=True)
class _Cache:
  """The batch's KV cache and the logits after the last prefill."""
  cache: Any
  logits_BxV: jax.Array | None


@dataclasses.dataclass(frozen=True)
class TurnOutput:
  """One turn's sampled messages on the host, rows x max_turn_tokens (any engine's)."""
  tokens_BxM: np.ndarray
  logp_BxM: np.ndarray
  n_B: np.ndarray
  routes_LxBxMxK: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Message:
  """One row's sampled message: its ids, its text and the trajectory entry holding it."""
  ids: np.ndarray
  text: str
  malformed: bool
  entry: Any


@dataclasses.dataclass(frozen=True)
class _Reply:
  """What one row's message led to: the ids to prefill next (None: the episode ended)."""
  obs: list[int] | None
  close: str | None                 # 'turns' or 'context': the episode is to be cut short.
  new_tokens: int
  malformed: bool
  obs_truncated: bool


class RolloutBackend(abc.ABC):
  """What every rollout engine shares: prompts rendered to ids, the turns, each message handed to its
  environment episode, observations rendered once, limits, faults and the statistics.

  An engine implements `_begin` (its state for a number of rows), `_reset` (rows emptied for new
  episodes), `_extend` (new ids in: prompts, observations) and `_sample` (one message per live
  row), and may override `_push` (new params in); a `Stream` drives them, `rollout` with one row
  per episode. Every engine returns the same Trajectory objects. `records_routes`: the
  trajectories carry the MoE routes the tokens were sampled with (the update replays them), else
  the update routes them itself. `lock`: held while a Stream drives the engine.
  """
  records_routes: bool
  lock: Any = contextlib.nullcontext()  # Ours: each Stream has its own cache, nothing to share.

  def __init__(self, cfg: ModelConfig, tok: Tokenizer, s: SamplerConfig):
    self.cfg, self.tok, self.s = cfg, tok, s
    self.stop_seqs = [(tok.end_of_message_id,), *s.stop_seqs]  # A message ends at any of them.
    self._specials = set(getattr(tok, 'special_ids', {}).values())
    self._pool = futures.ThreadPoolExecutor(s.env_workers, thread_name_prefix='env')

  @abc.abstractmethod
  def _begin(self, rows: int) -> Any:
    """The engine's state for `rows` empty rows."""

  @abc.abstractmethod
  def _reset(self, state, free_B: np.ndarray) -> Any:
    """The state with rows free_B emptied (their episodes ended; new ones take them)."""

  @abc.abstractmethod
  def _sample(self, params, state, trajs: list[Trajectory | None], live_B: np.ndarray, budget_B: np.ndarray,
              keys_B) -> tuple[Any, TurnOutput]:
    """One message per live row, at most its budget of tokens, ending at a stop sequence; row b's
    tokens sample with keys_B[b] (raw key data; generate's rule) and depend on nothing else but
    its trajectory."""

  @abc.abstractmethod
  def _extend(self, params, state, rows: list[list[int] | None], trajs: list[Trajectory | None]) -> Any:
    """The engine's state after each row's new ids (None: none)."""

  def _push(self, params) -> float:
    """Makes the engine sample with `params`. Returns seconds spent (0 for ours: it reads them)."""
    del params
    return 0.0

  def close(self) -> None:
    """Ends what the engine holds outside this process (nothing, for ours)."""

  def _text(self, ids) -> tuple[str, bool]:
    """The message text; a special token inside the content makes it unparseable on purpose."""
    body = list(ids[:-1]) if len(ids) and ids[-1] == self.tok.end_of_message_id else list(ids)
    bad = any(i in self._specials or not 0 <= i < self.tok.vocab_size for i in body)
    return self.tok.decode(body) + ('\x00<special>' if bad else ''), bad

  def rollout(self, params, episodes, key, *, tasks=None, groups=None):
    """Runs every episode to its end, one row each, every row's message of a turn sampled at once
    (a Stream as wide as the batch that waits for every answer). Episode i samples with
    episode_keys(key, n)[i]. Returns (trajectories, RolloutStats)."""
    with self.lock:
      stream = Stream(self, len(episodes), wait_s=None)
      running = stream.submit(episodes, episode_keys(key, len(episodes)), tasks=tasks,
                              groups=range(len(episodes)) if groups is None else groups)
      while stream.busy:
        stream.advance(params)
      trajs = [e.traj for e in running]
      return trajs, stream.stats(trajs)

  def _trajectory(self, episode, task, group: int) -> Trajectory:
    """The episode's trajectory, holding its rendered prompt."""
    prompt = chat.render(self.tok, episode.prompt, add_generation_prompt=True)[0]
    if len(prompt) >= self.s.max_len:
      raise ValueError(f'prompt of {len(prompt)} tokens does not fit sampler.max_len={self.s.max_len}')
    return Trajectory.from_prompt(prompt, task=task, prompt=episode.prompt, group=group)

  def _budget(self, traj: Trajectory) -> int:
    """Tokens the row may sample this turn: the turn's budget within the trajectory's length limit."""
    return min(self.s.max_turn_tokens, self.s.max_len - len(traj.tokens))

  def _message(self, traj: Trajectory, out: TurnOutput, r: int) -> _Message:
    """Appends row r's sampled message to its trajectory."""
    n = int(out.n_B[r])
    ids = out.tokens_BxM[r, :n]
    routes = out.routes_LxBxMxK[:, r, :n].transpose(1, 0, 2) if self.records_routes else None
    text, malformed = self._text(ids)
    return _Message(ids, text, malformed, traj.add_model(ids, out.logp_BxM[r, :n], text, routes))

  def _reply(self, traj: Trajectory, m: _Message, call: _EnvCall) -> _Reply:
    """What the episode's answer to a message means: its end, a cut, or the observation's ids."""
    if call.step is not None:
      m.entry.info = dict(call.step.info)
    if call.fault is not None or call.step.done:
      _end(traj, call)
      return _Reply(None, None, len(m.ids), m.malformed, False)
    obs, cut = self._observation(call.step.observation, m.ids)
    # The next message needs room too: an observation that reaches max_len ends the episode.
    last = len(traj.messages) >= self.s.max_turns
    reason = 'turns' if last else 'context' if len(traj.tokens) + len(obs) >= self.s.max_len else None
    if reason:
      traj.truncated = reason == 'context'
      return _Reply(None, reason, len(m.ids), m.malformed, cut)
    traj.add_observation(obs, call.step.observation)
    return _Reply(obs, None, len(m.ids), m.malformed, cut)

  def _observation(self, observation: str, msg_ids) -> tuple[list[int], bool]:
    """Ids after a model message: its closing, the observation and the next assistant turn's opening.

    Returns (ids, whether the observation was cut to its tail).
    """
    tok, keep = self.tok, self.s.max_obs_tokens
    body = tok.encode(observation)
    cut = len(body) > keep
    if cut:  # Keep the tail: that is where tracebacks say what broke.
      body = [*tok.encode('...'), *body[-keep:]]
    # After the model's own end-of-message only the rest of the suffix (ChatML's newline); after a
    # cut or another stop sequence all of it. Then the chat template's ids, token for token.
    closing = tok.message_suffix('assistant')[int(len(msg_ids) > 0 and msg_ids[-1] == tok.end_of_message_id):]
    return [*closing, *tok.message_prefix('tool'), *body, *tok.message_suffix('tool'),
            *chat.generation_prompt(tok)], cut


@dataclasses.dataclass(eq=False)
class Running:
  """An episode in a Stream: its trajectory, its key and what it waits for."""
  episode: Any
  traj: Trajectory
  key: np.ndarray                   # Raw key data: message k samples with fold_in(key, k) in any row.
  row: int | None = None            # Its row once admitted.
  ids: list[int] | None = None      # Ids to prefill before its next message (its prompt, an observation).
  call: futures.Future | None = None  # Its environment call in flight: a step, or a close that scores it.
  closing: bool = False             # The call in flight is close(): its answer ends the episode.
  deadline: float = 0.0             # time.monotonic() past which the call in flight faults it.
  message: _Message | None = None   # Its last message, which the step in flight answers.
  version: int | None = None        # The learner's update count when its first token was sampled.
  ended: bool = False               # Scored, faulted or dropped: out of the rows.


@dataclasses.dataclass(frozen=True)
class Turn:
  """What one Stream.advance did."""
  ended: list[Running]              # Episodes that ended in it, scored or faulted.
  sampled: int                      # Rows that sampled a message.


class Stream:
  """Continuous batching: `rows` rows of a backend's batch, each holding one episode at a time.

  `submit` queues episodes; each `advance(params)` is one turn: rows whose episode ended are
  emptied (`_reset`: a jitted program for ours, compiled with the cache, so nothing compiles after
  the first turn) and take queued episodes, whose prompts are prefilled with the observations of the
  others; every row whose episode waits for the model samples a message, which goes to its episode
  on the backend's pool; then the turn waits for the episodes' answers. wait_s None (`rollout`):
  for every answer, so all rows sample in step. Else up to wait_s and until at least one answer:
  an episode whose tool call is slow keeps its row but holds up no other, and answers that come
  later are taken at a later turn. An episode's trajectory depends on its key, its prompt and its
  answers only, not on its row, the rows beside it or the timing. A call not answered within
  sampler.env_call_timeout_s faults its episode (masked, counted against rl.max_mask_rate), so an
  environment that hangs stalls neither a turn nor a take.

  Params may change between turns (a learner's update). The rows' cache is then kept, not
  recomputed: the tokens already sampled keep the log-probs of the params that sampled them, which
  the update's truncated importance weights correct for, and recomputing each running episode's
  whole context at every update would cost a prefill of every row per step. New tokens attend to
  keys and values of the older params (as in PipelineRL's in-flight updates); the recorded log-probs
  are those of exactly that mixture, so the importance weights stay exact. (vLLM drops its prefix
  cache at a push and recomputes each request's context: vllm_client.py.)
  """

  def __init__(self, backend: RolloutBackend, rows: int, wait_s: float | None):
    self.b, self.rows, self.wait_s = backend, rows, wait_s
    self.slots: list[Running | None] = [None] * rows
    self.queue: collections.deque[Running] = collections.deque()
    self.state = None                 # The engine's, made at the first turn.
    self._replies: list[_Reply] = []  # Since the last stats().
    self._env_s = self._push_s = self._seconds = 0.0

  def submit(self, episodes, keys: np.ndarray, *, tasks=None, groups) -> list[Running]:
    """Queues episodes (keys: raw key data, one row each; groups: a trajectory's group each)."""
    out = [Running(ep, self.b._trajectory(ep, None if tasks is None else tasks[i], int(g)), keys[i])
           for i, (ep, g) in enumerate(zip(episodes, groups))]
    self.queue.extend(out)
    return out

  @property
  def busy(self) -> bool:
    return bool(self.queue) or any(self.slots)

  @property
  def free_rows(self) -> int:
    return self.slots.count(None)

  def advance(self, params, version: int = 0) -> Turn:
    """One turn with `params` (the learner's `version`: updates so far)."""
    t0 = time.perf_counter()
    with self.b.lock:
      self._push_s += self.b._push(params)
      if self.state is None:
        self.state = self.b._begin(self.rows)
      self._admit()
      self._prefill(params)
      sampled = self._sample(params, version)
    turn = Turn(self._answers(), sampled)
    self._seconds += time.perf_counter() - t0
    return turn

  def drop(self, running: list[Running]) -> list[futures.Future]:
    """Takes episodes out unscored: their rows are freed, each is closed on the pool once its call
    in flight returns (close() frees what it holds; its Step is not read). Returns the closes."""
    closes = []
    for e in running:
      if e.row is not None and self.slots[e.row] is e:
        self.slots[e.row] = None
      if e in self.queue:
        self.queue.remove(e)
      if not e.ended and not e.closing:  # (A close in flight frees it already.)
        closes.append(self._close_after(e.call, e.episode))
      e.ended = True
    return closes

  def _close_after(self, call: futures.Future | None, episode) -> futures.Future:
    """Closes an episode unscored (DROPPED) once its call in flight, if any, has returned: on the
    thread that ran the call, so that no thread waits on a call that may hang for good."""
    if call is None or call.done():
      return self.b._pool.submit(_call_env, episode.close, DROPPED)
    out = futures.Future()
    call.add_done_callback(lambda _: out.set_result(_call_env(episode.close, DROPPED)))
    return out

  def stats(self, trajs: list[Trajectory]) -> RolloutStats:
    """Statistics of the turns since the last call (faults and truncations: of `trajs`)."""
    out = _stats(trajs, self._replies, self._env_s, self._push_s, self._seconds)
    self._replies, self._env_s, self._push_s, self._seconds = [], 0.0, 0.0, 0.0
    return out

  def _trajs(self) -> list[Trajectory | None]:
    return [e and e.traj for e in self.slots]

  def _admit(self) -> None:
    """Queued episodes into empty rows, their rows reset and their prompts to prefill."""
    free = [r for r, e in enumerate(self.slots) if e is None][:len(self.queue)]
    if not free:
      return
    for r in free:
      e = self.slots[r] = self.queue.popleft()
      e.row, e.ids = r, list(e.traj.tokens)
    self.state = self.b._reset(self.state, np.isin(np.arange(self.rows), free))

  def _prefill(self, params) -> None:
    rows = [e.ids if e is not None else None for e in self.slots]
    if any(rows):
      self.state = self.b._extend(params, self.state, rows, self._trajs())
      for e in self.slots:
        if e is not None:
          e.ids = None

  def _sample(self, params, version: int) -> int:
    """A message for every row waiting for one; those with no room left are closed instead.
    Returns the rows sampled."""
    ready = [e for e in self.slots if e is not None and e.call is None]
    for e in ready:
      if self.b._budget(e.traj) <= 0:
        e.traj.truncated = True
        self._call(e, 'close', 'context')
    ready = [e for e in ready if e.call is None]
    if not ready:
      return 0
    live_B, budget_B = np.zeros(self.rows, bool), np.zeros(self.rows, np.int32)
    keys_B, turn_B = np.zeros((self.rows, *ready[0].key.shape), ready[0].key.dtype), np.zeros(self.rows, np.int32)
    for e in ready:
      live_B[e.row], budget_B[e.row] = True, self.b._budget(e.traj)
      keys_B[e.row], turn_B[e.row] = e.key, len(e.traj.messages)
    self.state, out = self.b._sample(params, self.state, self._trajs(), live_B, budget_B,
                                     message_keys(keys_B, turn_B))
    for e in ready:
      e.version = version if e.version is None else e.version
      e.message = self.b._message(e.traj, out, e.row)
      self._call(e, 'step', e.message.text)
    return len(ready)

  def _call(self, e: Running, method: str, arg: str) -> None:
    e.call, e.closing = self.b._pool.submit(_call_env, getattr(e.episode, method), arg), method == 'close'
    e.deadline = time.monotonic() + self.b.s.env_call_timeout_s

  def _answers(self) -> list[Running]:
    """Waits for the episodes' answers (the class docstring's rule), or until the first call in
    flight passes its deadline, and takes them in row order."""
    ended = []
    while True:
      calls = {e.call: e for e in self.slots if e is not None and e.call is not None}
      if not calls:
        return ended
      t0 = time.perf_counter()
      left = lambda: max(0.0, min(e.deadline for e in calls.values()) - time.monotonic())
      done, _ = futures.wait(calls, timeout=left() if self.wait_s is None else min(self.wait_s, left()))
      if not done and self.wait_s is not None:
        done, _ = futures.wait(calls, timeout=left(), return_when=futures.FIRST_COMPLETED)
      self._env_s += time.perf_counter() - t0
      now = time.monotonic()
      answers = {calls[c]: c.result() for c in done}
      answers |= {e: self._timed_out(e) for e in calls.values() if e not in answers and e.deadline <= now}
      for e in sorted(answers, key=lambda e: e.row):
        if self._answer(e, answers[e]):
          e.ended, self.slots[e.row] = True, None
          ended.append(e)
      if self.wait_s is not None and answers:
        return ended

  def _timed_out(self, e: Running) -> _EnvCall:
    """The fault of a call past sampler.env_call_timeout_s. The call keeps its thread (a thread
    cannot be stopped); a step's episode is closed unscored once the step returns."""
    if not e.closing:
      self._close_after(e.call, e.episode)
    limit = self.b.s.env_call_timeout_s
    return _EnvCall(None, f'EnvCallTimeout: its {"close" if e.closing else "step"} did not answer in '
                    f'{limit:g} s (sampler.env_call_timeout_s)', limit)

  def _answer(self, e: Running, call: _EnvCall) -> bool:
    """Takes an episode's answer. Returns whether the episode ended."""
    e.call = None
    if e.closing:
      _end(e.traj, call)
      return True
    reply = self.b._reply(e.traj, e.message, call)
    self._replies.append(reply)
    if reply.close:
      self._call(e, 'close', reply.close)
      return False
    e.ids = reply.obs
    return reply.obs is None


class Sampler(RolloutBackend):
  """Ours: jitted generation for one model config, tokenizer and sampler config on the KV cache.

  `jit` compiles its programs: jax.jit on one device, or a Trainer's `jit` (its mesh and rules: the
  KV cache split by rows like the batch, the expert layer's shard_map as in training).
  """

  def __init__(self, cfg: ModelConfig, tok: Tokenizer, s: SamplerConfig, jit: Callable = jax.jit):
    super().__init__(cfg, tok, s)
    self.records_routes = s.record_routes
    width = max(len(q) for q in self.stop_seqs)  # Right-aligned, -1 (any token) on the left.
    self.stops = np.array([[-1] * (width - len(q)) + list(q) for q in self.stop_seqs], np.int32)
    self._programs = _programs(jit, cfg, s, tok.pad_id)
    self._compiled = {}  # (program, rows, span) -> its executable.

  def _chunks(self, rows: list[list[int] | None]):
    """Each row's ids cut into right-padded chunks of sampler.chunk: (ids, mask) per chunk."""
    w = self.s.chunk
    for start in range(0, max([len(r) for r in rows if r] + [1]), w):
      ids = np.full((len(rows), w), self.tok.pad_id, np.int32)
      mask = np.zeros((len(rows), w), bool)
      for i, r in enumerate(rows):
        part = (r or [])[start:start + w]
        ids[i, :len(part)], mask[i, :len(part)] = part, True
      yield ids, mask

  def _begin(self, rows: int) -> _Cache:
    """An empty cache; the reset program is compiled with it (no later turn compiles)."""
    kv = _Cache(decode.init_cache(self.cfg, rows, self.s.cache_len), jnp.zeros((rows, self.cfg.vocab_size), jnp.float32))
    if ('reset', rows, self.s.cache_len) not in self._compiled:
      self._compiled['reset', rows, self.s.cache_len] = self._programs['reset'].lower(
          kv.cache, np.zeros(rows, bool)).compile()
    return kv

  def _reset(self, kv: _Cache, free_B: np.ndarray) -> _Cache:
    return _Cache(self._compiled['reset', len(free_B), self.s.cache_len](kv.cache, free_B), kv.logits_BxV)

  def _extend(self, params, kv: _Cache, rows: list[list[int] | None], trajs) -> _Cache:
    """Prefills each row's new ids (None: none) into the cache a chunk at a time, recording their
    routes. The rows' trajectories already end with those ids: the span holds the longest."""
    span = self._span(max(len(t.tokens) for t, r in zip(trajs, rows) if r))
    for ids, mask in self._chunks(rows):
      logits, cache, routes = self._run('extend', span, len(trajs), params, ids, mask, kv.cache,
                                        kv.logits_BxV)
      kv = _Cache(cache, logits)
      if self.s.record_routes:
        routes, n_B = np.asarray(routes), mask.sum(1)
        for r in np.flatnonzero(n_B):
          trajs[r].routes = (trajs[r].routes or []) + list(routes[:, r, :n_B[r]].transpose(1, 0, 2))
    return kv

  def _sample(self, params, kv: _Cache, trajs, live_B, budget_B, keys_B) -> tuple[_Cache, TurnOutput]:
    span = self._span(max(len(trajs[r].tokens) + budget_B[r] for r in np.flatnonzero(live_B)))
    out = self._run('generate', span, len(trajs), params, kv.cache, kv.logits_BxV, ~live_B, budget_B, keys_B,
                    self.stops)
    cache = out.pop('cache')
    return _Cache(cache, kv.logits_BxV), TurnOutput(*jax.device_get([out['tokens'], out['logp'], out['n'],
                                                                    out['routes']]))

  def _span(self, need: int) -> int:
    """The fewest cache slots of sampler.span_sizes that hold `need`."""
    return next(n for n in self.s.span_sizes if n >= need)

  def _run(self, program: str, span: int, rows: int, params, *args):
    """`program` ('extend' or 'generate') on `rows` rows, reading `span` slots. At a batch size's
    first call each program is compiled for every span, so that no later turn compiles."""
    if (program, rows, span) not in self._compiled:
      for n in self.s.span_sizes:
        self._compiled[program, rows, n] = self._programs[program].lower(params, *args, span=n).compile()
    return self._compiled[program, rows, span](params, *args)


def _stats(trajs: list[Trajectory], replies: list[_Reply], env_s: float, push_s: float,
           seconds: float) -> RolloutStats:
  return RolloutStats(
      sample_s=seconds - env_s - push_s, env_s=env_s, push_s=push_s, new_tokens=sum(r.new_tokens for r in replies),
      faults=sum(t.fault is not None for t in trajs), truncated=sum(t.truncated for t in trajs),
      obs_truncated=sum(r.obs_truncated for r in replies), malformed_tokens=sum(r.malformed for r in replies))
