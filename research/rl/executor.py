"""Runs untrusted Python out of process under time and memory limits (the pyfunc executor).

`Executor` is the small interface the environment needs; `SubprocessExecutor` is a fresh
`python -I` per run under rlimits (address space, CPU seconds, file size) and a wall-clock timeout
that kills the process group. The harness reads the code and tests from stdin, runs them, and
prints one result line tagged with a per-run nonce; a program that exits early, crashes the
interpreter or prints a forged line without the nonce gets no result and fails.
This isolates faults and runaway code, not a determined adversary: the sandbox issue swaps in its
bubblewrap sandbox behind the same interface.
"""

import dataclasses
import json
import os
import resource
import secrets
import signal
import subprocess
import sys
from typing import Protocol

_HARNESS = r'''
import json, sys, traceback
req = json.loads(sys.stdin.readline())
tag = req.pop('nonce')
def report(**kw):
  sys.stdout.flush()
  sys.__stdout__.write('\n' + tag + ' ' + json.dumps(kw) + '\n')
  sys.__stdout__.flush()
ns = {'__name__': 'solution'}
try:
  exec(compile(req['code'], 'solution.py', 'exec'), ns)
  for call, expected in req['tests']:
    got = eval(call, ns)
    if got != expected:
      report(status='fail', error_type='AssertionError', error=f'assert {call} == {expected!r}, got {got!r}',
             failed={'call': call, 'expected': repr(expected), 'got': repr(got)})
      break
  else:
    report(status='pass')
except BaseException as e:
  tb = traceback.format_exc(limit=-3)
  report(status='error', error_type=type(e).__name__, error=f'{type(e).__name__}: {e}', traceback=tb)
'''


# Keyword-only: research/tasks/sandbox.Limits orders the same names differently.
@dataclasses.dataclass(frozen=True, kw_only=True)
class Limits:
  """A wall-clock timeout and the rlimits the child process runs under."""
  wall_s: float = 5.0
  cpu_s: int = 5
  memory_mb: int = 512
  fsize_mb: int = 1

  def set_rlimits(self):
    """Runs in the child between fork and exec (`preexec_fn`)."""
    mem = self.memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s))
    resource.setrlimit(resource.RLIMIT_FSIZE, (self.fsize_mb << 20,) * 2)


@dataclasses.dataclass
class Result:
  status: str                       # pass | fail | error | timeout | crash
  error_type: str = ''
  error: str = ''
  traceback: str = ''
  failed: dict | None = None        # {'call', 'expected', 'got'} for a failed test.

  @property
  def passed(self) -> bool:
    return self.status == 'pass'


class Executor(Protocol):
  def run(self, code: str, tests: list[tuple[str, object]], limits: Limits) -> Result: ...


class SubprocessExecutor:
  def __init__(self, python: str = sys.executable):
    self.python = python

  def run(self, code: str, tests, limits: Limits = Limits()) -> Result:
    nonce = secrets.token_hex(16)
    req = json.dumps({'code': code, 'tests': [list(t) for t in tests], 'nonce': nonce}) + '\n'
    proc = subprocess.Popen([self.python, '-I', '-c', _HARNESS], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=limits.set_rlimits,
                            start_new_session=True, env={'PATH': os.environ.get('PATH', '')})
    try:
      out, err = proc.communicate(req.encode(), timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.communicate()
      return Result('timeout', 'TimeoutError', f'TimeoutError: no result within {limits.wall_s}s')
    if proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL) and not out:
      # The CPU-seconds limit fired before the wall clock (a loaded machine): also a timeout.
      return Result('timeout', 'TimeoutError', f'TimeoutError: over {limits.cpu_s} CPU seconds')
    for line in reversed(out.decode(errors='replace').splitlines()):
      if line.startswith(nonce + ' '):
        return Result(**json.loads(line[len(nonce) + 1:]))
    tail = err.decode(errors='replace').strip().splitlines()[-1:] or [f'exit code {proc.returncode}']
    return Result('crash', 'Crash', f'the program ended without a result ({tail[0]})')
