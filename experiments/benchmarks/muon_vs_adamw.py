"""Loss curves of the tiny MoE with Muon vs AdamW at equal steps, each at its best learning rate.

python -m experiments.benchmarks.muon_vs_adamw --steps=100 --json=/tmp/muon_vs_adamw.json

Both arms see the same batches; Muon runs sharded (fsdp:2, expert:4) on 8 simulated devices.
"""

import argparse
import json
import os

os.environ.setdefault('XLA_FLAGS', '--xla_force_host_platform_device_count=8')

import jax  # pylint: disable=g-import-not-at-top
import numpy as np

from experiments import tiny_moe
from research.data import synthetic
from research.model import config as model_config
from research.parallel import mesh as mesh_lib
from research.train import optimizer as optim
from research.train import step as step_lib


def small_config(name: str, lr: float, steps: int):
  c = tiny_moe.get_config()
  c.model.update(d_model=64, num_layers=2, head_dim=16, d_expert=64, d_ff=128)
  c.optimizer.update(name=name, learning_rate=lr)
  c.optimizer.muon.adam_learning_rate = 0.01 if name == 'muon' else 0.0
  c.data.update(batch_size=8, seq_len=32)
  c.train.steps = steps
  return c


def curve(config, mesh_spec: str) -> list[float]:
  cfg = model_config.from_dict(config.model)
  mesh = mesh_lib.make_mesh(mesh_spec)
  trainer = step_lib.Trainer(cfg, optim.make_optimizer(config.optimizer, config.train.steps, cfg, mesh),
                             mesh)
  state, step = trainer.init(jax.random.key(config.seed)), trainer.step_fn()
  batches = synthetic.packed_batches(config.seed, config.data.batch_size, config.data.seq_len)
  losses = []
  for i in range(config.train.steps):
    state, m = step(state, trainer.put_batch(next(batches)), jax.random.key(i))
    losses.append(m['loss'])
  return [float(l) for l in jax.device_get(losses)]


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument('--steps', type=int, default=100)
  ap.add_argument('--adamw_lrs', default='0.003,0.01,0.03')
  ap.add_argument('--muon_lrs', default='0.02,0.06,0.12')
  ap.add_argument('--mesh', default='fsdp:2,expert:4')
  ap.add_argument('--json', default=None)
  args = ap.parse_args()
  runs = {}
  for name, lrs in (('adamw', args.adamw_lrs), ('muon', args.muon_lrs)):
    for lr in map(float, lrs.split(',')):
      losses = curve(small_config(name, lr, args.steps), args.mesh)
      runs[f'{name}@{lr:g}'] = losses
      print(f'{name:>6} lr={lr:<6g} loss@25%={np.mean(losses[args.steps // 4 - 5:args.steps // 4]):.3f} '
            f'loss@end={np.mean(losses[-5:]):.3f}', flush=True)
  best = {n: min((k for k in runs if k.startswith(n)), key=lambda k: np.mean(runs[k][-5:]))
          for n in ('adamw', 'muon')}
  print('best:', best, {k: round(float(np.mean(runs[v][-5:])), 3) for k, v in best.items()})
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'runs': runs, 'best': best}, f)


if __name__ == '__main__':
  main()
