"""The task factory's pipeline with 1 and with 2 DirectRunner workers, side by side in one run.

python -m experiments.benchmarks.factory_scaling --repos=experiments/task_repos.txt \
    --out=/tmp/factory_scaling --max_candidates=6 [--json=/tmp/factory_scaling.json]

Both runs see the same repositories and the same seeded sample of candidates, each into a fresh
output directory; environments and the original suites' results come from the cache (a first,
warm-up run fills it), so the candidates' gates are what is timed. Reports candidates per second
of each run, their ratio, the 1-minute load average before and after each run (the machine may
be shared), kept tasks per repository, and
whether both runs wrote identical task records (determinism).
"""
import json
import os
from pathlib import Path
import shutil

from absl import app, flags
from apache_beam.options import pipeline_options

from experiments import task_repos
from research.tasks.factory import beam
from research.tasks import factory
from research.tasks.factory import sources
from research.tasks import task as task_lib

_REPOS = flags.DEFINE_string('repos', 'experiments/task_repos.txt', 'Repositories file.')
_OUT = flags.DEFINE_string('out', '/tmp/factory_scaling', 'Output root (one folder per run).')
_CACHE = flags.DEFINE_string('cache', str(Path.home() / '.cache/research-envs'), 'Cache.')
_MAX_CANDIDATES = flags.DEFINE_integer('max_candidates', 6, 'Candidates per repository.')
_WORKERS = flags.DEFINE_list('workers', ['1', '2'], 'Worker counts, run in this order.')
_JSON = flags.DEFINE_string('json', None, 'Also write the report here.')


def _run(repos: list[sources.Source], workers: int) -> dict:
  out = Path(_OUT.value) / f'workers{workers}'
  shutil.rmtree(out, ignore_errors=True)
  opts = beam.Options(
      out=str(out), cache=_CACHE.value, settings=factory.Settings(),
      profiles=task_repos.get_config(), max_candidates=_MAX_CANDIDATES.value)
  load = os.getloadavg()[0]
  seconds = beam.run(repos, opts, pipeline_options.PipelineOptions(
      runner='DirectRunner', direct_num_workers=workers, direct_running_mode='multi_processing'))
  stats = json.loads((out / 'summary.json').read_text())
  tried = sum(r['tried'] for r in stats['repos'].values())
  return {'workers': workers, 'seconds': round(seconds, 1), 'candidates': tried,
          'candidates_per_s': round(tried / seconds, 4), 'load_before': round(load, 1),
          'load_after': round(os.getloadavg()[0], 1),
          'kept_by_repo': {k: r['kept'] for k, r in stats['repos'].items()},
          'records': [p.read_bytes() for p in task_lib.shard_paths(out)]}


def main(argv):
  del argv
  repos = sources.read_list(Path(_REPOS.value))
  runs = [_run(repos, int(w)) for w in _WORKERS.value]
  identical = all(r['records'] == runs[0]['records'] for r in runs)
  for r in runs:
    del r['records']
  report = {'runs': runs, 'identical_records': identical,
            'speedup': round(runs[-1]['candidates_per_s'] / runs[0]['candidates_per_s'], 3),
            'cpus': os.cpu_count()}
  print(json.dumps(report, indent=1))
  if _JSON.value:
    Path(_JSON.value).write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
  app.run(main)
