"""A task set from many repositories: near duplicates dropped, records in shards, a summary.

Two tasks are near duplicates when they delete the same code (compared as syntax trees, so
formatting and comments do not count; e.g. one helper vendored into two repositories) or leave the
same hole (the same file after the deletion, e.g. two modes of one symbol that remove the same
lines). Of each group the task with the smallest id stays. The summary has, per repository, the
candidates, kept tasks and repository-level rejections; per gate, the rejected candidates; and
the distributions of the difficulty signals (lines deleted, covering tests, cyclomatic size),
as `summary.json`, a table (`summary.txt`) and a figure (`summary.png`).
"""
import ast
import collections
import dataclasses
import hashlib
import json
from pathlib import Path
import shutil

from research.tasks.factory import deletion
from research.tasks import task as task_lib
from research.tasks.task import Solution, Task

DUPLICATE = 'duplicate'
SIGNALS = ('lines_deleted', 'covering_tests', 'cyclomatic')


@dataclasses.dataclass(frozen=True)
class RepoReport:
  """What happened to one repository before its candidates were tried."""
  key: str
  venv: str | None
  candidates: int  # Candidates listed (each mode of each function).
  tried: int  # Those sampled and sent through the gates.
  stable_tests: int
  repo_rejected: str | None
  rejections: list[dict]  # Candidates rejected while listing (no covering test).


def _digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


def _code_key(deleted: str) -> str:
  try:
    return _digest(ast.dump(deletion.parse_fragment(deleted)))
  except SyntaxError:
    return _digest(' '.join(deleted.split()))


def hole(task: Task, out: Path) -> str:
  """A digest of the file the task leaves with a hole (what two modes may share)."""
  return _digest(task.repo + '\0' + task.file + '\0' +
                 (out / task.grading_tree / task.file).read_text(errors='replace'))


def dedupe(made: list[tuple[Task, Solution]], holes: dict[str, str], out: Path
           ) -> tuple[list[tuple[Task, Solution]], list[dict]]:
  """(kept, rejection records of the duplicates); the duplicates' trees are deleted from out.

  `holes` maps task ids to their hole digests.
  """
  first = {}
  kept, dropped = [], []
  for task, solution in sorted(made, key=lambda m: m[0].id):
    keys = [('same deleted code as', _code_key(solution.deleted)),
            ('same hole as', holes[task.id])]
    twin = next(((why, first[k]) for why, k in keys if k in first), None)
    if twin is None:
      first.update({k: task.id for _, k in keys})
      kept.append((task, solution))
      continue
    dropped.append({'candidate': task.id, 'gate': DUPLICATE, 'detail': f'{twin[0]} {twin[1]}'})
    for rel in {task.tree, task.grading_tree}:
      shutil.rmtree(out / rel, ignore_errors=True)
  return kept, dropped


def statistics(tasks: list[Task], rejections: list[dict], reports: list[RepoReport]) -> dict:
  """Per repository and per gate counts, and the difficulty signals' distributions."""
  kept = collections.Counter(t.repo for t in tasks)
  by_gate = collections.Counter(r['gate'] for r in rejections)
  repos = {r.key: {'venv': r.venv, 'candidates': r.candidates, 'tried': r.tried,
                   'stable_tests': r.stable_tests, 'kept': kept[r.key],
                   'repo_rejected': r.repo_rejected} for r in sorted(reports, key=lambda r: r.key)}
  signals = {s: sorted(getattr(t, s) for t in tasks) for s in SIGNALS}
  return {'kept': len(tasks), 'rejected': sum(by_gate.values()), 'repos': repos,
          'rejected_by_gate': dict(sorted(by_gate.items())), 'signals': signals}


def table(stats: dict) -> str:
  rows = [('repository', 'candidates', 'tried', 'kept', 'stable tests', 'note')]
  for key, r in stats['repos'].items():
    rows.append((key, r['candidates'], r['tried'], r['kept'], r['stable_tests'],
                 (r['repo_rejected'] or '')[:60]))
  widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(f'{str(v):<{w}}' for v, w in zip(row, widths)) for row in rows]
  lines += ['', f'kept {stats["kept"]}, rejected {stats["rejected"]}']
  lines += [f'  rejected: {gate:<18} {n}' for gate, n in stats['rejected_by_gate'].items()]
  for s, values in stats['signals'].items():
    if values:
      mid = values[len(values) // 2]
      lines.append(f'  {s:<15} median {mid}, min {values[0]}, max {values[-1]}')
  return '\n'.join(lines)


def plot(stats: dict, path: Path) -> None:
  """Kept by repository, rejected by gate, and the difficulty signals' histograms."""
  import matplotlib  # Only the figure needs it.
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  fig, axes = plt.subplots(1, 2 + len(SIGNALS), figsize=(5 * (2 + len(SIGNALS)), 4))
  repos = stats['repos']
  axes[0].barh(list(repos), [r['kept'] for r in repos.values()])
  axes[0].set_title('kept tasks by repository')
  gates = stats['rejected_by_gate']
  axes[1].barh(list(gates), list(gates.values()))
  axes[1].set_xscale('log')  # One gate (no covering test) usually dwarfs the rest.
  axes[1].set_title('rejected candidates by gate')
  for ax, (signal, values) in zip(axes[2:], stats['signals'].items()):
    ax.hist(values, bins=min(20, max(1, len(set(values)))))
    ax.set_title(signal.replace('_', ' '))
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt.close(fig)


def write(out: Path, made: list[tuple[Task, Solution]], holes: dict[str, str],
          rejections: list[dict], reports: list[RepoReport], shards: int) -> dict:
  """Writes the task set (shards, solutions, rejections, summary); returns the statistics."""
  made, duplicates = dedupe(made, holes, out)
  rejections = sorted(rejections + duplicates, key=lambda r: r['candidate'])
  tasks = [t for t, _ in made]
  task_lib.write_shards(out, tasks, [s for _, s in made], shards)
  with open(out / 'rejected.jsonl', 'w') as f:
    f.writelines(json.dumps(r, sort_keys=True) + '\n' for r in rejections)
  stats = statistics(tasks, rejections, reports)
  with open(out / 'summary.json', 'w') as f:
    json.dump(stats, f, indent=1)
  with open(out / 'summary.txt', 'w') as f:
    f.write(table(stats) + '\n')
  plot(stats, out / 'summary.png')
  return stats
