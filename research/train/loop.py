"""The supervised training loop: config -> mesh, model, optimizer, data -> steps, metrics, checkpoints.

Callable from scripts and notebooks (`train(config, workdir)`); launch/train.py wraps it in absl.
A run resumes from the newest readable checkpoint in workdir/checkpoints (params, optimizer state,
step, RNG, data iterator and the metrics not yet logged), so an interrupted run continues exactly
where it stopped. SIGTERM makes it save at the next step and return; on several hosts, JAX's
preemption sync picks a step they all save at. The host waits for the devices only at log, eval
and checkpoint steps.
"""

import json
import os
import signal
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from research.checkpoint import manager as ckpt_lib
from research.data import pipeline
from research.metrics import flops as flops_lib
from research.metrics.writer import MetricsWriter
from research.model import config as model_config
from research.parallel import distributed
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.train import optimizer as optim
from research.train.step import TrainState, Trainer, loss_fn



def check_divisible(cfg: model_config.ModelConfig, mesh_shape: dict[str, int], batch_size: int,
                    rules: sharding.Rules = sharding.RULES):
  """Fails at start, naming the field and the mesh axes its logical axis's rule lays it out on,
  when a size does not divide them."""
  checks = [
      ('data.batch_size', batch_size, 'act_batch'),
      ('model.num_experts', cfg.num_experts, 'experts'),
      ('model.d_model', cfg.d_model, 'embed'),
      ('model.num_heads', cfg.num_heads, 'heads'),
      ('model.d_expert', cfg.d_expert, 'expert_mlp'),
      ('model.d_ff', cfg.d_ff, 'mlp'),
      ('model.vocab_size', cfg.vocab_size, 'vocab'),
  ]
  for field, value, logical in checks:
    axes = sharding.mesh_axes(logical, rules)
    ways = mesh_lib.axis_size(mesh_shape, axes)
    if value % ways:
      raise ValueError(f'{field}={value} is not divisible by the mesh axes {"*".join(axes)} '
                       f'(= {ways}) of rules[{logical!r}], of mesh {mesh_shape}')


def setup(config: ml_collections.ConfigDict):
  """Validated (model config, mesh) from an experiment config."""
  cfg = model_config.from_dict(config.model.to_dict())
  shape = mesh_lib.parse_mesh_spec(config.mesh)
  check_divisible(cfg, shape, config.data.batch_size)
  return cfg, mesh_lib.make_mesh(shape)


def make_trainer(config: ml_collections.ConfigDict) -> Trainer:
  """The Trainer (model config, mesh, optimizer) an experiment config describes."""
  cfg, mesh = setup(config)
  tx = optim.make_optimizer(config.optimizer, config.train.steps, cfg, mesh)
  return Trainer(cfg, tx, mesh, qk_clip_tau=config.optimizer.get('qk_clip_tau', 0.0))


def _writable_workdir(workdir: str) -> str:
  """Creates workdir if needed and proves it writable (os.access is always True for root)."""
  try:
    os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryFile(dir=workdir):
      pass
  except OSError as e:
    raise PermissionError(f'workdir {workdir!r} is not writable: {e.strerror or e}') from None
  return workdir


class _Preemption:
  """SIGTERM -> `reached(step)` is True; across hosts JAX's preemption sync agrees on the step."""

  def __init__(self):
    self.flag, self._installed, self._old = False, False, None

  def __enter__(self):
    # Several hosts: JAX's preemption notifier owns SIGTERM. Off the main thread (some notebook
    # runners) Python cannot install handlers; the run is then simply not preemptible.
    if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
      self._old = signal.signal(signal.SIGTERM, lambda *_: setattr(self, 'flag', True))
      self._installed = True
    return self

  def __exit__(self, *exc):
    if self._installed:
      signal.signal(signal.SIGTERM, self._old)

  def reached(self, step: int) -> bool:
    if jax.process_count() > 1:
      return multihost_utils.reached_preemption_sync_point(step)
    return self.flag


def checkpoint_tree(state: TrainState, rng_data) -> dict:
  """What a checkpoint's `state` item holds; rng_data is jax.random.key_data of the run's key."""
  return {'step': state.step, 'params': state.params, 'opt_state': state.opt_state, 'rng': rng_data}


def _checkpointer(config: ml_collections.ConfigDict, workdir: str) -> ckpt_lib.Checkpointer:
  c = config.checkpoint
  return ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=c.every, keep=c.keep,
                               best_metric=c.best_metric, best_mode=c.best_mode,
                               config=json.loads(config.to_json()))


def _init_or_restore(trainer: Trainer, ckpt: ckpt_lib.Checkpointer, seed: int, step: int | None = None):
  """(state, rng key data, Restored or None): fresh, or the newest readable (or `step`) checkpoint."""
  state = trainer.init(jax.random.key(seed))
  rng_data = jax.device_put(jax.random.key_data(jax.random.key(seed)),
                            NamedSharding(trainer.mesh, P()))
  if step is None and ckpt.latest_step() is None:
    return state, rng_data, None
  target = ckpt_lib.abstract(checkpoint_tree(state, rng_data))
  jax.tree.map(lambda x: x.delete(), state)  # Freed before the restore allocates its copy.
  restored = ckpt.restore(target, step)
  if restored is None:
    raise RuntimeError(f'no checkpoint in {ckpt.directory} could be read (see the warnings); '
                       'the unreadable ones were moved to its corrupt/ folder')
  s = restored.state
  return TrainState(s['step'], s['params'], s['opt_state']), s['rng'], restored


def load(config: ml_collections.ConfigDict, workdir: str, step: int | None = None):
  """(trainer, TrainState) of workdir's newest (or `step`) checkpoint: to sample, or to start RL."""
  ckpt = _checkpointer(config, workdir)
  if step is None and ckpt.latest_step() is None:
    raise FileNotFoundError(f'no checkpoint in {ckpt.directory}')
  trainer = make_trainer(config)
  state, _, _ = _init_or_restore(trainer, ckpt, config.seed, step)
  ckpt.close()
  return trainer, state


def eval_fn(trainer: Trainer):
  """(params, global batches) -> {'eval_loss'}: the token-weighted mean cross-entropy."""
  ce_tokens = jax.jit(lambda p, b: (loss_fn(p, b, trainer.cfg)[1]['ce'], jnp.sum(b['loss_mask'])))

  def run(params, batches) -> dict[str, float]:
    with jax.set_mesh(trainer.mesh):
      out = jax.device_get([ce_tokens(params, b) for b in batches])
    tokens = sum(float(t) for _, t in out)
    return {'eval_loss': sum(float(ce) * float(t) for ce, t in out) / max(tokens, 1.0)}
  return run


def train(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """Trains (or resumes) and returns the rows logged by this call (also in workdir/metrics.jsonl)."""
  workdir = _writable_workdir(workdir)
  trainer = make_trainer(config)
  steps, batch = config.train.steps, config.data.batch_size
  rows = distributed.host_rows(trainer.batch_sharding, batch)
  data = pipeline.from_config(config.data, 'train', config.seed, rows)
  eval_docs = pipeline.documents(config.data, 'eval', config.seed) if config.train.eval_every else None
  put = lambda b: jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      trainer.batch_sharding, x, (batch,) + x.shape[1:]), b)

  ckpt = _checkpointer(config, workdir)
  state, rng_data, restored = _init_or_restore(trainer, ckpt, config.seed)
  rng = jax.random.wrap_key_data(rng_data)
  pending, start = [], 0
  if restored:
    data.set_state(restored.data or {})
    pending, start = restored.meta.get('pending', []), restored.step

  flops = flops_lib.flops_per_token(trainer.cfg, config.data.seq_len)['train']
  peak = config.train.peak_tflops * 1e12 or flops_lib.peak_flops()
  writer = MetricsWriter(workdir, total_steps=steps, initial_step=start)
  writer.truncate(start)  # Rows after the checkpoint are logged again, identically.
  step_fn, evaluate = trainer.step_fn(), eval_fn(trainer)
  history, untimed, t0 = [], len(pending), time.perf_counter()
  with _Preemption() as preemption:
    for step in range(start + 1, steps + 1):
      state, metrics = step_fn(state, put(next(data)), jax.random.fold_in(rng, step))
      pending.append(metrics)
      row = {}
      if step % config.train.log_every == 0 or step == steps:
        fetched = jax.device_get(pending)  # Host sync: once per log interval.
        elapsed = time.perf_counter() - t0
        tokens_per_s = sum(float(m['tokens']) for m in fetched[untimed:]) / elapsed
        row = {k: float(v) for k, v in fetched[-1].items()}
        # In float64 from Python floats: after a resume, `pending` holds floats read back from the
        # checkpoint, and a float32 mean would then differ in the last bits from an unbroken run.
        row.update(loss=float(np.mean([float(m['loss']) for m in fetched])), tokens_per_s=tokens_per_s)
        if peak:
          row['mfu'] = flops_lib.mfu(tokens_per_s, flops, jax.device_count(), peak)
        pending, untimed = [], 0
      if config.train.eval_every and step % config.train.eval_every == 0:
        eval_data = pipeline.Pipeline(eval_docs, batch_size=batch, seq_len=config.data.seq_len,
                                      shards=config.data.shards, seed=config.seed, host_rows=rows)
        row.update(evaluate(state.params,
                            (put(next(eval_data)) for _ in range(config.train.eval_steps))))
      if row:
        history.append(writer.write(step, row))
      stop = preemption.reached(step)
      saved = stop or step == steps or ckpt.should_save(step)
      if saved:
        meta = {'pending': [{k: float(v) for k, v in m.items()} for m in jax.device_get(pending)]}
        ckpt.save(step, checkpoint_tree(state, rng_data), data=data.get_state(), meta=meta,
                  metrics=row if 'eval_loss' in row else None, force=True)
      if row or saved:  # The devices are idle: time the next interval from here.
        t0 = time.perf_counter()
      if stop:
        print(f'SIGTERM: saved a checkpoint at step {step} in {ckpt.directory}; '
              'run the same command to resume', flush=True)
        break
  ckpt.close()
  writer.close()
  return history
