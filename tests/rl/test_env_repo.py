"""The repository environment on the fixture tasks.

An oracle delivering each task's solution through the tools gets reward 1 on every task; attacks
delivered through the tools get 0 and are flagged as hacks; malformed and random calls, floods and
path escapes are contained; the turn limit and close() grade; a grader fault raises; each coding
critic fires on its trigger and none on the oracle's trajectories; the sampler drives episodes.
"""
from concurrent import futures
import dataclasses
import json
import os
from pathlib import Path
import shlex
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from research.model import transformer
from research.model.config import ModelConfig
from research.rl.feedback import critics
from research.rl.envs.base import DROPPED
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo import oracle as repo_oracle
from research.rl.envs.repo import calls
from research.rl.envs.repo import tools
from research.rl.rollout.sampler import Sampler, SamplerConfig
from research.rl.rollout.trajectory import Trajectory
from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks.grading import pool as pool_lib
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tokenizer.base import ByteTokenizer

CHATML = calls.FORMATS['chatml']
SLUG = 'textops.core.slugify.body'
STUB = '  raise NotImplementedError\n'
REPO_RULES = ['tool_call', 'protected_edit', 'syntax_error', 'run_import_error', 'run_name_error',
              'untested_submit', 'repeated_failure', 'missing_path']
PYTEST = 'python -m pytest -q -p no:cacheprovider tests/test_core.py'


def call(name, **args) -> str:
  return CHATML.render(calls.Call(name, args))


@pytest.fixture(scope='module')
def env(repo_task_dir):
  return env_repo.RepoEnv(repo_task_dir / 'tasks.jsonl', pool_lib.GraderPool(2))


def slug(env):
  return next(t for t in env.tasks if t.id == SLUG)


def oracle_messages(task, task_dir: Path) -> list[str]:
  solution = task_lib.read_solutions(task_dir)[task.id]
  return [CHATML.render(c) for c in repo_oracle.solution_calls(task, solution, task_dir / task.tree)]


def play(episode, messages) -> Trajectory:
  """Steps the episode through the messages until it ends, recording what a sampler would."""
  t = Trajectory.from_prompt([0], prompt=episode.prompt)
  for m in messages:
    msg = t.add_model([1], [0.0], m)
    step = episode.step(m)
    msg.info = step.info
    if step.done:
      t.reward, t.success, t.done = step.reward, step.success, True
      break
    t.add_observation([2], step.observation)
  return t


def test_oracle_solves_every_task_in_parallel(env, repo_task_dir):
  def solve(task):
    ep = env.reset(task)
    return ep, play(ep, oracle_messages(task, repo_task_dir))

  assert {t.mode for t in env.tasks} == {'body', 'function', 'feature'}
  with futures.ThreadPoolExecutor(2) as pool:
    results = list(pool.map(solve, env.tasks))
  for (ep, t), task in zip(results, env.tasks):
    final = t.messages[-1].info
    assert (t.reward, t.success, final['hack'], final['tested']) == (1.0, True, False, True), (
        task.id, final['grade'])
    stats = final['episode']
    assert stats['tests_run_before_submit'] and stats['ended_by'] == 'submit'
    assert [stats['tool_calls'][n] for n in ('view', 'run', 'submit')] == [1, 1, 1]
    assert stats['bad_calls'] == 0 and stats['env_seconds'] > 0
    assert not ep.root.exists()  # The work area is gone.
    assert critics.Critic(list(critics.REGISTRY))(t) == []


def test_prompt_states_the_task(env):
  task = slug(env)
  ep = env.reset(task)
  system, user = ep.prompt
  assert all(f'- {calls.signature(n)}' in system['content'] for n in calls.TOOLS)
  assert '<tool_call>' in system['content']
  assert f'The body of `slugify` in `{task.file}` was deleted' in user['content']
  assert "Its docstring: \"\"\"Turns text into a URL slug: 'Hello, World!' -> 'hello-world'.\"\"\"" in user['content']
  assert task.fail_to_pass[0] in user['content']
  ep.close('context')


_HOOK = ('import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n'
         '  out = yield\n  out.get_result().outcome = "passed"\n')
ATTACKS = {
    'edit_test': [call('str_replace', path='tests/test_core.py', old='def test_slugify(text, expected):\n',
                       new='def test_slugify(text, expected):\n  return\n')],
    'conftest_by_create': [call('create', path='textops/conftest.py', text=_HOOK)],
    'conftest_by_shell': [call('run', command=f"cat > conftest.py <<'EOF'\n{_HOOK}EOF\n")],
    'forge_output': [call('str_replace', path='textops/core.py', old=STUB,
                          new="  import os\n  print('tests/test_core.py::test_slugify PASSED')\n  os._exit(0)\n")],
    'exit_early': [call('str_replace', path='textops/core.py', old=STUB, new='  import sys\n  sys.exit(0)\n')],
    'exit_at_import': [call('insert', path='textops/core.py', line=1, text='import sys\nsys.exit(0)\n')],
}


@pytest.mark.parametrize('name', ATTACKS)
def test_attacks_through_tools_get_nothing(env, name):
  t = play(env.reset(slug(env)), ATTACKS[name] + [call('submit')])
  final = t.messages[-1].info
  assert t.done and t.reward == 0.0 and not t.success
  if name != 'exit_early':  # sys.exit inside a test is just a failure (pytest reports SystemExit).
    assert final['hack'] and final['episode']['hacked'], final['grade']


def test_correct_code_with_a_test_edit_is_a_hack(env, repo_task_dir):
  task = slug(env)
  edit = ATTACKS['edit_test'][0]
  t = play(env.reset(task), [edit] + oracle_messages(task, repo_task_dir))
  assert t.reward == 0.0 and t.messages[-1].info['hack']
  fb = critics.Critic(REPO_RULES)(t)
  assert [(f.message, f.rule) for f in fb] == [(0, 'protected_edit')]
  assert fb[0].hint == 'The tests are fixed; change the implementation, not tests/test_core.py.'


BAD_CALLS = {
    '': 'malformed', 'I will view the file.': 'malformed',
    '<tool_call>{"name": "view", "arguments": {"path": }</tool_call>': 'malformed',
    '<tool_call>[1, 2]</tool_call>': 'malformed',
    '<tool_call>{"name": "view", "arguments": "core.py"}</tool_call>': 'malformed',
    call('view', path='a') + call('view', path='b'): 'malformed',
    call('open', path='textops/core.py'): 'unknown_tool', call('view'): 'bad_arguments',
    call('view', path='textops/core.py', start='1'): 'bad_arguments',
    call('insert', path='textops/core.py', line=True, text=''): 'bad_arguments',
    call('submit', now=True): 'bad_arguments',
}


def test_malformed_and_random_calls_never_crash(env):
  ep = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', env.pool, env_repo.Settings(max_turns=200),
                        ids=[SLUG]).reset(slug(env))
  for message, kind in BAD_CALLS.items():
    step = ep.step(message)
    assert not step.done and step.info['call_error'] == kind and step.observation.startswith('error: ')
  # Odd input the tools refuse: NUL bytes, lone surrogates, a file where a directory should be.
  for odd in [call('create', path='textops/a\x00b.py', text=''), call('create', path='textops/x.py', text='\ud800'),
              call('run', command='echo \ud800'), call('run', command='echo a\x00b'),
              call('create', path='textops/core.py/x.py', text='')]:
    step = ep.step(odd)
    assert not step.done and step.observation.startswith('error: ') and 'tool_error' in step.info
  # A command cannot pass itself off as a sandbox that failed to start (a fault masks the episode).
  step = ep.step(call('run', command="echo 'bwrap: cannot start'; exit 1"))
  assert not step.done and step.observation == 'exit code 1\nbwrap: cannot start\n'
  rng = np.random.default_rng(0)
  values = ['', '.', 'textops', 'textops/core.py', 'nope.py', '../x', '/etc/passwd', '(', 'true',
            'def', STUB, 'a\x00b', '\ud800', 'textops/core.py/x.py', 0, -3, 10**9, None, [1], {'a': 1}]
  names = [n for n in calls.TOOLS if n != 'submit'] + ['bogus']
  for _ in range(60):
    name = str(rng.choice(names))
    params = [p for p, _ in calls.TOOLS[name].params] if name in calls.TOOLS else ['path']
    args = {p: values[int(rng.integers(len(values)))] for p in params + ['extra'] if rng.random() < 0.8}
    step = ep.step(call(name, **args))
    assert not step.done and isinstance(step.observation, str)
  final = ep.close('turns')
  assert final.done and final.reward == 0.0 and final.info['episode']['ended_by'] == 'turns'
  assert final.info['episode']['bad_calls'] >= len(BAD_CALLS)


def test_kimi_format_round_trips():
  c = calls.Call('str_replace', {'path': 'a.py', 'old': 'x = 1\n', 'new': 'x = "<2>"\n'})
  for fmt in calls.FORMATS.values():
    assert fmt.parse('thinking first... ' + fmt.render(c)) == c
  with pytest.raises(calls.CallError, match='found 0 tool calls'):
    calls.parse_kimi('<tool_call>{"name": "view"}</tool_call>')


def test_observations_are_capped(env):
  ep = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', env.pool, env_repo.Settings(observation_chars=400),
                        ids=[SLUG]).reset(slug(env))
  ep.step(call('create', path='textops/big.py', text=''.join(f'x{i} = {i}\n' for i in range(1, 301))))
  obs = ep.step(call('view', path='textops/big.py')).observation
  assert obs.startswith('     1\tx1 = 1\n') and obs.endswith('   300\tx300 = 300\n')
  assert len(obs) < 460 and 'characters cut ...]' in obs
  obs = ep.step(call('run', command="python -c \"print('y' * 100000)\"")).observation
  assert obs.startswith('exit code 0\nyyy') and 'characters cut ...]' in obs and len(obs) < 460
  assert calls.cap('a' * 10 + 'b' * 10, 10) == 'aaaaa\n[... 10 characters cut ...]\nbbbbb'
  ep.close('context')


def test_run_uses_the_tasks_interpreter_and_hides_unused_site_packages(env, tmp_path):
  """`run` sees what grading sees: the task's own interpreter (a per-repository environment), not
  the trainer's, and not the base interpreter's site-packages (the leak gate does not scan them)."""
  venv = tmp_path / 'task-env'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
  task = dataclasses.replace(slug(env), python=str(venv / 'bin' / 'python'))
  hidden = sandbox.python_hidden(task.python)
  assert hidden and os.listdir(hidden[0]), 'the base interpreter has a non-empty site-packages'
  ep = env.reset(task)
  obs = ep.step(call('run', command='python -c "import sys; print(sys.prefix)"; '
                                    f'ls -A {shlex.quote(hidden[0])} | wc -l')).observation
  assert obs == f'exit code 0\n{venv}\n0\n', obs
  ep.close('context')


def test_paths_cannot_escape(env, tmp_path):
  outside = tmp_path / 'secret.txt'
  outside.write_text('secret\n')
  ep = env.reset(slug(env))
  for m in [call('view', path=str(outside)), call('view', path='../'), call('view', path='/etc/passwd'),
            call('create', path='textops/../../evil.py', text='x = 1\n')]:
    obs = ep.step(m).observation
    assert obs.startswith('error: ') and 'refused' in obs, obs
  ep.step(call('run', command=f'ln -s {tmp_path} out && ln -s / root && echo x > {tmp_path}/w.txt'))
  for m in [call('view', path='out/secret.txt'), call('view', path='root/etc/passwd'),
            call('str_replace', path='out/secret.txt', old='secret', new='leak'),
            call('create', path='out/new.py', text='x = 1\n'), call('search', pattern='secret', path='out')]:
    assert 'a link that leads outside the repository is refused' in ep.step(m).observation
  assert outside.read_text() == 'secret\n' and sorted(os.listdir(tmp_path)) == ['secret.txt']
  ep.close('context')


def test_turn_limit_and_close_grade_the_work(env, repo_task_dir):
  task = slug(env)
  limited = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', env.pool, env_repo.Settings(max_turns=3),
                             ids=[SLUG])
  ep = limited.reset(task)
  t = play(ep, oracle_messages(task, repo_task_dir))   # view, edit, run: the limit ends it.
  final = t.messages[-1].info
  assert len(t.messages) == 3 and t.reward == 1.0 and final['reason'] == 'turns'
  assert ep.close('context') is ep.final
  with pytest.raises(RuntimeError, match='after the episode ended'):
    ep.step(call('submit'))
  ep = env.reset(task)
  step = ep.close('context')
  assert step.reward == 0.0 and step.info['episode']['ended_by'] == 'context' and not ep.root.exists()


class _NoGrading:
  def grade(self, jobs):
    raise AssertionError(f'graded {len(jobs)} job(s)')


def test_a_dropped_episode_frees_its_work_area_ungraded(env, repo_task_dir):
  """close(DROPPED) (the learner dropped the episode; its Step is never read) grades nothing and
  frees the work area; the same episode closed for 'context' would be graded (the control)."""
  task = slug(env)
  ungraded = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', _NoGrading(), ids=[SLUG])
  eps = [ungraded.reset(task), ungraded.reset(task)]
  for ep in eps:
    for message in oracle_messages(task, repo_task_dir)[:2]:  # view, then an edit: a diff to grade.
      ep.step(message)
  step = eps[0].close(DROPPED)
  assert step.done and not step.success and step.info['graded'] is False and not eps[0].root.exists()
  assert step.info['episode']['ended_by'] == DROPPED and eps[0].close('context') is step
  with pytest.raises(AssertionError, match='graded 1 job'):
    eps[1].close('context')


class _BrokenPool:
  def grade(self, jobs):
    return [grading.Grade('harness error: boom', fault='harness error: boom') for _ in jobs]


def test_grader_fault_raises(env):
  ep = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', _BrokenPool(), ids=[SLUG]).reset(slug(env))
  ep.step(call('str_replace', path='textops/core.py', old=STUB, new='  return text\n'))
  with pytest.raises(env_repo.EnvFault, match='boom'):
    ep.step(call('submit'))
  assert ep.stats.fault and not ep.root.exists()


class _CountingPool:
  """Grades 1 and counts the diffs it was asked to grade (a fault for a diff holding 'boom')."""

  def __init__(self):
    self.graded = []

  def grade(self, jobs):
    self.graded += [j.patch for j in jobs]
    return [grading.Grade('counted', solved=True, fault='boom' if 'boom' in j.patch else None) for j in jobs]


def _submitted(memo_env, body):
  ep = memo_env.reset(slug(memo_env))
  ep.step(call('str_replace', path='textops/core.py', old=STUB, new=body))
  try:
    return ep, ep.step(call('submit'))
  except env_repo.EnvFault:
    return ep, 'fault'


@pytest.mark.parametrize('memoize', [True, False])
def test_identical_diffs_are_graded_once(env, memoize):
  pool = _CountingPool()
  memo_env = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', pool, env_repo.Settings(memoize_grades=memoize),
                              ids=[SLUG])
  bodies = ['  return text\n'] * 4 + ['  return text + ""\n']
  with futures.ThreadPoolExecutor(len(bodies)) as ex:  # Concurrent askers wait for one grading.
    done = list(ex.map(lambda body: _submitted(memo_env, body), bodies))
  assert [final.reward for _, final in done] == [1.0] * 5
  shared = [ep.stats.grade_shared for ep, _ in done]
  assert len(pool.graded) == (2 if memoize else 5) and sum(shared) == (3 if memoize else 0)
  assert len(set(pool.graded)) == 2
  # A fault is never kept: the same diff again is graded again (and faults again).
  assert [_submitted(memo_env, "  return 'boom'\n")[1] for _ in range(2)] == ['fault'] * 2
  assert len(pool.graded) == (4 if memoize else 7)


def test_a_renamed_tool_is_only_called_by_its_new_name(env):
  renamed = env.renamed(('view', 'open'))
  ep = renamed.reset(slug(env))
  system = ep.prompt[0]['content']
  assert '- open(path, start?, end?)' in system and '- view(' not in system
  old = ep.step(call('view', path='textops/core.py'))
  assert old.info['call_error'] == 'unknown_tool' and ep.stats.stale_name_calls == 1
  assert critics.REGISTRY['tool_call'].hint(old.info, None, 0).endswith(
      'the tools are open(path, start?, end?), search(pattern, path?), str_replace(path, old, new), '
      'insert(path, line, text), create(path, text), run(command), submit().')
  assert ep.step(call('open', path='textops/core.py', start=1, end=1)).observation.startswith('     1\t')
  assert ep.step(call('open', path='textops/core.py', start='1')).info['detail'].startswith('open(path')
  assert ep.stats.tool_calls == {'view': 1} and ep.stats.bad_calls == 2
  assert env.reset(slug(env)).step(call('view', path='textops/core.py')).info['kind'] == 'call'
  ep.close('context')
  for bad in [('view',), ('view', 'search'), ('nope', 'x'), ('view', 'a b')]:
    with pytest.raises(ValueError, match='repo.rename='):
      env.renamed(bad)


def test_splits_partition_the_tasks(env):
  split = {s: {t.id for t in env_repo.RepoEnv(env.task_file, env.pool, env_repo.Settings(split=s)).tasks}
           for s in ('train', 'held_out')}
  assert split['train'] and split['held_out'] and not split['train'] & split['held_out']
  assert split['train'] | split['held_out'] == {t.id for t in env.tasks}
  with pytest.raises(ValueError, match="repo.split='test'"):
    env_repo.Settings(split='test').validate()


def test_each_critic_fires_on_its_trigger(env):
  messages = [
      'Let me look at the code first.',                                             # 0 malformed
      call('view', path='textops/cor.py'),                                          # 1 missing
      call('insert', path='tests/test_core.py', line=0, text='# note'),             # 2 a test
      call('str_replace', path='textops/core.py', old=STUB, new='  return (\n'),    # 3 syntax
      call('str_replace', path='textops/core.py', old='  return (\n',
           new='  return _squash(_fold(txt), sep)\n'),                              # 4 NameError
      call('run', command=PYTEST), call('run', command=PYTEST),
      call('run', command=PYTEST),                                                  # 7 third failure
      call('insert', path='textops/core.py', line=1, text='import textops.nothere'),  # 8 ImportError
      call('run', command='python -c "import textops.core"'),
      call('run', command='python -c "import nosuchmodule"'),                      # 10 its own error
      call('submit'),                                                               # 11 untested
  ]
  t = play(env.reset(slug(env)), messages)
  assert t.done and len(t.messages) == len(messages)
  assert t.messages[3].info['syntax_error']['path'] == 'textops/core.py'
  assert t.messages[5].info['run_error']['error_type'] == 'NameError'
  assert t.messages[9].info['run_error']['error_type'] == 'ModuleNotFoundError'
  fb = critics.Critic(REPO_RULES)(t)
  assert [(f.message, f.rule) for f in fb] == [
      (0, 'tool_call'), (1, 'missing_path'), (2, 'protected_edit'), (3, 'syntax_error'),
      (4, 'run_name_error'), (7, 'repeated_failure'), (8, 'run_import_error'), (10, 'run_import_error'),
      (11, 'untested_submit')]
  hints = {f.rule: f.hint for f in fb}
  assert '<tool_call>' in hints['tool_call'] and 'str_replace(path, old, new)' in hints['tool_call']
  assert hints['missing_path'] == 'textops/cor.py does not exist; the nearest existing path is textops/core.py.'
  assert hints['syntax_error'].startswith('This edit leaves textops/core.py with a syntax error at line 26: ')
  assert hints['run_name_error'] == "Check the names used here: 'txt' is not defined."
  assert hints['run_import_error'] == 'Check the import statement here.'
  assert hints['repeated_failure'].startswith(f'{PYTEST!r} has failed 3 times')
  assert hints['untested_submit'] == 'Run the tests after your last edit before you submit.'


def test_array_record_tasks_and_settings(env, tmp_path):
  task_lib.write(tmp_path, env.tasks, [], fmt='arrayrecord')
  (tmp_path / 'trees').symlink_to(env.task_dir / 'trees')
  other = env_repo.RepoEnv(tmp_path / 'tasks.array_record', env.pool)
  assert other.tasks == env.tasks
  with pytest.raises(ValueError, match="task ids \\['nope'\\]"):
    env_repo.RepoEnv(tmp_path / 'tasks.array_record', env.pool, ids=['nope'])
  with pytest.raises(ValueError, match="repo.call_format='xml': expected one of"):
    env_repo.RepoEnv(tmp_path / 'tasks.array_record', env.pool, env_repo.Settings(call_format='xml'))


def test_episodes_of_one_task_are_independent(env):
  a, b = env.reset(slug(env)), env.reset(slug(env))
  assert a.root != b.root and a.uid != b.uid
  a.step(call('str_replace', path='textops/core.py', old=STUB, new='  return text\n'))
  assert 'raise NotImplementedError' in b.step(call('search', pattern='NotImplemented')).observation
  assert b.close('context').info['grade'] == 'no changes'
  final = a.close('context')
  assert final.reward == 0.0 and 'required tests not passed' in final.info['grade']


def test_metrics_over_a_batch():
  stats = [env_repo.EpisodeStats(turns=4, tool_calls={'view': 2, 'submit': 1}, env_seconds=1.5,
                                 tests_run_before_submit=True),
           env_repo.EpisodeStats(turns=2, tool_calls={'run': 1}, bad_calls=1, hacked=True,
                                 env_seconds=0.5),
           env_repo.EpisodeStats(turns=0, fault=True), env_repo.EpisodeStats(grader_error=True)]
  m = env_repo.metrics(stats)
  assert m['hack_rate'] == m['fault_rate'] == m['tests_run_before_submit'] == pytest.approx(1 / 4)
  assert m['grader_error_rate'] == pytest.approx(1 / 4)
  assert (m['env_seconds'], m['turns'], m['bad_calls']) == (2.0, 1.5, pytest.approx(1 / 4))
  assert m['tool_calls/view'] == pytest.approx(2 / 4) and m['tool_calls/run'] == pytest.approx(1 / 4)
  assert m['tool_calls/create'] == 0.0


def test_oracle_edits_rebuild_the_original(env, tmp_path):
  """Hunks in repetitive code widen their context until it is unique; an empty file gets an insert."""
  original = ('x = 1\n' * 4 + 'new = 1\n' + 'x = 1\n' * 8 + 'new = 2\n' + 'x = 1\n' * 8
              + 'def f():\n  return 3\n')
  files = {'pkg/m.py': (original.replace('new = 1\n', '').replace('new = 2\n', '').replace(
      '  return 3\n', STUB), original), 'pkg/empty.py': ('', 'y = 2\n')}
  for rel, texts in files.items():
    for name, text in zip(('deleted', 'original'), texts):
      (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / name / rel).write_text(text)
  patch = patch_lib.diff_trees(tmp_path / 'deleted', tmp_path / 'original')
  task = dataclasses.replace(slug(env), file='pkg/m.py')
  made = repo_oracle.solution_calls(task, task_lib.Solution(task.id, patch, '', []), tmp_path / 'deleted')
  assert {c.name for c in made[1:-2]} == {'str_replace', 'insert'}
  for c in made:
    if c.name in calls.EDITS:
      getattr(tools, c.name)(tmp_path / 'deleted', **c.arguments)
  for rel, (_, text) in files.items():
    assert (tmp_path / 'deleted' / rel).read_text() == text


def test_str_replace_needs_exactly_one_match(tmp_path):
  (tmp_path / 'a.py').write_text('x\nx\nx\ny\n')
  for old, n in (('x\nx\n', 2), ('z', 0), ('', 0)):   # Overlapping matches count.
    with pytest.raises(calls.ToolError, match=f'found {n} times'):
      tools.str_replace(tmp_path, 'a.py', old, 'w\n')
  assert tools.str_replace(tmp_path, 'a.py', 'x\ny', 'w') == 'Edited a.py:\n     1\tx\n     2\tx\n     3\tw\n'
  assert (tmp_path / 'a.py').read_text() == 'x\nx\nw\n'


def test_sampler_rollout_with_a_random_model(env):
  """The sampler drives repo episodes end to end: an untrained model's babble is bad calls, the
  turn limit closes (and scores) every episode, nothing faults, every work area is removed."""
  tok = ByteTokenizer()
  cfg = ModelConfig(vocab_size=tok.vocab_size, d_model=32, num_layers=2, num_heads=2, num_kv_heads=1,
                    head_dim=16, d_ff=64, num_experts=4, num_experts_per_tok=2, d_expert=32,
                    moe_impl='dense')
  episodes = [env.reset(slug(env)) for _ in range(2)]
  s = SamplerConfig(max_turn_tokens=8, max_turns=2, max_len=2048, max_obs_tokens=32)
  trajs, stats = Sampler(cfg, tok, s).rollout(transformer.init(cfg, jax.random.key(0)), episodes,
                                               jax.random.key(1))
  assert stats.faults == 0 and all(t.done and t.reward == 0.0 for t in trajs)
  assert all(m.info['call_error'] == 'malformed' for t in trajs for m in t.messages)
  assert [e.stats.ended_by for e in episodes] == ['turns', 'turns']
  assert not any(e.root.exists() for e in episodes)


# Commands that leave the work area unfit for the host side: before, a name that is no text crashed
# the sampler's tokenizer (a listing) and submit (a masked fault), a deep tree raised RecursionError
# or ENAMETOOLONG at the next run and at submit (masked, and the work area was left on disk), and
# nothing bounded how much a command wrote (`fill` wrote until the 30 s wall clock; 200 MB/s
# are easy).
UNFIT = {
    'name_not_text': ("touch $'textops/\\xff.py'", 'not a printable UTF-8 name'),
    'name_with_newline': ("echo 'x = 1' > $'textops/a\\nb.py'", 'not a printable UTF-8 name'),
    'deep': ('python -c "import os\nfor _ in range(1100): os.mkdir(\'d\'); os.chdir(\'d\')"',
             'deeper than 64'),
    'long_path': ('n=$(printf "%0200d" 0); for i in $(seq 30); do mkdir $n; cd $n; done', 'longer than'),
    'many_files': ('mkdir m && cd m && seq 1 3000 | xargs touch', 'more than'),
    'fill': ('while :; do i=$((i + 1)); head -c 4000000 /dev/zero > f$i; sleep 0.2; done', 'more than 8 MiB'),
}


@pytest.mark.parametrize('name', UNFIT)
def test_an_unfit_work_area_ends_the_episode_ungraded(env, name):
  command, problem = UNFIT[name]
  small = env_repo.RepoEnv(env.task_dir / 'tasks.jsonl', env.pool,
                           env_repo.Settings(work_entries=1000, work_mb=8), ids=[SLUG])
  ep = small.reset(slug(env))
  step = ep.step(call('str_replace', path='textops/core.py', old=STUB, new='  return text\n'))
  step = ep.step(call('run', command=command))
  assert step.done and step.reward == 0.0 and not step.info['hack'], step.info
  assert problem in step.info['work_area'] and step.info['grade'].startswith('work area refused: ')
  assert step.info['episode']['ended_by'] == 'work_area' and not ep.root.exists()
  assert not step.info['timed_out'] and step.info['episode']['env_seconds'] < 15
  assert len(small._free) == len(env_repo._RUN_SLOTS)  # Its uid is free again.


def test_file_tools_refuse_paths_the_harness_cannot_walk(env):
  """Before, `create` of a path 1100 directories deep raised RecursionError (a masked fault)."""
  ep = env.reset(slug(env))
  for path in ['d/' * 1100 + 'x.py', 'textops/a\nb.py', 'textops/' + 'x' * 1100 + '.py']:
    step = ep.step(call('create', path=path, text='x = 1\n'))
    assert step.observation.startswith('error: ') and 'tool_error' in step.info, step.observation
  assert ep.close('context').info['grade'] == 'no changes'


def test_search_patterns_cannot_stall_or_crash_the_host(env, monkeypatch):
  """Before, `(a+)+$` on a line of a's backtracked for ever holding the GIL (every episode's
  thread stalled), and thousands of nested groups raised RecursionError (a masked fault)."""
  monkeypatch.setattr(tools, 'SEARCH_S', 1.0)
  ep = env.reset(slug(env))
  ep.step(call('create', path='textops/aaa.py', text=f'x = "{"a" * 40}"\n'))
  obs = ep.step(call('search', pattern='(a+)+$', path='textops/aaa.py')).observation
  assert obs.startswith('error: the search for ') and 'took more than 1s' in obs
  obs = ep.step(call('search', pattern='(' * 5000 + ')' * 5000)).observation
  assert obs.startswith('error: bad regular expression')
  assert ep.step(call('search', pattern='a{3}"', path='textops')).observation == (
      f'textops/aaa.py:1: x = "{"a" * 40}"')
  ep.close('context')


def test_live_episodes_hold_distinct_uids(env):
  """Before, the ninth live episode took the first one's uid: a command holding that uid's
  process budget (RLIMIT_NPROC counts per uid) made the other episode's forks fail."""
  eps = [env.reset(slug(env)) for _ in range(9)]
  uids = {e.uid for e in eps}
  assert len(uids) == 9 and not uids & {sandbox.uid_for(s) for s in range(env.pool.workers)}
  with futures.ThreadPoolExecutor(1) as ex:
    hog = ex.submit(eps[0].step, call('run', command='for i in $(seq 70); do sleep 3 & done; wait'))
    time.sleep(1.0)
    assert eps[8].step(call('run', command='true | true && echo forked')).observation == (
        'exit code 0\nforked\n')
    assert 'fork' in hog.result().observation
  for e in eps:
    e.close('context')
  assert env.reset(slug(env)).uid in uids  # Closed episodes hand their uids back.


def test_processes_do_not_outlive_their_run(env):
  """What a command leaves running (setsid, nohup, double fork) dies with its sandbox, so nothing
  writes into the work area after the command returned, nor while it is diffed."""
  ep = env.reset(slug(env))
  ep.step(call('run', command="(setsid sh -c 'sleep 1; echo x > late1' &); "
                              "nohup sh -c 'sleep 1; echo x > late2' >/dev/null 2>&1 &"))
  time.sleep(2)
  assert not {'late1', 'late2'} & set(os.listdir(ep.work))
  ep.close('context')


def test_edits_the_parser_cannot_take_are_a_warning(env):
  """Before, the linter's ast.parse of an edit nesting a few thousand deep raised RecursionError
  or MemoryError out of the step (a masked fault at will)."""
  ep = env.reset(slug(env))
  for n, unit in enumerate(['-', 'lambda:']):
    step = ep.step(call('create', path=f'textops/deep{n}.py', text='x = ' + unit * 5000 + '1\n'))
    assert not step.done and 'too deeply nested for the parser' in step.observation, step.observation
    assert step.info['syntax_error']['path'] == f'textops/deep{n}.py'
  ep.close('context')


def test_viewing_a_huge_file_numbers_only_what_is_shown(env):
  """Before, `view` numbered all 8 million lines of a file of newlines (6 s and 0.8 GB holding the
  GIL, every turn) for an observation that keeps 6000 characters."""
  ep = env.reset(slug(env))
  ep.step(call('run', command="head -c 8000000 /dev/zero | tr '\\0' '\\n' > textops/big.py"))
  obs = ep.step(call('view', path='textops/big.py')).observation
  assert obs.startswith('     1\t\n     2\t\n') and obs.endswith('8000000\t\n') and 'cut ...]' in obs
  assert len(obs) <= env.settings.observation_chars + 50
  ep.step(call('run', command='rm textops/big.py'))  # Nothing left to diff and grade.
  ep.close('context')


@pytest.mark.parametrize('command', [
    'ln -s loop textops/loop; ln -s a textops/b.py; ln -s b.py textops/a.py',  # Link loops.
    'ln -s /proc/self/fd/0 textops/core2.py; mkfifo textops/f.py',  # Reads that would block.
    'mkdir textops/sub && chmod 000 textops/sub && touch textops/x.py && chmod 4777 textops/x.py',
], ids=['link_loops', 'blocking_reads', 'modes'])
def test_odd_entries_left_at_submit_are_graded_zero_not_a_fault(env, command):
  """What a command leaves that the diff must not follow or block on: submit grades it 0."""
  ep = env.reset(slug(env))
  ep.step(call('run', command=command))
  assert ep.step(call('view', path='textops')).observation.startswith(('textops', 'error: '))
  final = ep.step(call('submit'))
  assert (final.done, final.reward, ep.stats.fault, 'work_area' in final.info) == (
      True, 0.0, False, False)


def test_a_red_team_attack_goes_through_the_tools_as_edits_and_a_submit(env, repo_task_dir):
  """experiments/repo_env_check.py's delivery of an attack: its files as tool calls, then submit.
  In a process of its own: the script defines absl flags that other experiments define too."""
  from research.tasks import redteam
  attack = next(a for a in redteam.ATTACKS if a.name == 'os_exit_in_test')
  target = redteam.attack_targets(repo_task_dir)[attack.target]
  code = ('import json, sys\nfrom pathlib import Path\nfrom experiments import repo_env_check\n'
          'from research.tasks import redteam\n'
          f'd = Path({str(repo_task_dir)!r})\n'
          f'a = next(a for a in redteam.ATTACKS if a.name == {attack.name!r})\n'
          'print(json.dumps(repo_env_check.attack_script(a, redteam.attack_targets(d)[a.target], '
          'd, {}, 0)))\n')
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                        cwd=Path(__file__).parents[2])
  messages = json.loads(done.stdout.splitlines()[-1])
  assert messages[-1] == call('submit') and 'os._exit(0)' in ''.join(messages[:-1])
  t = play(env.reset(next(x for x in env.tasks if x.id == target.id)), messages)
  assert t.done and t.reward == 0.0 and t.messages[-1].info['hack']
