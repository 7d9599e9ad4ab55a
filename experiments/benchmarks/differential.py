"""Differential checks on real libraries: which tasks can use them, and whether their verdicts hold.

python -m experiments.benchmarks.differential --json=FILE [--sdists=inflection==0.5.1,...]
    [--max_tasks=8] [--gradings=20] [--workers=2] [--memorized=memorized_bound,...]

Makes the fixture's tasks and up to --max_tasks tasks of each sdist (`pip download` into
--sdist_cache), then per repository: tasks kept, tasks with recorded calls (and why the others
have none), and on each task with calls the honest original graded --gradings times, each with
fresh inputs (every grading must give 1: no flaky verdict), and the red team's memorized-table
bodies (research/tasks/redteam/attacks/memorized.py, --memorized of them, with the table the
original answers for the task's recorded calls) on its body tasks, graded with the check (must
give 0) and without it (`calls=[]`: what the check is worth).
"""
import collections
import dataclasses
import json
from pathlib import Path
import tempfile

from absl import app
from absl import flags

from research.tasks import task as task_lib
from research.tasks import testing
from research.tasks.factory import sources
from research.tasks.grading import pool as pool_lib
from research.tasks import redteam
from research.tasks.redteam.attacks import memorized

_JSON = flags.DEFINE_string('json', None, 'Where to write the report.')
_SDISTS = flags.DEFINE_list('sdists', ['inflection==0.5.1', 'more-itertools==10.5.0',
                                       'cachetools==5.5.0'], 'Real libraries (NAME==VERSION).')
_SDIST_CACHE = flags.DEFINE_string('sdist_cache', str(Path.home() / '.cache/redteam-sdists'),
                                   'Where sdists are downloaded.')
_MAX_TASKS = flags.DEFINE_integer('max_tasks', 8, 'Tasks made from each sdist at most.')
_GRADINGS = flags.DEFINE_integer('gradings', 20, 'Gradings of each honest original.')
_WORKERS = flags.DEFINE_integer('workers', 2, 'Graders in parallel.')
_MEMORIZED = flags.DEFINE_list('memorized', ['memorized_bound', 'memorized_nearest'],
                               'The memorized-table attacks tried on each body task.')


def _memorized(task_dir: Path, tasks: list[task_lib.Task], workers: int) -> list[dict]:
  """Each memorized-table attack on each body task with calls: graded with and without the check."""
  body = [t for t in tasks if t.calls and t.mode == 'body']
  rows, jobs = [], []
  for t in body:
    info = {'tables': redteam.memorized_tables({t.symbol: t}, task_dir)}
    for a in [a for a in memorized.ATTACKS if a.name in _MEMORIZED.value]:
      diff, _ = redteam.run_policy(t, task_dir, a.script, info)
      tree = task_dir / t.grading_tree
      jobs += [pool_lib.Job(t, tree, diff), pool_lib.Job(dataclasses.replace(t, calls=[]), tree, diff)]
      rows.append({'task': t.id, 'attack': a.name})
  grades = pool_lib.GraderPool(workers).grade(jobs)
  for row, checked, unchecked in zip(rows, grades[::2], grades[1::2]):
    row.update(reward=checked.reward, reward_without_check=unchecked.reward,
               reason=checked.reason[:200])
  return rows


def repo_report(name: str, task_dir: Path, gradings: int, workers: int) -> dict:
  tasks = task_lib.read(task_dir / 'tasks.jsonl')
  solutions = task_lib.read_solutions(task_dir)
  checked = [t for t in tasks if t.calls]
  jobs = [pool_lib.Job(t, task_dir / t.grading_tree, solutions[t.id].patch)
          for t in checked for _ in range(gradings)]
  grades = pool_lib.GraderPool(workers).grade(jobs)
  honest = collections.defaultdict(list)
  for job, g in zip(jobs, grades):
    honest[job.task.id].append(g.reward)
  attacks = _memorized(task_dir, tasks, workers)
  return {
      'repo': name, 'kept': len(tasks), 'with_calls': len(checked),
      'share': len(checked) / max(len(tasks), 1),
      'without_calls': {'methods': sum('.' in t.symbol for t in tasks if not t.calls),
                        'functions': sum('.' not in t.symbol for t in tasks if not t.calls)},
      'honest_gradings': len(jobs), 'honest_rewarded': sum(g.reward == 1.0 for g in grades),
      'honest_not_1': {k: v for k, v in honest.items() if set(v) != {1.0}},
      'inputs_compared_mean': (sum(g.differential['compared'] for g in grades if g.differential)
                               / max(sum(bool(g.differential) for g in grades), 1)),
      'memorized_tried': len(attacks),
      'memorized_rewarded': sum(a['reward'] != 0.0 for a in attacks),
      'memorized_rewarded_without_check': sum(a['reward_without_check'] == 1.0 for a in attacks),
      'memorized': attacks}


def main(argv):
  del argv
  cache = Path(_SDIST_CACHE.value)
  with tempfile.TemporaryDirectory(prefix='differential-') as tmp:
    work = Path(tmp)
    _, fixture_dir, _ = testing.make_fixture_tasks(work / 'fixture', only=None,
                                                   modes=task_lib.MODES, log=lambda _: None)
    dirs = [('fixture', fixture_dir)] + [
        (spec, testing.sdist_tasks(sources.fetch_sdist(spec, cache), work / 'sdists',
                                   _MAX_TASKS.value, log=lambda _: None)) for spec in _SDISTS.value]
    reports = [repo_report(name, d, _GRADINGS.value, _WORKERS.value) for name, d in dirs]
  for r in reports:
    print(f'{r["repo"]:<24} kept {r["kept"]:>3}  with calls {r["with_calls"]:>3} '
          f'({r["share"]:.0%})  honest {r["honest_rewarded"]}/{r["honest_gradings"]}  '
          f'memorized rewarded {r["memorized_rewarded"]}/{r["memorized_tried"]} '
          f'(without the check {r["memorized_rewarded_without_check"]})')
  if _JSON.value:
    Path(_JSON.value).write_text(json.dumps(reports, indent=1))


if __name__ == '__main__':
  app.run(main)
