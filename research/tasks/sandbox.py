"""Runs a command in a bubblewrap sandbox: no network, own pid namespace, read-only system.

Everything outside the listed binds is invisible. The command runs as an unprivileged uid
(RLIMIT_NPROC does not apply to root) under rlimits, with stdout and stderr read through a pipe
(only head and tail kept), a wall-clock limit that kills the whole process tree, and a seccomp
filter that denies the kernel keyrings (the one store a uid's runs share). A Python command can
instead be forked into its sandbox from a zygote that imported its modules once (Zygote; the
zygote is this module run as a script, at its end).
"""
import contextlib
import ctypes
import dataclasses
import errno
import functools
import gc
import importlib
import json
import os
from pathlib import Path
import platform
import resource
import runpy
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from typing import Callable, Mapping, Sequence

BWRAP, PRLIMIT, SETPRIV = 'bwrap', 'prlimit', 'setpriv'
# Distinct uids keep concurrent sandboxes from sharing one RLIMIT_NPROC budget (a command that
# holds its uid's processes would starve every other sandbox of that uid): each process gets its
# own block of UIDS_PER_PROCESS (one per grader slot or live episode).
BASE_UID = 200_000
UIDS_PER_PROCESS = 1024


def uid_for(slot: int = 0) -> int:
  return BASE_UID + (os.getpid() % 50_000) * UIDS_PER_PROCESS + slot % UIDS_PER_PROCESS
_SYSTEM_DIRS = ('/usr', '/bin', '/sbin', '/lib', '/lib64', '/lib32')


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-run resource limits."""
  cpu_s: int = 60
  wall_s: float = 120.0
  memory_mb: int = 2048
  nproc: int = 64
  fsize_mb: int = 64
  tmp_mb: int = 256
  output_kb: int = 64  # How much output is kept (half head, half tail).


@dataclasses.dataclass(frozen=True)
class Completed:
  """How a sandboxed command ended."""
  returncode: int
  timed_out: bool
  wall_s: float
  output: str
  # Set when bubblewrap itself failed, i.e. the command never ran: a harness fault.
  sandbox_error: str | None = None

  @property
  def signal(self) -> int | None:
    """The signal that killed the command (bwrap reports it as 128 + n)."""
    if self.returncode < 0:
      return -self.returncode
    if self.returncode > 128:
      return self.returncode - 128
    return None


@functools.cache
def _python_paths(python: str) -> tuple[str, str, list[str]]:
  out = subprocess.run(
      [python, '-I', '-c',
       'import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, sys.path]))'],
      check=True, capture_output=True, text=True).stdout
  return tuple(json.loads(out))


@functools.cache
def python_roots(python: str) -> tuple[str, ...]:
  """Directories an interpreter needs: its prefixes and any sys.path entry outside them."""
  prefix, base, path = _python_paths(python)
  roots = [prefix, base]
  for entry in path:
    if os.path.isdir(entry) and not any(_under(entry, r) for r in roots):
      roots.append(entry)
  return tuple(roots)


@functools.cache
def python_hidden(python: str) -> tuple[str, ...]:
  """Site directories inside python_roots that the interpreter does not use: a venv's base
  interpreter's site-packages. Sandboxes cover them with an empty tmpfs, so that what is
  installed there (other versions of the test tools, copies of the library a task deletes
  code from) is out of the policy's and the tests' view."""
  prefix, base, path = _python_paths(python)
  if prefix == base:
    return ()
  used = {os.path.realpath(p) for p in path}
  return tuple(sorted(str(d) for d in Path(base).glob('lib/python3*/site-packages')
                      if d.is_dir() and os.path.realpath(d) not in used))


def _under(path: str, root: str) -> bool:
  return os.path.commonpath([path, root]) == root


def available() -> bool:
  return all(shutil.which(tool) for tool in (BWRAP, PRLIMIT, SETPRIV))


def _which(tool: str) -> str:
  path = shutil.which(tool)
  if path is None:
    raise FileNotFoundError(f'{tool} is not installed (bubblewrap: `make sysdeps`; '
                            f'prlimit and setpriv: util-linux)')
  return path


def _rlimits(limits: Limits) -> list[tuple[str, str, int, int]]:
  """The command's rlimits: (prlimit's option, resource's name, soft, hard)."""
  mb = 1 << 20
  return [('cpu', 'RLIMIT_CPU', limits.cpu_s, limits.cpu_s + 1),
          ('as', 'RLIMIT_AS', limits.memory_mb * mb, limits.memory_mb * mb),
          ('nproc', 'RLIMIT_NPROC', limits.nproc, limits.nproc),
          ('fsize', 'RLIMIT_FSIZE', limits.fsize_mb * mb, limits.fsize_mb * mb),
          ('core', 'RLIMIT_CORE', 0, 0)]


def _rlimit_argv(limits: Limits) -> list[str]:
  return [_which(PRLIMIT), *(f'--{o}={s}:{h}' for o, _, s, h in _rlimits(limits)), '--']


# The kernel's keyrings are kept per uid and outlive a run: through them one run of a grading
# (or one task's) left data for the next (a red team handed a grading's answers from its main
# run to its isolated run, and one task's outputs to another). The sandbox's seccomp filter
# fails `add_key`, `request_key` and `keyctl` with EPERM, as Docker's default profile does; a
# foreign system-call ABI (x86's 32-bit or x32 calls) fails whole. Per architecture: its
# AUDIT_ARCH and the three calls' numbers.
_KEYRING_CALLS = {'x86_64': (0xC000003E, (248, 249, 250)),
                  'aarch64': (0xC00000B7, (217, 218, 219))}
_X32_BIT = 0x40000000


def seccomp_program(machine: str | None = None) -> bytes:
  """The classic BPF program bwrap's `--seccomp` loads (struct sock_filter, native order)."""
  machine = machine or platform.machine()
  if machine not in _KEYRING_CALLS:
    raise OSError(f'no seccomp filter for the architecture {machine!r} '
                  f'(known: {sorted(_KEYRING_CALLS)})')
  arch, calls = _KEYRING_CALLS[machine]
  ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
  allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
  n = len(calls)
  program = [(ld_abs, 0, 0, 4),  # seccomp_data.arch
             (jeq, 1, 0, arch), (ret, 0, 0, deny),
             (ld_abs, 0, 0, 0),  # seccomp_data.nr
             (jge, n + 1, 0, _X32_BIT)]
  program += [(jeq, n - i, 0, nr) for i, nr in enumerate(calls)]
  program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
  return b''.join(struct.pack('=HBBI', *op) for op in program)


def _bwrap_argv(ro: Sequence[str], rw: Sequence[str], cwd: str, env: Mapping[str, str],
                limits: Limits, uid: int, hide: Sequence[str] = (),
                seccomp_fd: int | None = None, info_fd: int | None = None) -> list[str]:
  argv = [_which(BWRAP), '--unshare-pid', '--unshare-net', '--unshare-ipc', '--unshare-uts',
          '--unshare-cgroup-try', '--die-with-parent', '--new-session', '--clearenv',
          *(['--seccomp', str(seccomp_fd)] if seccomp_fd is not None else []),
          *(['--info-fd', str(info_fd)] if info_fd is not None else []),
          '--proc', '/proc', '--dev', '/dev',
          '--perms', '1777', '--size', str(limits.tmp_mb << 20), '--tmpfs', '/tmp',
          # multiprocessing needs POSIX semaphores, which live in /dev/shm.
          '--perms', '1777', '--size', str(limits.tmp_mb << 20), '--tmpfs', '/dev/shm']
  for d in _SYSTEM_DIRS:
    if os.path.islink(d):
      argv += ['--symlink', os.readlink(d), d]
    elif os.path.isdir(d):
      argv += ['--ro-bind', d, d]
  made = {'/', '/tmp', *_SYSTEM_DIRS}
  binds = sorted([(p, '--ro-bind') for p in ro] + [(p, '--bind') for p in rw],
                 key=lambda b: b[0].count('/'))
  for path, flag in binds:
    # bwrap creates missing parents as 0700, which the unprivileged uid cannot traverse.
    for parent in reversed(Path(path).parents):
      if str(parent) not in made:
        made.add(str(parent))
        argv += ['--perms', '0755', '--dir', str(parent)]
    argv += [flag, path, path]
    made.add(path)
  for path in hide:  # After the binds: an empty tmpfs over a directory inside one of them.
    argv += ['--tmpfs', path]
  for k, v in env.items():
    argv += ['--setenv', k, v]
  argv += ['--chdir', cwd,
           _which(SETPRIV), f'--reuid={uid}', f'--regid={uid}', '--clear-groups',
           '--inh-caps=-all', '--bounding-set=-all']
  return argv


class _Tail:
  """Keeps the head and tail of a stream, so a flood of output costs no memory."""

  def __init__(self, keep: int):
    self._half = keep // 2
    self.head = bytearray()
    self.tail = bytearray()
    self.total = 0

  def drain(self, stream) -> None:
    while chunk := stream.read1(1 << 16):
      self.total += len(chunk)
      room = self._half - len(self.head)
      self.head += chunk[:max(room, 0)]
      self.tail += chunk[max(room, 0):]
      if len(self.tail) > self._half:
        del self.tail[:len(self.tail) - self._half]

  def text(self) -> str:
    cut = self.total - len(self.head) - len(self.tail)
    middle = b'\n[... %d bytes cut ...]\n' % cut if cut else b''
    return (self.head + middle + self.tail).decode('utf-8', 'replace')


def run(argv: Sequence[str], *, cwd: str | os.PathLike, ro: Sequence[str | os.PathLike] = (),
        rw: Sequence[str | os.PathLike] = (), env: Mapping[str, str] | None = None,
        limits: Limits = Limits(), stdin: bytes = b'', uid: int | None = None,
        isolate: bool = True, pass_fds: Sequence[int] = (),
        hide: Sequence[str | os.PathLike] = (), watch: Callable[[], bool] | None = None,
        watch_s: float = 1.0, stop: threading.Event | None = None,
        zygote: 'Zygote | None' = None) -> Completed:
  """Runs argv with only `ro` (read-only) and `rw` binds visible, at their host paths.

  `pass_fds` stay open in the command at the same numbers (e.g. a pipe the harness reads).
  `hide` are directories inside the binds that appear empty (e.g. python_hidden).
  `watch` is asked every `watch_s` while the command runs; True kills it (e.g. a work area that
  outgrew its budget: the file-size limit bounds each file, not how many).
  `stop`, set by another thread while the command runs, kills it at once (e.g. a harness that has
  read from a pipe all it needs); run sets it too, as the command ends.
  `zygote`: argv is `zygote.python -I -B SCRIPT|-c CODE ARGS...` in the zygote's environment, and
  runs as a fork of it that joins the sandbox (see Zygote), not as an exec'd interpreter.

  With isolate=False the same command runs as a plain subprocess under the same rlimits and
  wall clock, for comparison (it sees the whole machine).
  """
  spec = _Spec(os.fspath(cwd), [os.fspath(p) for p in ro], [os.fspath(p) for p in rw],
               [os.fspath(p) for p in hide], dict(env or {}), limits,
               uid_for() if uid is None else uid, tuple(pass_fds), watch, watch_s, stop)
  if zygote is None:
    return _exec(spec, argv, stdin, isolate)
  if not isolate or stdin:
    raise ValueError('runs of a zygote are sandboxed and read no input')
  return _forked(spec, zygote, zygote.request(argv, spec.env))


@dataclasses.dataclass(frozen=True)
class _Spec:
  """What run() was asked for (paths as strings)."""
  cwd: str
  ro: list[str]
  rw: list[str]
  hide: list[str]
  env: dict[str, str]
  limits: Limits
  uid: int
  pass_fds: tuple[int, ...]
  watch: Callable[[], bool] | None
  watch_s: float
  stop: threading.Event | None

  def bwrap(self, seccomp_fd: int, info_fd: int | None = None) -> list[str]:
    """bwrap's command line up to the command; the writable binds handed to the uid."""
    for p in self.rw:
      _chown_tree(p, self.uid)
    return _bwrap_argv(self.ro, self.rw, self.cwd, self.env, self.limits, self.uid, self.hide,
                       seccomp_fd, info_fd)

  def wait(self, ended: threading.Event, start: float, kill: Callable[[], None]) -> bool:
    """_wait under this run's wall clock, watch and stop."""
    return _wait(ended, start + self.limits.wall_s, self.watch, self.watch_s, self.stop, kill)


def _exec(spec: _Spec, argv: Sequence[str], stdin: bytes, isolate: bool) -> Completed:
  """run() of a command exec'd in its sandbox (or, isolate=False, as a plain subprocess)."""
  seccomp = _seccomp_fd() if isolate else None
  prefix, popen_env = (spec.bwrap(seccomp), {}) if isolate else ([], spec.env)
  start = time.perf_counter()
  # A pipe, not a file: the command can neither truncate nor rewrite what it already wrote.
  try:
    proc = subprocess.Popen([*prefix, *_rlimit_argv(spec.limits), *argv], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=spec.cwd,
                            env=popen_env, start_new_session=True,
                            pass_fds=spec.pass_fds + ((seccomp,) if isolate else ()))
  except OSError as e:  # Nothing ran (a missing tool, no processes left): the harness's fault.
    return Completed(-1, False, time.perf_counter() - start, '', f'could not start: {e}')
  finally:
    if seccomp is not None:
      os.close(seccomp)
  output = _Tail(spec.limits.output_kb << 10)
  reader = threading.Thread(target=output.drain, args=(proc.stdout,), daemon=True)
  reader.start()
  try:
    proc.stdin.write(stdin)
    proc.stdin.close()
  except BrokenPipeError:
    pass  # The command exited without reading its input; its exit status says why.
  ended = threading.Event()
  threading.Thread(target=lambda: (proc.wait(), ended.set()), daemon=True).start()
  timed_out = spec.wait(ended, start, lambda: _kill(proc))
  reader.join()
  proc.stdout.close()
  text = output.text()
  error = text.strip() if isolate and proc.returncode == 1 and text.startswith('bwrap:') else None
  return Completed(proc.returncode, timed_out, time.perf_counter() - start, text, error)


def _seccomp_fd() -> int:
  """A pipe's read end holding the seccomp filter (bwrap reads it; a few dozen bytes, so the
  write never blocks)."""
  read_end, write_end = os.pipe()
  os.write(write_end, seccomp_program())
  os.close(write_end)
  return read_end


def _kill(proc: subprocess.Popen) -> None:
  """Kills the command's process group: for bwrap, the namespace's init, which takes every
  process inside with it."""
  with contextlib.suppress(ProcessLookupError):  # The command ended meanwhile.
    os.killpg(proc.pid, signal.SIGKILL)


def _wait(ended: threading.Event, deadline: float, watch: Callable[[], bool] | None,
          watch_s: float, stop: threading.Event | None, kill: Callable[[], None]) -> bool:
  """Waits for `ended` until `deadline` (perf_counter), asking `watch` every `watch_s`; calls
  `kill` when time is up, `watch` says so or `stop` is set, and waits for the end it brings.
  Returns whether the wall clock ran out."""
  wake = stop or threading.Event()
  threading.Thread(target=lambda: (ended.wait(), wake.set()), daemon=True).start()
  while True:
    left = deadline - time.perf_counter()
    wake.wait(max(min(left, watch_s) if watch else left, 0))
    if ended.is_set():
      return False
    timed_out = time.perf_counter() >= deadline
    if timed_out or wake.is_set() or watch and watch():
      kill()
      ended.wait()
      return timed_out


# --- Runs forked from a zygote ------------------------------------------------------------------
ZYGOTE = Path(__file__)  # Run as a script: the zygote's side is at the end of this module.
# What a forked run's sandbox runs while the run is in it: it prints once the sandbox is set up,
# and ends (ending the sandbox) when the harness closes its input after the run.
_PLACEHOLDER = ('/bin/sh', '-c', 'echo ready && exec cat >/dev/null')
# How long a zygote may take to import its modules before runs are the harness's faults.
_ZYGOTE_START_S = 120.0


class Zygote:
  """An interpreter that has imported `preload` once and forks sandboxed runs of itself.

  A run of `python -I -B` costs its start-up and imports each time (pytest's: about 90 ms, most
  of a short test run). A zygote (this module as a script, outside any sandbox) pays them once;
  for each run the harness sets up a bubblewrap sandbox exactly as for an exec'd command, with a
  placeholder command, and the zygote forks a process that joins the sandbox's namespaces and
  root, takes the run's rlimits, uid, seccomp filter and session as bwrap, setpriv and prlimit
  give them, checks them, and runs the script. Every run of one zygote starts from the same state
  (no code of a run ever runs in the zygote), so runs differ in what they are given, not in
  when they ran. Threads share one zygote; it starts on first use and restarts if it died.
  """

  def __init__(self, python: str, env: Mapping[str, str], preload: Sequence[str] = ()):
    self.python, self.env, self.preload = python, dict(env), tuple(preload)
    self._lock = threading.Lock()
    self._proc: subprocess.Popen | None = None
    self._sock: socket.socket | None = None

  def request(self, argv: Sequence[str], env: Mapping[str, str]) -> dict:
    """What the zygote needs of `argv`, a command it can run in `env`."""
    argv = [os.fspath(a) for a in argv]
    if argv[:3] != [self.python, '-I', '-B'] or len(argv) < 4 or argv[3] == '-c' and len(argv) < 5:
      raise ValueError(f'a zygote of {self.python} runs `{self.python} -I -B SCRIPT|-c CODE ...`, '
                       f'not {argv[:4]}')
    if dict(env) != self.env:
      raise ValueError(f'a zygote runs in the environment it started in, not {dict(env)}')
    code = argv[3] == '-c'
    return {'script': None if code else argv[3], 'code': argv[4] if code else None,
            'args': argv[5 if code else 4:], 'env': self.env}

  def _start(self) -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    log = tempfile.TemporaryFile()
    with theirs:
      proc = subprocess.Popen(
          [self.python, '-I', '-B', str(ZYGOTE), str(theirs.fileno()), *self.preload],
          env=self.env, cwd='/', stdin=subprocess.DEVNULL, stdout=log, stderr=log,
          pass_fds=(theirs.fileno(),), start_new_session=True)
    mine.settimeout(_ZYGOTE_START_S)
    try:
      ready = mine.recv(16)
    except TimeoutError:
      ready = b''
    if ready != b'ready':
      proc.kill()
      proc.wait()
      log.seek(0)
      raise OSError(f'the zygote of {self.python} did not start: {log.read()[-500:]!r}')
    mine.settimeout(None)
    self._proc, self._sock = proc, mine

  def send(self, request: dict, fds: Sequence[int]) -> None:
    with self._lock:
      if self._proc is None or self._proc.poll() is not None:
        self._start()
      socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))


_ZYGOTES: dict[tuple, Zygote] = {}
_ZYGOTES_LOCK = threading.Lock()


def zygote_for(python: str, env: Mapping[str, str], preload: Sequence[str] = ()) -> Zygote:
  """This process's zygote of `python` in `env` with `preload` imported (one per key)."""
  key = (python, tuple(sorted(env.items())), tuple(preload))
  with _ZYGOTES_LOCK:
    if key not in _ZYGOTES:
      _ZYGOTES[key] = Zygote(python, env, preload)
    return _ZYGOTES[key]


def _placeholder(spec: _Spec) -> tuple[subprocess.Popen, int] | Completed:
  """bwrap started around the placeholder and waited on until it has set the sandbox up:
  (bwrap, the host pid of the sandbox's pid 1), or how bwrap failed (nothing ran)."""
  seccomp = _seccomp_fd()
  info_read, info_write = os.pipe()
  start = time.perf_counter()
  try:
    proc = subprocess.Popen([*spec.bwrap(seccomp, info_write), *_rlimit_argv(spec.limits),
                             *_PLACEHOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, cwd=spec.cwd, env={},
                            start_new_session=True, pass_fds=(seccomp, info_write))
  except OSError as e:
    os.close(info_read)
    return Completed(-1, False, time.perf_counter() - start, '', f'could not start: {e}')
  finally:
    os.close(seccomp)
    os.close(info_write)
  with os.fdopen(info_read, 'rb') as info:
    first = proc.stdout.readline()
    if first == b'ready\n':
      return proc, json.loads(info.read())['child-pid']  # bwrap writes it in pieces, then closes it.
  with proc:
    proc.stdin.close()
    text = (first + proc.stdout.read()).decode('utf-8', 'replace')
  return Completed(proc.returncode, False, time.perf_counter() - start, text,
                   text.strip() or f'bwrap ended with {proc.returncode} before its command')


def _forked(spec: _Spec, zygote: Zygote, request: dict) -> Completed:
  """run() of a zygote's command: the sandbox set up by bwrap around a placeholder, the command
  forked into it by the zygote."""
  start = time.perf_counter()
  started = _placeholder(spec)
  if isinstance(started, Completed):
    return started
  proc, ns_pid = started
  with proc:
    out_read, out_write = os.pipe()
    status, remote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      zygote.send({**request, 'ns_pid': ns_pid, 'cwd': spec.cwd, 'uid': spec.uid,
                   'fds': list(spec.pass_fds), 'seccomp': seccomp_program().hex(),
                   'rlimits': [r[1:] for r in _rlimits(spec.limits)]},
                  [remote.fileno(), out_write, *spec.pass_fds])
    except OSError as e:
      _kill(proc)
      os.close(out_read)
      return Completed(-1, False, time.perf_counter() - start, '', f'zygote failed: {e}')
    finally:
      remote.close()
      os.close(out_write)
    output = _Tail(spec.limits.output_kb << 10)
    with status, os.fdopen(out_read, 'rb') as out:
      reader = threading.Thread(target=output.drain, args=(out,), daemon=True)
      reader.start()
      ended, report = threading.Event(), []
      threading.Thread(target=lambda: (report.append(status.recv(1 << 16)), ended.set()),
                       daemon=True).start()
      # Killing bwrap ends the run with its namespace: the keeper reports that end.
      timed_out = spec.wait(ended, start, lambda: _kill(proc))
      proc.stdin.close()  # The placeholder ends, and bwrap's init takes what the run left.
      proc.wait()
      reader.join()
  result = json.loads(report[0] or b'{"error": "the keeper ended without a report"}')
  wall_s, text = time.perf_counter() - start, output.text()
  if 'error' in result:
    return Completed(-1, timed_out, wall_s, text, f'zygote failed: {result["error"]}')
  code = os.waitstatus_to_exitcode(result['status'])
  # As bwrap reports its command's end: 128 + the signal that killed it.
  return Completed(128 - code if code < 0 else code, timed_out, wall_s, text)


def _chown_tree(root: str, uid: int) -> None:
  os.chown(root, uid, uid, follow_symlinks=False)
  for dirpath, dirnames, filenames in os.walk(root):
    for name in dirnames + filenames:
      os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


# --- The zygote: this module run as a script by a task's interpreter ----------------------------
# `python -I -B sandbox.py SOCKET_FD MODULE...`, outside any sandbox, in the environment its runs
# get (the module imports only the standard library, so any interpreter of the task runs it).
# It holds nothing but its imports (with _pytest.config, pytest's builtin plugins too): no task,
# no answer. Per request (a JSON message and its descriptors on the socket: Zygote.send) it forks
# a keeper, which joins every namespace of a bubblewrap sandbox that is already set up (its pid
# 1's: mount, pid, network, IPC, UTS, cgroup), and forks the run inside it. The run takes the
# sandbox's root and the request's directory, descriptors and rlimits, drops to the request's uid
# with no groups and no capability in any set, sets no_new_privs, loads the seccomp filter,
# checks all of that in /proc/self/status, and only then runs the request's script or code as
# `__main__`. The keeper reports the run's wait status (or why it could not start it) on the
# request's own socket.
_LIBC = ctypes.CDLL(None, use_errno=True)
# A run's code can replace os._exit: its ends go through the one taken here.
_EXIT = os._exit
_NAMESPACES = ('cgroup', 'ipc', 'uts', 'net', 'pid', 'mnt')  # mnt last: it changes the root.
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _PR_CAPBSET_DROP = 1, 38, 22, 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, _SECCOMP_MODE_FILTER = 47, 4, 2
# What the run's /proc/self/status must say before any of the request's code runs.
_CAP_FIELDS = ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')


class _Filter(ctypes.Structure):
  _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
  _fields_ = [('version', ctypes.c_uint32), ('pid', ctypes.c_int)]


class _CapData(ctypes.Structure):
  _fields_ = [('effective', ctypes.c_uint32), ('permitted', ctypes.c_uint32),
              ('inheritable', ctypes.c_uint32)]


def _checked(result: int, what: str) -> None:
  if result != 0:
    code = ctypes.get_errno()
    raise OSError(code, f'{what}: {os.strerror(code)}')


def _join_sandbox(pid: int) -> None:
  """Joins the namespaces of `pid` (the sandbox's pid 1) and takes its root."""
  fds = [os.open(f'/proc/{pid}/ns/{ns}', os.O_RDONLY) for ns in _NAMESPACES]
  root = os.open(f'/proc/{pid}/root', os.O_RDONLY | os.O_DIRECTORY)
  try:
    for ns, fd in zip(_NAMESPACES, fds):
      _checked(_LIBC.setns(fd, 0), f'setns {ns}')
    os.fchdir(root)
    os.chroot('.')
  finally:
    for fd in [*fds, root]:
      os.close(fd)
  # The sandbox's /proc is its pid namespace's: its pid 1 must have the root just taken.
  if _identity(os.stat('/')) != _identity(os.stat('/proc/1/root/')):
    raise OSError('the joined root is not the sandbox\'s')


def _identity(stat: os.stat_result) -> tuple[int, int]:
  return stat.st_dev, stat.st_ino


def _drop_privileges(uid: int, seccomp: bytes) -> None:
  """Becomes `uid` with no groups, no capability in any set, no_new_privs and `seccomp`."""
  os.setgroups([])
  os.setresgid(uid, uid, uid)
  with open('/proc/sys/kernel/cap_last_cap') as f:
    last = int(f.read())
  for cap in range(last + 1):
    _checked(_LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f'drop capability {cap}')
  _checked(_LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), 'clear ambient')
  os.setresuid(uid, uid, uid)  # Clears the permitted and effective sets (no keep-caps).
  data = (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3: two words, all zero.
  _checked(_LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), 'capset')
  _checked(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 'no_new_privs')
  program = ctypes.create_string_buffer(seccomp, len(seccomp))
  prog = _Filter(len(seccomp) // 8, ctypes.cast(program, ctypes.c_void_p))
  _checked(_LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), 'seccomp')
  with open('/proc/self/status') as f:
    status = dict(line.rstrip('\n').split(':\t', 1) for line in f if ':\t' in line)
  ids = f'{uid}\t{uid}\t{uid}\t{uid}'
  wrong = [k for k in _CAP_FIELDS if int(status[k], 16)] + [
      k for k, want in (('Uid', ids), ('Gid', ids), ('Groups', ''), ('NoNewPrivs', '1'),
                        ('Seccomp', '2')) if status[k].strip() != want.strip()]
  if wrong:
    raise OSError(f'privileges not dropped: {wrong}')


def _run_forked(request: dict, fds: list[int], report: int) -> None:
  """The run (a child of the keeper, inside the sandbox): never returns."""
  try:
    _checked(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), 'pdeathsig')
    os.chdir(request['cwd'])
    # Every descriptor moved above the numbers it goes to, then put there: no dup2 overwrites
    # one still to be placed. `report` stays above them until the set-up is done.
    targets = [1, *request['fds']]
    base = max([2, report, *fds, *targets]) + 1
    moved = [os.dup2(fd, base + i) for i, fd in enumerate([*fds, report])]
    report = moved.pop()
    os.dup2(os.open('/dev/null', os.O_RDONLY), 0)
    os.dup2(moved[0], 2)
    for fd, target in zip(moved, targets):
      os.dup2(fd, target)  # dup2 leaves the copy inheritable.
    keep = {0, 1, 2, report, *targets}
    for fd in map(int, os.listdir('/proc/self/fd')):
      if fd not in keep:
        try:
          os.close(fd)
        except OSError:
          pass  # listdir's own descriptor, closed already.
    for name, soft, hard in request['rlimits']:
      resource.setrlimit(getattr(resource, name), (soft, hard))
    _drop_privileges(request['uid'], bytes.fromhex(request['seccomp']))
  except BaseException:  # noqa: BLE001 - nothing of the request ran: the keeper reports it.
    os.write(report, json.dumps({'error': traceback.format_exc(limit=3)[-600:]}).encode())
    _EXIT(1)
  os.close(report)
  code = 1
  try:
    os.environ.clear()
    os.environ.update(request['env'], PWD=request['cwd'])  # bwrap's --chdir sets PWD.
    sys.argv = [request['script'] or '-c', *request['args']]
    if request['script']:
      runpy.run_path(request['script'], run_name='__main__')
    else:
      main = types.ModuleType('__main__')
      sys.modules['__main__'] = main
      exec(compile(request['code'], '<string>', 'exec'), vars(main))
    code = 0
  except SystemExit as e:  # As the interpreter ends: None is 0, an int the status, else printed.
    if e.code is None or isinstance(e.code, int):
      code = e.code or 0
    else:
      print(e.code, file=sys.stderr)
  except BaseException:  # noqa: BLE001 - as an interpreter does: the traceback, status 1.
    traceback.print_exc()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # noqa: BLE001 - a closed or broken stream: the run is over anyway.
        pass
    _EXIT(code & 0xFF)


def _keep_run(request: dict, fds: list[int]) -> None:
  """The keeper (a child of the zygote): joins the sandbox, forks the run, reports its end."""
  status_fd = fds.pop(0)
  try:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _checked(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), 'pdeathsig')
    _join_sandbox(request['ns_pid'])
    os.setsid()  # A session of its own that the run is in and does not lead, as under bwrap.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
      try:
        os.close(read_end)
        os.close(status_fd)
        _run_forked(request, fds, write_end)
      finally:
        _EXIT(1)  # Never back into the keeper's code.
    os.close(write_end)
    for fd in fds:
      os.close(fd)
    with os.fdopen(read_end, 'rb') as f:
      error = f.read()  # Empty once the run closed it, i.e. is past its set-up.
    _, status = os.waitpid(pid, 0)
    result = json.loads(error) if error else {'status': status}
  except BaseException:  # noqa: BLE001 - reported: the harness fault of a run that never ran.
    result = {'error': traceback.format_exc(limit=3)[-600:]}
  try:
    os.write(status_fd, json.dumps(result).encode())
  finally:
    _EXIT(0)


def zygote_main() -> None:
  sock = socket.socket(fileno=int(sys.argv[1]))
  for module in sys.argv[2:]:
    importlib.import_module(module)
  config = sys.modules.get('_pytest.config')
  if config is not None:  # pytest imports its builtin plugins at every start: here, once.
    for name in (*getattr(config, 'essential_plugins', ()), *config.default_plugins):
      importlib.import_module(f'_pytest.{name}')
  # What the preloads made is never freed: out of the collector's sight, a run's collections
  # (pytest forces some at its end) walk only what the run made, and forked pages stay shared.
  gc.freeze()
  # No death signal here (it follows the thread that started the zygote): the zygote ends when
  # the harness's end of the socket closes, i.e. with the harness.
  signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # Keepers are reaped by the kernel.
  sock.send(b'ready')
  while True:
    message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 64)
    if not message:
      return  # The harness closed the socket.
    if os.fork() == 0:
      sock.close()
      _keep_run(json.loads(message), fds)
    for fd in fds:
      os.close(fd)


if __name__ == '__main__':
  zygote_main()
