import json
import shutil

from apache_beam.options import pipeline_options
from PIL import Image
import pytest

from research.tasks.factory import beam
from research.tasks.factory import venvs
from research.tasks import factory
from research.tasks import testing
from research.tasks import grading
from research.tasks.factory import sources
from research.tasks import task as task_lib

TARGETS = ('title_case', 'wrap')


def _options(workers: int, mode: str) -> pipeline_options.PipelineOptions:
  return pipeline_options.PipelineOptions(runner='DirectRunner', direct_num_workers=workers,
                                          direct_running_mode=mode)


def _records(out):
  return [p.read_bytes() for p in task_lib.shard_paths(out)]


def test_two_repositories_in_their_environment_deterministic_resumable(tmp_path, monkeypatch):
  fx = testing.write_fixture(tmp_path / 'fx')
  copy = tmp_path / 'textops-copy'
  shutil.copytree(fx.repo, copy)
  wheels = tmp_path / 'wheels'
  testing.write_wheel(wheels, 'numdep', '1.0', {'numdep.py': testing.NUMDEP})
  repos = [sources.parse(str(fx.repo)), sources.parse(str(copy)),
           sources.parse(str(tmp_path / 'missing'))]

  def opts(out):
    return beam.Options(
        out=str(out), cache=str(tmp_path / 'cache'),
        settings=factory.Settings(modes=('body', 'function'), only=TARGETS, runs=1),
        profiles={'textops': venvs.Profile(inherit_site_packages=True)},
        wheelhouse=str(wheels), shards=2)
  first = tmp_path / 'first'
  beam.run(repos, opts(first), _options(2, 'multi_processing'))

  tasks = [t for p in task_lib.shard_paths(first) for t in task_lib.read(p)]
  solutions = task_lib.read_solutions(first)
  ids = [t.id for t in tasks]
  assert ids == sorted(ids) and len(task_lib.shard_paths(first)) == 2
  assert [t.id for t in task_lib.read(first)] == ids  # The directory: its shards, in order.
  with pytest.raises(FileNotFoundError, match='holds no tasks.jsonl'):
    task_lib.read(tmp_path / 'wheels')
  assert {(t.symbol, t.mode) for t in tasks} == {
      ('title_case', 'body'), ('title_case', 'function'), ('wrap', 'body')}
  with open(first / 'rejected.jsonl') as f:
    rejected = {r['candidate']: r for r in map(json.loads, f)}
  # The copy's tasks delete the same code as the original's: near duplicates, dropped.
  assert {t.repo for t in tasks} == {'repo'}
  for t in tasks:
    twin = rejected[t.id.replace('repo/', 'textops-copy/')]
    assert twin == {'candidate': twin['candidate'], 'gate': 'duplicate',
                    'detail': f'same deleted code as {t.id}'}
    assert not (first / 'trees' / twin['candidate']).exists()
  assert rejected['repo/textops.core.wrap.function']['gate'] == 'not_importable'
  # Every task names its environment and passes in the grading sandbox with its interpreter.
  env_ids = {t.venv for t in tasks}
  assert len(env_ids) == 1 and all(t.python == str(tmp_path / 'cache/venvs' / t.venv /
                                                   'bin/python') for t in tasks)
  for t in tasks[:2]:
    assert grading.grade(t, first / t.grading_tree, solutions[t.id].patch).reward == 1.0
  assert all(t.lines_deleted > 0 and t.covering_tests > 0 and t.cyclomatic >= 1 for t in tasks)
  stats = json.loads((first / 'summary.json').read_text())
  assert stats['repos']['textops-copy']['kept'] == 0 and stats['repos']['repo']['kept'] == 3
  # A repository that cannot be fetched is rejected with the reason; the others go on.
  assert stats['repos']['missing']['repo_rejected'].startswith(
      'ValueError: not a NAME==VERSION, sdist, git URL or directory')
  assert stats['rejected_by_gate'] == {'duplicate': 3, 'not_importable': 2}
  assert Image.open(first / 'summary.png').size[0] > 0

  # A second run (one worker process, a new output) writes the same records.
  second = tmp_path / 'second'
  beam.run(repos, opts(second), _options(1, 'in_memory'))
  assert _records(second) == _records(first)
  assert (second / 'solutions.jsonl').read_bytes() == (first / 'solutions.jsonl').read_bytes()

  # A rerun into the same output tries nothing again.
  def refuse(*args):
    raise AssertionError('a finished candidate was tried again')
  monkeypatch.setattr(factory, 'try_candidate', refuse)
  beam.run(repos, opts(second), _options(1, 'in_memory'))
  assert _records(second) == _records(first)
