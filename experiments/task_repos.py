"""Per-repository environment profiles for the task factory, and the acceptance run's repositories.

python -m launch.make_tasks --repos=experiments/task_repos.txt --out=/tmp/taskset \
    --runner=DirectRunner --workers=2 --max_candidates=12

A profile pins what a repository's metadata leaves open (research/tasks/factory/venvs.py builds the
environment from the metadata first); keys are canonical distribution names.
"""
from research.tasks.factory import venvs

PROFILES = {
    # tests/conftest.py implements pytest_ignore_collect(path, config): py.path hook arguments,
    # which pytest 9 refuses; its tox.ini names a requirements file the sdist does not ship.
    'boltons': venvs.Profile.from_dict({'requirements': ['pytest==7.4.4']}),
}


def get_config() -> dict[str, venvs.Profile]:
  return PROFILES
