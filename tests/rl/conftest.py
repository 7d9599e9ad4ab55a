"""The fixture repository's task set, made once per test run (tests/shared.py; the factory is the
slow part)."""
import pytest

import shared
from research.tasks import testing


@pytest.fixture(scope='session')
def repo_task_dir(tmp_path_factory):
  """The task directory (tasks.jsonl, trees/, solutions.jsonl) of the red team's targets, all modes;
  shared by every test of the run: read it, write elsewhere.

  With the tests visible in the policy's tree: episodes here run them (critics read their
  results); the default, hidden tests, is covered by tests/tasks.
  """
  return shared.once(tmp_path_factory, 'repo_tasks', lambda d: testing.make_fixture_tasks(
      d, only=testing.TARGETS, modes=('body', 'function', 'feature'), log=lambda _: None,
      visible_tests=True)[1])
