"""Runs pytest inside the sandbox and streams per-test results to a report outside the tree.

Executed as `python -I -B runner.py CONFIG` with a one-line secret on stdin; standalone
(stdlib, pytest and optionally coverage), so nothing from this repository enters the sandbox.
Each report line carries a sequence number and an HMAC under the secret, so lines written by the
code under test (which cannot read stdin once it is closed) do not verify.
"""
import builtins
import hashlib
import hmac
import json
import os
import sys


class Reporter:
  """pytest plugin that appends one signed JSON line per event to the report."""

  def __init__(self, path, key, coverage=None):
    self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    self._key = key
    self._seq = 0
    self._cov = coverage
    self._snapshot = None

  def emit(self, kind, **fields):
    payload = json.dumps({'kind': kind, 'seq': self._seq, **fields}, sort_keys=True)
    mac = hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()
    os.write(self._fd, (mac + ' ' + payload + '\n').encode())
    self._seq += 1

  def take_snapshot(self):
    """Identity of what a module under test could patch to forge results."""
    import _pytest.python
    import _pytest.reports
    import _pytest.runner
    import pytest
    watched = {
        'builtins': vars(builtins), '_pytest.runner': vars(_pytest.runner),
        'pytest': vars(pytest), 'TestReport': vars(_pytest.reports.TestReport),
        'Function': vars(_pytest.python.Function), 'Reporter': vars(Reporter),
        'os': {'_exit': os._exit}, 'sys': {'exit': sys.exit}}
    self._snapshot = {f'{owner}.{name}': id(value)
                      for owner, namespace in watched.items()
                      for name, value in list(namespace.items())
                      if not (owner == 'builtins' and name == '_')
                      if callable(value)}

  def changed(self):
    if self._snapshot is None:
      return []
    before = self._snapshot
    self.take_snapshot()
    return sorted(k for k, v in before.items() if self._snapshot.get(k) != v)

  # pytest hooks.
  def pytest_sessionstart(self, session):
    self.emit('session_start', rootdir=str(session.config.rootpath))

  def pytest_collectreport(self, report):
    if report.failed:
      self.emit('collect_error', nodeid=report.nodeid, message=str(report.longrepr)[-2000:])

  def pytest_runtest_logstart(self, nodeid, location):
    del location
    if self._cov is not None:
      self._cov.switch_context(nodeid)

  def pytest_runtest_logreport(self, report):
    self.emit('test', nodeid=report.nodeid, when=report.when, outcome=report.outcome,
              xfail=hasattr(report, 'wasxfail'),
              message=str(report.longrepr)[-1000:] if report.failed else '')

  def pytest_runtest_logfinish(self, nodeid, location):
    del nodeid, location
    if self._cov is not None:
      self._cov.switch_context('')

  def pytest_sessionfinish(self, session, exitstatus):
    self.emit('session_finish', exitstatus=int(exitstatus), changed=self.changed(),
              collected=session.testscollected)


def main():
  key = sys.stdin.buffer.readline().strip()
  # Closes the only channel the secret came through before any code under test runs.
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  os.close(devnull)
  with open(sys.argv[1]) as f:
    config = json.load(f)
  # First bytes of the output: the grader's proof that the runner started (output is a pipe).
  os.write(1, config['marker'].encode() + b'\n')
  sys.dont_write_bytecode = True
  sys.path[:0] = config['prepend_path']
  sys.path.extend(config['append_path'])
  cov = None
  if config.get('coverage_file'):
    import coverage
    cov = coverage.Coverage(data_file=config['coverage_file'], source=config['coverage_source'],
                            config_file=False)
  reporter = Reporter(config['report'], key, cov)
  reporter.emit('runner_start', pid=os.getpid())
  import pytest
  reporter.take_snapshot()
  if cov is not None:
    cov.start()
  code = pytest.main(config['pytest_args'], plugins=[reporter])
  if cov is not None:
    cov.stop()
    cov.save()
  reporter.emit('runner_exit', code=int(code))
  sys.stdout.flush()
  sys.stderr.flush()
  # Skips atexit handlers a module under test may have registered.
  os._exit(int(code))


if __name__ == '__main__':
  main()
