"""Supervised training entry point; rerunning the same command resumes from the last checkpoint.

python -m launch.train --config=experiments/tiny_moe.py --workdir=/tmp/tiny_moe \
    --config.model.num_experts=16

Multi-host (one command per process; docs/cluster.md): add --coordinator_address=HOST:PORT
--num_processes=N --process_id=I, or set JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
JAX_PROCESS_ID; under SLURM, Open MPI or on a Cloud TPU slice JAX finds them itself.
"""

from absl import app, flags
from ml_collections import config_flags

from launch import processes
from research.train import loop

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for metrics, TensorBoard and checkpoints.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  processes.start(_CONFIG.value.mesh)
  rows = [r for r in loop.train(_CONFIG.value, _WORKDIR.value) if 'loss' in r]
  if not rows:
    print(f'no step logged: {_WORKDIR.value} already holds the final step, or the run stopped first')
    return
  first, last = rows[0], rows[-1]
  print(f'loss {first["loss"]:.3f} (step {first["step"]}) -> {last["loss"]:.3f} (step {last["step"]}), '
        f'{last["tokens_per_s"]:.0f} tokens/s; metrics in {_WORKDIR.value}/metrics.jsonl')


if __name__ == '__main__':
  flags.FLAGS.set_default('verbosity', -1)  # absl WARNING: orbax's per-save INFO lines drown the bar.
  app.run(main)
