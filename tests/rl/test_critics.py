"""Critics find the wrong step and write the hint; the judge interface with a scripted judge."""
import pytest

from research.rl.feedback import critics
from research.rl.envs import toolcalc as tc
from research.rl.envs.repo import rules  # noqa: F401  (registers the repository rules)
from research.rl.rollout.trajectory import Trajectory


def _traj(episode, messages):
  t = Trajectory.from_prompt([1, 2, 3], prompt=episode.prompt)
  for m in messages:
    msg = t.add_model([65, 259], [0.0, 0.0], m)
    step = episode.step(m)
    msg.info = step.info
    if step.done:
      break
    t.add_observation([4, 5], step.observation)
  return t


def test_toolcalc_rules():
  task = tc.Problem((3, 4, 2), ('+', '*'))
  ep = tc.ToolCalc().reset(task)
  t = _traj(ep, ['add(3,4)', 'add(3,4)', 'mul(7 2)', 'mul(7,2)', 'ans(14)'])
  fb = critics.Critic(['unknown_tool', 'malformed_call', 'repeated_call'])(t)
  assert [(f.message, f.rule) for f in fb] == [(0, 'unknown_tool'), (1, 'unknown_tool'), (2, 'malformed_call')]
  assert fb[0].hint == 'Reminder: available tools are +:plus -:sub *:mul'
  # Order decides which rule claims a message.
  fb = critics.Critic(['repeated_call', 'unknown_tool'])(t)
  assert [(f.message, f.rule) for f in fb] == [(0, 'unknown_tool'), (1, 'repeated_call')]
  assert fb[1].hint == 'add(3,4) was already called; use its result.'
  # A real tool for the wrong operation (the student dodging the renamed tool) also gets the reminder.
  dodge = _traj(tc.ToolCalc().reset(task), ['sub(3,4)', 'mul(-1,2)', 'ans(-2)'])
  fb = critics.Critic(['unknown_tool', 'wrong_tool'])(dodge)
  assert [(f.message, f.rule) for f in fb] == [(0, 'wrong_tool')]
  clean = _traj(tc.ToolCalc().reset(task), ['plus(3,4)', 'mul(7,2)', 'ans(14)'])
  assert critics.Critic(list(critics.REGISTRY))(clean) == []


def test_error_rules_read_the_run_info():
  """`import_error` / `name_error` read a step's error; messages without one get no hint."""
  t = Trajectory.from_prompt([1, 2, 3], prompt=[])
  infos = [{'error_type': 'ModuleNotFoundError', 'error': "No module named 'maths'"},
           {'error_type': 'NameError', 'error': "name 'm' is not defined"},
           {'error_type': 'NameError', 'error': 'something else'},
           {'error_type': 'AssertionError', 'error': 'assert 4 == 3'}, {}]
  for info in infos:
    t.add_model([65], [0.0], 'run pytest').info = info
    t.add_observation([4], 'out')
  fb = critics.Critic(['import_error', 'name_error'])(t)
  assert [(f.message, f.rule, f.hint) for f in fb] == [
      (0, 'import_error', 'Check the import statement here.'),
      (1, 'name_error', "Check the names used here: 'm' is not defined."),
      (2, 'name_error', 'Check the names used here.')]


def test_faulted_trajectory_gets_no_feedback():
  t = _traj(tc.ToolCalc().reset(tc.Problem((1, 2), ('+',))), ['add(1,2)'])
  t.fault = 'RuntimeError: boom'
  assert critics.Critic(['unknown_tool'])(t) == []


def test_unknown_rule_named():
  with pytest.raises(ValueError, match='not_a_rule'):
    critics.Critic(['not_a_rule'])


def test_judge_critic_with_scripted_judge():
  """A scripted judge reads the rendered transcript and names the message that went wrong."""
  def judge(prompt):
    lines = [l for l in prompt.splitlines() if l.startswith('[model message')]
    bad = [i for i, l in enumerate(lines) if 'add(' in l]
    return '\n'.join(f'message {i}: use plus, not add' for i in bad) + '\nmessage 9: out of range\ngarbage'

  ep = tc.ToolCalc().reset(tc.Problem((3, 4), ('+',)))
  t = _traj(ep, ['add(3,4)', 'plus(3,4)', 'ans(7)'])
  jc = critics.JudgeCritic(judge)
  assert '[user] tools +:plus -:sub *:mul\n3+4' in jc.prompt(t) and '[tool] error: unknown tool add' in jc.prompt(t)
  fb = critics.Critic([jc])(t)
  assert [(f.message, f.hint, f.rule) for f in fb] == [(0, 'use plus, not add', 'judge')]
  assert jc.errors == 2  # The out-of-range index and the garbage line.

  def broken(prompt):
    raise TimeoutError('judge unavailable')
  jb = critics.JudgeCritic(broken)
  assert jb(t) == [] and jb.errors == 1
