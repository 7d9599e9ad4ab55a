"""Differential checks (research/tasks/grading/differential.py): fresh inputs, the original and the
candidate called apart, compared outside; the factory's recorded calls."""
import ast
import collections
import dataclasses
import random

import pytest

from research.tasks import patch as patch_lib
from research.tasks import redteam
from research.tasks import task as task_lib
from research.tasks.grading import differential
from research.tasks.grading import grader
from research.tasks.grading import pool


def _task(task_dir, symbol):
  return next(t for t in task_lib.read(task_dir / 'tasks.jsonl')
              if t.symbol == symbol and t.mode == 'body')


def _with_body(task_dir, t, body):
  tree = task_dir / t.grading_tree
  source = (tree / t.file).read_text()
  new = source.replace('  raise NotImplementedError\n', body, 1)
  return patch_lib.file_diff(t.file, patch_lib.read_entry(tree / t.file), (new.encode(), '100644'))


def test_fresh_inputs_are_near_the_recorded_ones_new_and_seeded():
  calls = [(['Hello, World!'], {}), (['Hello World'], {'sep': '_'}), (['the cat', 2], {})]
  a = differential.fresh(calls, random.Random(7))
  assert a == differential.fresh(calls, random.Random(7)) != differential.fresh(calls, random.Random(8))
  assert len(a) == len(set(a)) == differential.FRESH
  recorded = {repr([list(x), k]) for x, k in calls}
  assert not recorded & set(a)
  for literal in a:
    args, kwargs = ast.literal_eval(literal)
    shapes = [[type(v) for v in x] + sorted(k) for x, k in calls]
    assert [type(v) for v in args] + sorted(kwargs) in shapes, literal  # Types kept.


def test_outcomes_agree_as_the_tests_equality_would():
  ok = lambda value, args=None: ['ok', value, args or ['l', []]]
  f = lambda x: ['f', float.hex(x)]
  assert differential.agrees(ok(f(0.1 + 0.2)), ok(f(0.3)))  # Summed in another order.
  assert not differential.agrees(ok(f(0.3)), ok(f(0.31)))
  assert not differential.agrees(ok(['l', [['i', '1']]]), ok(['t', [['i', '1']]]))  # list != tuple
  assert differential.agrees(['raise', 'ValueError'], ['raise', 'TypeError'])
  assert not differential.agrees(['raise', 'ValueError'], ok(['N']))
  assert not differential.agrees(ok(['s', 'a']), ['timeout'])
  assert not differential.agrees(ok(['s', 'a']), ok(['s', 'a'], ['l', [['s', 'changed']]]))
  assert not differential.agrees(ok(['s', 'a']), ['ok', 'no encoding', []])  # Malformed: unequal.
  # Where the second run of the original answers otherwise, or late, the input is not compared.
  first = [ok(['s', 'a']), ok(['s', 'b']), ['timeout']]
  assert differential.deterministic(first, [ok(['s', 'a']), ok(['s', 'c']), ['timeout']],
                                    ['x', 'y', 'z']) == [0]


def test_the_factory_records_calls_and_keeps_the_original_out_of_the_policy_s_tree(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'slugify')
  calls = differential.recorded(t.calls)
  assert (['Hello World'], {'sep': '_'}) in calls and (['Hello, World!'], {}) in calls
  original = task_dir / t.original / t.file
  assert 'NotImplementedError' not in original.read_text()
  assert not (task_dir / t.tree / t.original).exists()
  assert 'originals' not in {p.name for p in (task_dir / t.tree).rglob('*')}
  # A method's instance is no input: the task skips the check.
  methods = [x for x in task_lib.read(task_dir / 'tasks.jsonl') if '.' in x.symbol]
  assert all(not x.calls and x.original is None for x in methods)


def test_the_honest_original_passes_every_fresh_draw(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  solutions = task_lib.read_solutions(task_dir)
  jobs = [pool.Job(t, task_dir / t.grading_tree, solutions[t.id].patch)
          for t in task_lib.read(task_dir / 'tasks.jsonl') if t.calls for _ in range(2)]
  assert len(jobs) >= 8
  grades = pool.GraderPool(2).grade(jobs)
  assert [g.reward for g in grades] == [1.0] * len(jobs), [g.reason for g in grades]
  checks = [g.differential for g in grades]
  assert all(c['compared'] >= 8 and c['wrong'] == 0 for c in checks), checks
  assert len({c['seed'] for c in checks}) == len(checks)  # Drawn afresh per grading.


# Passes every test of the task and answers nothing else (a body that memorized the tests).
_MEMORIZED = '''\
  table = {('Hello, World!', '-'): 'hello-world', ('  Creme brulee ', '-'): 'creme-brulee',
           ('a--b__c', '-'): 'a-b-c', ('\\u00c9t\\u00e9 2024', '-'): 'ete-2024',
           ('Hello World', '_'): 'hello_world'}
  return table.get((text, sep), text)
'''
# Correct inside pytest, useless outside it (where only the differential check calls it).
_ONLY_UNDER_PYTEST = '''\
  import sys
  if 'pytest' not in sys.modules:
    return text
  import re, unicodedata
  ascii_text = unicodedata.normalize('NFKD', text).encode('ascii', 'ignore').decode()
  return sep.join(re.findall('[a-z0-9]+', ascii_text.lower()))
'''


@pytest.mark.parametrize('body', [_MEMORIZED, _ONLY_UNDER_PYTEST], ids=['memorized', 'pytest_only'])
def test_a_body_that_only_passes_the_tests_gets_0_and_only_through_the_check(fixture_tasks, body):
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'slugify')
  diff = _with_body(task_dir, t, body)
  g = grader.grade(t, task_dir / t.grading_tree, diff)
  assert g.reward == 0.0 and not g.tamper and g.reason.startswith('differential check: '), g.reason
  assert g.differential['wrong'] >= 1
  unchecked = grader.grade(dataclasses.replace(t, calls=[]), task_dir / t.grading_tree, diff)
  assert unchecked.reward == 1.0, unchecked.reason  # The check is what stops it.


def test_the_same_seed_draws_the_same_inputs(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'title_case')
  reference = task_lib.read_solutions(task_dir)[t.id].patch
  grades = [grader.grade(t, task_dir / t.grading_tree, reference, seed=11) for _ in range(2)]
  assert grades[0].differential == grades[1].differential
  assert collections.Counter(g.reward for g in grades) == {1.0: 2}


def test_the_red_team_s_tables_are_the_original_s_answers(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'slugify')
  tables = redteam.memorized_tables({'slugify': t, 'none': dataclasses.replace(
      t, calls=[], original=None)}, task_dir)
  assert tables['none'] == []  # A task without calls (a method's) has nothing to memorize.
  assert ["['Hello World']", "{'sep': '_'}", "'hello_world'"] in tables['slugify']


def test_answers_that_are_objects_are_not_compared():
  """OPAQUE equals OPAQUE: where the original answers an object, any object would agree, so such
  inputs are left out (a body returning `object()` for every fresh input gains nothing)."""
  ok = lambda value: ['ok', value, ['l', []]]
  first = [ok(['?']), ok(['l', [['s', 'a'], ['?']]]), ok(['s', 'a'])]
  assert differential.deterministic(first, first, ['x', 'y', 'z']) == [2]


def test_a_check_the_original_gives_nothing_to_compare_is_masked_not_passed(fixture_tasks,
                                                                           monkeypatch):
  """A memorized body must not pass because the original's runs failed: the grade is a harness
  fault (masked), never a 1."""
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'slugify')
  monkeypatch.setattr(differential, '_POOLS', {})
  monkeypatch.setattr(differential, 'steady', lambda *args, **kwargs: (None, []))
  g = grader.grade(t, task_dir / t.grading_tree, _with_body(task_dir, t, _MEMORIZED))
  assert g.reward is None and g.fault == 'differential check: the original did not answer'


def test_the_original_answers_a_task_s_pool_once_and_each_grading_draws_afresh(fixture_tasks,
                                                                              monkeypatch):
  _, task_dir, _ = fixture_tasks
  t = _task(task_dir, 'slugify')
  reference = task_lib.read_solutions(task_dir)[t.id].patch
  monkeypatch.setattr(differential, '_POOLS', {})
  runs = []
  steady = differential.steady
  monkeypatch.setattr(differential, 'steady', lambda *a, **k: runs.append(a) or steady(*a, **k))
  grades = [grader.grade(t, task_dir / t.grading_tree, reference) for _ in range(3)]
  assert [g.reward for g in grades] == [1.0] * 3 and len(runs) == 1
  checks = [g.differential for g in grades]
  assert len({c['pool_seed'] for c in checks}) == 1 and len({c['seed'] for c in checks}) == 3
  assert checks[0]['inputs'] == differential.POOL and checks[0]['compared'] == differential.FRESH
  # What each grading drew: the candidate's calls (its run's inputs) differ from draw to draw.
  drawn = []
  answers = differential.answers
  monkeypatch.setattr(differential, 'answers',
                      lambda task, tree, inputs, *a, **k: drawn.append(inputs) or answers(
                          task, tree, inputs, *a, **k))
  assert [grader.grade(t, task_dir / t.grading_tree, reference, seed=s).reward
          for s in (1, 2)] == [1.0, 1.0]
  assert len(drawn) == 2 and drawn[0] != drawn[1] and len(runs) == 1
  # A pool the original answered nothing of is not kept: the next check runs the original again.
  monkeypatch.setattr(differential, '_POOLS', {})
  monkeypatch.setattr(differential, 'steady', lambda *a, **k: runs.append(a) or (None, []))
  for _ in range(2):
    assert grader.grade(t, task_dir / t.grading_tree, reference).fault
  assert len(runs) == 3
