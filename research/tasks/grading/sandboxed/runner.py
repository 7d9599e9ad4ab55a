"""Runs pytest inside the sandbox and streams per-test events to the harness through a pipe.

Executed as `python -I -B runner.py CONFIG` (forked from a zygote that imported pytest: see
research/tasks/sandbox.py's Zygote) with the write end of a pipe open at the config's
`report_fd`; standalone (stdlib, pytest and optionally coverage), so nothing from this repository
enters the sandbox. The runner holds no secret: code under test shares this process and can reach
anything the runner holds (a key, an hmac object, a signing method), so a secret would only hide
how little it protects. Events go into a pipe the harness drains outside the sandbox: nothing
written can be taken back, and the harness does all the accounting. After each test the runner
checks what in-process forging has to change (test code objects, the reporter, the registered
hooks, the functions the reporter relies on); that raises the bar, while the grader's hidden
tests and mutant twins make forging pointless.
"""
import builtins
import itertools
import json
import operator
import os
import sys

# Taken before any code under test runs: the reporter writes only through these, and the
# checks compare the live attributes against them.
_DUMPS, _WRITE, _EXIT = json.dumps, os.write, os._exit

# What the check of in-place changes compares with at C speed (_unchanged), taken as well.
_MAP, _ANY, _GETATTR, _IS_NOT = map, any, getattr, operator.is_not
_DICT_GET, _REPEAT = dict.get, itertools.repeat


def _load_record():
  """record.py, copied beside this file, run in a namespace of its own (never in sys.modules, where
  a tree's own `record` module would meet it) before any code under test."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'record.py')
  with open(path) as f:
    code = compile(f.read(), path, 'exec')
  space = {'__name__': '_sealed_record'}
  exec(code, space)  # pylint: disable=exec-used
  return space


_RECORD = _load_record()


def _watched():
  """Namespaces whose callables a module under test could replace to forge results."""
  import json.encoder
  import random
  import _pytest.python
  import _pytest.reports
  import _pytest.runner
  import pytest
  everything = None
  return {'builtins': (vars(builtins), everything),
          '_pytest.runner': (vars(_pytest.runner), everything),
          'pytest': (vars(pytest), everything),
          'TestReport': (vars(_pytest.reports.TestReport), everything),
          'Function': (vars(_pytest.python.Function), everything),
          'Reporter': (vars(Reporter), everything), 'runner': (globals(), everything),
          'json': (vars(json), everything), 'json.encoder': (vars(json.encoder), everything),
          'JSONEncoder': (vars(json.JSONEncoder), everything),
          # pytest itself sets hooks in sys while it runs; only what ends a run is watched.
          'os': (vars(os), ('write', '_exit', 'getpid', 'urandom')), 'sys': (vars(sys), ('exit',)),
          # What the value checks planted in test modules import (research/tasks/grading/sandboxed/value_check.py).
          'random': (vars(random), everything), 'Random': (vars(random.Random), everything),
          'sys.modules': (sys.modules, ('builtins', 'os', 'random'))}


# Packages whose code decides a verdict in this process: pytest and pluggy (collection, calls,
# reports, hooks), json (the reporter's encoder) and unittest (TestCase's assertions).
_DECIDING = ('_pytest', 'pytest', 'pluggy', 'json', 'unittest')
_FUNCTION_PARTS = ('__code__', '__defaults__', '__kwdefaults__', '__closure__')


def _deciding_modules():
  """The loaded modules of _DECIDING (unittest imported first: tests import it later)."""
  import unittest  # pylint: disable=unused-import
  return [m for name, m in list(sys.modules.items())
          if name.partition('.')[0] in _DECIDING and m is not None]


def _function_parts(label, f):
  """(label, object, attribute, value) of what changes a function in place, the function object
  staying the same: its code, defaults and closure, the keyword defaults and cells inside them."""
  out = [(label, f, a, _part(f, a)) for a in _FUNCTION_PARTS]
  for key, value in (f.__kwdefaults__ or {}).items():
    out.append((f'{label} keyword default', f.__kwdefaults__, key, value))
  for i, cell in enumerate(f.__closure__ or ()):
    out.append((f'{label} cell {i}', cell, 'cell_contents', _part(cell, 'cell_contents')))
  return out


_EMPTY = object()


def _part(obj, attr):
  """obj's attribute (a dict's item) `attr`, or _EMPTY (an empty cell, a missing key)."""
  try:
    return obj.get(attr, _EMPTY) if type(obj) is dict else getattr(obj, attr)
  except (AttributeError, ValueError):
    return _EMPTY


def _functions_in(value):
  """The Python functions a namespace entry holds (itself, a method's, a property's)."""
  found = [value.fget, value.fset, value.fdel] if isinstance(value, property) else [
      getattr(value, '__func__', value)]
  return [f for f in found if type(f).__name__ == 'function']


def _in_place(modules):
  """What code under test can change in place in the deciding modules: (every function's parts,
  module level and in the classes defined there, and every such class's bases; the callables and
  descriptors of those classes' dictionaries, for the identity snapshot of Reporter.watch)."""
  parts, classes = [], {}
  for m in modules:
    for name, value in list(vars(m).items()):
      label = f'{m.__name__}.{name}'
      for f in _functions_in(value):
        parts += _function_parts(label, f)
      if isinstance(value, type) and value.__module__ == m.__name__:
        space = vars(value)
        # What a class holds for its instances to call; its data (pytest keeps state there) aside.
        classes[f'class {label}'] = (space, [k for k, v in space.items() if callable(v) or
                                             isinstance(v, (classmethod, staticmethod, property))])
        parts.append((label, value, '__bases__', value.__bases__))
        for key, entry in list(space.items()):
          for f in _functions_in(entry):
            parts += _function_parts(f'{label}.{key}', f)
  return parts, classes


def _columns(parts, columns):
  """`columns` with the parts of _in_place added as _unchanged compares them: (objects,
  attributes, values) of attributes, (dictionaries, keys, values) of dictionary items; and the
  parts of cells, which are read one by one (an empty cell raises)."""
  attributes, items, cells = columns
  kinds = ['item' if type(p[1]) is dict else 'cell' if type(p[1]).__name__ == 'cell' else 'attribute'
           for p in parts]
  cells += [p for p, kind in zip(parts, kinds) if kind == 'cell']
  for into, kind in ((attributes, 'attribute'), (items, 'item')):
    chosen = [p for p, k in zip(parts, kinds) if k == kind]
    for i, column in enumerate(into):
      column += [p[i + 1] for p in chosen]
  return columns


def _unchanged(attributes, items):
  """Whether every attribute and item of the columns still is its value, as _part reads them
  (C loops: the check runs after every test); False where reading one fails."""
  try:
    return not (_ANY(_MAP(_IS_NOT, _MAP(_GETATTR, attributes[0], attributes[1]), attributes[2]))
                or _ANY(_MAP(_IS_NOT, _MAP(_DICT_GET, items[0], items[1], _REPEAT(_EMPTY)),
                             items[2])))
  except Exception:  # noqa: BLE001 - a part that does not read: the exact check says which.
    return False


def _hide_current_test():
  """pytest names the running test in the environment (PYTEST_CURRENT_TEST); with the graded test
  file, code under test could tell a twin from the test it copies by that name (a case appended to
  positional ids, a value twin's line). Replaced before the snapshot, so that putting pytest's
  function back is caught like any patch of _pytest.runner."""
  import _pytest.runner

  def update(item, when):
    del item, when
    os.environ.pop('PYTEST_CURRENT_TEST', None)
  _pytest.runner._update_current_test_var = update  # pylint: disable=protected-access


# Constants by which the runner finds what grading plants into test modules: the value checks
# (value_check.MARK) and the record function of sealed asserts (record.MARK).
_VALUE_CHECKS = ' value checks answered wrongly'
_SEAL = 'an expectation the grader sealed'


def _planted(items, constant):
  """Per test module of the items, (the names of its functions whose code holds `constant`, those
  of their helpers: functions named `<one of those names>_*`)."""
  modules = {id(m): m for m in (getattr(item, 'module', None) for item in items) if m is not None}
  found = {}
  for m in modules.values():
    space = vars(m)
    names = [name for name, f in space.items()
             if constant in getattr(getattr(f, '__code__', None), 'co_consts', ())]
    if names:
      found[m] = names, [h for h, f in space.items() if callable(f) and h not in names
                         and any(h.startswith(n + '_') for n in names)]
  return found


def _value_checks(items):
  """The test modules' value-check functions, and the builtins those modules resolve names in:
  tests call the checks at run time, so replacing either later is tampering."""
  return {f'test module {m.__name__}': (vars(m), names + helpers + ['__builtins__'])
          for m, (names, helpers) in _planted(items, _VALUE_CHECKS).items()}


def _seal_records(items):
  """(the test modules' record functions of sealed asserts, watched like the value checks; the
  functions): their copies of record.py's `record`, which write through the `put` the runner
  binds to them (main)."""
  planted = _planted(items, _SEAL)
  return ({f'seals of {m.__name__}': (vars(m), names + helpers) for m, (names, helpers) in planted.items()},
          [vars(m)[name] for m, (names, _) in planted.items() for name in names])


# What the audit hook (_auditor) stops:
# - a change of the code or defaults of the sealed asserts' `record` copies (but the runner's one
#   binding of `put`), of any function of runner.py and record.py or of the value checks planted
#   in test modules; a copy of one (a new function on its code);
# - a read of the defaults of `put` and of its writer (where the writer and its nonce are held),
#   and the ways around such reads: the heap walks of gc and other threads' frames;
# - code of a sealed test file run but by its module's one import: a second run of the file's
#   code, a function made on or given code of it, code holding its code run under another name
#   (`put` writes only what such code asks);
# - a tracing or profiling hook, or a sys.monitoring callback (Python 3.12: one sees every frame
#   it is called in; a tracer can rewrite a running frame's locals); ctypes reaching the
#   interpreter's own C API.
_TRACING = ('sys.settrace', 'sys.setprofile', 'sys.monitoring.register_callback')
_AUDITED = frozenset({'object.__setattr__', 'object.__getattr__', 'function.__new__', 'exec',
                      *_TRACING, 'ctypes.dlsym', 'gc.get_objects', 'gc.get_referents',
                      'gc.get_referrers', 'sys._current_frames', 'sys._current_exceptions'})


def _sealed_in(sealed):
  """A function of a code object: the `sealed` files (path -> the file) whose code it holds,
  itself or nested; like the audit hook that calls it, it looks up nothing at call time."""

  def walk(code, _sealed=sealed, _code=type(_sealed_in.__code__), _type=type, _set=set):
    found, stack = _set(), [code]
    while stack:
      c = stack.pop()
      if c.co_filename in _sealed:
        found.add(_sealed[c.co_filename])
      for k in c.co_consts:  # No comprehension: its function would close over these names.
        if _type(k) is _code:
          stack.append(k)
    return found

  return walk


def _auditor(fd, put, tracing, sealed):
  """An audit hook (sys.addaudithook: it stays for the life of the process) that stops, and reports
  at once on the pipe as an `A <why>` line, what would let code under test write or change a
  sealed assert's record (_AUDITED says what; tracers are allowed with `tracing`, under coverage;
  `sealed`: path -> test file). Like `put`, it looks up nothing at call time."""
  def hook(event, args, _fd=fd, _write=_WRITE, _put=put, _tracing=tracing, _mark=_SEAL,
           _checks=_VALUE_CHECKS, _files=(_auditor.__code__.co_filename, put.__code__.co_filename),
           _send=put.__defaults__[0], _events=_AUDITED, _function=type(_auditor),
           _code=type(_auditor.__code__), _type=type, _tuple=tuple, _len=len, _str=str,
           _error=RuntimeError, _sealed=sealed, _sealed_in=_sealed_in(sealed),
           _ran=set(), _tracers=_TRACING, _defaults=frozenset({'__defaults__', '__kwdefaults__'}),
           _names=frozenset({'__code__', '__defaults__', '__kwdefaults__'})):
    why = None
    if event == 'object.__getattr__':  # The most frequent (the integrity checks read many).
      if not ((args[0] is _put or args[0] is _send) and args[1] in _defaults):
        return
      why = b'sealed record writer read at run time'
    elif event not in _events:
      return
    elif event == 'object.__setattr__':
      target = args[0]
      if _type(target) is not _function or args[1] not in _names:
        return
      code = target.__code__
      if _mark in code.co_consts:
        now, new = target.__defaults__, args[2]
        if not (args[1] == '__defaults__' and _type(now) is _tuple and _len(now) == 1
                and now[0] is None and _type(new) is _tuple and _len(new) == 1 and new[0] is _put):
          why = b'sealed record function changed at run time'
      elif code.co_filename in _files or _checks in code.co_consts:
        why = b'grading code changed at run time'
      elif _type(args[2]) is _code and _sealed_in(args[2]):
        why = b'sealed test code run outside its module'
    elif event == 'exec':
      found = _sealed_in(args[0]) if _type(args[0]) is _code else ()
      if found:
        own = _sealed.get(args[0].co_filename)
        if own is None or _len(found) > 1 or own in _ran:
          why = b'sealed test code run outside its module'
        else:
          _ran.add(own)
    elif event == 'function.__new__':
      code = args[0]
      if _mark in code.co_consts or _checks in code.co_consts or code.co_filename in _files:
        why = b'grading code copied at run time'
      elif _sealed_in(code):
        why = b'sealed test code run outside its module'
    elif event in _tracers:
      if not _tracing:
        why = b'tracing hook set at run time'
    elif event == 'ctypes.dlsym':
      if _type(args[1]) is _str and args[1].startswith(('Py', '_Py')):
        why = b'interpreter internals reached through ctypes'
    else:  # gc's heap walks, other threads' frames.
      why = b'heap or frames of other threads walked at run time'
    if why is not None:
      _write(_fd, b'A ' + why + b'\n')
      raise _error(why)

  return hook


def _snapshot(namespaces):
  """(owner, name, namespace, object) for the names listed, or else for every callable:
  identity, not equality, is compared."""
  return [(owner, name, space, space[name]) for owner, (space, names) in namespaces.items()
          for name in (names or list(space))
          if names or callable(space[name]) and not (owner == 'builtins' and name == '_')]


def _functions(fn):
  """A test's function and every function it wraps, with their code objects."""
  fn = getattr(fn, '__func__', fn)
  chain = []
  while callable(fn) and len(chain) < 16:
    chain.append((fn, getattr(fn, '__code__', None)))
    fn = getattr(fn, '__wrapped__', None)
  return chain


def _hooks(pm):
  """Every registered plugin, and every hook caller with its implementations."""
  return pm.get_plugins(), {name: (caller, [impl.function for impl in caller.get_hookimpls()])
                            for name, caller in vars(pm.hook).items()}


def _in_solution(plugin, tree, test_dirs):
  """Whether a plugin is defined in the tree outside conftest files and test directories: in
  code the solution may write."""
  module = plugin if hasattr(plugin, '__file__') else sys.modules.get(type(plugin).__module__)
  path = os.path.realpath(getattr(module, '__file__', None) or '/')
  parts = os.path.relpath(path, tree).split(os.sep)
  return (path.startswith(tree + os.sep) and parts[-1] != 'conftest.py'
          and not set(parts[:-1]) & set(test_dirs))


def _orphan_hooks(pm):
  plugins = pm.get_plugins()
  return [f'hook implemented outside any plugin: {name}' for name, caller in vars(pm.hook).items()
          for impl in caller.get_hookimpls() if impl.plugin not in plugins]


def _same_hooks(before, after):
  (plugins, callers), (plugins_now, callers_now) = before, after
  return plugins == plugins_now and callers.keys() == callers_now.keys() and all(
      c is callers_now[k][0] and len(f) == len(callers_now[k][1])
      and all(a is b for a, b in zip(f, callers_now[k][1])) for k, (c, f) in callers.items())


class Reporter:
  """pytest plugin that writes one JSON line per event to the report pipe, and checks itself."""
  # No instance dict: nothing can shadow a method on the instance.
  __slots__ = ('_fd', '_tree', '_test_dirs', '_seq', '_cov', '_watched', '_tests', '_hooks',
               '_config', '_early', '_put', '_parts', '_columns')

  def __init__(self, fd, tree, test_dirs, coverage=None, put=None):
    self._fd = fd
    self._tree = os.path.realpath(tree)
    self._test_dirs = test_dirs
    self._seq = 0
    self._cov = coverage
    self._watched = []
    self._tests = {}
    self._hooks = None
    self._config = None
    self._early = []  # Problems found once: at a plugin's registration, after collection.
    self._put = put  # What the record functions of sealed asserts write through (record.py).
    self._parts = []  # (label, object, attribute, value): what changes a function in place.
    self._columns = ([], [], []), ([], [], []), []  # _parts as _unchanged compares them.

  def emit(self, kind, **fields):
    line = _DUMPS({'kind': kind, 'seq': self._seq, **fields}, sort_keys=True) + '\n'
    _WRITE(self._fd, line.encode())
    self._seq += 1

  def watch(self, namespaces, parts=()):
    self._watched += _snapshot(namespaces)
    self._parts += parts
    _columns(parts, self._columns)

  def problems(self, nodeids):
    """What changed since it was recorded that only tampering explains; of the tests, only
    `nodeids` are checked (all of them after every test would cost quadratic time)."""
    out = self._early + [f'patched at run time: {owner}.{name}'
                         for owner, name, space, value in self._watched
                         if space.get(name) is not value]
    attributes, items, cells = self._columns
    # Each part read one by one only where the columns show a change: then every part is named.
    parts = cells if _unchanged(attributes, items) else self._parts
    out += [f'changed in place: {label} {attr}' for label, obj, attr, value in parts
            if _part(obj, attr) is not value]
    if type(self) is not _REPORTER:
      out.append(f'reporter changed: class {type(self).__name__}')
    for nodeid in nodeids:
      out += self.test_problems(nodeid)
    config = self._config
    if config is not None and not _same_hooks(self._hooks, _hooks(config.pluginmanager)):
      out.append('pytest plugins or hooks changed')
    return sorted(set(out))

  def test_problems(self, nodeid):
    item, chain = self._tests.get(nodeid, (None, None))
    if item is None:
      return []
    out = [f'test item changed: {nodeid}.{name}' for name in vars(item)
           # An instance attribute that shadows a method, e.g. `item.runtest = lambda: None`.
           if callable(getattr(type(item), name, None))]
    obj = item.__dict__.get('_obj')
    if _functions(chain[0][0]) != chain or obj is not None and (
        getattr(obj, '__func__', obj) is not chain[0][0]):
      out.append(f'test code replaced: {nodeid}')
    return out

  # pytest hooks.
  def pytest_load_initial_conftests(self, early_config):
    """After pytest's own early patches of its classes (legacypath's, tryfirst), before the
    conftest files load (Config's, trylast), which may import code under test."""
    del early_config
    parts, classes = _in_place(_deciding_modules())
    self.watch(classes, parts)

  def pytest_plugin_registered(self, plugin, manager):
    # Called for every plugin, those registered before this one included.
    if _in_solution(plugin, self._tree, self._test_dirs):
      self._early.append(f'plugin registered by code under test: {manager.get_name(plugin)}')

  def pytest_sessionstart(self, session):
    self.emit('session_start', rootdir=str(session.config.rootpath))

  def pytest_collectreport(self, report):
    if report.failed:
      self.emit('collect_error', nodeid=report.nodeid, message=str(report.longrepr)[-2000:])

  def pytest_collection_finish(self, session):
    self._config = session.config
    self._tests = {item.nodeid: (item, _functions(getattr(item, 'obj', None)))
                   for item in session.items if callable(getattr(item, 'obj', None))}
    pm = session.config.pluginmanager
    self._early += _orphan_hooks(pm)
    self._hooks = _hooks(pm)
    self.watch({'PluginManager': (vars(pm), None),
                'PluginManager class': (vars(type(pm)), None),
                'HookCaller': (vars(type(pm.hook.pytest_runtest_logreport)), None)})
    self.watch(_value_checks(session.items))
    watched, functions = _seal_records(session.items)
    for f in {id(f): f for f in functions}.values():  # A module may hold another's copy too.
      bound = f.__defaults__
      if not (type(bound) is tuple and len(bound) == 1 and bound[0] is self._put):
        f.__defaults__ = (self._put,)
    self.watch(watched)
    self.emit('collected', nodeids=sorted(item.nodeid for item in session.items))

  def pytest_runtest_logstart(self, nodeid, location):
    del location
    # Before the test runs, so that a test neutered by an earlier one is caught.
    self._early += self.test_problems(nodeid)
    if self._cov is not None:
      self._cov.switch_context(nodeid)

  def pytest_runtest_logreport(self, report):
    # pytest 9 reports each unittest subTest (and `subtests` fixture step) under its test's
    # node id and phase; the harness counts those apart (a failed one fails the test).
    subtest = type(report).__name__ == 'SubtestReport'
    self.emit('test', nodeid=report.nodeid, when='subtest' if subtest else report.when,
              outcome=report.outcome,
              xfail=hasattr(report, 'wasxfail'),
              message=str(report.longrepr)[-1000:] if report.failed else '')

  def pytest_runtest_logfinish(self, nodeid, location):
    del location
    if self._cov is not None:
      self._cov.switch_context('')
    self.emit('check', nodeid=nodeid, problems=self.problems([nodeid]))

  def pytest_sessionfinish(self, session, exitstatus):
    self.emit('session_finish', exitstatus=int(exitstatus), problems=self.problems(self._tests),
              collected=session.testscollected)


_REPORTER = Reporter


def main():
  with open(sys.argv[1]) as f:
    job = json.load(f)  # What the harness asks for (grading.run_pytest writes every key).
  fd = job['report_fd']
  os.set_inheritable(fd, False)  # Not into processes the tests start.
  # First bytes of the output: the grader's proof that the runner started (output is a pipe).
  os.write(1, job['marker'].encode() + b'\n')
  sys.dont_write_bytecode = True
  sys.path[:0] = job['prepend_path']
  sys.path.extend(job['append_path'])
  cov = None
  if job['coverage_file']:
    import coverage
    cov = coverage.Coverage(data_file=job['coverage_file'], source=job['coverage_source'],
                            config_file=False)
  tree = job['tree']
  # The sealed test files under every name their code may carry (pytest imports by the real path).
  sealed = {os.path.join(root, rel): rel for rel in job['sealed']
            for root in (tree, os.path.realpath(tree))}
  put = _RECORD['recorder'](fd, _WRITE, frozenset(sealed))
  reporter = Reporter(fd, tree, job['test_dirs'], cov, put)
  reporter.emit('runner_start', pid=os.getpid())
  import pytest
  _hide_current_test()
  reporter.watch(_watched())
  if cov is not None:
    cov.start()
  sys.addaudithook(_auditor(fd, put, cov is not None, sealed))
  code = pytest.main(job['pytest_args'], plugins=[reporter])
  if cov is not None:
    cov.stop()
    cov.save()
  reporter.emit('runner_exit', code=int(code))
  sys.stdout.flush()
  sys.stderr.flush()
  # Skips atexit handlers a module under test may have registered.
  _EXIT(int(code))


if __name__ == '__main__':
  main()
