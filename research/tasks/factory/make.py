"""Task factory: deletes code that tests exercise and keeps the deletions that pass every gate.

Per repository: the suite runs three times in the sandbox (the first under coverage, which maps
functions to the tests that execute them); tests that do not pass all three times are dropped.
Per candidate (a function and a deletion mode), the gates are: the package still imports; at
least one test fails (FAIL_TO_PASS) and one still passes (PASS_TO_PASS); the rebuilt policy tree
and the venv hold no copy of the deleted code; no trivial body (`return True`, the first
argument, ...) passes every FAIL_TO_PASS test; twins of the tests fail on the original; and the
original, graded as a solution in the grading sandbox, gets reward 1. A failing candidate is
recorded with its gate, never fatal.
"""
import dataclasses
import json
from pathlib import Path
import random
import tempfile
import time
from typing import Callable

import tqdm

from research.tasks import layout
from research.tasks import task as task_lib
from research.tasks.factory import taskset
from research.tasks.factory.candidates import Candidate, Prepared, Reject, Rejected, Settings, Summary, prepare
from research.tasks.factory.gates import try_candidate, venv_leaks
from research.tasks.task import Solution, Task


def make_tasks(repo: Path, out: Path, *, fmt: str = 'jsonl', progress: bool = True,
               log: Callable[[str], None] = print, **settings) -> Summary:
  """Writes validated tasks for `repo` into `out` and returns the summary.

  `settings` are the fields of Settings.
  """
  start = time.perf_counter()
  settings = Settings(**settings)
  repo, out = Path(repo).resolve(), Path(out).resolve()
  summary = Summary(repo.name)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'trees').mkdir(exist_ok=True)
  rejections = []

  def reject(cand: Candidate, gate: str, detail: str) -> None:
    summary.rejected[gate] += 1
    rejections.append({'candidate': cand.id, 'gate': gate, 'detail': detail})

  with tempfile.TemporaryDirectory(prefix='factory-') as tmp:
    base = Path(tmp) / repo.name
    layout.copy_tree(repo, base)
    try:
      prepared = prepare(base, settings, summary, reject)
    except Rejected as e:
      summary.repo_rejected = str(e)
      prepared = None
    made = _make_all(base, out, prepared, settings, summary, reject, progress) if prepared else []
  task_lib.write(out, [m[0] for m in made], [m[1] for m in made], fmt)
  summary.seconds = time.perf_counter() - start
  with open(out / 'rejected.jsonl', 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rejections)
  with open(out / 'summary.json', 'w') as f:
    json.dump({**dataclasses.asdict(summary), 'rejected': dict(summary.rejected)}, f, indent=1)
  report = taskset.RepoReport(summary.repo, settings.venv, summary.candidates,
                              summary.tried, summary.stable_tests, summary.repo_rejected, [])
  taskset.plot(taskset.statistics([m[0] for m in made], rejections, [report]),
               out / 'summary.png')
  log(summary.table())
  return summary


def _make_all(base: Path, out: Path, prepared: Prepared, settings: Settings, summary: Summary,
              reject: Reject, progress: bool) -> list[tuple[Task, Solution]]:
  """Tries the candidates in a seeded order, until max_tasks are kept."""
  cands = list(prepared.candidates)
  random.Random(settings.seed).shuffle(cands)
  leaks = venv_leaks(base, cands, settings)
  made = []
  bar = tqdm.tqdm(cands, desc=f'tasks from {summary.repo}', unit='candidate',
                  disable=not progress)
  for cand in bar:
    if settings.max_tasks is not None and summary.kept >= settings.max_tasks:
      break
    summary.tried += 1
    result = try_candidate(base, out, cand, prepared, settings, leaks.get(cand.id, []))
    if isinstance(result, Rejected):
      reject(cand, result.gate, result.detail)
    else:
      made.append(result)
      summary.kept += 1
    bar.set_postfix(kept=summary.kept, rejected=sum(summary.rejected.values()))
  return made


