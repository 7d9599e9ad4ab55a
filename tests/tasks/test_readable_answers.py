"""experiments/benchmarks/readable_answers.py: sealed answers that other test code still holds."""
from experiments.benchmarks import readable_answers
from research.tasks import layout
from research.tasks import task as task_lib


def test_answers_held_elsewhere_in_the_tests_are_counted(fixture_tasks, tmp_path):
  _, task_dir, _ = fixture_tasks
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl')
           if t.id == 'textops.core.slugify.body')
  # The four slugify cases and test_slugify_separator: each answer left the module with its seal.
  assert readable_answers.task_report(task_dir, t, 3, 0) == {
      'f2p': 8, 'f2p_with_answers': 5, 'answers': 5, 'isolated': 0,
      'f2p_readable_without_case': 0, 'answers_readable': 0,
      'f2p_readable_without_case_in_run': 0, 'answers_readable_in_run': 0}
  layout.copy_tree(task_dir / t.grading_tree, tmp_path / t.grading_tree)
  (tmp_path / t.grading_tree / 'tests' / 'test_more.py').write_text(
      "def test_more():\n  assert len('hello-world') == len('CREME-BRULEE') > len('ab')\n")
  # test_slugify, which expects both, then runs alone: test_more is not in its run.
  assert readable_answers.task_report(tmp_path, t, 3, 0) == {
      'f2p': 8, 'f2p_with_answers': 5, 'answers': 5, 'isolated': 1,
      'f2p_readable_without_case': 2, 'answers_readable': 1,
      'f2p_readable_without_case_in_run': 0, 'answers_readable_in_run': 0}
