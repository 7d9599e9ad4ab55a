"""One fixture task set per test run (tests/shared.py): the factory is the slow part."""
import pytest

import shared
from research.tasks import testing

# Enough targets to reach every deletion mode and every candidate gate, plus the attack targets.
TARGETS = (*testing.TARGETS, 'wrap', 'count_vowels', '_remember', 'reverse_words')


@pytest.fixture(scope='session')
def fixture_tasks(tmp_path_factory):
  """(unscrubbed checkout, task dir, factory summary) for the fixture repository; shared by every
  test of the run: read it, write elsewhere."""
  return shared.once(tmp_path_factory, 'fixture_tasks', lambda d: testing.make_fixture_tasks(
      d, only=TARGETS, modes=('body', 'function', 'feature'), log=lambda _: None))
