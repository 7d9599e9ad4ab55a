"""The task factory on Apache Beam: many repositories, their candidates spread over workers.

  repositories -> prepare (fetch or unpack, environment, original suite three times with coverage,
  candidates, environment leak scan) -> reshuffle -> gates per candidate (trees written into
  out/trees and out/graded, one result record per candidate) -> write (near duplicates dropped,
  ArrayRecord shards, solutions, rejections, per-gate statistics, table and figure)

Every stage is a plain function of its element, so the pipeline runs unchanged on the DirectRunner
(a worker process per core) and on Dataflow, Flink or Spark runners; there `out` and `cache` must be
one filesystem every worker sees (NFS, Filestore, a FUSE-mounted bucket), and workers need bwrap,
util-linux and root, as the sandbox does. Resumable: out/state/<repo>/ keeps the prepared
repository and one record per finished candidate, and a rerun reads those instead of redoing
them. Deterministic given the seed: candidates are sampled per repository with a seeded RNG, twin
sites are seeded per candidate, and the written records are sorted by id.
"""
import atexit
import dataclasses
import hashlib
import json
import os
from pathlib import Path, PurePosixPath
import pickle
import random
import shutil
import subprocess
import tempfile
import time
from typing import Iterable

import apache_beam as beam
from packaging import utils as pkg_utils

from research.tasks.factory import venvs
from research.tasks import factory
from research.tasks import layout
from research.tasks.factory import sources
from research.tasks.factory import taskset
from research.tasks.task import Solution, Task

_PREPARED = 'prepared.pkl'
_COUNT = 'candidates.json'  # How many candidates a prepared repository sends: for progress.


@dataclasses.dataclass(frozen=True)
class Options:
  """What every stage needs; pickled to the workers."""
  out: str
  cache: str  # Sources under cache/trees and cache/sdists, environments under cache/venvs.
  settings: factory.Settings  # Per-repository fields (python, prefix) are filled in by prepare.
  profiles: dict[str, venvs.Profile]  # By canonical distribution name or repository key.
  wheelhouse: str | None = None
  max_candidates: int | None = None  # Per repository, a seeded sample.
  shards: int = 4


@dataclasses.dataclass(frozen=True)
class Work:
  """One candidate, with what any worker needs to try it."""
  source: sources.Source
  spec: venvs.Spec
  settings: factory.Settings
  prepared: factory.Prepared  # Without its candidate list.
  candidate: factory.Candidate
  env_leaks: list[str]


_BASES: dict[str, Path] = {}  # Per worker process: repository key -> its working copy.


def _base(source: sources.Source, cache: Path) -> Path:
  """A working copy of the repository without artifacts, made once per worker process."""
  if source.key not in _BASES:
    root = Path(tempfile.mkdtemp(prefix='factory-base-'))
    atexit.register(shutil.rmtree, root, True)
    layout.copy_tree(sources.fetch(source, cache), root / source.key)
    _BASES[source.key] = root / source.key
  return _BASES[source.key]


def _state(opts: Options, key: str) -> Path:
  return Path(opts.out) / 'state' / key


def _atomic_write(path: Path, data: bytes) -> None:
  tmp = path.with_name(f'.{path.name}.{os.getpid()}.tmp')
  tmp.write_bytes(data)
  os.replace(tmp, path)


def _profile(base: Path, key: str, opts: Options) -> venvs.Profile:
  """The profile for the repository's distribution name, its key, or its key less a version."""
  for name in (venvs.project_name(base), key, key.rsplit('-', 1)[0]):
    if name and pkg_utils.canonicalize_name(name) in opts.profiles:
      return opts.profiles[pkg_utils.canonicalize_name(name)]
  return venvs.Profile()


def _prepare_fresh(source: sources.Source, opts: Options
                   ) -> tuple[taskset.RepoReport, list[Work]]:
  cache = Path(opts.cache)
  env, works, summary = None, [], factory.Summary(source.key)
  rejections, prepared = [], None
  try:  # A repository that cannot be fetched or given an environment is rejected, not fatal.
    base = _base(source, cache)
    modules = [PurePosixPath(p).name for p in layout.source_packages(base)]
    spec = venvs.spec_for(base, modules, _profile(base, source.key, opts),
                         wheelhouse=opts.wheelhouse)
    env = venvs.build(spec, cache / 'venvs')
    settings = dataclasses.replace(opts.settings, python=env.python, venv=env.id,
                                   id_prefix=source.key)
    summary, rejections, prepared = _suite(base, source, settings, cache)
  except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
    summary.repo_rejected = f'{type(e).__name__}: {e}'[:1000]
  if prepared is not None:
    cands = sorted(prepared.candidates, key=lambda c: c.id)
    random.Random(f'{opts.settings.seed}:{source.key}').shuffle(cands)
    cands = cands[:opts.max_candidates]
    leaks = factory.venv_leaks(base, cands, settings)
    slim = dataclasses.replace(prepared, candidates=[])
    works = [Work(source, spec, settings, slim, c, leaks.get(c.id, [])) for c in cands]
  report = taskset.RepoReport(source.key, env and env.id, summary.candidates, len(works),
                              summary.stable_tests, summary.repo_rejected, rejections)
  return report, works


def _suite(base: Path, source: sources.Source, settings: factory.Settings, cache: Path
           ) -> tuple[factory.Summary, list[dict], factory.Prepared | None]:
  """The repository-level gates (the original suite run three times), cached in `cache` by
  source, environment and settings: a rerun, even into a new output directory, finds the same
  stable tests, coverage and time limits, so it writes the same records."""
  config = json.dumps([source.spec, dataclasses.asdict(settings)], sort_keys=True, default=list)
  path = cache / 'suites' / (hashlib.sha256(config.encode()).hexdigest()[:20] + '.pkl')
  if path.is_file():
    with open(path, 'rb') as f:
      return pickle.load(f)
  summary, rejections, prepared = factory.Summary(source.key), [], None

  def reject(cand, gate, detail):
    rejections.append({'candidate': cand.id, 'gate': gate, 'detail': detail})
  try:
    prepared = factory.prepare(base, settings, summary, reject)
  except factory.Rejected as e:
    summary.repo_rejected = str(e)
  path.parent.mkdir(parents=True, exist_ok=True)
  _atomic_write(path, pickle.dumps((summary, rejections, prepared)))
  return summary, rejections, prepared


def prepare(source: sources.Source, opts: Options) -> Iterable:
  """Work items for the candidates, and the repository's report as the 'repos' output."""
  state = _state(opts, source.key)
  if (state / _PREPARED).is_file():
    with open(state / _PREPARED, 'rb') as f:
      report, works = pickle.load(f)
  else:
    report, works = _prepare_fresh(source, opts)
    (state / 'done').mkdir(parents=True, exist_ok=True)
    _atomic_write(state / _COUNT, json.dumps(len(works)).encode())
    _atomic_write(state / _PREPARED, pickle.dumps((report, works)))
  yield beam.pvalue.TaggedOutput('repos', report)
  yield from works


def try_work(work: Work, opts: Options) -> dict:
  """The candidate's result record: {'id', 'task', 'solution', 'hole'} or {'id', 'gate',
  'detail'}."""
  done = _state(opts, work.source.key) / 'done' / (work.candidate.id.split('/', 1)[1] + '.json')
  if done.is_file():
    with open(done) as f:
      return json.load(f)
  base = _base(work.source, Path(opts.cache))
  venvs.build(work.spec, Path(opts.cache) / 'venvs')  # Built by prepare; rebuilt on a new machine.
  result = factory.try_candidate(base, Path(opts.out), work.candidate, work.prepared,
                                 work.settings, work.env_leaks)
  if isinstance(result, factory.Rejected):
    record = {'id': work.candidate.id, 'gate': result.gate, 'detail': result.detail}
  else:
    record = {'id': work.candidate.id, 'task': dataclasses.asdict(result[0]),
              'solution': dataclasses.asdict(result[1]),
              'hole': taskset.hole(result[0], Path(opts.out))}
  _atomic_write(done, json.dumps(record, sort_keys=True).encode())
  return record


def write(_, results: list[dict], reports: list[taskset.RepoReport], opts: Options) -> dict:
  """Writes the task set from every candidate's result."""
  made = [(Task(**r['task']), Solution(**r['solution'])) for r in results if 'task' in r]
  rejections = [{'candidate': r['id'], 'gate': r['gate'], 'detail': r['detail']}
                for r in results if 'gate' in r]
  rejections += [r for report in reports for r in report.rejections]
  holes = {r['id']: r['hole'] for r in results if 'task' in r}
  stats = taskset.write(Path(opts.out), made, holes, rejections, reports, opts.shards)
  print(taskset.table(stats), flush=True)
  return stats


def build(p: beam.Pipeline, repos: list[sources.Source], opts: Options) -> None:
  """Adds the factory's stages to p."""
  prepared = (p | 'repositories' >> beam.Create(sorted(repos, key=lambda s: s.key))
              | 'spread repositories' >> beam.Reshuffle()
              | 'prepare' >> beam.FlatMap(prepare, opts).with_outputs('repos', main='work'))
  results = (prepared.work | 'spread candidates' >> beam.Reshuffle()
             | 'gates' >> beam.Map(try_work, opts))
  _ = (p | 'once' >> beam.Create([None])
       | 'write' >> beam.Map(write, beam.pvalue.AsList(results),
                             beam.pvalue.AsList(prepared.repos), opts))


def progress(out: Path, stop, interval: float = 1.0) -> None:
  """A progress bar of finished candidates with kept and rejected counts, until stop is set."""
  import tqdm
  seen, kept, rejected = set(), 0, 0
  bar = tqdm.tqdm(desc='candidates', unit='candidate')
  while not stop.wait(interval):
    totals = [json.loads(p.read_text()) for p in out.glob(f'state/*/{_COUNT}')]
    bar.total = sum(totals) or None
    for path in out.glob('state/*/done/*.json'):
      if path not in seen:
        seen.add(path)
        with open(path) as f:
          kept_one = 'task' in json.load(f)
        kept, rejected = kept + kept_one, rejected + (not kept_one)
        bar.update(1)
    bar.set_postfix(kept=kept, rejected=rejected, refresh=True)
  bar.close()


def run(repos: list[sources.Source], opts: Options, pipeline_options) -> float:
  """Runs the pipeline (with a progress bar where out is local); returns its wall seconds."""
  import threading
  out = Path(opts.out)
  out.mkdir(parents=True, exist_ok=True)
  stop = threading.Event()
  bar = threading.Thread(target=progress, args=(out, stop), daemon=True)
  bar.start()
  start = time.perf_counter()
  try:
    with beam.Pipeline(options=pipeline_options) as p:
      build(p, repos, opts)
  finally:
    stop.set()
    bar.join()
  return time.perf_counter() - start
