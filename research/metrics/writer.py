"""Metric rows to workdir/metrics.jsonl and TensorBoard event files, with console progress.

    writer = MetricsWriter(workdir, total_steps=1000)        # only process 0 writes
    writer.write(step, {'loss': 2.31, 'tokens_per_s': 1.2e4}) # a jsonl row, TB scalars, the bar
    writer.close()

A row is flat {name: number}; TensorBoard gets each value as a scalar under its name (event files in
workdir/tensorboard, written with tensorboardX: no TensorFlow). A resumed run calls
`truncate(step)` to drop rows logged after its checkpoint, so metrics.jsonl reads as one run.
"""

import json
import os
import sys

import jax
import tqdm

CONSOLE_KEYS = {'loss': '{:.3f}', 'tokens_per_s': '{:.0f}', 'mfu': '{:.1%}', 'eval_loss': '{:.3f}'}


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without torch.

  tensorboardX imports torch when it is installed (seconds of start-up) only to accept torch
  tensors; rows here are floats, so the import is blocked while tensorboardX loads.
  """
  blocked = 'torch' not in sys.modules
  if blocked:
    sys.modules['torch'] = None  # `import torch` raises ImportError.
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    if blocked:
      del sys.modules['torch']
  return SummaryWriter


class MetricsWriter:

  def __init__(self, workdir: str, *, total_steps: int | None = None, initial_step: int = 0,
               tensorboard: bool = True, console: bool = True, desc: str = 'train'):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.active = jax.process_index() == 0
    self._tb = self._bar = None
    if not self.active:
      return
    if tensorboard:
      self._tb = _summary_writer()(os.path.join(workdir, 'tensorboard'))
    if console:
      self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, desc=desc, unit='step')
    self._step = initial_step

  def truncate(self, step: int):
    """Drops rows with a step after `step` (atomically)."""
    if not self.active or not os.path.exists(self.path):
      return
    with open(self.path) as f:
      rows = [line for line in f if line.strip() and json.loads(line)['step'] <= step]
    with open(self.path + '.tmp', 'w') as f:
      f.writelines(rows)
    os.replace(self.path + '.tmp', self.path)

  def write(self, step: int, row: dict) -> dict:
    """Appends {'step': step, **row} (values as floats) and returns it."""
    row = {'step': int(step), **{k: float(v) for k, v in row.items()}}
    if not self.active:
      return row
    with open(self.path, 'a') as f:
      f.write(json.dumps(row) + '\n')
    if self._tb:
      for k, v in row.items():
        if k != 'step':
          self._tb.add_scalar(k, v, step)
      self._tb.flush()
    if self._bar:
      self._bar.update(step - self._step)
      self._bar.set_postfix({k: fmt.format(row[k]) for k, fmt in CONSOLE_KEYS.items() if k in row})
    self._step = step
    return row

  def close(self):
    if self._tb:
      self._tb.close()
    if self._bar:
      self._bar.close()
