"""The RL update on packed rows against one rollout per row, side by side on the same rollouts (issue 40).

python -m experiments.benchmarks.packed_update --json=/tmp/packed_update.json [--config=repo] [--steps=5]

On experiments/repo_rl.py (one device, as `launch.rl` runs it; --config=toolcalc:
experiments/toolcalc_rl.py), after a warm start of --sft_steps, the rollouts of --steps RL steps are
sampled once from the warm-start params. Two runners that differ only in rl.row_buckets (0: one
rollout per row, the layout before packing; the config's: packed) then run the update (the teacher
and anchor passes, then the train step: `Runner._update`) on those rollouts, each from its own copy
of the params, taking turns step by step so that the machine's load falls on both alike. Per
layout: rows and padding tokens per update, time_teacher and time_update (means over the updates
after the first, which compiles every row count), and each update's loss (equal to float error).
"""

import json
import os
import shutil
import time

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import numpy as np

from experiments import repo_rl
from experiments import toolcalc_rl
from research.rl import loop
from research.rl.envs.repo import env as env_repo
from research.rl.envs.repo.settings import Settings

_JSON = flags.DEFINE_string('json', None, 'Also write the numbers here.')
_CONFIG = flags.DEFINE_enum('config', 'repo', ['repo', 'toolcalc'], 'The RL config.')
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/packed_update_bench', 'Scratch directory (emptied first).')
_STEPS = flags.DEFINE_integer('steps', 5, 'RL steps (updates per layout).')
_SFT_STEPS = flags.DEFINE_integer('sft_steps', 2, 'Warm-start steps.')

LAYOUTS = ('one_per_row', 'packed')


def _config(name: str, workdir: str, steps: int, sft_steps: int):
  c = (repo_rl if name == 'repo' else toolcalc_rl).get_config()
  if name == 'repo':
    c.env.repo.tasks = str(env_repo.make(Settings(), workdir).task_file)  # The fixture's tasks.
  c.sft.steps, c.rl.steps, c.eval.num_tasks, c.tensorboard = sft_steps, steps, 0, False
  return c


def run(name: str, workdir: str, steps: int, sft_steps: int) -> dict:
  c = _config(name, workdir, steps, sft_steps)
  runners = {}
  for layout in LAYOUTS:
    lc = c.copy_and_resolve_references()
    lc.rl.row_buckets = 0 if layout == 'one_per_row' else c.rl.row_buckets
    runners[layout] = loop.Runner(lc, os.path.join(workdir, layout))
  first = runners[LAYOUTS[0]]
  params = first.warm_start(lambda i, row: None)
  rollouts = [first.rollouts(step, params) for step in range(1, steps + 1)]
  # Each its own copy: an update donates its params.
  states = {k: r.fresh_state(jax.tree.map(jnp.copy, params)) for k, r in runners.items()}
  rows = {k: [] for k in LAYOUTS}
  for ro in rollouts:
    if not ro.active.any():  # As train_step: nothing carries a gradient.
      continue
    real = sum(min(len(t.tokens), c.sampler.max_len) for t in ro.trajs)
    for k, r in runners.items():
      states[k], row = r._update(ro, states[k])
      rows[k].append({**row, 'pad_tokens': row['update_rows'] * c.sampler.max_len - real, 'real_tokens': real})
  out = {'config': name, 'max_len': c.sampler.max_len, 'rollouts_per_step': first.batch_rows,
         'row_counts': runners['packed'].row_counts, 'updates': len(rows['packed'])}
  for k, rs in rows.items():
    timed = rs[1:] or rs
    out[k] = {'rows': [r['update_rows'] for r in rs], 'pad_tokens': [r['pad_tokens'] for r in rs],
              'real_tokens': [r['real_tokens'] for r in rs], 'loss': [r['loss'] for r in rs],
              'time_teacher': float(np.mean([r['time_teacher'] for r in timed])),
              'time_update': float(np.mean([r['time_update'] for r in timed])),
              'first_time_teacher': rs[0]['time_teacher'], 'first_time_update': rs[0]['time_update']}
  return out


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  shutil.rmtree(_WORKDIR.value, ignore_errors=True)
  os.makedirs(_WORKDIR.value)
  res = run(_CONFIG.value, _WORKDIR.value, _STEPS.value, _SFT_STEPS.value)
  res.update(machine=f'{os.cpu_count()} CPUs, jax {jax.__version__}', date=time.strftime('%Y-%m-%d %H:%M'))
  for k in LAYOUTS:
    r = res[k]
    print(f'{k}: rows {r["rows"]}, padding tokens {r["pad_tokens"]} of real {r["real_tokens"]}; '
          f'time_teacher {r["time_teacher"]:.2f} s, time_update {r["time_update"]:.2f} s '
          f'(first: {r["first_time_teacher"]:.1f}, {r["first_time_update"]:.1f}); loss {r["loss"]}')
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(res, f, indent=1)


if __name__ == '__main__':
  app.run(main)
