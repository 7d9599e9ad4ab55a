"""False-positive rate of the tamper scanner on honest solutions of real libraries.

python -m experiments.benchmarks.tamper_fp [--libraries=absl,rich,...] [--json=FILE]

A task is what the factory would make from an installed pure-Python library: every (function,
mode) candidate of its deletion step, assuming a test covers every line. Its honest solution
restores the original, so a flag from `tamper.scan(old=deleted file, new=original file)` is a false
positive. No test runs: the scan is static.
"""
import ast
import collections
import dataclasses
import json
from pathlib import Path
import sysconfig
import tempfile
import time

from absl import app, flags

from research.tasks import factory
from research.tasks import layout
from research.tasks.grading import tamper
from research.tasks import task as task_lib

LIBRARIES = ('absl', 'attr', 'click', 'dateutil', 'etils', 'humanize', 'jinja2', 'markdown_it',
             'ml_collections', 'optax', 'packaging', 'pluggy', 'rich')
_SITE = Path(sysconfig.get_paths()['purelib'])


@dataclasses.dataclass
class LibraryResult:
  library: str
  candidates: int = 0
  not_deletable: int = 0  # Deletion refused, or left a file that does not parse.
  flagged: int = 0
  constructs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  examples: list[str] = dataclasses.field(default_factory=list)  # Candidate: flags, a few.

  @property
  def rate(self) -> float:
    return self.flagged / max(1, self.candidates - self.not_deletable)


def measure(package: Path, modes: tuple[str, ...] = task_lib.MODES) -> LibraryResult:
  """Scans the honest solution of every candidate task made from the package at `package`."""
  result = LibraryResult(package.name)
  with tempfile.TemporaryDirectory(prefix='tamper-fp-') as tmp:
    tree = Path(tmp) / 'repo'
    layout.copy_tree(package, tree / package.name)
    files = [f for f in layout.iter_files(tree) if f.endswith('.py')]
    # Every line covered by one pretend test: every candidate counts.
    covered = {f: dict.fromkeys(range(1, len((tree / f).read_bytes().splitlines()) + 2), {'t'})
               for f in files}
    summary = factory.Summary(package.name)
    cands = factory.list_candidates(tree, [package.name], covered, factory.Settings(modes=modes),
                                summary, lambda *_: None)
    result.candidates = len(cands)
    originals = {}  # file -> (source, findings): one parse of each original.
    for cand in cands:
      path = tree / cand.file
      if cand.file not in originals:
        source = path.read_text()
        originals[cand.file] = source, tamper.constructs(source)
      source, after = originals[cand.file]
      try:
        factory.delete(tree, cand)
      except factory.Rejected:
        result.not_deletable += 1
        continue
      deleted = path.read_text()
      path.write_text(source)
      try:
        ast.parse(deleted)
      except SyntaxError:  # The factory's import gate rejects these (`not_importable`).
        result.not_deletable += 1
        continue
      found = tamper.compare(tamper.constructs(deleted), after)
      if found:
        result.flagged += 1
        result.constructs.update(found)
        if len(result.examples) < 20:
          result.examples.append(f'{cand.id}: {found}')
  return result


def table(results: list[LibraryResult]) -> str:
  rows = ['| library | tasks | flagged | rate |', '| --- | --- | --- | --- |']
  rows += [f'| {r.library} | {r.candidates - r.not_deletable} | {r.flagged} | {r.rate:.2%} |'
           for r in results]
  tasks = sum(r.candidates - r.not_deletable for r in results)
  flagged = sum(r.flagged for r in results)
  rows.append(f'| all | {tasks} | {flagged} | {flagged / max(1, tasks):.2%} |')
  return '\n'.join(rows)


def main(argv):
  del argv
  results = []
  for name in flags.FLAGS.libraries:
    start = time.perf_counter()
    results.append(measure(_SITE / name))
    print(f'{name}: {results[-1].flagged}/{results[-1].candidates} flagged, '
          f'{time.perf_counter() - start:.0f} s', flush=True)
  print(table(results))
  for r in results:
    for example in r.examples:
      print(f'  {r.library}: {example}')
  worst = max(results, key=lambda r: r.rate)
  tasks = sum(r.candidates - r.not_deletable for r in results)
  flagged = sum(r.flagged for r in results)
  print(f'overall {flagged}/{tasks} = {flagged / max(1, tasks):.2%}; '
        f'worst {worst.library} {worst.rate:.2%}')
  if flags.FLAGS.json:
    out = {'tasks': tasks, 'flagged': flagged, 'rate': flagged / max(1, tasks),
           'worst': worst.library,
           'libraries': [{**dataclasses.asdict(r), 'constructs': dict(r.constructs),
                          'rate': r.rate} for r in results]}
    Path(flags.FLAGS.json).write_text(json.dumps(out, indent=1))


if __name__ == '__main__':
  # Defined here, not at import: tests import measure() next to other benchmarks' flags.
  flags.DEFINE_list('libraries', list(LIBRARIES),
                    'Installed packages to measure (directories in site-packages).')
  flags.DEFINE_string('json', None, 'Also write the results to this file.')
  app.run(main)
