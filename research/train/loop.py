"""The supervised training loop: config -> mesh, model, optimizer, data -> steps, metrics.jsonl.

Callable from scripts and notebooks (`train(config, workdir)`); launch/train.py wraps it in absl.
"""

import json
import os
import time

import jax
import ml_collections
import numpy as np
import tqdm

from research.data import synthetic
from research.model import config as model_config
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train.step import Trainer


def check_divisible(cfg: model_config.ModelConfig, mesh_shape: dict[str, int], batch_size: int):
  """Fails at start, naming the field, when a dimension does not divide its mesh axes."""
  batch_ways = mesh_shape['data'] * mesh_shape['fsdp'] * mesh_shape['expert']
  checks = [
      ('data.batch_size', batch_size, batch_ways, 'data*fsdp*expert'),
      ('model.num_experts', cfg.num_experts, mesh_shape['expert'], 'expert'),
      ('model.d_model', cfg.d_model, mesh_shape['fsdp'], 'fsdp'),
      ('model.num_heads', cfg.num_heads, mesh_shape['tensor'], 'tensor'),
      ('model.d_expert', cfg.d_expert, mesh_shape['tensor'], 'tensor'),
      ('model.d_ff', cfg.d_ff, mesh_shape['tensor'], 'tensor'),
      ('model.vocab_size', cfg.vocab_size, mesh_shape['tensor'], 'tensor'),
  ]
  for field, value, ways, axes in checks:
    if value % ways:
      raise ValueError(f'{field}={value} is not divisible by the mesh axes {axes} (= {ways}) '
                       f'of mesh {mesh_shape}')


def setup(config: ml_collections.ConfigDict):
  """Validated (model config, mesh) from an experiment config."""
  cfg = model_config.from_dict(config.model.to_dict())
  shape = mesh_lib.parse_mesh_spec(config.mesh)
  check_divisible(cfg, shape, config.data.batch_size)
  return cfg, mesh_lib.make_mesh(shape)


def _writable_workdir(workdir: str) -> str:
  os.makedirs(workdir, exist_ok=True)
  if not os.access(workdir, os.W_OK):
    raise PermissionError(f'workdir {workdir!r} is not writable')
  return workdir


def train(config: ml_collections.ConfigDict, workdir: str) -> list[dict]:
  """Trains and returns the logged metrics (also appended to workdir/metrics.jsonl)."""
  workdir = _writable_workdir(workdir)
  cfg, mesh = setup(config)
  steps = config.train.steps
  trainer = Trainer(cfg, optim.make_optimizer(config.optimizer, steps), mesh)
  rng = jax.random.key(config.seed)
  state = trainer.init(rng)
  step_fn = trainer.step_fn()
  batches = synthetic.packed_batches(config.seed, config.data.batch_size, config.data.seq_len)

  history, pending = [], []
  t0, bar = time.perf_counter(), tqdm.tqdm(total=steps, desc='train', unit='step')
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    for step in range(1, steps + 1):
      state, metrics = step_fn(state, trainer.put_batch(next(batches)), jax.random.fold_in(rng, step))
      pending.append(metrics)
      if step % config.train.log_every and step != steps:
        continue
      fetched = jax.device_get(pending)  # The only host sync: once per log interval.
      elapsed, t0 = time.perf_counter() - t0, time.perf_counter()
      row = {k: float(v) for k, v in fetched[-1].items()}
      row.update(step=step, tokens_per_s=sum(float(m['tokens']) for m in fetched) / elapsed,
                 loss=float(np.mean([m['loss'] for m in fetched])))
      history.append(row)
      f.write(json.dumps(row) + '\n')
      f.flush()
      bar.update(len(pending))
      bar.set_postfix(loss=f'{row["loss"]:.3f}', tok_s=f'{row["tokens_per_s"]:.0f}')
      pending = []
  bar.close()
  return history
