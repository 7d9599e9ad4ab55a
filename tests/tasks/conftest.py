"""One fixture task set per test process: the factory is the slow part."""
import pytest

from research.tasks import redteam

# Enough targets to reach every deletion mode and every candidate gate, plus the attack targets.
TARGETS = (*redteam.TARGETS, 'wrap', 'count_vowels', '_remember', 'reverse_words')


@pytest.fixture(scope='session')
def fixture_tasks(tmp_path_factory):
  """(unscrubbed checkout, task dir, factory summary) for the fixture repository."""
  return redteam.make_fixture_tasks(tmp_path_factory.mktemp('fixture_tasks'), only=TARGETS,
                                    modes=('body', 'function', 'feature'), log=lambda _: None)
