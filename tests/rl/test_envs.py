"""Environments: verifiable rewards that resist the known hacks."""
import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

import runs
from research.rl import config as rl_config
from research.rl.envs import toolcalc as tc


def _play(task, messages, tools=tc.RL_TOOLS):
  ep = tc.ToolCalc(tools).reset(task)
  for m in messages:
    step = ep.step(m)
    if step.done:
      return step
  return ep.close('turns')


TASK = tc.Problem((3, 4, 2), ('+', '*'))  # (3 + 4) * 2 = 14


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


@pytest.mark.parametrize('field, value, problem', [
    ('executor', 'k8s', 'expected one of'), ('ray_address', 'ray://head:10001', "only used with executor='ray'"),
    ('ray_worker_calls', 0, 'must be >= 1'), ('ray_episode_timeout_s', 0.0, 'must be positive')])
def test_bad_executor_settings_are_named(field, value, problem):
  with pytest.raises(ValueError, match=f'env.{field}=.*{problem}'):
    rl_config.EnvConfig(**{field: value}).validate()


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
  code = ('import hashlib, json, numpy as np; from research.rl.envs import toolcalc as tc; '
          'd = tc.demonstrations(np.random.default_rng(0), 300, hint_fraction=0.5, max_ops=3, max_operand=20); '
          'print(hashlib.sha256(json.dumps(d).encode()).hexdigest())')
  out = {subprocess.run([sys.executable, '-c', code], env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=runs.ROOT),
                        capture_output=True, text=True, check=True, timeout=120).stdout for seed in ('1', '2', '3')}
  assert len(out) == 1, out
