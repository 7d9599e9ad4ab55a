"""Differential checks: the candidate and the original called on fresh inputs, compared outside.

A deletion task knows its original. The factory records the inputs the required tests call the
deleted function with (`trace`, in a run of the original) and keeps those the original answers
the same way twice (`Task.calls`, with the original's file under `originals/`). At every grading
that the tests would pass, `check` draws fresh inputs near the recorded ones (`fresh`: strings,
numbers, lengths and containers perturbed, types kept) and calls the candidate on them, in its own
sandbox under the task's limits. They come from a pool per task and harness process (`Pool`:
POOL inputs drawn from a secret seed, answered by the original twice, inputs in two orders, each
in a sandbox of its own, keeping the inputs where its two answers agree), drawn afresh at every
grading (seeded per grading; both seeds in the grade): the original runs at a task's first
check in the process, not at every one, and no run shows the candidate more than its draw. The
candidate must answer each of those (where the original's answer is builtins throughout) as the original does: the same value (floats to 1e-9), the
same changes to its arguments, an exception where the original raised one, in time where it
answered in time. Neither the original nor its answers are ever in the candidate's sandbox, so a
body that memorized the tests' answers has nothing to read, and fails on inputs no test wrote.
"""
import dataclasses
import json
import math
from pathlib import Path, PurePosixPath
import random
import secrets
import shutil
import string
import threading

from research.tasks import layout
from research.tasks import sandbox
from research.tasks.grading import seal
from research.tasks.grading import testrun
from research.tasks.task import Task

CALLS = Path(__file__).parent / 'sandboxed' / 'calls.py'

FRESH = 24            # Fresh inputs per grading.
POOL = 4 * FRESH      # Inputs of a task's pool, which gradings draw theirs from.
PER_CALL_S = 2.0      # Time one call may take (the original, on an input, too).
MIN_CALLS = 1         # Recorded calls a task needs to use the check (each gives fresh inputs).
TRACE_LIMIT = 64      # Distinct calls recorded per task.


@dataclasses.dataclass(frozen=True)
class Check:
  """One grading's differential check."""
  seed: int                         # The grading's draw from the pool.
  inputs: int                       # Inputs of the pool.
  compared: int                     # Those drawn (the original answered each the same way twice).
  wrong: int                        # Those the candidate answered otherwise.
  disagreed: list[str]              # The first few of them.
  # Why no input could be compared (the original did not answer, or answered nothing the same way
  # twice): the harness's own fault, in processes the candidate's code never ran in. Masked, not
  # passed: a check that did not run must not let a memorized body through.
  fault: str | None = None
  pool_seed: int | None = None      # The pool's.

  @property
  def passed(self) -> bool:
    return not self.wrong


# --- Inputs -------------------------------------------------------------------------------------
def _literal(value) -> str | None:
  """`value` as a literal the sandbox reads back (ast.literal_eval), or None."""
  text = repr(value)
  try:  # Parsed under layout's lock: CPython's parser is not safe across the pool's threads.
    return text if layout.literal_value(text) == value else None
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return None


def recorded(calls: list[str]) -> list[tuple[list, dict]]:
  """The recorded calls (record.py's encodings of [args, kwargs]) that are builtins throughout."""
  out = []
  for text in calls:
    try:
      args, kwargs = seal.decode(text)
    except (ValueError, TypeError, KeyError, IndexError):
      continue
    if _literal([list(args), kwargs]) is not None:
      out.append((list(args), kwargs))
  return out


_ALPHABET = string.ascii_letters + string.digits + ' -_.,!?'


def _perturb_str(s: str, rng: random.Random) -> str:
  chars = sorted(set(s) | set(rng.sample(_ALPHABET, 4)))
  i = rng.randrange(len(s) + 1)
  op = rng.choice(('insert', 'delete', 'replace', 'case', 'repeat', 'swap'))
  if op == 'insert' or not s:
    return s[:i] + rng.choice(chars) + s[i:]
  i = min(i, len(s) - 1)
  if op == 'delete':
    return s[:i] + s[i + 1:]
  if op == 'replace':
    return s[:i] + rng.choice(chars) + s[i + 1:]
  if op == 'case':
    return s[:i] + s[i].swapcase() + s[i + 1:]
  if op == 'repeat':
    j = rng.randrange(i, len(s)) + 1
    return s[:j] + ' ' + s[i:j] + s[j:]
  words = s.split(' ')
  rng.shuffle(words)
  return ' '.join(words)


def _perturb(value, rng: random.Random, depth: int = 0):
  """A value near `value` of the same type (containers: one element changed, dropped or doubled)."""
  if isinstance(value, bool):
    return not value
  if isinstance(value, int):
    return value + rng.choice((-2, -1, 1, 2, 3)) if abs(value) < 64 else value + rng.randint(-9, 9)
  if isinstance(value, float):
    return value * rng.choice((0.5, 1.5, 2.0)) + rng.choice((0.0, 0.25, -1.0))
  if isinstance(value, str):
    return _perturb_str(value, rng)
  if isinstance(value, bytes):
    return _perturb_str(value.decode('latin-1'), rng).encode('latin-1', 'replace')
  if isinstance(value, (list, tuple)) and value and depth < 4:
    items = list(value)
    i = rng.randrange(len(items))
    op = rng.choice(('change', 'change', 'drop', 'double'))
    if op == 'change':
      items[i] = _perturb(items[i], rng, depth + 1)
    elif op == 'drop':
      del items[i]
    else:
      items.insert(i, items[i])
    return type(value)(items)
  if isinstance(value, dict) and value and depth < 4:
    key = rng.choice(list(value))
    return {**value, key: _perturb(value[key], rng, depth + 1)}
  return value


def fresh(calls: list[tuple[list, dict]], rng: random.Random, n: int = FRESH) -> list[str]:
  """`n` inputs (literals of [args, kwargs]), each a recorded call with one or two of its
  arguments perturbed; distinct, and none a recorded call."""
  seen = {_literal([a, k]) for a, k in calls}
  out = []
  for _ in range(n * 8):
    if len(out) == n:
      break
    args, kwargs = rng.choice(calls)
    args, kwargs = list(args), dict(kwargs)
    names = [('a', i) for i in range(len(args))] + [('k', k) for k in kwargs]
    if not names:
      continue
    for kind, key in rng.sample(names, min(len(names), rng.choice((1, 1, 2)))):
      if kind == 'a':
        args[key] = _perturb(args[key], rng)
      else:
        kwargs[key] = _perturb(kwargs[key], rng)
    literal = _literal([args, kwargs])
    if literal is not None and literal not in seen:
      seen.add(literal)
      out.append(literal)
  return out


# --- Runs ---------------------------------------------------------------------------------------
def module_of(task: Task) -> str:
  """The dotted name the task's file imports as (from the first of its python_path it is under)."""
  path = PurePosixPath(task.file).with_suffix('')
  for root in task.python_path:
    if not root or path.is_relative_to(root):
      name = path.relative_to(root or '.').as_posix()
      return name.removesuffix('/__init__').replace('/', '.')
  return path.as_posix().replace('/', '.')


def _job_paths(task: Task, tree: Path) -> dict:
  return {'prepend_path': [str(tree / p) if p else str(tree) for p in task.python_path],
          'append_path': list(task.site_dirs), 'module': module_of(task), 'function': task.symbol}


def run(task: Task, tree: Path, job: dict, scratch: Path, limits: sandbox.Limits, *,
        python: str, uid: int | None = None, isolate: bool = True) -> list | None:
  """calls.py on `tree` in a sandbox (`job`: its mode and inputs); its JSON answer, or None when
  the run did not end with one (timed out, crashed, printed none)."""
  harness = scratch / 'calls'
  harness.mkdir()
  shutil.copy(CALLS, harness / 'calls.py')
  shutil.copy(testrun.RECORD, harness / 'record.py')
  marker = f'calls answered {secrets.token_hex(8)}: '
  (harness / 'job.json').write_text(json.dumps({**job, **_job_paths(task, tree), 'marker': marker}))
  env = {**testrun.ENV, 'PATH': f'{Path(python).parent}:/usr/bin:/bin'}
  done = sandbox.run([python, '-I', '-B', str(harness / 'calls.py'), str(harness / 'job.json')],
                     cwd=tree, ro=[tree, harness, *sandbox.python_roots(python), *task.site_dirs],
                     env=env, limits=limits, uid=uid, isolate=isolate,
                     hide=sandbox.python_hidden(python))
  lines = [l for l in done.output.splitlines() if l.startswith(marker)]
  if done.timed_out or not lines:
    return None
  try:
    return json.loads(lines[-1][len(marker):])
  except ValueError:
    return None


# --- The check ----------------------------------------------------------------------------------
def same(a, b) -> bool:
  """Decoded values equal as `==` says, floats to a relative 1e-9 (an honest rewrite may sum in
  another order)."""
  if isinstance(a, float) and isinstance(b, float):
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b)
  if type(a) is not type(b):  # pylint: disable=unidiomatic-typecheck
    return a == b
  if isinstance(a, (list, tuple)):
    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
  if isinstance(a, dict):
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
  return a == b


def _decoded(outcome) -> tuple:
  """An outcome of calls.py as something `agrees` compares (malformed: unequal to every answer)."""
  try:
    kind = outcome[0]
    if kind == 'ok':
      return 'ok', seal.decode(json.dumps(outcome[1])), seal.decode(json.dumps(outcome[2]))
    return (kind,) if kind in ('raise', 'timeout') else ('malformed',)
  except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
    return ('malformed',)


def agrees(original, candidate) -> bool:
  """The candidate's outcome answers an input as the original's does."""
  o, c = _decoded(original), _decoded(candidate)
  if o[0] == 'raise':
    return c[0] == 'raise'
  return o[0] == c[0] == 'ok' and same(o[1], c[1]) and same(o[2], c[2])


def _opaque(node) -> bool:
  """Whether a record.py encoding holds a value no exact builtin represents (OPAQUE, which is
  equal to any other OPAQUE: any object would agree with it)."""
  return isinstance(node, list) and (node[:1] == ['?'] or any(_opaque(x) for x in node[1:]))


def deterministic(first: list, second: list, inputs: list[str]) -> list[int]:
  """Indices of the inputs worth comparing: the original answered them the same way in both its
  runs (`second` ran the inputs in reverse order), in time, and with builtins throughout."""
  return [i for i in range(len(inputs))
          if _decoded(first[i])[0] != 'timeout' and not _opaque(first[i])
          and agrees(first[i], second[i]) and agrees(second[i], first[i])]


def original_tree(task: Task, graded: Path, into: Path) -> Path:
  """A copy of the grading tree with the original file back (from the task set's originals/)."""
  task_dir = graded.parents[len(Path(task.grading_tree).parts) - 1]
  layout.copy_tree(graded, into)
  shutil.copy(task_dir / task.original / task.file, into / task.file)
  return into


def answers(task: Task, tree: Path, inputs: list[str], scratch: Path, limits: sandbox.Limits,
            **kwargs) -> list | None:
  """calls.py's outcomes of `inputs` on `tree` (one per input), or None where it gave none."""
  scratch.mkdir()
  out = run(task, tree, {'mode': 'call', 'per_call_s': PER_CALL_S, 'inputs': inputs}, scratch,
            limits, **kwargs)
  return out if isinstance(out, list) and len(out) == len(inputs) else None


def steady(task: Task, original: Path, inputs: list[str], scratch: Path, limits: sandbox.Limits,
           **kwargs) -> tuple[list | None, list[int]]:
  """(the original's outcomes of `inputs`, the indices it answers the same way a second time,
  the inputs in reverse order); (None, []) where it did not answer."""
  first = answers(task, original, inputs, scratch / 'o1', limits, **kwargs)
  second = answers(task, original, inputs[::-1], scratch / 'o2', limits, **kwargs)
  if first is None or second is None:
    return None, []
  return first, deterministic(first, second[::-1], inputs)


@dataclasses.dataclass(frozen=True)
class Pool:
  """A task's inputs for differential checks in this process, with the original's answers."""
  seed: int
  inputs: list[str]
  answers: list | None  # The original's first answer to each input; None where it gave none.
  kept: list[int]   # The inputs it answered the same way twice.


_POOLS: dict[tuple, Pool] = {}
_POOLS_LOCK = threading.Lock()


def pool(task: Task, graded: Path, scratch: Path, limits: sandbox.Limits, **kwargs) -> Pool:
  """The task's pool (graded: its grading tree): made at its first check in this process (from
  a secret seed), kept once the original answered some input the same way twice."""
  key = (task.id, tuple(task.calls), str(graded), kwargs['python'], kwargs['isolate'], limits)
  with _POOLS_LOCK:
    if key in _POOLS:
      return _POOLS[key]
  seed = secrets.randbits(63)
  inputs = fresh(recorded(task.calls), random.Random(seed), POOL)
  original = original_tree(task, graded, scratch / 'original')
  first, kept = steady(task, original, inputs, scratch, limits, **kwargs)
  made = Pool(seed, inputs, first, kept)
  if not kept:  # Not kept: a run the load ended early must not fail every later check.
    return made
  with _POOLS_LOCK:
    return _POOLS.setdefault(key, made)


def check(task: Task, candidate: Path, graded: Path, scratch: Path, limits: sandbox.Limits, *,
          python: str, seed: int, uid: int | None = None, isolate: bool = True) -> Check:
  """FRESH inputs drawn with `seed` from the task's pool, answered by the candidate at
  `candidate` (its tree) as by the original."""
  kwargs = dict(python=python, uid=uid, isolate=isolate)
  drawn = pool(task, graded, scratch, limits, **kwargs)
  if not drawn.kept:
    why = 'did not answer' if drawn.answers is None else 'answered no input the same way twice'
    return Check(seed, len(drawn.inputs), 0, 0, [], f'differential check: the original {why}',
                 drawn.seed)
  chosen = sorted(random.Random(seed).sample(drawn.kept, min(FRESH, len(drawn.kept))))
  answer = answers(task, candidate, [drawn.inputs[i] for i in chosen], scratch / 'c', limits,
                   **kwargs)
  if answer is None:
    return Check(seed, len(drawn.inputs), len(chosen), len(chosen), ['no answer for every input'],
                 pool_seed=drawn.seed)
  wrong = [drawn.inputs[i] for i, a in zip(chosen, answer) if not agrees(drawn.answers[i], a)]
  return Check(seed, len(drawn.inputs), len(chosen), len(wrong), wrong[:3], pool_seed=drawn.seed)


# --- The factory's half -------------------------------------------------------------------------
def record_calls(task: Task, original: Path, scratch: Path, limits: sandbox.Limits, *,
                 seed: int, isolate: bool = True) -> tuple[list[str], str]:
  """(the calls the task's required tests make of its function, as the original `original` (a
  tree) answers them the same way twice; why none, where none). Run by the factory."""
  if '.' in task.symbol:
    return [], 'a method: its instance is no input'
  kwargs = dict(python=task.python, isolate=isolate)
  (scratch / 'trace').mkdir()
  traced = run(task, original, {'mode': 'trace', 'limit': TRACE_LIMIT, 'pytest_args': testrun.pytest_args(
      original, task.fail_to_pass, task.config_file)}, scratch / 'trace', limits, **kwargs)
  texts = [json.dumps(c) for c in traced or [] if isinstance(c, list)]
  texts = [t for t in texts if recorded([t])]  # Builtins throughout: inputs to perturb.
  if len(texts) < MIN_CALLS:
    return [], f'{len(texts)} calls with builtin arguments recorded (fewer than {MIN_CALLS})'
  calls = recorded(texts)
  drawn = fresh(calls, random.Random(seed))
  if not drawn:
    return [], 'no argument to perturb'
  inputs = [_literal([a, k]) for a, k in calls] + drawn
  first, kept = steady(task, original, inputs, scratch, limits, **kwargs)
  if first is None:
    return [], 'the original did not answer its calls'
  if len(kept) < len(inputs) // 2 or not set(range(len(texts))) & set(kept):
    return [], (f'{len(inputs) - len(kept)} of {len(inputs)} inputs not comparable: the original '
                'answered them otherwise the second time, late, or with objects')
  return [t for i, t in enumerate(texts) if i in kept], ''
