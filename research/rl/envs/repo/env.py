"""repo: restore code deleted from a repository, with editor and shell tools, graded by its tests.

Tasks are the records `launch.make_tasks` writes (research/tasks/task.py). An episode is a private
work area (a copy of the task's tree in a temp dir, removed when the episode ends), a first message
stating what is missing and listing the tools (calls.py, tools.py), and one tool call per
model message. `run` executes a shell command in the bubblewrap sandbox with the work area the
only writable place. `submit()`, the turn limit or `close(reason)` (the loop's context limit) diffs
the work area against the pristine tree and grades the diff in a fresh sandbox (GraderPool); the
reward is `grading.reward(grade)`, and where that masks the episode (a harness fault) the episode
raises `EnvFault`, which the sampler masks as it masks any episode that raises. Episodes share
nothing mutable but the grader (pool and memo), so a pool of threads may step many at once.

`Step.info` tells critics what each message did (call errors, edited paths and whether they are
protected, syntax errors, run errors, repeated failures, missing paths); the final Step's
info['episode'] holds the episode's statistics for the loop's metrics.
"""

import collections
from concurrent import futures
import copy
import dataclasses
import hashlib
from pathlib import Path, PurePosixPath
import re
import secrets
import shlex
import subprocess
import tempfile
import threading
import time
from typing import Callable

import numpy as np

from research.rl.envs.base import DROPPED, Environment, Step
from research.rl.envs.repo import calls
from research.rl.envs.repo import oracle
from research.rl.envs.repo import rules  # noqa: F401 - registers the environment's critic rules.
from research.rl.envs.repo import tools
from research.rl.envs.repo.settings import Settings
from research.tasks import grading
from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tasks import testing

# A command that runs the tests: `pytest ...`, `python -m pytest ...` (not `cat pytest.ini`).
_PYTEST = re.compile(r'(?:^|[\s;&|()])(?:py\.test|pytest)(?=$|[\s;&|()])')
_RUN_ERROR = re.compile(r"\b(ImportError|ModuleNotFoundError|NameError): (.*)")
# Sandboxed runs take uids from the top half of this process's block, one per live episode (two
# episodes of one uid would share a process budget); graders use the bottom.
_RUN_SLOTS = range(sandbox.UIDS_PER_PROCESS // 2, sandbox.UIDS_PER_PROCESS)


# Whole-word tokens for a tokenizer that wants them (loop's env.word_tokens): the call syntax's words.
WORDS = ('tool_call', 'name', 'arguments', *calls.TOOLS, *sum(calls.NAME_POOL.values(), ()),
         *dict.fromkeys(p for spec in calls.TOOLS.values() for p, _ in spec.params))


def in_split(task_id: str, split: str) -> bool:
  held_out = int(hashlib.sha256(task_id.encode()).hexdigest(), 16) % 4 == 0
  return split == 'all' or held_out == (split == 'held_out')


class EnvFault(RuntimeError):
  """The harness failed (grader or sandbox), not the policy: the episode is masked."""


@dataclasses.dataclass
class EpisodeStats:
  """What one episode did, for the loop's metrics."""
  turns: int = 0
  tool_calls: dict[str, int] = dataclasses.field(default_factory=dict)
  bad_calls: int = 0
  env_seconds: float = 0.0
  grade_seconds: float = 0.0        # Of env_seconds, in the grader (its share of an RL step's time).
  last_edit: int = 0                # Turn of the last successful edit (0: none).
  last_test: int = 0                # Turn of the last `run` that invoked pytest (0: none).
  tests_run_before_submit: bool = False
  hacked: bool = False
  # Grading raised on what the solution shaped (Grade.error): reward 0, not masked; a rate above
  # zero may also be a harness bug, which this makes visible.
  grader_error: bool = False
  fault: bool = False
  ended_by: str = ''                # submit, turns, or the loop's close reason.
  grade_reason: str = ''
  grade_shared: bool = False        # Graded once for an identical (task, diff) of another episode.
  stale_name_calls: int = 0         # Calls by the old name of a renamed tool (Settings.rename).


def metrics(stats: list[EpisodeStats]) -> dict[str, float]:
  """A batch's per-step metrics: rates and means per episode (tool calls by tool), env_seconds and
  grade_seconds summed over the episodes (they run at once: the step's wall time is time_env)."""
  n = max(len(stats), 1)
  out = {'hack_rate': sum(s.hacked for s in stats) / n, 'fault_rate': sum(s.fault for s in stats) / n,
         'grader_error_rate': sum(s.grader_error for s in stats) / n,
         'env_seconds': sum(s.env_seconds for s in stats),
         'grade_seconds': sum(s.grade_seconds for s in stats), 'turns': sum(s.turns for s in stats) / n,
         'tests_run_before_submit': sum(s.tests_run_before_submit for s in stats) / n,
         'bad_calls': sum(s.bad_calls for s in stats) / n,
         'grades_shared': sum(s.grade_shared for s in stats) / n,
         'stale_name_calls': sum(s.stale_name_calls for s in stats) / n}
  for name in calls.TOOLS:
    out[f'tool_calls/{name}'] = sum(s.tool_calls.get(name, 0) for s in stats) / n
  return out


def tool_list(shown: dict[str, str]) -> str:
  """The tools as the prompt lists them (`shown`: tool -> the name the environment shows)."""
  return '\n'.join(f'- {calls.signature(n, shown[n])}: {spec.usage}' for n, spec in calls.TOOLS.items())


def call_syntax(call_format: str) -> str:
  return calls.FORMATS[call_format].render(calls.Call('NAME', {'ARG': 'VALUE'}))


def task_statement(task: task_lib.Task, tree: Path) -> str:
  """What is missing and how the work is checked (the docstring when the tree still has it)."""
  what = {'body': f'The body of `{task.symbol}` in `{task.file}` was deleted (it now raises '
                  'NotImplementedError).',
          'function': f'The function `{task.symbol}` was deleted from `{task.file}`.',
          'feature': f'`{task.symbol}` and the code only it used were deleted from `{task.file}`.'}
  lines = [what[task.mode]]
  doc = tools.docstring((tree / task.file).read_text(errors='replace'), task.symbol)
  if doc:
    lines.append(f'Its docstring: """{doc}"""')
  tests = task.fail_to_pass[:5] + (['...'] if len(task.fail_to_pass) > 5 else [])
  lines += ['Restore it so that these tests pass: ' + ', '.join(tests) + '.',
            f'The tests run with: {shlex.join(task.test_command)}',
            'The tests are fixed: change the implementation, not the tests or their configuration.']
  return '\n'.join(lines)


def prompt(task: task_lib.Task, tree: Path, call_format: str, shown: dict[str, str]) -> list[dict]:
  system = ('You fix a Python repository with these tools, one tool call per message:\n'
            f'{tool_list(shown)}\nPaths are relative to the repository root. A call looks like:\n'
            f'{call_syntax(call_format)}')
  return [{'role': 'system', 'content': system},
          {'role': 'user', 'content': task_statement(task, tree)}]


def is_protected(rel: str, task: task_lib.Task) -> bool:
  """A path a solution must not change: tests, test configuration, autoloaded or outside code."""
  return (layout.is_test_path(rel) or layout.is_config_path(rel) or rel in task.protected_paths
          or PurePosixPath(rel).name in layout.AUTOLOADED
          or rel.endswith('.py') and not layout.is_editable(rel, task.packages))


def run_error(output: str) -> dict | None:
  """The first ImportError / NameError a command printed (later ones may be summaries, cut short)."""
  m = _RUN_ERROR.search(output)
  return {'error_type': m.group(1), 'error': m.group(0)} if m else None


_FILE_TOOLS = {'view': tools.view, 'search': tools.search, 'str_replace': tools.str_replace,
               'insert': tools.insert, 'create': tools.create}


class GradeMemo:
  """Grades each distinct (task, grading tree, diff) once; later and concurrent askers share it
  (the `size` latest; 0: nothing shared).

  A sandboxed grading is a function of these inputs (its mutant twins are drawn afresh, but
  identical diffs only ever share them), so the G rollouts of a group that write the same diff
  pay for one grading. A fault is handed to those already waiting, never kept.
  """

  def __init__(self, pool: grading.GraderPool, size: int = 4096):
    self.pool, self.size = pool, size
    self._grades: collections.OrderedDict[tuple, futures.Future] = collections.OrderedDict()
    self._lock = threading.Lock()

  def grade(self, job: grading.Job) -> tuple[grading.Grade, bool]:
    """(the grade, whether another episode's grading gave it)."""
    key = (job.task.id, str(job.tree), hashlib.sha256(job.patch.encode()).hexdigest())
    with self._lock:
      fut = self._grades.get(key)
      if fut is None:
        self._grades[key] = mine = futures.Future()
        if len(self._grades) > self.size:
          self._grades.popitem(last=False)
    if fut is not None:
      return fut.result(), True
    out = grading.Grade('harness error: grading raised', fault='grading raised')
    try:
      out = self.pool.grade([job])[0]
    finally:
      if out.fault:
        with self._lock:
          self._grades.pop(key, None)
      mine.set_result(out)
    return out, False


class Episode:
  """One task in a private work area; thread-safe across episodes (nothing shared but the grader)."""

  def __init__(self, task: task_lib.Task, pristine: Path, graded: Path,
               grader: GradeMemo, settings: Settings, uid: int,
               release: Callable[[], None] = lambda: None):
    """`pristine`: the tree the policy starts from; `graded`: the tree grading applies the diff to
    (the same with the hidden tests); `grader`: shared by the env's episodes; `release`: called
    once the work area is gone (hands `uid` back)."""
    self.task, self.pristine, self.graded = task, pristine, graded
    self.grader, self.s, self.uid, self._release = grader, settings, uid, release
    self.root = Path(tempfile.mkdtemp(prefix='repo-episode-'))
    self.work = self.root / 'repo'
    layout.copy_tree(pristine, self.work)
    entries, size, _ = tools.survey(self.work)
    self.most = (entries + settings.work_entries, size + (settings.work_mb << 20))
    self.shown = settings.shown()
    self.names = {shown: n for n, shown in self.shown.items()}
    self.prompt = prompt(task, self.work, settings.call_format, self.shown)
    self.stats = EpisodeStats()
    self.failures: collections.Counter[str] = collections.Counter()
    self.final: Step | None = None

  def step(self, message: str) -> Step:
    return self._timed(self._step, message)

  def close(self, reason: str) -> Step:
    return self._timed(self._finish, reason)

  def _timed(self, fn, arg) -> Step:
    t0 = time.perf_counter()
    try:
      out = fn(arg)
    except BaseException as e:
      self.stats.fault |= isinstance(e, EnvFault)
      self._remove()
      raise
    finally:
      self.stats.env_seconds += time.perf_counter() - t0
    if out.done:
      out.info['episode'] = dataclasses.asdict(self.stats)
    return out

  def _remove(self) -> None:
    # rm, not shutil.rmtree: a command may have nested directories deeper than Python recurses.
    subprocess.run(['rm', '-rf', '--', str(self.root)], check=False, capture_output=True)
    release, self._release = self._release, None
    if release is not None:
      release()

  def _work_problem(self) -> str | None:
    """What makes the work area unfit for the host-side tools and the diff (tools.survey)."""
    return tools.survey(self.work, *self.most)[2]

  def _step(self, message: str) -> Step:
    if self.final is not None:
      raise RuntimeError('repo env: step() after the episode ended')
    self.stats.turns += 1
    info = {'message': message, 'syntax': call_syntax(self.s.call_format),
            'tools': ', '.join(calls.signature(n, s) for n, s in self.shown.items())}
    parsed = None
    try:
      parsed = calls.FORMATS[self.s.call_format].parse(message)
      call = calls.check(parsed, self.names)
    except calls.CallError as e:
      self.stats.bad_calls += 1
      info.update(kind='bad_call', call_error=e.kind, detail=str(e))
      if parsed is not None and parsed.name not in self.names and parsed.name in calls.TOOLS:
        self.stats.stale_name_calls += 1  # The name a renamed tool had at the warm start.
      obs = f'error: {e}'
    else:
      self.stats.tool_calls[call.name] = self.stats.tool_calls.get(call.name, 0) + 1
      info.update(kind='call', tool=call.name)
      if call.name == 'submit':
        return self._finish('submit', info)
      obs = self._dispatch(call, info)
      if 'work_area' in info:
        return self._finish('work_area', info)
    if self.stats.turns >= self.s.max_turns:
      return self._finish('turns', info)
    return Step(calls.cap(obs, self.s.observation_chars), False, 0.0, False, info)

  def _dispatch(self, call: calls.Call, info: dict) -> str:
    args = call.arguments
    if call.name == 'run':
      return self._run(args['command'], info)
    try:
      more = {'most': self.s.observation_chars} if call.name == 'view' else {}
      obs = _FILE_TOOLS[call.name](self.work, **args, **more)
    except calls.Missing as e:
      info.update(missing=e.path, nearest=e.nearest)
      return f'error: {e}'
    except (calls.ToolError, OSError) as e:  # OSError: e.g. a file where a directory should be.
      info['tool_error'] = str(e)
      return f'error: {e}'
    if call.name in calls.EDITS:
      obs += self._after_edit(str(PurePosixPath(args['path'])), info)
    return obs

  def _after_edit(self, rel: str, info: dict) -> str:
    """Records the edit for critics; a syntax error is also shown, as an editor's linter would."""
    self.stats.last_edit = self.stats.turns
    info.update(edited=rel, protected=is_protected(rel, self.task))
    if not rel.endswith('.py'):
      return ''
    err = tools.syntax_error((self.work / rel).read_text(errors='replace'))
    if err is None:
      return ''
    info['syntax_error'] = {'path': rel, 'line': err[0], 'message': err[1]}
    return f'\nwarning: {rel} no longer parses: line {err[0]}: {err[1]}'

  def _run(self, command: str, info: dict) -> str:
    """The command in the sandbox: the work area writable, the interpreter and site dirs read-only."""
    if not tools.is_text(command):
      info['tool_error'] = 'the command must be UTF-8 text without NUL bytes'
      return f'error: {info["tool_error"]}'
    marker = f'run started {secrets.token_hex(8)}'
    python = self.s.python or self.task.python
    py_path = [str(self.work / p) if p else str(self.work) for p in self.task.python_path]
    # As in grading: no plugin autoload (the venv's plugins were half of a test run's time).
    env = {'PATH': f'{Path(python).parent}:/usr/bin:/bin', 'HOME': '/tmp', 'TMPDIR': '/tmp',
           'LANG': 'C.UTF-8', 'PYTHONDONTWRITEBYTECODE': '1', 'PYTEST_DISABLE_PLUGIN_AUTOLOAD': '1',
           'PYTHONPATH': ':'.join(py_path + list(self.task.site_dirs))}
    # The marker, printed first, tells a command that ran from a sandbox that failed to start
    # (which would mask the episode: a way around the reward if the command could fake it).
    argv = ['/bin/sh', '-c', 'printf "%s\\n" "$0"; exec /bin/bash -c "$1"', marker, command]
    # The interpreter's unused base site-packages are hidden, as in grading: the factory's leak
    # gate does not scan them, and they may hold a copy of the library the task deleted code from.
    done = sandbox.run(argv, cwd=self.work, rw=[self.work], env=env, limits=self.s.run_limits,
                       ro=[*sandbox.python_roots(python), *self.task.site_dirs], uid=self.uid,
                       hide=sandbox.python_hidden(python),
                       watch=lambda: self._work_problem() is not None)
    # Only a command can make what the host-side tools and the diff cannot handle (deep trees,
    # names that are no text, a full disk): such a work area ends the episode ungraded.
    if problem := self._work_problem():
      info['work_area'] = problem
    if not done.output.startswith(marker + '\n'):
      raise EnvFault(f'sandbox did not start the command (exit {done.returncode}): '
                     f'{(done.sandbox_error or done.output)[:300]}')
    output = done.output[len(marker) + 1:]
    pytest = bool(_PYTEST.search(command))
    if pytest:
      self.stats.last_test = self.stats.turns
    info.update(command=command, returncode=done.returncode, timed_out=done.timed_out, pytest=pytest)
    if done.returncode != 0:
      self.failures[command] += 1
      info['failed_times'] = self.failures[command]
    if err := run_error(output):
      info['run_error'] = err
    status = f'exit code {done.returncode}' + (
        f' (killed at the time limit of {self.s.run_limits.wall_s:g}s)' if done.timed_out else '')
    return f'{status}\n{output}'

  def _finish(self, reason: str, info: dict | None = None) -> Step:
    """Grades the work area's diff; the same final Step for every later close. A dropped episode
    (base.DROPPED: never scored) frees its work area ungraded."""
    if self.final is not None:
      return self.final
    st = self.stats
    st.ended_by = reason
    if reason == DROPPED:
      self._remove()
      self.final = Step(None, True, 0.0, False, {'kind': 'closed', 'reason': reason, 'graded': False})
      return self.final
    st.tests_run_before_submit = st.last_test > st.last_edit
    info = {**(info or {'kind': 'closed'}), 'reason': reason}
    if reason == 'submit':
      info['tested'] = st.tests_run_before_submit
    problem = info.get('work_area') or self._work_problem()
    diff = '' if problem else patch_lib.diff_trees(self.pristine, self.work)
    self._remove()
    if problem:
      info['work_area'] = problem
      grade = grading.Grade(f'work area refused: {problem}')
    elif diff:
      t0 = time.perf_counter()
      grade, st.grade_shared = self.grader.grade(grading.Job(self.task, self.graded, diff))
      st.grade_seconds = time.perf_counter() - t0
    else:
      grade = grading.Grade('no changes')
    st.grade_reason = grade.reason
    reward = grading.reward(grade)
    if reward is None:
      raise EnvFault(f'grader: {grade.reason}')
    st.hacked = bool(grade.tamper)
    st.grader_error = grade.error is not None
    info.update(hack=st.hacked, grade=grade.reason, tamper=list(grade.tamper))
    self.final = Step(None, True, reward, reward == 1.0, info)
    return self.final


class RepoEnv(Environment):
  """Tasks from a task file (tasks.jsonl or tasks.array_record) or a task set's directory written
  by launch.make_tasks (those of `ids`, or of `settings.split`)."""
  name = 'repo'
  words = WORDS

  def __init__(self, task_file: str | Path, pool: grading.GraderPool | None = None,
               settings: Settings = Settings(), ids: list[str] | None = None):
    self.task_file = Path(task_file)
    self.task_dir = self.task_file if self.task_file.is_dir() else self.task_file.parent
    tasks = task_lib.read(self.task_file)
    unknown = sorted(set(ids or ()) - {t.id for t in tasks})
    if unknown:
      raise ValueError(f'repo env: task ids {unknown} are not in {task_file}')
    self.tasks = [t for t in tasks if (ids is None or t.id in ids) and in_split(t.id, settings.split)]
    if not self.tasks:
      raise ValueError(f'repo env: no tasks in {task_file} (split={settings.split!r})')
    self.pool = pool or grading.GraderPool()
    self.settings = settings.validate()
    self.grader = GradeMemo(self.pool, size=4096 if settings.memoize_grades else 0)
    self._free = list(_RUN_SLOTS)
    self._lock = threading.Lock()

  def renamed(self, rename: tuple[str, ...]) -> 'RepoEnv':
    """The same tasks, grader and uid slots with `Settings.rename` set to `rename` (() : none)."""
    other = copy.copy(self)
    other.settings = dataclasses.replace(self.settings, rename=tuple(rename)).validate()
    return other

  def sample_task(self, rng: np.random.Generator) -> task_lib.Task:
    return self.tasks[int(rng.integers(len(self.tasks)))]

  def metrics(self, episodes: list[Episode]) -> dict[str, float]:
    """The batch's metrics (`metrics`) from its episodes' statistics."""
    return metrics([e.stats for e in episodes])

  def demonstrations(self, hint_fraction: float) -> oracle.Demonstrations:
    """The oracle's episodes of the tasks, and their hinted variants (oracle.py)."""
    return oracle.Demonstrations(self, hint_fraction)

  def reset(self, task: task_lib.Task) -> Episode:
    """A new episode, holding a uid of its own until its work area is removed."""
    with self._lock:
      if not self._free:
        raise RuntimeError(f'repo env: all {len(_RUN_SLOTS)} sandbox uids are held by live '
                           'episodes (close them, or raise sandbox.UIDS_PER_PROCESS)')
      slot = self._free.pop()

    def release():
      with self._lock:
        self._free.append(slot)
    try:
      return Episode(task, self.task_dir / task.tree, self.task_dir / task.grading_tree,
                     self.grader, self.settings, sandbox.uid_for(slot), release)
    except BaseException:
      release()
      raise


def make(s: Settings, workdir: str) -> RepoEnv:
  """The environment of `env.repo`: its task file, else the fixture's tasks, made once under
  workdir/repo_tasks (tests visible: `run` runs them)."""
  if s.tasks:
    return RepoEnv(s.tasks, settings=s)
  out = Path(workdir) / 'repo_tasks'
  if not (out / 'tasks' / 'tasks.jsonl').exists():
    testing.make_fixture_tasks(out, only=testing.TARGETS, modes=('body', 'function', 'feature'),
                               log=lambda _: None, visible_tests=True)
  return RepoEnv(out / 'tasks' / 'tasks.jsonl', settings=s)
