"""pyfunc: write a Python function that the task's tests check; tracebacks are the observation.

Each model message is a complete solution (code fences are stripped). It runs out of process
(research/rl/executor.py) against the task's tests; a failure is shown (traceback tail, or the failed
assertion with the expected value) and the model may try again, up to `max_attempts`.
Reward: 1 when the tests pass, minus 0.25 per earlier failed attempt; an episode that never passes
scores 0 if its last attempt ran and failed a test cleanly, and -0.5 if it crashed, timed out, was
empty or never came (so a crash or a stall is never better than an honest wrong answer).
Resubmitting identical code costs 0.25 more.
"""

import dataclasses
import re

import numpy as np

from research.rl.env import Step
from research.rl.executor import Executor, Limits, SubprocessExecutor

FAIL_ATTEMPT, CRASHED, REPEAT = -0.25, -0.5, -0.25


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  spec: str
  tests: tuple[tuple[str, object], ...]


TASKS = (
    Task('add', 'add(a, b) returns a + b.', (('add(2, 3)', 5), ('add(-1, 1)', 0))),
    Task('rev', 'rev(s) returns the string s reversed.', (('rev("abc")', 'cba'), ('rev("")', ''))),
    Task('fact', 'fact(n) returns n factorial.', (('fact(0)', 1), ('fact(5)', 120))),
    Task('evens', 'evens(xs) returns the even numbers of the list xs, in order.',
         (('evens([1, 2, 3, 4])', [2, 4]), ('evens([])', []))),
    Task('isqrt', 'isqrt(n) returns the integer square root of n (use the math module).',
         (('isqrt(15)', 3), ('isqrt(16)', 4))),
    Task('vowels', 'vowels(s) counts the vowels aeiou in s.', (('vowels("banana")', 3), ('vowels("xyz")', 0))),
    Task('fib', 'fib(n) returns the n-th Fibonacci number, fib(0) = 0, fib(1) = 1.',
         (('fib(1)', 1), ('fib(10)', 55))),
    Task('uniq', 'uniq(xs) returns the sorted distinct elements of xs.', (('uniq([3, 1, 3])', [1, 3]),)),
)
_FENCE = re.compile(r'^```(?:python)?\n(.*?)\n?```$', re.S)


class Episode:
  def __init__(self, task: Task, executor: Executor, limits: Limits, max_attempts: int):
    self.task, self.executor, self.limits, self.max_attempts = task, executor, limits, max_attempts
    self.prompt = [{'role': 'user', 'content': f'Write a Python function: {task.spec}'}]
    self.attempts: list[str] = []
    self.repeats = 0
    self.last_clean = False

  def step(self, message: str) -> Step:
    code = message.strip()
    if m := _FENCE.match(code):
      code = m.group(1)
    self.repeats += code in self.attempts
    self.attempts.append(code)
    if not code:
      res = {'status': 'error', 'error_type': 'EmptyAnswer', 'error': 'EmptyAnswer: no code'}
    else:
      r = self.executor.run(code, self.task.tests, self.limits)
      res = dataclasses.asdict(r)
    info = {**res, 'message': message, 'repeat': self.repeats > 0 and code in self.attempts[:-1]}
    penalty = FAIL_ATTEMPT * (len(self.attempts) - 1) + REPEAT * self.repeats
    if res['status'] == 'pass':
      return Step(None, True, 1.0 + penalty, True, info)
    self.last_clean = res['status'] == 'fail'
    if len(self.attempts) >= self.max_attempts:
      return Step(None, True, (0.0 if self.last_clean else CRASHED) + penalty, False, info)
    obs = res['error'] if res['status'] == 'fail' else (res.get('traceback') or res['error'])
    return Step(obs, False, 0.0, False, info)

  def close(self, reason: str) -> Step:
    penalty = FAIL_ATTEMPT * max(len(self.attempts) - 1, 0) + REPEAT * self.repeats
    return Step(None, True, (0.0 if self.last_clean else CRASHED) + penalty, False,
                {'kind': 'closed', 'reason': reason})


class PyFunc:
  name = 'pyfunc'

  def __init__(self, tasks=TASKS, executor: Executor | None = None, limits: Limits = Limits(),
               max_attempts: int = 3):
    self.tasks, self.limits, self.max_attempts = tuple(tasks), limits, max_attempts
    self.executor = executor or SubprocessExecutor()

  def sample_task(self, rng: np.random.Generator) -> Task:
    return self.tasks[int(rng.integers(len(self.tasks)))]

  def reset(self, task: Task) -> Episode:
    return Episode(task, self.executor, self.limits, self.max_attempts)
