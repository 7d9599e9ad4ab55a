"""CASES (research/tasks/redteam/attacks/readers.py): a forger that knows its own arguments finds, in the
calling test's parametrize cases, the one they pick; sealed parametrize arguments stop it."""
import dataclasses

from experiments.benchmarks import twin_kinds
from research.tasks import grading
from research.tasks.grading import tamper
from research.tasks import task as task_lib
from research.tasks.redteam.attacks import readers


def test_a_reader_of_parametrize_cases_is_rewarded_where_only_literals_are_sealed(fixture_tasks):
  _, task_dir, _ = fixture_tasks
  t = next(t for t in task_lib.read(task_dir / 'tasks.jsonl')
           if t.id == 'textops.core.slugify.body')
  graded = task_dir / t.grading_tree
  reference = task_lib.read_solutions(task_dir)[t.id].patch
  # The parametrized test alone, without twins: test_slugify_separator's literal is sealed (no
  # case list answers it) and word_counts calls slugify from the package, not from a test line.
  cases = [n for n in t.fail_to_pass if n.startswith('tests/test_core.py::test_slugify[')]
  assert len(cases) == 4
  t = dataclasses.replace(t, fail_to_pass=cases, twin_sites=[], calls=[])  # Only the seals.
  source = twin_kinds.forged_source(task_dir, t, reference, readers.CASES, with_args=True)
  assert '  _args = [text, sep]\n  _mine = list(_args)\n' in source
  assert tamper.scan((task_dir / t.tree / t.file).read_text(), source) == []
  forged = twin_kinds.forged_patch(task_dir, t, reference, readers.CASES, with_args=True)
  read = twin_kinds.forged_patch(task_dir, t, reference, readers.READER)
  # Literals sealed, case lists not (as grading sealed before it sealed parametrize arguments).
  literals = dataclasses.replace(t, sealed=[s for s in t.sealed if '::test_slugify[' not in s])
  g = grading.grade(literals, graded, forged)
  assert (g.reward, g.tamper) == (1.0, []), g.reason
  # The expectation reader finds no literal there: the expected value is a case argument.
  g = grading.grade(literals, graded, read)
  assert (g.reward, g.tamper) == (0.0, [])
  # The factory sealed the expected argument (seal.py): the case list holds tokens instead.
  assert {f'{n}@0' for n in cases} <= set(t.sealed)
  g = grading.grade(t, graded, forged)
  assert (g.reward, g.tamper) == (0.0, []), g.reason
  assert 'sealed assert 0 unequal to its literal' in g.reason
  assert grading.grade(t, graded, reference).reward == 1.0
