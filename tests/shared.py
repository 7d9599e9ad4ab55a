"""Session fixtures built once for the whole test run, not once per xdist worker.

`once(tmp_path_factory, name, build)` runs `build(directory)` in a directory every worker of the
run shares (beside the workers' own base temp dirs), under a file lock: the first worker to ask
builds, the others wait for it and read its pickled result. The slow fixtures (the factory on the
fixture repository) cost one build per run this way.
"""
import fcntl
import os
from pathlib import Path
import pickle
from typing import Callable, TypeVar

T = TypeVar('T')


def once(tmp_path_factory, name: str, build: Callable[[Path], T]) -> T:
  base = tmp_path_factory.getbasetemp()
  # Under xdist each worker's base is <run root>/popen-gwN; alone, the base is the run's root.
  root = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
  directory = root / f'shared-{name}'
  with open(root / f'shared-{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    done = root / f'shared-{name}.pickle'
    if done.exists():
      return pickle.loads(done.read_bytes())
    directory.mkdir()
    result = build(directory)
    done.write_bytes(pickle.dumps(result))
    return result
