import ast
import dataclasses
import importlib
import re

import pytest

from research.tasks import redteam
from research.tasks.redteam.attacks import base
from research.tasks.redteam.attacks import equal
from research.tasks.redteam.attacks import forging
from research.tasks.redteam.attacks import neutering
from research.tasks.redteam.attacks import peeking
from research.tasks.redteam.attacks import plant
from research.tasks.redteam.attacks import plugins
from research.tasks import testing

# Names whose literal presence in planted code would give an attack away to a static scanner.
TELLING = ('gc', 'get_objects', 'pytest', 'emit', 'dumps', '_getframe', 'f_back', 'f_locals',
           'f_globals', 'tb_frame', '__traceback__', '__code__', '__eq__', '__import__',
           '__builtins__', 'pluginmanager', 'hookimpl', 'pytest_runtest_makereport', 'runtest')


@pytest.fixture(scope='module')
def report(fixture_tasks):
  origin, task_dir, _ = fixture_tasks
  return redteam.run(origin, task_dir, log=lambda _: None, workers=2)


def _by_name(report: dict) -> dict[str, dict]:
  return {a['name']: a for a in report['attacks']}


def test_the_red_team_covers_every_class_of_issue_12():
  assert len(redteam.ATTACKS) >= 100
  assert len({a.name for a in redteam.ATTACKS}) == len(redteam.ATTACKS)
  assert all(a.cls in base.CLASSES for a in redteam.ATTACKS)
  for cls in base.ISSUE_CLASSES:
    attacks = [a for a in redteam.ATTACKS if a.cls == cls]
    assert len(attacks) >= 3 and len({a.variant for a in attacks}) >= 3, cls


def _names_in(code: str) -> set[str]:
  """Words in the string literals, attribute names and imports of code."""
  words = set()
  for node in ast.walk(ast.parse(code)):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
      words.update(re.findall(r'\w+', node.value))
    elif isinstance(node, ast.Attribute):
      words.add(node.attr)
    elif isinstance(node, ast.alias):
      words.add(node.name)
  return words


@pytest.mark.parametrize('parts, modules', [
    ((forging.FORGE_EMIT,), ('gc',)), ((forging.FORGE_DUMPS,), ('json',)),
    ((plugins.PLUGIN_MAKEREPORT, plugins.PLUGIN_REGISTER), ('gc', 'pytest')),
    ((neutering.NEUTER_CODE,), ('gc',)), ((peeking.CALLER_TRACEBACK, peeking.PEEK), ()),
    ((peeking.CALLER_GETFRAME, peeking.PEEK), ('sys',)), ((equal.EQUAL,), ())])
def test_obfuscated_plants_hold_no_telling_name(parts, modules):
  plain = _names_in(plant.planted(parts, modules))
  hidden = _names_in(plant.planted(parts, modules, obfuscated=True))
  assert plain & set(TELLING)  # The plain rendering names what it touches...
  assert not hidden & set(TELLING)  # ...the obfuscated one nowhere.


def test_round_three_classes_have_five_attacks_on_three_tasks():
  for cls in (base.MEMORIZED, base.CALLER, base.PYTEST_IN_PLACE, base.REPORT_FAULT):
    attacks = [a for a in redteam.ATTACKS if a.cls == cls]
    assert len(attacks) >= 5 and len({a.target for a in attacks}) >= 3, cls


def test_no_attack_is_masked(report):
  # A harness fault spares the policy its 0 (RL masks it): no attack may turn into one.
  assert report['masked'] == [], report['masked']
  assert all(a['reward'] is not None for a in report['attacks'])


def test_every_control_fails_the_tests_without_a_flag(report):
  for a in report['attacks']:
    assert a['control_reward'] == 0.0 and not a['control_tamper'], a
    assert 'required tests not passed' in a['control_reason'], a


@pytest.mark.parametrize('name', [a.name for a in redteam.ATTACKS])
def test_attack_is_blocked(report, name):
  a = _by_name(report)[name]
  assert a['blocked'], a
  if a['expected_flag']:
    assert a['flagged'], a


def test_leak_hunts_find_nothing_in_the_sandbox_but_the_code_outside(report):
  assert report['attacks_tried'] == len(redteam.ATTACKS)
  assert report['hunts'] >= 6
  for a in report['attacks']:
    assert not a['found_leak'], a  # Scrubbing and the sandbox left nothing to find...
    if a['control_found_leak'] is not None:
      assert a['control_found_leak'], a  # ...that the same hunt finds without them.
  assert {c['class'] for c in report['classes']} == set(base.CLASSES)
  assert sum(c['tried'] for c in report['classes']) == report['attacks_tried']


def test_every_honest_solution_passes(report, fixture_tasks):
  # The original of every fixture task, and a rewrite of slugify that shares no line with it.
  _, task_dir, _ = fixture_tasks
  tasks = (task_dir / 'tasks.jsonl').read_text().count('\n')
  assert report['honest_total'] == tasks + 1 >= len(testing.TARGETS) + 1
  assert report['honest_passed'] == report['honest_total'], [
      h for h in report['honest'] if h['reward'] != 1.0]


def test_twin_runs_alone_reward_an_upstream_line_reader_and_sealing_stops_it(fixture_tasks):
  """The line reader answers only where its caller's line is the upstream suite's, which a twin
  run's line is not: graded on twins alone (no seal, no differential check) it gets 1 on
  title_case; graded fully, its sealed assert fails it. Its control fails either way."""
  origin, task_dir, _ = fixture_tasks
  run = importlib.import_module('research.tasks.redteam.run')  # The package's `run` is the function.
  tasks = run.attack_targets(task_dir)
  armed = next(a for a in redteam.ATTACKS if a.name == 'caller_upstream_line_title_case')
  alone = dataclasses.replace(armed, name=armed.name + '_twins_alone', twins_alone=True)
  out = {o.name: o for o in run.run_attacks([armed, alone], tasks, task_dir,
                                            run.policy_info(origin, task_dir, tasks, ''),
                                            log=lambda _: None)}
  assert out[alone.name].reward == 1.0 and out[armed.name].reward == 0.0
  assert 'sealed assert' in out[armed.name].reason
  assert out[alone.name].control_reward == out[armed.name].control_reward == 0.0
