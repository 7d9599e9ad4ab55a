"""Streaming RL's rollouts (rl.stream): the learner takes complete groups as they finish.

    groups = GroupStream(sampler.Stream(backend, rows, wait_s), new_group, max_staleness)
    taken = groups.take(params, version, n)   # each update: n groups whose episodes all ended

A GroupStream keeps a Stream's rows busy with the episodes of new groups (one task, G episodes:
the group baseline), and each `take` runs turns until n groups have ended, then hands out the
first n to complete, in that order. Episodes still running carry over to a later take, sampled
on with the newer params (the tokens keep the log-probs they were sampled with; sampler.Stream
says why the cache is kept). A group is dropped whole, counted and never scored, when one of its
episodes started (sampled its first token) more than `max_staleness` updates before the learner:
its baseline needs all G.
"""

from concurrent import futures
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from research.rl.rollout.sampler import RolloutStats, Running, Stream

# new_group(gid) -> (episodes, their tasks, their keys as raw key data): one group's G episodes.
NewGroup = Callable[[int], tuple[list[Any], list[Any], np.ndarray]]


@dataclasses.dataclass(eq=False)
class Group:
  """One task's G episodes in the stream."""
  gid: int
  members: list[Running]

  @property
  def ended(self) -> bool:
    return all(e.ended for e in self.members)

  def oldest(self) -> int | None:
    """The update count of its earliest first token (None: none sampled yet)."""
    started = [e.version for e in self.members if e.version is not None]
    return min(started) if started else None


@dataclasses.dataclass(frozen=True)
class Taken:
  """One take: the groups an update trains on and what carries over."""
  groups: list[Group]               # In the order they completed.
  stats: RolloutStats               # Of the turns since the last take.
  staleness_B: np.ndarray           # Per episode of `groups`: updates between its first token and this one.
  dropped: int                      # Episodes dropped at this take (their group passed the bound).
  running: int                      # Episodes carried over to a later take (in the rows or queued).


class GroupStream:
  """Groups fed to a Stream and taken as they complete (module docstring); `gid` counts groups
  from `first_gid` (a resumed run starts past the groups it used)."""

  def __init__(self, stream: Stream, new_group: NewGroup, max_staleness: int, first_gid: int = 0):
    self.stream, self.new_group = stream, new_group
    self.max_staleness, self.gid = max_staleness, first_gid
    self.live: list[Group] = []       # Not yet taken or dropped.
    self.complete: list[Group] = []   # Ended, in the order they did.
    self._group_of: dict[Running, Group] = {}

  def take(self, params, version: int, n: int) -> Taken:
    """n complete groups for the update after `version` updates, sampling with `params` as needed."""
    dropped = self._drop_stale(version)
    while len(self.complete) < n:
      self._feed()
      ended = [self._group_of.pop(e) for e in self.stream.advance(params, version).ended]
      self.complete += [g for g in dict.fromkeys(ended) if g.ended]  # Once each, in row order.
    out, self.complete = self.complete[:n], self.complete[n:]
    self.live = [g for g in self.live if g not in out]
    trajs = [e.traj for g in out for e in g.members]
    return Taken(out, self.stream.stats(trajs),
                 np.array([version - e.version for g in out for e in g.members], np.int32), dropped,
                 sum(not e.ended for g in self.live for e in g.members))

  def close(self) -> None:
    """Drops every group still in the stream; returns once their episodes are closed (unscored),
    so that nothing calls an environment that is shut down next, or after sampler.env_call_timeout_s
    (a close waits for its episode's call in flight, which may hang for good)."""
    futures.wait(self.stream.drop([e for g in self.live for e in g.members]),
                 timeout=self.stream.b.s.env_call_timeout_s)
    self.live, self.complete = [], []

  def _feed(self) -> None:
    """New groups until every free row has a queued episode to take."""
    while self.stream.free_rows > len(self.stream.queue):
      episodes, tasks, keys = self.new_group(self.gid)
      g = Group(self.gid, self.stream.submit(episodes, keys, tasks=tasks, groups=[self.gid] * len(episodes)))
      self._group_of.update({e: g for e in g.members})
      self.live.append(g)
      self.gid += 1

  def _drop_stale(self, version: int) -> int:
    """Drops the groups with an episode that started more than max_staleness updates ago.
    Returns the episodes dropped."""
    stale = [g for g in self.live if g.oldest() is not None and version - g.oldest() > self.max_staleness]
    for g in stale:
      self.stream.drop(g.members)
      for e in g.members:
        self._group_of.pop(e, None)
    self.live = [g for g in self.live if g not in stale]
    self.complete = [g for g in self.complete if g not in stale]
    return sum(len(g.members) for g in stale)
