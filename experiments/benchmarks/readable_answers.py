"""How many FAIL_TO_PASS tests' sealed answers a forger can still read in the graded test files.

python -m experiments.benchmarks.readable_answers --tasks=DIR [--json=FILE]

DIR is a task set written by `launch.make_tasks`. Each task's grading tree is planted as grading
plants it (twins, value checks, seals: research/tasks/grading/grader.py step 4), and the string constants
of every test file in it are collected. An F2P test's answers are the literals its sealed asserts
(or its case's sealed argument) expect, strings of at least --min_chars characters; one is
readable when it is such a constant. A readable answer sits in no assert and in no list beside its
input (sealing moved it out), but it is another test's input or literal, so a forger with the
inverse function, or one that guesses among the module's strings, can return it (docs/tasks.md,
"Sealed expectations"). Per task: the distinct answers and those readable; the F2P tests with
answers and those whose every answer is readable when case is ignored (a forger changes case
itself: inflection's tests expect `plural.capitalize()` too; where the function only changes
case, `titleize`, its input is then its answer, and that count means little).
"""
import argparse
import ast
import collections
import json
from pathlib import Path
import random
import tempfile

from research.tasks import grading
from research.tasks.grading import isolation
from research.tasks import layout
from research.tasks.grading import seal
from research.tasks import task as task_lib


def _constants(tree: Path, min_chars: int) -> set[str]:
  """The string constants of the tree's test files (none that does not parse)."""
  out = set()
  for path in tree.rglob('*.py'):
    if not layout.is_test_path(path.relative_to(tree).as_posix()):
      continue
    try:
      module = ast.parse(path.read_text(errors='replace'))
    except SyntaxError:
      continue
    out |= {n.value for n in ast.walk(module) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and len(n.value) >= min_chars}
  return out


def task_report(directory: Path, t: task_lib.Task, min_chars: int, seed: int) -> dict:
  """Counts of one task's F2P string answers and tests, planted with `seed`: in the planted test
  files, and (`*_in_run`) in those of the run that holds the test (research/tasks/grading/isolation.py)."""
  rng = random.Random(seed)
  with tempfile.TemporaryDirectory(prefix='readable-') as scratch:
    work = Path(scratch) / 'tree'
    layout.copy_tree(directory / t.grading_tree, work)
    planted = grading.plant_checks(t, work, rng)
    everywhere = _constants(work, min_chars)
    parts = isolation.split(t.fail_to_pass, t.test_files, work, planted.sealing, planted.twins, Path(scratch))
    alone = {f: _constants(p.tree, min_chars) for p in parts[1:] for f in p.functions}
    main = _constants(work, min_chars)
  answers = collections.defaultdict(set)
  for e in planted.sealing.expect.values():
    for n in t.fail_to_pass:
      if e.of(n) and isinstance(e.value, str) and len(e.value) >= min_chars:
        answers[n].add(e.value)
  distinct = set().union(*answers.values())

  def counts(seen: dict[str, set[str]], suffix: str) -> dict[str, int]:
    readable = {v for n, values in answers.items() for v in values & seen[n]}
    return {f'f2p_readable_without_case{suffix}': sum(
                all(v.casefold() in {c.casefold() for c in seen[n]} for v in values)
                for n, values in answers.items()),
            f'answers_readable{suffix}': len(readable)}

  return {'f2p': len(t.fail_to_pass), 'f2p_with_answers': len(answers), 'answers': len(distinct),
          'isolated': len(alone), **counts({n: everywhere for n in answers}, ''),
          **counts({n: alone.get(seal.function_of(n), main) for n in answers}, '_in_run')}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--tasks', required=True, help='A task set (launch.make_tasks --out).')
  ap.add_argument('--min_chars', type=int, default=3,
                  help='Shorter strings (a letter, a separator) are everywhere: not counted.')
  ap.add_argument('--seed', type=int, default=0, help='Of the twins and seals planted.')
  ap.add_argument('--json', default=None, help='Also write the report here.')
  a = ap.parse_args()
  directory = Path(a.tasks)
  paths = task_lib.shard_paths(directory) or [directory / 'tasks.jsonl']
  report = {t.id: task_report(directory, t, a.min_chars, a.seed)
            for path in paths for t in task_lib.read(path)}
  total = collections.Counter()
  for r in report.values():
    total.update(r)
  report['total'] = dict(total)
  report['tasks_mostly_readable'] = sorted(
      k for k, r in report.items()
      if k != 'total' and r['answers_readable_in_run'] * 2 > r['answers'])
  text = json.dumps(report, indent=1)
  print(text)
  if a.json:
    Path(a.json).write_text(text)


if __name__ == '__main__':
  main()
