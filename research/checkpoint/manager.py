"""Checkpoints: orbax's CheckpointManager plus the data iterator's state and a compatibility check.

    ckpt = Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=100, keep=3,
                        best_metric='eval_loss', config=config_dict)
    restored = ckpt.restore(abstract_state)     # the newest readable checkpoint, or None
    if restored:
      step, state, data_state, meta = restored
    ...
    ckpt.save(step, state, data=it.get_state(), meta={...}, metrics={'eval_loss': x})
    ckpt.close()                                # waits for the last asynchronous save

`state` is any pytree of jax.Arrays (the train loop saves {'params', 'opt_state', 'step', 'rng'}).
It is restored onto the shardings of `abstract_state` (jax.ShapeDtypeStruct leaves with `.sharding`,
e.g. `jax.eval_shape` of an init), so a checkpoint restores onto another mesh or process count.
`data` is a {shard: state} dict of JSON (research/data/pipeline.py); each host writes the shards it
reads and every host reads all of them back. `meta` is JSON (the loop keeps its un-logged metrics
there, so a resumed run logs exactly what an uninterrupted one would).

Saves run in the background and are atomic: orbax writes a temporary directory and renames it once
every host has finished, so a crash mid-save leaves the previous checkpoints untouched. A checkpoint
that fails to read is skipped with a warning and moved to `corrupt/` (never deleted); the next older
one is used. A checkpoint whose arrays differ in shape from `abstract_state` raises
IncompatibleCheckpointError naming the arrays and the config fields that differ.
"""

import dataclasses
import json
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger(__name__)
CORRUPT_DIR = 'corrupt'


class IncompatibleCheckpointError(ValueError):
  """The checkpoint's arrays do not have the shapes the current config gives."""


class Restored(NamedTuple):
  step: int
  state: Any
  data: dict | None
  meta: dict


class DataStateHandler(ocp.CheckpointHandler):
  """Per-shard JSON files: each process writes the shards it reads; restore reads all of them."""

  def save(self, directory: epath.Path, args: 'DataSave'):
    for shard, state in args.states.items():
      (directory / f'shard_{shard}.json').write_text(json.dumps(state))

  def restore(self, directory: epath.Path, args: 'DataRestore | None' = None) -> dict:
    del args
    return {p.name[len('shard_'):-len('.json')]: json.loads(p.read_text())
            for p in directory.glob('shard_*.json')}

  def metadata(self, directory: epath.Path):
    return None

  def finalize(self, directory: epath.Path):
    pass

  def close(self):
    pass


@ocp.args.register_with_handler(DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataSave(ocp.args.CheckpointArgs):
  states: dict


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataRestore(ocp.args.CheckpointArgs):
  pass


def _key(k) -> str:
  for attr in ('key', 'name', 'idx'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def shapes(tree) -> dict[str, tuple[int, ...]]:
  """'params/embed/embedding' -> shape, for any pytree whose leaves have `.shape`."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))
  return {'/'.join(_key(k) for k in path): tuple(x.shape) for path, x in flat if hasattr(x, 'shape')}


def _flat_config(d, prefix='') -> dict:
  out = {}
  for k, v in (d or {}).items():
    if isinstance(v, dict):
      out.update(_flat_config(v, f'{prefix}{k}.'))
    else:
      out[f'{prefix}{k}'] = v
  return out


def abstract(tree):
  """Arrays -> ShapeDtypeStructs carrying their shardings: a restore target without the values."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Checkpointer:
  """Saves every `save_every` steps (or when forced); keeps the last `keep` and the best by metric."""

  def __init__(self, directory: str, *, save_every: int, keep: int = 3, best_metric: str | None = None,
               best_mode: str = 'min', config: dict | None = None, async_save: bool = True):
    if best_mode not in ('min', 'max'):
      raise ValueError(f'checkpoint best_mode={best_mode!r}: expected "min" or "max"')
    if keep < 1 or save_every < 1:
      raise ValueError(f'checkpoint keep={keep} and save_every={save_every} must be >= 1')
    self.directory = os.path.abspath(directory)
    self.save_every, self.best_metric, self.config = save_every, best_metric or None, config
    policies = [ocp.checkpoint_managers.LatestN(keep)]
    if self.best_metric:
      policies.append(ocp.checkpoint_managers.BestN(
          get_metric_fn=lambda m: m[self.best_metric], reverse=best_mode == 'min', n=1,
          keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save,
        preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies), create=True)
    self._mngr = ocp.CheckpointManager(self.directory, options=options, item_handlers={
        'state': ocp.StandardCheckpointHandler(), 'data': DataStateHandler(),
        'meta': ocp.JsonCheckpointHandler()})

  def all_steps(self) -> list[int]:
    return list(self._mngr.all_steps())

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def should_save(self, step: int) -> bool:
    return step % self.save_every == 0

  def save(self, step: int, state, *, data: dict | None = None, meta: dict | None = None,
           metrics: dict | None = None, force: bool = False) -> bool:
    """Starts an asynchronous save if `step` is due (or `force`); returns whether it did."""
    if step in self._mngr.all_steps() or not (force or self.should_save(step)):
      return False
    meta = dict(meta or {}, config=self.config)
    if metrics is not None:
      metrics = {k: float(v) for k, v in metrics.items()}
    use = metrics if metrics and self.best_metric in metrics else None
    args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta),
                              data=DataSave(data or {}))
    return self._mngr.save(step, args=args, metrics=use, force=True)  # Due: decided above.

  def _check_compatible(self, step: int, target):
    saved = shapes(self._mngr.item_metadata(step)['state'])
    want = shapes(target)
    problems = [f'{k} is {saved[k]} in the checkpoint but {want[k]} now'
                for k in sorted(saved.keys() & want.keys()) if saved[k] != want[k]]
    problems += [f'{k} {want[k]} is not in the checkpoint' for k in sorted(want.keys() - saved.keys())]
    problems += [f'{k} {saved[k]} is in the checkpoint but not in the model'
                 for k in sorted(saved.keys() - want.keys())]
    if not problems:
      return
    old = {}
    meta_path = epath.Path(self._mngr.directory) / str(step) / 'meta' / 'metadata'
    if meta_path.exists():
      old = _flat_config(json.loads(meta_path.read_text()).get('config'))
    now = _flat_config(self.config)
    fields = [f'{k}: {old[k]!r} in the checkpoint, {now[k]!r} now'
              for k in sorted(old.keys() & now.keys()) if old[k] != now[k]]
    shown = problems[:8] + ([f'... and {len(problems) - 8} more'] if len(problems) > 8 else [])
    raise IncompatibleCheckpointError(
        f'checkpoint step {step} in {self.directory} does not fit the current config: '
        + '; '.join(shown)
        + (f'. Config fields that differ: {"; ".join(fields)}' if fields else '')
        + '. Use the config it was saved with or another workdir; nothing was deleted.')

  def _quarantine(self, step: int, err: Exception):
    src = os.path.join(self.directory, str(step))
    dst = os.path.join(self.directory, CORRUPT_DIR, f'{step}.{int(time.time())}')
    log.warning('checkpoint step %d in %s is unreadable (%s: %s); moving it to %s and trying an '
                'older one', step, self.directory, type(err).__name__, err, dst)
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      os.rename(src, dst)
    ocp.multihost.sync_global_processes(f'checkpoint_quarantine_{step}')
    self._mngr.reload()

  def restore(self, abstract_state, step: int | None = None) -> Restored | None:
    """The newest readable checkpoint (or `step`) restored onto abstract_state's shardings."""
    self._mngr.wait_until_finished()
    steps = [step] if step is not None else sorted(self._mngr.all_steps(), reverse=True)
    for s in steps:
      try:
        self._check_compatible(s, abstract_state)
        out = self._mngr.restore(s, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore(),
            data=DataRestore()))
      except IncompatibleCheckpointError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        if step is not None:
          raise
        self._quarantine(s, e)
        continue
      return Restored(s, out['state'], out['data'] or None, out['meta'] or {})
    return None

  def wait(self):
    self._mngr.wait_until_finished()

  def close(self):
    self._mngr.wait_until_finished()
    self._mngr.close()
