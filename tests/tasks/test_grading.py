import dataclasses

from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks import pool
from research.tasks import task as task_lib


def _load(task_dir, task_id):
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl') if t.id == task_id)
  return t, task_dir / t.grading_tree, task_lib.read_solutions(task_dir)[t.id].patch


def test_diff_touching_only_protected_paths_is_rejected(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, _ = _load(task_dir, 'textops.core.title_case.body')
  test_file = tree / 'tests/test_core.py'
  diff = patch_lib.file_diff('tests/test_core.py', patch_lib.read_entry(test_file),
                             (b'def test_nothing():\n  pass\n', '100644'))
  g = grading.grade(t, tree, diff)
  assert g.reward == 0.0 and g.reason == 'no applicable source changes'
  assert g.tamper == ['protected path changed: tests/test_core.py']


def test_binary_file_is_dropped_with_a_reason_and_the_rest_graded(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  binary = patch_lib.file_diff('textops/blob.bin', None, (b'\0\xff', '100644'))
  g = grading.grade(t, tree, reference + binary)
  assert g.reward == 1.0 and g.rejected == ['binary file in diff: textops/blob.bin']


def test_missing_skipped_and_xfailed_tests_count_as_failed():
  phase = lambda outcome, xfail=False: {'outcome': outcome, 'xfail': xfail}
  cases = {
      'passed': {'setup': phase('passed'), 'call': phase('passed'), 'teardown': phase('passed')},
      'skipped': {'setup': phase('skipped'), 'teardown': phase('passed')},
      'xfailed': {'setup': phase('passed'), 'call': phase('skipped', True),
                  'teardown': phase('passed')},
      'error': {'setup': phase('failed'), 'teardown': phase('passed')},
      'missing': {'setup': phase('passed')},
  }
  assert {k: grading._final_outcome(v) for k, v in cases.items()} == {k: k for k in cases}


def test_a_harness_that_cannot_start_is_a_fault_not_a_zero(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t, tree, reference = _load(task_dir, 'textops.core.title_case.body')
  broken_env = dataclasses.replace(t, site_dirs=[*t.site_dirs, str(task_dir / 'missing')])
  g = grading.grade(broken_env, tree, reference)
  assert g.fault and g.reward is None and g.reason.startswith('sandbox failed: bwrap:')


def test_pool_grades_in_parallel_in_order(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  jobs = []
  for task_id in ('textops.core.title_case.body', 'textops.core.wrap.body'):
    t, tree, reference = _load(task_dir, task_id)
    jobs += [pool.Job(t, tree, reference), pool.Job(t, tree, '')]
  grades = pool.GraderPool(2).grade(jobs)
  assert [g.reward for g in grades] == [1.0, 0.0, 1.0, 0.0]
