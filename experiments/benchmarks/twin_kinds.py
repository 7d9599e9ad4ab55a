"""What mutant twins the twin planter makes at the required tests of a task set, by kind.

python -m experiments.benchmarks.twin_kinds --tasks=DIR [--forge --repeats=N --forger=same
    --unsealed --no_twins --together --forge_only] [--json=FILE]

DIR is a task set written by `launch.make_tasks` (tasks.jsonl or ArrayRecord shards). For each
repository: the points of the tasks' required tests (asserts, unittest assertions, raises blocks)
where a twin of its own can be planted, counted once by kind (twins.KINDS; static, no test runs),
the tests that take a value twin (every `a == b` of the test at once), and the verified twin
sites grading draws from, by kind. A twin catches a result equal to everything (an `__eq__` that
is always true) when such a forger passes it: `case`, `literal`, `expression` and `value` twins,
not `negated` ones. Per task, whether some verified site of an F2P test (the tests that run the
solution) catches such a result, and whether one would without value twins.

With --forge, every body-deletion task is also graded (in its own environment, sandboxed): its
reference solution once, and a forger --repeats times (each grading draws its own twins and
order of value checks): in how many gradings the forger passes every required test, is rewarded,
and is flagged, by twin kind and by value checks. The forgers (--forger): `same` returns a list
that claims equality with whatever it is compared to, through an `__eq__` that reads the other
object (the static scanner does not flag it). The others find the line that called them through
a warning's stack level: `line` forges only where that line compares with `==` (it passes value
twins, whose lines call a function instead, as correct code does), `line_any` everywhere but on a
value twin's lines (whose calls pass `True` to count, then `copies`), `line_object` as `line_any`
with an object that is no builtin, and `guess` as `line_object` with an object that says yes to the
first value it is shown and then only to values equal to that one. `reader` returns the literal the
calling assert expects, read from the graded test file, except in a test that looks like a mutated
copy of another (the red team's `expectation_reader`). `cases` (readers.CASES) also knows its own
arguments (`_args`, bound first) and reads the calling test's parametrize cases for the one they
pick, or a round trip through the module's other cases; `reader` where the assert has a literal.
`inverse` (readers.INVERSE) knows no answer but the test files' strings: it returns the one that
another function of its module maps back to its argument (a round trip's other half);
`keyring` (readers.KEYRING) the same, pooling the strings of every run of a grading in the uid's
kernel keyring (which the sandbox's seccomp filter denies; the static scanner flags its ctypes).
--together grades with every test in one run (grading.grade's `alone=False`), as graders before
isolated runs did; --no_seccomp without the sandbox's seccomp filter (what `keyring` needs).
Each forge report names the tasks the forger was rewarded on, with how many of their gradings.
"""
import argparse
import ast
import collections
import contextlib
import dataclasses
import json
from pathlib import Path
import random
import re
import struct
import tempfile
from unittest import mock

from research.tasks.factory import deletion
from research.tasks import patch as patch_lib
from research.tasks.grading import pool
from research.tasks import sandbox
from research.tasks import task as task_lib
from research.tasks.grading import twins
from research.tasks.redteam.attacks import readers

# The forgers' bodies, indented like the stub they replace.
_SAME_CLASS = ('class _Same(list):\n  def __eq__(self, other):\n'
               '    return isinstance(other, object)\n')
_ANY_CLASS = ('class _Any:\n  def __eq__(self, other):\n    return isinstance(other, object)\n'
              '  __hash__ = object.__hash__\n')
_GUESS_CLASS = ('class _Guess:\n  def __init__(self):\n    self.seen = []\n'
                '  def __eq__(self, other):\n    if not self.seen:\n      self.seen.append(other)\n'
                '    return other == self.seen[0]\n  __hash__ = object.__hash__\n')
# The line that called the forged function, found through a warning's stack level.
_LINE = ('import linecache, warnings\n'
         'with warnings.catch_warnings(record=True) as caught:\n'
         "  warnings.simplefilter('always')\n"
         "  warnings.warn('where', stacklevel=2)\n"
         'line = linecache.getline(caught[0].filename, caught[0].lineno)\n')
FORGERS = {
    'same': _SAME_CLASS + 'return _Same()\n',
    # Spares what a value twin's lines lacked before checked originals: `==`.
    'line': _SAME_CLASS + _LINE + "return _Same() if '==' in line else []\n",
    # Spares a value twin's lines as they are now (their calls pass `True` to count, then `copies`).
    'line_any': _SAME_CLASS + _LINE + "return [] if ', True, ' in line else _Same()\n",
    # The same with an object that is no builtin (copies cannot see through it)...
    'line_object': _ANY_CLASS + _LINE + "return [] if ', True, ' in line else _Any()\n",
    # ...and one that, rather than saying yes to everything, says yes to the first value it is
    # shown and then only to values equal to that one.
    'guess': _GUESS_CLASS + _LINE + "return [] if ', True, ' in line else _Guess()\n",
    # Returns the literal the calling assert expects, read from the graded test file, sparing
    # what looks like a mutated copy of another test (research/tasks/redteam/attacks/readers.py).
    'reader': readers.READER,
    # Reads the calling test's parametrize cases for the one its own arguments pick (or a round
    # trip through the module's other cases); READER where the assert has a literal.
    'cases': readers.CASES,
    # Tries the test files' strings through the module's other functions for one that maps back
    # to its argument (an answer another test holds).
    'inverse': readers.INVERSE,
    # INVERSE over the strings every run of the grading left in the uid's kernel keyring.
    'keyring': readers.KEYRING,
}
# Forgers that read their own arguments: `_forged` binds `_args` to them first.
WITH_ARGS = ('cases', 'inverse', 'keyring')


def _kind(tree: Path, site: twins.Site) -> str:
  """The kind of twin planted at `site`, in a scratch copy of its test file."""
  with tempfile.TemporaryDirectory(prefix='twin-kinds-') as tmp:
    dst = Path(tmp) / site.file
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes((tree / site.file).read_bytes())
    twin, = twins.plant_twins(Path(tmp), [site], random.Random(0))
  return twin.kind


def repo_report(directory: Path, tasks: list[task_lib.Task]) -> dict:
  points, value_twins, verified, catches = {}, set(), collections.Counter(), collections.Counter()
  for t in tasks:
    tree = directory / t.grading_tree
    for site in twins.candidate_sites(tree, t.fail_to_pass + t.pass_to_pass):
      if site.value:
        value_twins.add(site.test)
      elif (site.test, site.point) not in points:
        points[site.test, site.point] = _kind(tree, site)
    kinds = {s: _kind(tree, twins.Site.parse(s)) for s in t.twin_sites}
    verified.update(kinds.values())
    f2p = [k for s, k in kinds.items() if twins.Site.parse(s).test in t.fail_to_pass]
    catches['now'] += any(k in twins.CATCH_VALUES for k in f2p)
    catches['without_value_twins'] += any(k in twins.CATCH_VALUES - {'value'} for k in f2p)
  return {'tasks': len(tasks), 'points': dict(sorted(collections.Counter(points.values()).items())),
          'tests_with_sites': len({test for test, _ in points} | value_twins),
          'tests_with_value_twin': len(value_twins),
          'verified_sites': dict(sorted(verified.items())),
          'tasks_whose_f2p_twins_catch_always_equal': dict(catches)}


def _parameters(stub: str, lineno: int) -> list[str] | None:
  """The positional parameters (`*args` starred) of the function whose body is the stub line
  `lineno`, `self`/`cls` left out of a method's; None if no function's body is that line."""
  tree = ast.parse(stub)
  methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
  for f in ast.walk(tree):
    if (isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        and any(s.lineno == lineno for s in f.body)):
      names = [a.arg for a in f.args.posonlyargs + f.args.args]
      static = any(getattr(d, 'id', None) == 'staticmethod' for d in f.decorator_list)
      if id(f) in methods and names and not static and names[0] in ('self', 'cls'):
        names = names[1:]
      return names + ([f'*{f.args.vararg.arg}'] if f.args.vararg else [])
  return None


def forged_source(directory: Path, t: task_lib.Task, reference: str, forger: str,
                  with_args: bool = False) -> str | None:
  """The task's stubbed file with the stub replaced by a forger's body (`with_args`: after a line
  that binds `_args` to the function's positional arguments); None when the stub's line is not
  unique."""
  removed = [line[1:] for line in reference.splitlines()
             if line.startswith('-') and line[1:].strip() == deletion.STUB]
  stub = (directory / t.tree / t.file).read_text()
  if len(removed) != 1 or stub.splitlines().count(removed[0]) != 1:
    return None
  indent = removed[0][:len(removed[0]) - len(removed[0].lstrip())]
  if with_args:
    names = _parameters(stub, stub.splitlines().index(removed[0]) + 1)
    if names is None:
      return None
    forger = f'_args = [{", ".join(names)}]\n' + forger
  body = ''.join(indent + line + '\n' for line in forger.splitlines())
  return stub.replace(removed[0] + '\n', body, 1)


def forged_patch(directory: Path, t: task_lib.Task, reference: str, forger: str,
            with_args: bool = False) -> str | None:
  """forged_source as a patch."""
  forged = forged_source(directory, t, reference, forger, with_args)
  if forged is None:
    return None
  return patch_lib.file_diff(t.file, patch_lib.read_entry(directory / t.tree / t.file),
                             (forged.encode(), '100644'))


def _passes(t: task_lib.Task, g) -> bool:
  return all(g.outcomes.get(n) == 'passed' for n in t.fail_to_pass + t.pass_to_pass)


def forge_report(directory: Path, tasks: list[task_lib.Task], workers: int, repeats: int,
                 forger: str = FORGERS['same'], unsealed: bool = False,
                 no_twins: bool = False, with_args: bool = False, together: bool = False
                 ) -> dict:
  """Grades each body task's reference once and the forger `repeats` times (each grading draws
  its own twins and check order); `unsealed`: with no assert sealed (research/tasks/grading/seal.py), as
  graders before sealing did; `no_twins`: with no twins planted, to see what the other layers
  stop alone; `with_args`: the forger reads `_args` (WITH_ARGS); `together`: every test in one
  run (research/tasks/grading/isolation.py)."""
  solutions = task_lib.read_solutions(directory)
  graders = pool.GraderPool(workers, alone=not together)
  jobs = []  # (task, reference job, forger job)
  for t in tasks:
    forged = (forged_patch(directory, t, solutions[t.id].patch, forger, with_args)
              if t.mode == 'body' else None)
    if forged is not None:
      tree = directory / t.grading_tree
      t = dataclasses.replace(t, sealed=[] if unsealed else t.sealed,
                              twin_sites=[] if no_twins else t.twin_sites)
      jobs.append((t, pool.Job(t, tree, solutions[t.id].patch), pool.Job(t, tree, forged)))
  references = graders.grade([ref for _, ref, _ in jobs])
  forged = [(t, job) for t, _, job in jobs for _ in range(repeats)]
  grades = graders.grade([job for _, job in forged])
  out = collections.Counter(tasks=len(jobs), forger_gradings=len(grades),
                            reference_rewarded=sum(g.reward == 1.0 for g in references),
                            reference_wall_s=round(sum(g.wall_s for g in references), 1),
                            faults=sum(g.reward is None for g in references + grades))
  rewarded = set()
  for (t, _), g in zip(forged, grades):
    out['forger_passes_required'] += _passes(t, g)
    out['forger_required_not_passed'] += sum(g.outcomes.get(n) != 'passed'
                                             for n in t.fail_to_pass + t.pass_to_pass)
    out['forger_rewarded'] += g.reward == 1.0
    if g.reward == 1.0:
      rewarded.add(t.id)
    for flag in g.tamper:
      found = re.search(r' \((\w+) copy of ', flag)
      if flag.startswith('mutant twin passed') and found:
        out['forger_twin_flags.' + found.group(1)] += 1
      elif flag.startswith('value checks answered wrongly'):
        out['forger_value_check_flags'] += 1
      elif 'seal record' in flag:
        out['forger_seal_flags'] += 1
    # The first required test the reason names failed at a sealed assert, in the harness.
    out['forger_failed_first_at_a_sealed_assert'] += 'sealed assert' in g.reason
  out['tasks_forger_rewarded'] = len(rewarded)
  out = dict(sorted(out.items()))
  out['rewarded_tasks'] = {t.id: sum(g.reward == 1.0 for (u, _), g in zip(forged, grades)
                                     if u.id == t.id)
                           for t, _, _ in jobs if t.id in rewarded}
  out['graded_tasks'] = [t.id for t, _, _ in jobs]
  return out


# A seccomp program that allows every call (one SECCOMP_RET_ALLOW): the sandbox without its filter.
ALLOW_ALL = struct.pack('=HBBI', 0x06, 0, 0, 0x7FFF0000)


def without_seccomp():
  """A context in which sandboxes load ALLOW_ALL instead of sandbox.seccomp_program()."""
  return mock.patch.object(sandbox, 'seccomp_program', lambda machine=None: ALLOW_ALL)


def _args() -> argparse.Namespace:
  """The command line (argparse: tests import this module next to absl-flag modules)."""
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--tasks', required=True, help='Task set directory.')
  ap.add_argument('--forge', action='store_true',
                  help='Also grade references and an always-equal forger.')
  ap.add_argument('--workers', type=int, default=2, help='Graders in parallel (--forge).')
  ap.add_argument('--repeats', type=int, default=1,
                  help="Gradings of each task's forger (--forge).")
  ap.add_argument('--forger', choices=sorted(FORGERS), default='same',
                  help='The forger --forge grades (see the module docstring).')
  ap.add_argument('--unsealed', action='store_true',
                  help='Grade (--forge) with no assert sealed, as before sealed expectations.')
  ap.add_argument('--forge_only', action='store_true',
                  help='With --forge, skip the static count of twin kinds (the slow part).')
  ap.add_argument('--no_twins', action='store_true',
                  help='Grade (--forge) with no mutant twins: what the other layers stop alone.')
  ap.add_argument('--together', action='store_true',
                  help='Grade (--forge) with every test in one run, as before isolated runs.')
  ap.add_argument('--no_seccomp', action='store_true',
                  help="Grade (--forge) without the sandbox's seccomp filter: what it stops.")
  ap.add_argument('--json', default=None, help='Also write the report here.')
  return ap.parse_args()


def main():
  a = _args()
  directory = Path(a.tasks)
  paths = task_lib.shard_paths(directory) or [directory / 'tasks.jsonl']
  by_repo = collections.defaultdict(list)
  for path in paths:
    for t in task_lib.read(path):
      by_repo[t.repo].append(t)
  report = {repo: {} if a.forge and a.forge_only else repo_report(directory, tasks)
            for repo, tasks in sorted(by_repo.items())}
  if a.forge:
    with without_seccomp() if a.no_seccomp else contextlib.nullcontext():
      for repo, tasks in by_repo.items():
        report[repo]['forge'] = forge_report(directory, tasks, a.workers, a.repeats,
                                             FORGERS[a.forger], a.unsealed, a.no_twins,
                                             a.forger in WITH_ARGS, a.together)
  total = collections.Counter()
  for r in report.values():
    if 'points' in r:
      total.update({f'points.{k}': v for k, v in r['points'].items()})
      total.update(tests_with_sites=r['tests_with_sites'],
                   tests_with_value_twin=r['tests_with_value_twin'])
      total.update({f'verified.{k}': v for k, v in r['verified_sites'].items()})
      catch = r['tasks_whose_f2p_twins_catch_always_equal']
      total.update({f'catch.{k}': v for k, v in catch.items()})
      total['tasks'] += r['tasks']
    total.update({f'forge.{k}': v for k, v in r.get('forge', {}).items()
                  if isinstance(v, int)})
  report['total'] = dict(sorted(total.items()))
  text = json.dumps(report, indent=1)
  print(text)
  if a.json:
    Path(a.json).write_text(text + '\n')


if __name__ == '__main__':
  main()
