"""Calls one function of the tree on given inputs, or records the inputs its tests call it with.

Run as `python -I -B calls.py CONFIG` in the sandbox (research/tasks/grading/differential.py
writes the config): standalone, the standard library and, for `trace`, pytest; `record.py`, copied
beside it, encodes values as exact builtins, as sealed asserts record them.

- `call`: imports the module, calls the function on each input (a Python literal of
  `[args, kwargs]`) under a per-call timer, and prints, after the config's marker, one JSON line:
  per input `['ok', result, args after the call]` (record.py's encodings), `['raise', type name]`
  or `['timeout']`. Grading runs it on the original and on the candidate, in separate sandboxes,
  and compares the lines outside.
- `trace`: runs pytest on the given tests (the factory's run of the original) with the function
  wrapped wherever a module holds it, and prints the encoded `[args, kwargs]` of its first calls.
"""
import ast
import json
import os
import signal
import sys

_BUDGET = 1 << 20  # Nodes and characters of one encoding (record.py's budget).


class _Timeout(BaseException):
  """A call that ran past its time (BaseException: the function's `except Exception` misses it)."""


def _record():
  """record.py, copied beside this file (imported before any code of the tree)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  try:
    import record  # pylint: disable=import-outside-toplevel
  finally:
    del sys.path[0]
  return record


_RECORD = []  # record.py, once main() loaded it.


def _encode(value) -> list:
  try:
    encode = _RECORD[0].encode
    return encode(value, 0, [_BUDGET], 'differential', encode)
  except Exception:  # pylint: disable=broad-except
    return ['?']


def _function(job: dict):
  import importlib
  sys.path[:0] = job['prepend_path']
  sys.path.extend(job['append_path'])
  return getattr(importlib.import_module(job['module']), job['function'])


def _alarm(signum, frame):
  del signum, frame
  raise _Timeout


def _one(fn, literal: str, seconds: float) -> list:
  args, kwargs = ast.literal_eval(literal)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    result = fn(*args, **kwargs)
  except _Timeout:
    return ['timeout']
  except BaseException as e:  # pylint: disable=broad-except
    return ['raise', type(e).__name__]
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
  return ['ok', _encode(result), _encode([args, kwargs])]


def call(job: dict) -> list:
  signal.signal(signal.SIGALRM, _alarm)
  fn = _function(job)
  return [_one(fn, literal, job['per_call_s']) for literal in job['inputs']]


class _Tracer:
  """pytest plugin: after collection, the function is wrapped in every module that holds it."""

  def __init__(self, job: dict):
    self.job, self.calls = job, []

  def pytest_collection_finish(self, session):
    del session
    fn = sys.modules[self.job['module']].__dict__.get(self.job['function'])
    if fn is None:
      return
    calls, limit = self.calls, self.job['limit']

    def traced(*args, **kwargs):
      if len(calls) < limit:
        encoded = _encode([list(args), kwargs])  # Before the call: it may change its arguments.
        if encoded not in calls:
          calls.append(encoded)
      return fn(*args, **kwargs)
    for module in list(sys.modules.values()):
      space = getattr(module, '__dict__', {})
      for name, value in list(space.items()):
        if value is fn:
          space[name] = traced


def trace(job: dict) -> list:
  import pytest
  sys.path[:0] = job['prepend_path']
  sys.path.extend(job['append_path'])
  tracer = _Tracer(job)
  pytest.main(job['pytest_args'], plugins=[tracer])
  return tracer.calls


def main():
  _RECORD.append(_record())
  with open(sys.argv[1]) as f:
    job = json.load(f)
  out = {'call': call, 'trace': trace}[job['mode']](job)
  sys.stdout.flush()
  os.write(1, (job['marker'] + json.dumps(out) + '\n').encode())
  os._exit(0)  # pylint: disable=protected-access


if __name__ == '__main__':
  main()
