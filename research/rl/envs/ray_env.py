"""Episodes on Ray (env.executor='ray'): each episode lives on a Ray actor, its calls routed there.

`RayEnv` wraps an environment: the learner samples tasks and reads metrics from its own copy, and
every `reset` places the episode on the least loaded worker actor (one per node by default), which
builds the environment from the same maker and runs the episode's tool calls and grading (for the
repo env: in the bubblewrap sandbox of that node). The learner holds `RemoteEpisode`s, which keep
the Episode protocol, so the sampler steps them as it steps local ones, each call returning as
soon as its worker answers.

- Warm pool: a worker keeps `warm` prepared episodes (work areas copied, prompts rendered) of each
  task it has seen, refilled in the background, so a reset costs a dictionary pop.
- A lost worker (its process or node died): the episode is replayed on another worker from its
  message log (its state is the messages it took; the tools are deterministic) and the call that
  was lost runs there. The learner gets one result per call, so every episode is counted once.
  Only when no worker can replay it (none left, the replay diverged, or it was replayed
  MOST_REPLAYS times: an episode that kills every worker it runs on) does it raise
  `WorkerLost`: the sampler masks it (reward None), as it masks any environment fault; a fault
  never scores an episode 0 or 1.
- Timeouts: an episode whose calls have run `episode_timeout_s` on workers raises `EpisodeTimeout`
  (masked) and is dropped on its worker.
- Backpressure: each worker runs at most `worker_calls` calls at once; the learner's further
  calls wait for a slot instead of queueing on a full cluster.

Ray is imported here only, and this module only where env.executor is 'ray'.
"""

import collections
from concurrent import futures
import dataclasses
import itertools
import os
import threading
import time
from typing import Any, Callable

import numpy as np
import ray
from ray.util import scheduling_strategies

import research
from research.rl.envs.base import Environment, Step

# Tasks whose warm episodes a worker keeps (the least recently reset go first), bounding the work
# areas and sandbox uids spares hold.
_WARM_TASKS = 64
# Replays of one episode at most. A worker lost again at the same call on another worker points at
# the episode (a policy can make its commands take a node's memory, and Ray's monitor then kills
# workers): without a bound, such an episode would go on killing every worker it is moved to.
MOST_REPLAYS = 2


class WorkerLost(RuntimeError):
  """The episode's worker died and no other could replay it: an environment fault (masked)."""


class EpisodeTimeout(RuntimeError):
  """The episode ran longer than env.ray_episode_timeout_s on workers (masked)."""


@dataclasses.dataclass(frozen=True)
class _Result:
  """A call's outcome on the worker, the episode's exception returned as a value (not a RayTaskError)."""
  step: Step | None
  error: BaseException | None
  stats: Any                        # The episode's `stats` after the call (repo: EpisodeStats), or None.


class _Worker:
  """A Ray actor's state: the environment, its live episodes by id and the warm pool."""

  def __init__(self, make_env: Callable[[], Environment], warm: int):
    self.env, self.warm = make_env(), warm
    self.live: dict[int, Any] = {}
    self.busy: set[int] = set()
    self.dropped: set[int] = set()
    self.spares: collections.OrderedDict[Any, list] = collections.OrderedDict()
    self.lock = threading.Lock()
    self.background = futures.ThreadPoolExecutor(1, thread_name_prefix='warm')

  def node(self) -> str:
    return ray.get_runtime_context().get_node_id()

  def reset(self, eid: int, task) -> tuple[list[dict], Any]:
    """Starts episode `eid` of `task` (a warm one where there is). Returns its prompt and stats."""
    ep = self._take(task)
    with self.lock:
      self.live[eid] = ep
    return ep.prompt, getattr(ep, 'stats', None)

  def replay(self, eid: int, task, prompt: list[dict], messages: list[str]) -> _Result:
    """Rebuilds episode `eid` from its messages; a different prompt or an end mid-log is an error."""
    ep = self._take(task)
    try:
      if ep.prompt != prompt:
        raise WorkerLost('replay: the task gave a different prompt')
      for m in messages:
        if ep.step(m).done:
          raise WorkerLost('replay: the episode ended before its log did')
    except BaseException as e:  # noqa: BLE001 - returned to the learner, never raised here.
      _discard(ep)
      return _Result(None, _sendable(e), getattr(ep, 'stats', None))
    with self.lock:
      self.live[eid] = ep
    return _Result(None, None, getattr(ep, 'stats', None))

  def call(self, eid: int, method: str, arg: str) -> _Result:
    """`step(arg)` or `close(arg)` on episode `eid`; an ended or raising episode is let go."""
    with self.lock:
      ep = self.live[eid]
      self.busy.add(eid)
    step = error = None
    try:
      step = getattr(ep, method)(arg)
    except BaseException as e:  # noqa: BLE001 - the learner masks it, as it masks a local fault.
      error = _sendable(e)
    with self.lock:
      self.busy.discard(eid)
      ended = error is not None or step.done or eid in self.dropped
      if ended:
        self.live.pop(eid)
        self.dropped.discard(eid)
    if ended and error is None and not step.done:  # Timed out meanwhile: free its work area.
      self.background.submit(_discard, ep)
    return _Result(step, error, getattr(ep, 'stats', None))

  def drop(self, eid: int) -> None:
    """Lets a timed-out episode go: now if idle, else when its running call returns."""
    with self.lock:
      if eid in self.busy:
        self.dropped.add(eid)
        return
      ep = self.live.pop(eid, None)
    if ep is not None:
      self.background.submit(_discard, ep)

  def at_step(self, step: int) -> None:
    """Drift (Environment.at_step); the warm episodes were made before it and are discarded."""
    self.env.at_step(step)
    with self.lock:
      stale = [ep for eps in self.spares.values() for ep in eps]
      self.spares.clear()
    for ep in stale:
      self.background.submit(_discard, ep)

  def _take(self, task):
    """A prepared episode of `task`, else a new one; the task's warm pool is refilled behind."""
    key = _task_key(task)
    with self.lock:
      spares = self.spares.setdefault(key, [])
      self.spares.move_to_end(key)
      ep = spares.pop() if spares else None
      evicted = []
      while len(self.spares) > _WARM_TASKS:
        evicted += self.spares.popitem(last=False)[1]
    for old in evicted:
      self.background.submit(_discard, old)
    if self.warm:
      self.background.submit(self._refill, task, key)
    return ep if ep is not None else self.env.reset(task)

  def _refill(self, task, key) -> None:
    while True:
      with self.lock:
        spares = self.spares.get(key)
        if spares is None or len(spares) >= self.warm:
          return
      ep = self.env.reset(task)
      with self.lock:
        if self.spares.get(key) is spares:
          spares.append(ep)
          continue
      _discard(ep)  # Evicted, or drift, while it was made.
      return


def _task_key(task) -> Any:
  return getattr(task, 'id', None) or repr(task)


def _discard(ep) -> None:
  """Ends an episode nobody will read (a spare, a timed-out one): close() frees what it holds."""
  try:
    ep.close('discarded')
  except Exception:  # noqa: BLE001 - its result is not wanted, and a fault here hurts nobody.
    pass


def _with_fault(stats: Any) -> Any:
  """The stats marked as an environment fault, where they count faults (repo: EpisodeStats.fault)."""
  if dataclasses.is_dataclass(stats) and any(f.name == 'fault' for f in dataclasses.fields(stats)):
    return dataclasses.replace(stats, fault=True)
  return stats


def _sendable(e: BaseException) -> BaseException:
  """The exception, or its text as a RuntimeError where it does not pickle."""
  try:
    ray.cloudpickle.dumps(e)
    return e
  except Exception:  # noqa: BLE001
    return RuntimeError(f'{type(e).__name__}: {e}')


_WorkerActor = ray.remote(_Worker)


@dataclasses.dataclass(eq=False)
class _Handle:
  """A worker actor as the learner sees it: its call slots (backpressure) and live episodes."""
  actor: Any
  node: str                         # The Ray node it runs on.
  slots: threading.BoundedSemaphore
  live: int = 0
  lost: bool = False


class RemoteEpisode:
  """An episode on a worker; `step` / `close` as the Episode protocol (thread-safe across episodes)."""

  def __init__(self, env: 'RayEnv', eid: int, task, handle: _Handle, prompt: list[dict], stats: Any):
    self.env, self.eid, self.task, self.handle, self.prompt = env, eid, task, handle, prompt
    self.messages: list[str] = []     # Every step's message so far: the log a replay re-runs.
    self.stats = stats                # The episode's `stats` as its worker last sent them.
    self.worker_seconds = 0.0         # Time its calls ran on workers (the timeout's clock).
    self.replays = 0                  # Times it was rebuilt on another worker.
    self.ended = False
    self.final: Step | None = None    # The Step that ended it: every later close() returns it.

  def step(self, message: str) -> Step:
    out = self._call('step', message)
    self.messages.append(message)
    return out

  def close(self, reason: str) -> Step:
    return self.final or self._call('close', reason)

  def _call(self, method: str, arg: str) -> Step:
    if self.ended:
      raise RuntimeError(f'ray env: {method}() after episode {self.eid} ended')
    try:
      result = self._on_worker(method, arg)
    except (WorkerLost, EpisodeTimeout):
      self.stats = _with_fault(self.stats)
      self._end()
      raise
    self.stats = result.stats
    if result.error is not None or result.step.done:
      self._end()
    if result.error is not None:
      raise result.error
    if result.step.done:
      self.final = result.step
    return result.step

  def _on_worker(self, method: str, arg: str) -> _Result:
    """The call's result from the episode's worker, moving the episode while workers die."""
    while True:
      handle = self.handle
      result = self.env.run(handle, lambda: handle.actor.call.remote(self.eid, method, arg), self)
      if result is not None:
        return result
      self._move()

  def _move(self) -> None:
    """Replays the episode on another worker after losing its own (raises WorkerLost if none can,
    or if it was replayed MOST_REPLAYS times already)."""
    if self.replays >= MOST_REPLAYS:
      raise WorkerLost(f'episode {self.eid}: its worker was lost after {self.replays} replays '
                       'elsewhere (ray_env.MOST_REPLAYS); masked')
    while True:
      handle = self.env.place()
      try:
        result = self.env.run(handle, lambda: handle.actor.replay.remote(
            self.eid, self.task, self.prompt, self.messages), self)
      except EpisodeTimeout:
        self.env.release(handle)
        raise
      if result is None:
        self.env.release(handle)
        continue
      self.env.release(self.handle)
      self.handle, self.replays = handle, self.replays + 1
      if result.error is not None:
        self.stats = result.stats
        raise WorkerLost(f'episode {self.eid}: its worker was lost and the replay failed: {result.error}')
      return

  def _end(self) -> None:
    self.ended = True
    self.env.release(self.handle)


class RayEnv(Environment):
  """`make_env()`'s environment with its episodes on Ray workers (module docstring).

  `address`: a Ray cluster to join; empty: a local Ray sized to the machine (both only where this
  process is not connected to Ray yet). `workers`: actors (0: one per node with CPUs).
  `worker_calls`: calls one actor runs at once. `warm`: prepared episodes per task an actor keeps.
  `episode_timeout_s`: an episode's time on workers.
  """

  def __init__(self, make_env: Callable[[], Environment], *, address: str = '', workers: int = 0,
               worker_calls: int = 64, warm: int = 2, episode_timeout_s: float = 1800.0):
    self.local = make_env()
    self.name, self.words = self.local.name, self.local.words
    self.make_env, self.worker_calls, self.warm = make_env, worker_calls, warm
    self.timeout_s, self.workers = episode_timeout_s, workers
    if not ray.is_initialized():
      # A cluster's workers get this process's code (the research package, 2 MB); a local Ray's
      # import it as this process does.
      ray.init(address=address or None, log_to_driver=False, configure_logging=False,
               runtime_env={'py_modules': [os.path.dirname(research.__file__)]} if address else None)
    self._ids = itertools.count()
    self._lock = threading.Lock()
    self.handles: list[_Handle] = []
    self._start()

  def _start(self) -> str:
    """Starts actors: up to `workers` spread over the cluster, or one on each node with CPUs that
    has none (soft affinity: a node that died since ray.nodes() said otherwise gets none).
    Returns why the last actor that failed to start did ('' if none failed)."""
    with self._lock:
      live = [h for h in self.handles if not h.lost]
    if self.workers:
      where = ['SPREAD'] * (self.workers - len(live))
    else:
      have = {h.node for h in live}
      where = [scheduling_strategies.NodeAffinitySchedulingStrategy(n['NodeID'], soft=True)
               for n in ray.nodes()
               if n['Alive'] and n['Resources'].get('CPU', 0) >= 1 and n['NodeID'] not in have]
    # Two threads beyond the call slots: node(), drop() and at_step() never wait behind calls.
    actors = [_WorkerActor.options(num_cpus=1, max_concurrency=self.worker_calls + 2,
                                   scheduling_strategy=s).remote(self.make_env, self.warm) for s in where]
    why = ''
    for actor in actors:
      try:  # Up, its environment built, before it takes episodes.
        node = ray.get(actor.node.remote())
      except ray.exceptions.RayActorError as e:  # E.g. placed on a node that was dying.
        why = str(e)
        continue
      with self._lock:
        self.handles.append(_Handle(actor, node, threading.BoundedSemaphore(self.worker_calls)))
    return why

  def place(self) -> _Handle:
    """The live worker with the fewest live episodes (starting actors where none is left)."""
    why = ''
    for _ in range(3):
      with self._lock:
        live = [h for h in self.handles if not h.lost]
        if live:
          best = min(live, key=lambda h: h.live)
          best.live += 1
          return best
      why = self._start() or why
    raise WorkerLost(f'ray env: no worker actor could start: {why or "no node has a CPU for one"}')

  def release(self, handle: _Handle) -> None:
    with self._lock:
      handle.live -= 1

  def lost(self, handle: _Handle) -> None:
    """Takes a dead worker out of the pool (killed, so that it cannot come back half-way)."""
    with self._lock:
      first, handle.lost = not handle.lost, True
    if first:
      ray.kill(handle.actor, no_restart=True)

  def run(self, handle: _Handle, submit: Callable[[], Any], ep: RemoteEpisode | None) -> _Result | None:
    """One call on a worker, once it has a free slot. Returns its result, or None if the worker
    died (the caller moves the episode); raises EpisodeTimeout past the episode's time."""
    if handle.lost:
      return None
    with handle.slots:
      left = self.timeout_s - (ep.worker_seconds if ep else 0.0)
      t0 = time.perf_counter()
      try:
        return ray.get(submit(), timeout=max(left, 0.0))
      except ray.exceptions.RayActorError:
        self.lost(handle)
        return None
      except ray.exceptions.GetTimeoutError:
        if ep is None:
          raise
        handle.actor.drop.remote(ep.eid)
        raise EpisodeTimeout(f'episode {ep.eid} ran {self.timeout_s:g}s on workers '
                             '(env.ray_episode_timeout_s)') from None
      finally:
        if ep is not None:
          ep.worker_seconds += time.perf_counter() - t0

  def reset(self, task) -> RemoteEpisode:
    eid = next(self._ids)
    while True:
      handle = self.place()
      try:
        prompt, stats = ray.get(handle.actor.reset.remote(eid, task), timeout=self.timeout_s)
      except ray.exceptions.RayActorError:
        self.release(handle)
        self.lost(handle)
        continue
      return RemoteEpisode(self, eid, task, handle, prompt, stats)

  def sample_task(self, rng: np.random.Generator):
    return self.local.sample_task(rng)

  def at_step(self, step: int) -> None:
    """Drift on the learner's copy and on every worker; workers started on nodes that joined."""
    self.local.at_step(step)
    if not self.workers:
      self._start()
    for h, ref in [(h, h.actor.at_step.remote(step)) for h in self.handles if not h.lost]:
      try:
        ray.get(ref)
      except ray.exceptions.RayActorError:
        self.lost(h)

  def metrics(self, episodes: list[RemoteEpisode]) -> dict[str, float]:
    """The environment's metrics, from each episode's `stats` as its worker last sent them."""
    return self.local.metrics(episodes)

  def demonstrations(self, hint_fraction: float):
    return self.local.demonstrations(hint_fraction)

  def shutdown(self) -> None:
    """Ends the worker actors (the episodes they hold are gone)."""
    for h in self.handles:
      if not h.lost:
        ray.kill(h.actor, no_restart=True)
    self.handles = []
