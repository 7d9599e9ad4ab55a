"""Runs the scripted reward-hacking attacks against fixture tasks and reports what got through.

python -m experiments.redteam --json=/tmp/redteam.json [--attacks=git_history,forge_emit]
    [--sdists=inflection==0.5.1,cachetools==5.5.0 | --sdists=PATH.tar.gz,... | --sdists=]
    [--max_tasks=20] [--workers=2]

Honest solutions: the original of every task made from the fixture, and of up to `max_tasks`
tasks made from each sdist (NAME==VERSION is fetched with `pip download --no-deps
--no-binary :all:` into `--sdist_cache`). The defaults are small pure-Python libraries whose
suites pass under pytest 9.2 and Python 3.11: inflection 0.5.1 (20 tasks in about 130 s on two
busy cores) and cachetools 5.5.0 (20 in about 100 s); toolz 1.2.0 works too (20 in about 300 s).
"""
import json
from pathlib import Path
import tempfile

from absl import app, flags

from research.tasks import redteam
from research.tasks.factory import sources
from research.tasks import task as task_lib
from research.tasks import testing

_JSON = flags.DEFINE_string('json', None, 'Where to write the full report.')
_ATTACKS = flags.DEFINE_list('attacks', None, 'Run only these attacks (default: all).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Keep the fixture and tasks here (empty dir).')
_SDISTS = flags.DEFINE_list('sdists', ['inflection==0.5.1', 'cachetools==5.5.0'],
                            'Real repositories for honest solutions: sdist paths (.tar.gz) or '
                            'NAME==VERSION to download; empty for none.')
_SDIST_CACHE = flags.DEFINE_string('sdist_cache', str(Path.home() / '.cache/redteam-sdists'),
                                   'Where downloaded sdists are kept.')
_MAX_TASKS = flags.DEFINE_integer('max_tasks', 20, 'Tasks made from each sdist at most.')
_WORKERS = flags.DEFINE_integer('workers', 2, 'Policies and graders run in parallel.')


def fetch_sdist(spec: str, cache: Path) -> Path:
  """The sdist for NAME==VERSION, downloaded into cache unless it is there already."""
  try:
    return sources.fetch_sdist(spec, cache)
  except ValueError as e:
    raise app.UsageError(f'expected a .tar.gz path or NAME==VERSION: {e}') from e


def table(report: dict) -> str:
  rows = ['| attack | class | variant | reward | blocked | flagged | control ok | leak found '
          '(hunt) |', '| --- | --- | --- | --- | --- | --- | --- | --- |']
  for a in report['attacks']:
    hunt = '' if a['control_found_leak'] is None else f' ({a["control_found_leak"]})'
    rows.append(f'| {a["name"]} | {a["cls"]} | {a["variant"]} | {a["reward"]} | {a["blocked"]} '
                f'| {a["flagged"]} | {a["control_ok"]} | {a["found_leak"]}{hunt} |')
  rows += ['', '| class | tried | blocked |', '| --- | --- | --- |']
  rows += [f'| {c["class"]} | {c["tried"]} | {c["blocked"]} |' for c in report['classes']]
  return '\n'.join(rows)


def main(argv):
  del argv
  known = {a.name for a in redteam.ATTACKS}
  unknown = set(_ATTACKS.value or ()) - known
  if unknown:
    raise app.UsageError(f'unknown attacks {sorted(unknown)}; known: {sorted(known)}')
  sdists = [Path(s) if s.endswith('.tar.gz') else fetch_sdist(s, Path(_SDIST_CACHE.value))
            for s in _SDISTS.value if s]
  with tempfile.TemporaryDirectory(prefix='redteam-') as tmp:
    work = Path(_WORKDIR.value or tmp)
    origin, task_dir, _ = testing.make_fixture_tasks(work, only=None, modes=task_lib.MODES)
    honest_dirs = [testing.sdist_tasks(s, work / 'sdists', _MAX_TASKS.value) for s in sdists]
    report = redteam.run(origin, task_dir, _ATTACKS.value, workers=_WORKERS.value,
                         honest_dirs=honest_dirs)
  report['sdists'] = [s.name for s in sdists]
  print(table(report))
  print(f'attacks tried {report["attacks_tried"]}, blocked {report["attacks_blocked"]} '
        f'(missed: {", ".join(report["missed"]) or "none"}), masked {len(report["masked"])}, '
        f'flagged {report["flagged"]}, '
        f'controls ok {report["controls_ok"]}/{report["attacks_tried"]}, leak hunts that found '
        f'the code without the sandbox {report["controls_found_leak"]}/{report["hunts"]}, '
        f'honest solutions passed {report["honest_passed"]}/{report["honest_total"]} '
        f'(fixture and {", ".join(report["sdists"]) or "no sdists"})')
  if _JSON.value:
    Path(_JSON.value).write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
  app.run(main)
