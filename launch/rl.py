"""RL entry point: warm start (unless given), then RL with targeted feedback; table and plot at the end.

python -m launch.rl --config=experiments/toolcalc_rl.py --workdir=/tmp/toolcalc_rl \
    --config.loss.distill_coef=0    # outcome reward alone

On a mesh: --config.mesh=data:2,fsdp:2,expert:2 (a one-process CPU run simulates its devices).
Multi-host as launch.train (one command per process; docs/cluster.md): --coordinator_address=HOST:PORT
--num_processes=N --process_id=I, or JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID.
Every process steps every episode (the same rollouts); the update, sampler and teacher are sharded.
"""

import os

from absl import app, flags, logging
import jax
from ml_collections import config_flags

from launch import processes
from research.rl import loop
from research.rl import report

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for metrics.jsonl, checkpoints and the plot.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # Keep the console to the progress bars and the table.
  processes.start(_CONFIG.value.mesh)
  wd = _WORKDIR.value
  summary = loop.run(_CONFIG.value, wd)
  if jax.process_index():
    return
  png = report.plot_run(os.path.join(wd, 'metrics.jsonl'), os.path.join(wd, 'curves.png'))
  print(f'\nSuccess rate on {summary["eval_tasks"]} held-out tasks, before and after '
        f'{summary["rollouts"]} RL rollouts (by the rule that fired on the task before RL):')
  print(report.summary_table(summary))
  print(f'metrics: {wd}/metrics.jsonl  plot: {png}')


if __name__ == '__main__':
  app.run(main)
