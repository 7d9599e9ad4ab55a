"""Environments: verifiable rewards that resist the known hacks; pyfunc runs code out of process."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import runs
from research.rl import env_pyfunc, env_toolcalc as tc
from research.rl.executor import Limits, SubprocessExecutor


def _play(task, messages, tools=tc.RL_TOOLS):
  ep = tc.ToolCalc(tools).reset(task)
  for m in messages:
    step = ep.step(m)
    if step.done:
      return step
  return ep.close('turns')


TASK = tc.Task((3, 4, 2), ('+', '*'))  # (3 + 4) * 2 = 14


def test_toolcalc_solution_and_drift():
  assert TASK.question == '3+4*2' and TASK.answer == 14
  good = [m for m, _ in tc.solution(TASK, tc.RL_TOOLS)]
  assert good == ['plus(3,4)', 'mul(7,2)', 'ans(14)']
  step = _play(TASK, good)
  assert step.reward == 1.0 and step.success
  ep = tc.ToolCalc().reset(TASK)
  assert 'tools +:plus -:sub *:mul' in ep.prompt[0]['content']
  # The warm-start solution is right except for one step: the renamed tool.
  s = ep.step('add(3,4)')
  assert s.info['error'] == 'unknown_tool' and s.observation == 'error: unknown tool add'


def test_toolcalc_hacks_never_pay():
  """Invalid calls, stalls, empty answers and repeats never beat a clean wrong answer."""
  clean_wrong = _play(TASK, ['plus(3,4)', 'mul(7,2)', 'ans(13)']).reward
  assert clean_wrong == 0.0
  invalid = [['add(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'],   # Recovers: still not better.
             ['plus(3 4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)'],
             ['', 'plus(3,4)', 'mul(7,2)', 'ans(14)'],
             ['add(3,4)', 'ans(13)'], ['ans()'], ['ans(14']]
  for msgs in invalid:
    step = _play(TASK, msgs)
    assert step.reward <= clean_wrong and not step.success, msgs
  stalls = [['plus(3,4)'] * 5, ['plus(3,4)', 'mul(7,2)'], [], ['plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(13)']]
  for msgs in stalls:
    assert _play(TASK, msgs).reward < clean_wrong, msgs
  # Repeats cost even on the way to the right answer.
  assert _play(TASK, ['plus(3,4)', 'plus(3,4)', 'mul(7,2)', 'ans(14)']).reward < 1.0
  # Over every short sequence of messages, only a clean right answer scores above a clean wrong one.
  vocab = ['plus(3,4)', 'mul(7,2)', 'add(3,4)', 'ans(14)', 'ans(13)', 'x']
  for msgs in itertools.product(vocab, repeat=3):
    step = _play(TASK, list(msgs))
    assert (step.reward > clean_wrong) == step.success


def test_toolcalc_bad_config_named():
  with pytest.raises(ValueError, match='tools'):
    tc.ToolCalc({'/': 'div'})


def test_demonstrations_use_new_names_only_after_a_hint():
  rng = np.random.default_rng(0)
  demos = tc.demonstrations(rng, 300, hint_fraction=0.5)
  new_names = {n for names in tc.NAME_POOL.values() for n in names}
  hinted = 0
  for conv in demos:
    trained = [m for m in conv if m.get('loss')]
    if conv[-2]['role'] == 'system':  # A hinted example: only the message after the hint is trained.
      hinted += 1
      assert trained == [conv[-1]]
    for m in trained:
      called = m['content'].split('(')[0]
      assert called not in new_names or conv[conv.index(m) - 1]['role'] == 'system', conv
  assert 100 < hinted < 200


def test_demonstrations_do_not_depend_on_the_string_hash_seed():
  # The warm start's data is a function of its seed alone: two processes with different
  # PYTHONHASHSEED (set iteration order) make the same conversations.
  code = ('import hashlib, json, numpy as np; from research.rl import env_toolcalc as tc; '
          'd = tc.demonstrations(np.random.default_rng(0), 300, hint_fraction=0.5, max_ops=3, max_operand=20); '
          'print(hashlib.sha256(json.dumps(d).encode()).hexdigest())')
  out = {subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=runs.ROOT),
                        capture_output=True, text=True, check=True, timeout=120).stdout for seed in ('1', '2', '3')}
  assert len(out) == 1, out


EX = SubprocessExecutor()
FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=256)


@pytest.mark.parametrize('code,status,etype', [
    ('def add(a, b):\n  return a + b', 'pass', ''),
    ('def add(a, b):\n  return a - b', 'fail', 'AssertionError'),
    ('import nosuchmodule\ndef add(a, b): return a + b', 'error', 'ModuleNotFoundError'),
    ('def add(a, b): return c', 'error', 'NameError'),
    ('import os\nos._exit(0)', 'crash', 'Crash'),                              # Exiting early fails.
    ('print("\\nPASS {\\"status\\": \\"pass\\"}")\nimport os\nos._exit(0)', 'crash', 'Crash'),  # Forged.
    ('x = bytearray(1 << 30)', 'error', 'MemoryError'),
    ('while True: pass', 'timeout', 'TimeoutError'),
])
def test_executor_outcomes(code, status, etype):
  r = EX.run(code, [('add(2, 3)', 5)], FAST)
  assert (r.status, r.error_type) == (status, etype)


def test_pyfunc_rewards_and_observations():
  env = env_pyfunc.PyFunc(limits=FAST, max_attempts=3)
  task = [t for t in env_pyfunc.TASKS if t.name == 'isqrt'][0]
  ep = env.reset(task)
  s = ep.step('import maths\ndef isqrt(n): return 0')
  assert not s.done and 'ModuleNotFoundError' in s.observation
  s = ep.step('```python\ndef isqrt(n):\n  return int(n ** 0.5) + 1\n```')
  assert s.info['failed'] == {'call': 'isqrt(15)', 'expected': '3', 'got': '4'}
  s = ep.step('import math\ndef isqrt(n): return math.isqrt(n)')
  assert s.done and s.success and s.reward == 0.5  # Two failed attempts cost 0.25 each.
  # Never passing: a clean failing attempt scores 0, a crash or an empty answer scores less.
  clean = env.reset(task)
  for _ in range(3):
    last = clean.step('def isqrt(n): return 0')
  crash = env.reset(task)
  for _ in range(3):
    worst = crash.step('')
  assert last.done and worst.done and worst.reward < last.reward
  assert env.reset(task).close('context').reward == env_pyfunc.CRASHED
