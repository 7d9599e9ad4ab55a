"""Task records and the files they live in.

A task set directory holds `tasks.jsonl` (or `tasks.array_record`): what the policy and the
grader see; `trees/<id>/`: the tree the policy starts from (without the task's test files, unless
the task keeps them visible); `graded/<id>/`: the pristine tree grading starts from, with every
test; and `solutions.jsonl`: the deleted code, kept apart so that nothing that serves the policy
ever reads it.
"""
import dataclasses
import json
from pathlib import Path
from typing import Iterable

FORMATS = ('jsonl', 'arrayrecord')
MODES = ('body', 'function', 'feature')


@dataclasses.dataclass(frozen=True)
class Task:
  """One synthetic task: restore the deleted code so that the tests pass again."""
  id: str
  repo: str
  file: str
  symbol: str
  mode: str
  fail_to_pass: list[str]
  pass_to_pass: list[str]
  test_files: list[str]
  test_command: list[str]
  protected_paths: list[str]
  packages: list[str]  # Where a solution may create or change Python files.
  python_path: list[str]  # Tree-relative directories put first on sys.path.
  site_dirs: list[str]  # Absolute directories with dependencies that are not installed.
  config_file: str | None
  time_limit_s: float
  cpu_limit_s: int
  tree: str  # The policy's tree, relative to the task set directory.
  grading_tree: str  # The pristine tree graded on (every test in it), relative like `tree`.
  visible_tests: bool  # Whether `tree` keeps the test files that hold the required tests.
  twin_sites: list[str]  # Where mutant twins fail on the original ('<node id>@<point>').
  max_twins: int  # Twins planted per grading, at most.
  python: str  # The interpreter of the task's venv (tests and grading run with it).
  venv: str | None  # Its id when it is a per-repository venv (research/tasks/factory/venvs.py).
  # Difficulty signals: non-blank lines deleted, stable tests executing them, cyclomatic size.
  lines_deleted: int
  covering_tests: int
  cyclomatic: int
  # Asserts of required tests whose literal grading compares outside the sandbox
  # ('<node id>@<ordinal>', research/tasks/grading/seal.py).
  sealed: list[str]
  # Differential checks (research/tasks/grading/differential.py): the calls of the deleted
  # function the required tests make that the original answers the same way twice (record.py's
  # encodings of [args, kwargs]; empty: the task does not use them), and the directory, relative
  # like `tree`, that holds the original `file` (None with no calls).
  calls: list[str]
  original: str | None


@dataclasses.dataclass(frozen=True)
class Solution:
  """The deleted code of one task."""
  id: str
  patch: str  # Restores the original when applied to the task's tree.
  deleted: str
  fingerprints: list[str]  # Distinctive lines searched for by the leak gate.


def _dump(obj) -> str:
  return json.dumps(dataclasses.asdict(obj), sort_keys=True)


def write(directory: Path, tasks: Iterable[Task], solutions: Iterable[Solution],
          fmt: str = 'jsonl') -> Path:
  """Writes tasks and solutions; returns the task file."""
  if fmt not in FORMATS:
    raise ValueError(f'unknown task format {fmt!r}; expected one of {FORMATS}')
  lines = [_dump(t) for t in tasks]
  if fmt == 'jsonl':
    path = directory / 'tasks.jsonl'
    path.write_text(''.join(line + '\n' for line in lines))
  else:
    path = directory / 'tasks.array_record'
    _write_array_record(path, lines)
  _write_solutions(directory, solutions)
  return path


def _write_array_record(path: Path, lines: list[str]) -> None:
  from array_record.python import array_record_module  # Only this format needs it.
  writer = array_record_module.ArrayRecordWriter(str(path), 'group_size:1')
  for line in lines:
    writer.write(line.encode())
  writer.close()


def _write_solutions(directory: Path, solutions: Iterable[Solution]) -> None:
  with open(directory / 'solutions.jsonl', 'w') as f:
    f.writelines(_dump(s) + '\n' for s in solutions)


def shard_paths(directory: Path) -> list[Path]:
  """The ArrayRecord shards of a task set written by write_shards, in order."""
  return sorted(directory.glob('tasks-*-of-*.array_record'))


def write_shards(directory: Path, tasks: list[Task], solutions: Iterable[Solution],
                 shards: int) -> list[Path]:
  """Tasks in `shards` ArrayRecord files (contiguous runs, in the given order), and solutions."""
  if shards < 1:
    raise ValueError(f'shards must be at least 1, got {shards}')
  for old in shard_paths(directory):
    old.unlink()
  lines = [_dump(t) for t in tasks]
  paths = []
  for i in range(shards):
    paths.append(directory / f'tasks-{i:05d}-of-{shards:05d}.array_record')
    _write_array_record(paths[-1], lines[i * len(lines) // shards:(i + 1) * len(lines) // shards])
  _write_solutions(directory, solutions)
  return paths


def upgrade(record: dict) -> dict:
  """A task record as this version reads it, from any earlier version's: the one place that
  knows older records. Records made before sealing seal nothing, and before differential checks
  use none; `environment` is now `venv`; value twin sites of records made before checked
  originals (`@-1~seed`, twins.WHOLE) stay readable as they are."""
  record = dict(record)
  if 'environment' in record:  # Named `venv` since the restructuring (issue 38).
    record['venv'] = record.pop('environment')
  return {'sealed': [], 'calls': [], 'original': None, **record}


def decode(record: bytes | str) -> Task:
  fields = upgrade(json.loads(record))
  unknown = set(fields) - {f.name for f in dataclasses.fields(Task)}
  if unknown:
    raise ValueError(f'task record {fields.get("id")!r} has unknown fields {sorted(unknown)}')
  return Task(**fields)


def read(path: Path) -> list[Task]:
  """Reads tasks.jsonl, tasks.array_record, or a task set's directory (its task file, else the
  shards of a `launch.make_tasks --repos` run)."""
  if path.is_dir():
    files = [f for f in (path / 'tasks.jsonl', path / 'tasks.array_record') if f.is_file()]
    files = files[:1] or shard_paths(path)
    if not files:
      raise FileNotFoundError(f'{path} holds no tasks.jsonl, tasks.array_record or task shards')
    return [t for f in files for t in read(f)]
  if path.suffix == '.jsonl':
    return [decode(line) for line in path.read_text().splitlines() if line.strip()]
  from array_record.python import array_record_module
  reader = array_record_module.ArrayRecordReader(str(path))
  try:
    return [decode(r) for r in reader.read_all()]
  finally:
    reader.close()


def read_solutions(directory: Path) -> dict[str, Solution]:
  lines = (directory / 'solutions.jsonl').read_text().splitlines()
  return {s.id: s for s in (Solution(**json.loads(line)) for line in lines if line.strip())}
