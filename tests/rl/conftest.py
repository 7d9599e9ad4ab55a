"""The fixture repository's task set, made once per test process (the factory is the slow part)."""
import pytest

from research.tasks import redteam


@pytest.fixture(scope='session')
def repo_task_dir(tmp_path_factory):
  """The task directory (tasks.jsonl, trees/, solutions.jsonl) of the red team's targets, all modes."""
  _, task_dir, _ = redteam.make_fixture_tasks(tmp_path_factory.mktemp('repo_tasks'), only=redteam.TARGETS,
                                              modes=('body', 'function', 'feature'), log=lambda _: None)
  return task_dir
