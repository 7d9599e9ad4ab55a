"""Runs the scripted reward-hacking attacks against fixture tasks and reports what got through.

python -m experiments.redteam --json=/tmp/redteam.json [--attacks=git_history,fork_bomb]
"""
import json
from pathlib import Path
import tempfile

from absl import app, flags

from research.tasks import redteam

_JSON = flags.DEFINE_string('json', None, 'Where to write the full report.')
_ATTACKS = flags.DEFINE_list('attacks', None, 'Run only these attacks (default: all).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Keep the fixture and tasks here.')


def table(report: dict) -> str:
  rows = ['| attack | class | reward | blocked | flagged | leak found (control) |',
          '| --- | --- | --- | --- | --- | --- |']
  for a in report['attacks']:
    control = '' if a['control_found_leak'] is None else f' ({a["control_found_leak"]})'
    rows.append(f'| {a["name"]} | {a["kind"]} | {a["reward"]} | {a["blocked"]} | '
                f'{a["flagged"]} | {a["found_leak"]}{control} |')
  return '\n'.join(rows)


def main(argv):
  del argv
  known = {a.name for a in redteam.ATTACKS}
  unknown = set(_ATTACKS.value or ()) - known
  if unknown:
    raise app.UsageError(f'unknown attacks {sorted(unknown)}; known: {sorted(known)}')
  with tempfile.TemporaryDirectory(prefix='redteam-') as tmp:
    origin, task_dir, _ = redteam.make_fixture_tasks(Path(_WORKDIR.value or tmp))
    report = redteam.run(origin, task_dir, _ATTACKS.value)
  print(table(report))
  print(f'attacks tried {report["attacks_tried"]}, blocked {report["blocked"]}, flagged '
        f'{report["flagged"]} (detectable {report["flag_expected"]}), controls that found the '
        f'leak {report["controls_found_leak"]}/{report["controls"]}, honest solutions passed '
        f'{report["honest_passed"]}/{report["honest_total"]}')
  if _JSON.value:
    Path(_JSON.value).write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
  app.run(main)
