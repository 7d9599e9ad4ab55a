"""The supervised training loop: config -> mesh, model, optimizer, data -> steps, metrics, checkpoints.

Callable from scripts and notebooks (`train(config, workdir)`); launch/train.py wraps it in absl.
A run resumes from the newest readable checkpoint in workdir/checkpoints (params, optimizer state,
step, RNG, data iterator and the metrics not yet logged), so an interrupted run continues exactly
where it stopped. SIGTERM makes it save at the next step and return; on several hosts, JAX's
preemption sync picks a step they all save at. The host waits for the devices only at log, eval
and checkpoint steps.
"""

import dataclasses
import json
import os
import signal
import tempfile
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

from research import configs
from research.checkpoint import manager as ckpt_lib
from research.data import pipeline
from research.metrics import device_time
from research.metrics import flops as flops_lib
from research.metrics.writer import MetricsWriter
from research.model import config as model_config
from research.parallel import distributed
from research.parallel import mesh as mesh_lib
from research.parallel import sharding
from research.train import optimizer as optim
from research.train.step import TrainState, Trainer, loss_fn

BEST_MODES = ('min', 'max')


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """train: how long to run, and when the host looks at the devices."""
  steps: int = 300                  # Optimizer steps (the schedule's length too).
  log_every: int = 10               # Host syncs happen only here (and at eval / checkpoint steps).
  eval_every: int = 50              # Steps between evals on the held-out split; 0 disables.
  eval_steps: int = 4               # Batches per eval.
  peak_tflops: float = 0.0          # Per-device peak for MFU; 0 looks it up (unknown on CPU: no MFU).
  microbatches: int = 1             # Gradient accumulation: data.batch_size rows run as this many
                                    # sequential microbatches per optimizer step (activations / this).
  profile_start: int = 0            # First step traced by the profiler (WORKDIR/tensorboard/plugins/profile)
                                    # and attributed to model components (WORKDIR/device_time.json); 0: none.
  profile_steps: int = 3            # Steps traced from profile_start.

  def validate(self, path: str = 'train.') -> 'TrainConfig':
    for f in ('steps', 'log_every', 'eval_steps', 'microbatches', 'profile_steps'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be positive')
    if self.eval_every < 0:
      raise configs.invalid(path + 'eval_every', self.eval_every, 'must be >= 0 (0 disables eval)')
    if self.profile_start and not 1 <= self.profile_start <= self.steps - self.profile_steps + 1:
      raise configs.invalid(path + 'profile_start', self.profile_start,
                            f'must be 0 (no profile) or leave its {self.profile_steps} steps within '
                            f'{self.steps} steps')
    return self


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """checkpoint: when to save and which checkpoints to keep (in WORKDIR/checkpoints)."""
  every: int = 100                  # Steps between (asynchronous) saves; the last step always saves.
  keep: int = 3                     # Most recent checkpoints kept ...
  best_metric: str = 'eval_loss'    # ... plus the best by this eval metric ('' for none).
  best_mode: str = 'min'            # 'min' or 'max'.

  def validate(self, path: str = 'checkpoint.') -> 'CheckpointConfig':
    for f in ('every', 'keep'):
      if getattr(self, f) < 1:
        raise configs.invalid(path + f, getattr(self, f), 'must be positive')
    if self.best_mode not in BEST_MODES:
      raise configs.invalid(path + 'best_mode', self.best_mode, f'expected one of {BEST_MODES}')
    return self


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """A supervised run (launch/train.py): every section, each with its defaults."""
  seed: int = 0                     # Params, data order and dropout-free step RNG.
  mesh: str = 'fsdp:2,expert:4'     # Axis sizes (data, fsdp, expert, tensor); product <= devices.
  model: model_config.ModelConfig = dataclasses.field(default_factory=model_config.ModelConfig)
  data: pipeline.DataConfig = dataclasses.field(default_factory=pipeline.DataConfig)
  optimizer: optim.OptimizerConfig = dataclasses.field(default_factory=optim.OptimizerConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)


def check_divisible(cfg: model_config.ModelConfig, mesh_shape: dict[str, int], batch_size: int,
                    rules: sharding.Rules = sharding.RULES, microbatches: int = 1):
  """Fails at start, naming the field and the mesh axes its logical axis's rule lays it out on,
  when a size does not divide them."""
  if batch_size % microbatches:
    raise ValueError(f'data.batch_size={batch_size} is not divisible by train.microbatches={microbatches}')
  checks = [
      ('data.batch_size' + ' / train.microbatches' * (microbatches > 1), batch_size // microbatches, 'act_batch'),
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


def setup(config: ExperimentConfig):
  """Validated (model config, mesh) from an experiment config (or its ConfigDict)."""
  config = configs.from_dict(ExperimentConfig, config)
  shape = mesh_lib.parse_mesh_spec(config.mesh)
  check_divisible(config.model, shape, config.data.batch_size, microbatches=config.train.microbatches)
  return config.model, mesh_lib.make_mesh(shape)


def make_trainer(config: ExperimentConfig) -> Trainer:
  """The Trainer (model config, mesh, optimizer) an experiment config describes."""
  config = configs.from_dict(ExperimentConfig, config)
  cfg, mesh = setup(config)
  tx = optim.make_optimizer(config.optimizer, config.train.steps, cfg, mesh)
  return Trainer(cfg, tx, mesh, qk_clip_tau=config.optimizer.muon.qk_clip_tau,
                 microbatches=config.train.microbatches)


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


def _checkpointer(config: ExperimentConfig, workdir: str) -> ckpt_lib.Checkpointer:
  c = config.checkpoint
  return ckpt_lib.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=c.every, keep=c.keep,
                               best_metric=c.best_metric, best_mode=c.best_mode,
                               config=json.loads(json.dumps(configs.to_dict(config))))


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


def load(config: ExperimentConfig, workdir: str, step: int | None = None):
  """(trainer, TrainState) of workdir's newest (or `step`) checkpoint: to sample, or to start RL."""
  config = configs.from_dict(ExperimentConfig, config)
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


@dataclasses.dataclass
class _Start:
  """Where a call of `train` starts: fresh, or the newest checkpoint's step, RNG and unlogged metrics."""
  state: TrainState
  rng_data: jax.Array               # jax.random.key_data of the run's key.
  step: int                         # The last step done.
  pending: list[dict]               # Metrics of steps since the last log row.


def _start(trainer: Trainer, ckpt: ckpt_lib.Checkpointer, data: pipeline.Pipeline, seed: int) -> _Start:
  state, rng_data, restored = _init_or_restore(trainer, ckpt, seed)
  if not restored:
    return _Start(state, rng_data, 0, [])
  data.set_state(restored.data or {})
  return _Start(state, rng_data, restored.step, restored.meta.get('pending', []))


class _Interval:
  """Metrics of the steps since the last log row, and the wall time they took."""

  def __init__(self, pending: list, flops_per_token: float, peak_flops: float):
    # Restored steps ran before this process started: they count in the loss, not in the timing.
    self.pending, self.untimed, self.t0 = pending, len(pending), time.perf_counter()
    self.flops, self.peak = flops_per_token, peak_flops

  def row(self) -> dict[str, float]:
    """The log row of the interval (host sync), which then starts afresh."""
    fetched = jax.device_get(self.pending)
    tokens_per_s = sum(float(m['tokens']) for m in fetched[self.untimed:]) / (time.perf_counter() - self.t0)
    row = {k: float(v) for k, v in fetched[-1].items()}
    # In float64 from Python floats: after a resume, `pending` holds floats read back from the
    # checkpoint, and a float32 mean would then differ in the last bits from an unbroken run.
    row.update(loss=float(np.mean([float(m['loss']) for m in fetched])), tokens_per_s=tokens_per_s)
    if self.peak:
      row['mfu'] = flops_lib.mfu(tokens_per_s, self.flops, jax.device_count(), self.peak)
    self.pending, self.untimed = [], 0
    return row

  def meta(self) -> dict:
    """What a checkpoint keeps of the interval: its metrics as floats."""
    return {'pending': [{k: float(v) for k, v in m.items()} for m in jax.device_get(self.pending)]}


class _Profiler:
  """Traces steps [start, start + steps) with jax.profiler into log_dir, then writes where their
  device time went (research/metrics/device_time.py) to out_json and prints it."""

  def __init__(self, tc: TrainConfig, log_dir: str, out_json: str):
    self.start, self.steps, self.log_dir, self.out_json = tc.profile_start, tc.profile_steps, log_dir, out_json
    self.t0 = None

  def before(self, step: int, state: TrainState):
    if step == self.start:
      jax.block_until_ready(state)  # Earlier steps' work stays out of the trace.
      jax.profiler.start_trace(self.log_dir)
      self.t0 = time.perf_counter()

  def after(self, step: int, state: TrainState, lower_step):
    """lower_step() -> the step's jax Lowered (its compile() is the cached executable)."""
    if self.t0 is None or step != self.start + self.steps - 1:
      return
    jax.block_until_ready(state)
    wall = time.perf_counter() - self.t0
    self.stop()
    prof = device_time.read(self.log_dir, lower_step().compile().as_text(), self.steps, wall)
    if jax.process_index() == 0:
      with open(self.out_json, 'w') as f:
        json.dump({'first_step': self.start, **dataclasses.asdict(prof)}, f, indent=1)
      print(f'device time per step, steps {self.start}-{step} ({self.out_json}):\n{prof.table()}', flush=True)

  def stop(self):
    if self.t0 is not None:
      jax.profiler.stop_trace()
      self.t0 = None


def _eval_row(config: ExperimentConfig, evaluate, params, eval_docs, rows, put) -> dict[str, float]:
  d = config.data
  eval_data = pipeline.Pipeline(eval_docs, batch_size=d.batch_size, seq_len=d.seq_len, shards=d.shards,
                                seed=config.seed, host_rows=rows)
  return evaluate(params, (put(next(eval_data)) for _ in range(config.train.eval_steps)))


def train(config: ExperimentConfig, workdir: str) -> list[dict]:
  """Trains (or resumes) and returns the rows logged by this call (also in workdir/metrics.jsonl)."""
  config = configs.from_dict(ExperimentConfig, config)
  workdir = _writable_workdir(workdir)
  trainer = make_trainer(config)
  steps, tc, batch = config.train.steps, config.train, config.data.batch_size
  rows = distributed.host_rows(trainer.batch_sharding, batch)
  data = pipeline.from_config(config.data, 'train', config.seed, rows)
  eval_docs = pipeline.documents(config.data, 'eval', config.seed) if tc.eval_every else None
  put = lambda b: jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      trainer.batch_sharding, x, (batch,) + x.shape[1:]), b)
  ckpt = _checkpointer(config, workdir)
  start = _start(trainer, ckpt, data, config.seed)
  state, rng = start.state, jax.random.wrap_key_data(start.rng_data)
  interval = _Interval(start.pending, flops_lib.flops_per_token(trainer.cfg, config.data.seq_len)['train'],
                       tc.peak_tflops * 1e12 or flops_lib.peak_flops())
  writer = MetricsWriter(workdir, total_steps=steps, initial_step=start.step)
  writer.truncate(start.step)  # Rows after the checkpoint are logged again, identically.
  step_fn, evaluate, history = trainer.step_fn(), eval_fn(trainer), []
  profiler = _Profiler(tc, os.path.join(workdir, 'tensorboard'), os.path.join(workdir, 'device_time.json'))
  with _Preemption() as preemption:
    for step in range(start.step + 1, steps + 1):
      batch_in, key = put(next(data)), jax.random.fold_in(rng, step)
      profiler.before(step, state)
      state, metrics = step_fn(state, batch_in, key)
      profiler.after(step, state, lambda: step_fn.lower(state, batch_in, key))
      interval.pending.append(metrics)
      row = interval.row() if step % tc.log_every == 0 or step == steps else {}
      if tc.eval_every and step % tc.eval_every == 0:
        row.update(_eval_row(config, evaluate, state.params, eval_docs, rows, put))
      if row:
        history.append(writer.write(step, row))
      stop = preemption.reached(step)
      saved = stop or step == steps or ckpt.should_save(step)
      if saved:
        ckpt.save(step, checkpoint_tree(state, start.rng_data), data=data.get_state(), meta=interval.meta(),
                  metrics=row if 'eval_loss' in row else None, force=True)
      if row or saved:  # The devices are idle: time the next interval from here.
        interval.t0 = time.perf_counter()
      if stop:
        print(f'SIGTERM: saved a checkpoint at step {step} in {ckpt.directory}; '
              'run the same command to resume', flush=True)
        break
  profiler.stop()  # A run stopped inside the profiled steps.
  ckpt.close()
  writer.close()
  return history
