"""The fixture repository's task set, made once per test process (the factory is the slow part)."""
import pytest

from research.tasks import redteam


@pytest.fixture(scope='session')
def repo_task_dir(tmp_path_factory):
  """The task directory (tasks.jsonl, trees/, solutions.jsonl) of the red team's targets, all modes.

  With the tests visible in the policy's tree: episodes here run them (critics read their
  results); the default, hidden tests, is covered by tests/tasks.
  """
  _, task_dir, _ = redteam.make_fixture_tasks(tmp_path_factory.mktemp('repo_tasks'), only=redteam.TARGETS,
                                              modes=('body', 'function', 'feature'), log=lambda _: None,
                                              visible_tests=True)
  return task_dir
