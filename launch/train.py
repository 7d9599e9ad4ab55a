"""Supervised training entry point.

python -m launch.train --config=experiments/tiny_moe.py --workdir=/tmp/tiny_moe \
    --config.model.num_experts=16
"""

from absl import app, flags
from ml_collections import config_flags

from research.train import loop

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for metrics.jsonl and checkpoints.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  del argv
  history = loop.train(_CONFIG.value, _WORKDIR.value)
  first, last = history[0], history[-1]
  print(f'loss {first["loss"]:.3f} (step {first["step"]}) -> {last["loss"]:.3f} (step {last["step"]}), '
        f'{last["tokens_per_s"]:.0f} tokens/s; metrics in {_WORKDIR.value}/metrics.jsonl')


if __name__ == '__main__':
  app.run(main)
