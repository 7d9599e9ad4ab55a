"""Makes validated synthetic tasks from a local Python repository with a pytest suite.

python -m launch.make_tasks --repo=PATH --out=DIR [--format=arrayrecord] [--max_tasks=50] \
    [--modes=body,function,feature] [--site_dir=DIR ...] [--visible_tests] [--max_twins=4]
"""
from absl import app, flags

from research.tasks import factory
from research.tasks import task

_REPO = flags.DEFINE_string('repo', None, 'Repository to delete code from (left unchanged).')
_OUT = flags.DEFINE_string('out', None, 'Task set directory: tasks, trees/, solutions.jsonl.')
_FORMAT = flags.DEFINE_enum('format', 'jsonl', task.FORMATS, 'File format of the task records.')
_MODES = flags.DEFINE_list('modes', list(task.MODES), f'Deletion modes, from {task.MODES}.')
_MAX_TASKS = flags.DEFINE_integer('max_tasks', None, 'Stop after this many kept tasks.')
_ONLY = flags.DEFINE_list('only', None, 'Only these targets (qualified names, e.g. Foo.bar).')
_SEED = flags.DEFINE_integer('seed', 0, 'Shuffles the candidates.')
_RUNS = flags.DEFINE_integer('runs', 3, 'Runs of the original suite; flaky tests are dropped.')
_SITE_DIRS = flags.DEFINE_multi_string(
    'site_dir', [], 'Directory with dependencies to put on the sandbox path (repeatable).')
_VISIBLE_TESTS = flags.DEFINE_boolean(
    'visible_tests', False, "Keep the test files that decide the reward in the policy's tree "
    '(by default they are hidden, as in SWE-bench).')
_MAX_TWINS = flags.DEFINE_integer('max_twins', 4, 'Mutant twins planted per grading, at most.')
flags.mark_flags_as_required(['repo', 'out'])


def main(argv):
  del argv
  unknown = set(_MODES.value) - set(task.MODES)
  if unknown:
    raise app.UsageError(f'unknown modes {sorted(unknown)}; expected some of {task.MODES}')
  summary = factory.make_tasks(
      _REPO.value, _OUT.value, modes=tuple(_MODES.value), max_tasks=_MAX_TASKS.value,
      only=_ONLY.value, seed=_SEED.value, runs=_RUNS.value, site_dirs=tuple(_SITE_DIRS.value),
      visible_tests=_VISIBLE_TESTS.value, max_twins=_MAX_TWINS.value, fmt=_FORMAT.value)
  if summary.repo_rejected:
    raise SystemExit(f'repository rejected: {summary.repo_rejected}')


if __name__ == '__main__':
  app.run(main)
