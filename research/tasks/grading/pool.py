"""A pool of sandboxed graders: tasks graded in parallel, each under its own limits and uid."""
from concurrent import futures
import dataclasses
import os
from pathlib import Path
import queue
import traceback
from typing import Sequence

from research.tasks import sandbox
from research.tasks.grading import grader
from research.tasks.grading.reward import Grade
from research.tasks.task import Task


@dataclasses.dataclass(frozen=True)
class Job:
  task: Task
  tree: Path  # The task's pristine tree.
  patch: str


class GraderPool:
  """Grades jobs on `workers` threads; each busy slot has its own uid (its own process budget)."""

  def __init__(self, workers: int | None = None, *, isolate: bool = True,
               python: str | None = None, limits: sandbox.Limits | None = None,
               alone: bool = True, twin_runs: bool = True):
    """`python` overrides each task's own interpreter; `alone`, `twin_runs`: grader.grade's."""
    self.workers = workers or os.cpu_count() or 1
    self.isolate, self.python, self.limits, self.alone = isolate, python, limits, alone
    self.twin_runs = twin_runs
    self._slots = queue.Queue()
    for slot in range(self.workers):
      self._slots.put(slot)

  def _grade(self, job: Job) -> Grade:
    slot = self._slots.get()
    try:
      return grader.grade(job.task, job.tree, job.patch, python=self.python,
                           isolate=self.isolate, uid=sandbox.uid_for(slot), limits=self.limits,
                           alone=self.alone, twin_runs=self.twin_runs)
    except Exception:  # grader.grade returns its own failures: this is the pool's (reward.reward).
      error = 'harness error: ' + traceback.format_exc(limit=2)[-400:]
      return Grade(error, fault=error)
    finally:
      self._slots.put(slot)

  def grade(self, jobs: Sequence[Job]) -> list[Grade]:
    """Grades in parallel; results in the order of jobs."""
    with futures.ThreadPoolExecutor(self.workers) as ex:
      return list(ex.map(self._grade, jobs))
