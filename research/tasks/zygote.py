"""A Python interpreter that has imported its preloads once and forks a process per sandboxed run.

Run by the harness, outside any sandbox, as `python -I -B zygote.py SOCKET_FD MODULE...`, in the
environment its runs get; standalone (the standard library and the preloaded modules), because
it runs under a task's own interpreter. It holds nothing but those imports (with _pytest.config,
pytest's builtin plugins too): no task, no answer.

Per request (a JSON line and its file descriptors on the socket, research/tasks/sandbox.py's
`Zygote` sends them) it forks a keeper, which joins every namespace of a bubblewrap sandbox that
is already set up (its pid 1's: mount, pid, network, IPC, UTS, cgroup), and forks the run inside
it. The run takes the sandbox's root and the request's directory, file descriptors, rlimits and
session, drops to the request's uid with no groups and no capability in any set, sets
no_new_privs, loads the seccomp filter, checks all of that in /proc/self/status, and only then
executes the request's script or code as `__main__`. The keeper reports the run's wait status
(or why it could not start it) on the request's own socket. The run starts as an exec'd
interpreter would (same flags, path, environment and preloads), without paying the imports again.
"""
import ctypes
import gc
import importlib
import json
import os
import resource
import runpy
import signal
import socket
import sys
import traceback
import types

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


def _check(result: int, what: str) -> None:
  if result != 0:
    errno = ctypes.get_errno()
    raise OSError(errno, f'{what}: {os.strerror(errno)}')


def _join(pid: int) -> None:
  """Joins the namespaces of `pid` (the sandbox's pid 1) and takes its root."""
  fds = [os.open(f'/proc/{pid}/ns/{ns}', os.O_RDONLY) for ns in _NAMESPACES]
  root = os.open(f'/proc/{pid}/root', os.O_RDONLY | os.O_DIRECTORY)
  try:
    for ns, fd in zip(_NAMESPACES, fds):
      _check(_LIBC.setns(fd, 0), f'setns {ns}')
    os.fchdir(root)
    os.chroot('.')
  finally:
    for fd in [*fds, root]:
      os.close(fd)
  # The sandbox's /proc is its pid namespace's: its pid 1 must have the root just taken.
  if os.stat('/') != os.stat('/proc/1/root/'):
    raise OSError('the joined root is not the sandbox\'s')


def _drop(uid: int, seccomp: bytes) -> None:
  """Becomes `uid` with no groups, no capability in any set, no_new_privs and `seccomp`."""
  os.setgroups([])
  os.setresgid(uid, uid, uid)
  with open('/proc/sys/kernel/cap_last_cap') as f:
    last = int(f.read())
  for cap in range(last + 1):
    _check(_LIBC.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f'drop capability {cap}')
  _check(_LIBC.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), 'clear ambient')
  os.setresuid(uid, uid, uid)  # Clears the permitted and effective sets (no keep-caps).
  data = (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3: two words, all zero.
  _check(_LIBC.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), 'capset')
  _check(_LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 'no_new_privs')
  program = ctypes.create_string_buffer(seccomp, len(seccomp))
  prog = _Filter(len(seccomp) // 8, ctypes.cast(program, ctypes.c_void_p))
  _check(_LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), 'seccomp')
  with open('/proc/self/status') as f:
    status = dict(line.rstrip('\n').split(':\t', 1) for line in f if ':\t' in line)
  ids = f'{uid}\t{uid}\t{uid}\t{uid}'
  wrong = [k for k in _CAP_FIELDS if int(status[k], 16)] + [
      k for k, want in (('Uid', ids), ('Gid', ids), ('Groups', ''), ('NoNewPrivs', '1'),
                        ('Seccomp', '2')) if status[k].strip() != want.strip()]
  if wrong:
    raise OSError(f'privileges not dropped: {wrong}')


def _run(request: dict, fds: list[int], report: int) -> None:
  """The run (a child of the keeper, inside the sandbox): never returns."""
  try:
    _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), 'pdeathsig')
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
    _drop(request['uid'], bytes.fromhex(request['seccomp']))
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
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else 0 if e.code is None else (
        print(e.code, file=sys.stderr) or 1)
  except BaseException:  # noqa: BLE001 - as an interpreter does: the traceback, status 1.
    traceback.print_exc()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # noqa: BLE001 - a closed or broken stream: the run is over anyway.
        pass
    _EXIT(code & 0xFF)


def _keep(request: dict, fds: list[int]) -> None:
  """The keeper (a child of the zygote): joins the sandbox, forks the run, reports its end."""
  status_fd = fds.pop(0)
  try:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _check(_LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), 'pdeathsig')
    _join(request['ns_pid'])
    os.setsid()  # A session of its own that the run is in and does not lead, as under bwrap.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
      try:
        os.close(read_end)
        os.close(status_fd)
        _run(request, fds, write_end)
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


def main() -> None:
  sock = socket.socket(fileno=int(sys.argv[1]))
  for module in sys.argv[2:]:
    importlib.import_module(module)
  config = sys.modules.get('_pytest.config')
  if config is not None:  # pytest imports its builtin plugins at every start: here, once.
    for name in (*config.essential_plugins, *config.default_plugins):
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
      _keep(json.loads(message), fds)
    for fd in fds:
      os.close(fd)


if __name__ == '__main__':
  main()
