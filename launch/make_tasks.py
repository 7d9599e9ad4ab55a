"""Makes validated synthetic tasks from Python repositories with pytest suites.

One local repository, in this process:
python -m launch.make_tasks --repo=PATH --out=DIR [--format=arrayrecord] [--max_tasks=50] \
    [--modes=body,function,feature] [--site_dir=DIR ...] [--visible_tests] [--max_twins=4]

Many repositories (sdists NAME==VERSION, .tar.gz paths, git URLs, directories; one a line), each in
its own venv, as an Apache Beam pipeline (research/tasks/factory/beam.py):
python -m launch.make_tasks --repos=experiments/task_repos.txt --out=DIR --runner=DirectRunner \
    [--workers=2] [--max_candidates=N] [--cache=~/.cache/research-envs] [--wheelhouse=DIR] \
    [--beam_option=--project=P ...]
"""
import logging
import os
from pathlib import Path

from absl import app, flags

from experiments import task_repos
from research.tasks import factory
from research.tasks import task

_REPO = flags.DEFINE_string('repo', None, 'Repository to delete code from (left unchanged).')
_REPOS = flags.DEFINE_string('repos', None, 'File listing repositories, one a line (a pipeline).')
_OUT = flags.DEFINE_string('out', None, 'Task set directory: tasks, trees/, solutions.jsonl.')
_FORMAT = flags.DEFINE_enum('format', 'jsonl', task.FORMATS, 'File format of the task records '
                            '(--repo only; --repos writes ArrayRecord shards).')
_MODES = flags.DEFINE_list('modes', list(task.MODES), f'Deletion modes, from {task.MODES}.')
_MAX_TASKS = flags.DEFINE_integer('max_tasks', None, 'Stop after this many kept tasks (--repo).')
_MAX_CANDIDATES = flags.DEFINE_integer(
    'max_candidates', None, 'Candidates tried per repository, a seeded sample (--repos).')
_ONLY = flags.DEFINE_list('only', None, 'Only these targets (qualified names, e.g. Foo.bar).')
_SEED = flags.DEFINE_integer('seed', 0, 'Shuffles the candidates.')
_RUNS = flags.DEFINE_integer('runs', 3, 'Runs of the original suite; flaky tests are dropped.')
_SITE_DIRS = flags.DEFINE_multi_string(
    'site_dir', [], 'Directory with dependencies to put on the sandbox path (repeatable).')
_VISIBLE_TESTS = flags.DEFINE_boolean(
    'visible_tests', False, "Keep the test files that decide the reward in the policy's tree "
    '(by default they are hidden, as in SWE-bench).')
_MAX_TWINS = flags.DEFINE_integer('max_twins', 4, 'Mutant twins planted per grading, at most.')
_RUNNER = flags.DEFINE_string('runner', 'DirectRunner', 'Beam runner (--repos).')
_WORKERS = flags.DEFINE_integer('workers', os.cpu_count(), 'DirectRunner worker processes.')
_CACHE = flags.DEFINE_string('cache', str(Path.home() / '.cache/research-envs'),
                             'Fetched sources and per-repository venvs.')
_WHEELHOUSE = flags.DEFINE_string('wheelhouse', None, 'Build venvs offline from here.')
_SHARDS = flags.DEFINE_integer('shards', 4, 'ArrayRecord shards of the task set (--repos).')
_BEAM_OPTIONS = flags.DEFINE_multi_string('beam_option', [], 'Passed to Beam, e.g. --project=P.')
flags.mark_flags_as_required(['out'])
flags.mark_flags_as_mutual_exclusive(['repo', 'repos'], required=True)


def _pipeline(settings: factory.Settings) -> None:
  from apache_beam.options import pipeline_options  # Only the pipeline needs Beam.
  from research.tasks.factory import beam
  from research.tasks.factory import sources
  if _MAX_TASKS.value is not None:
    raise app.UsageError('--max_tasks stops at an order-dependent point; with --repos use '
                         '--max_candidates (a seeded sample per repository)')
  opts = beam.Options(
      out=str(Path(_OUT.value).resolve()), cache=str(Path(_CACHE.value).expanduser().resolve()),
      settings=settings, profiles=task_repos.get_config(), wheelhouse=_WHEELHOUSE.value,
      max_candidates=_MAX_CANDIDATES.value, shards=_SHARDS.value)
  logging.getLogger('apache_beam').setLevel(logging.WARNING)  # Beam logs every bundle.
  options = pipeline_options.PipelineOptions(
      _BEAM_OPTIONS.value, runner=_RUNNER.value, direct_num_workers=_WORKERS.value,
      direct_running_mode='multi_processing')
  seconds = beam.run(sources.read_list(Path(_REPOS.value)), opts, options)
  print(f'pipeline wall seconds: {seconds:.1f}')


def main(argv):
  del argv
  unknown = set(_MODES.value) - set(task.MODES)
  if unknown:
    raise app.UsageError(f'unknown modes {sorted(unknown)}; expected some of {task.MODES}')
  kwargs = dict(modes=tuple(_MODES.value), only=_ONLY.value, seed=_SEED.value, runs=_RUNS.value,
                site_dirs=tuple(_SITE_DIRS.value), visible_tests=_VISIBLE_TESTS.value,
                max_twins=_MAX_TWINS.value)
  if _REPOS.value:
    return _pipeline(factory.Settings(**kwargs))
  summary = factory.make_tasks(_REPO.value, _OUT.value, max_tasks=_MAX_TASKS.value,
                               fmt=_FORMAT.value, **kwargs)
  if summary.repo_rejected:
    raise SystemExit(f'repository rejected: {summary.repo_rejected}')


if __name__ == '__main__':
  app.run(main)
