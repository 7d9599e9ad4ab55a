"""The training entry point trains the tiny MoE on the synthetic corpus: the loss falls, and two
steps traced by the profiler are attributed to the model's components."""

import glob
import json
import subprocess
import sys

import runs

SMALL = ['--config.model.d_model=64', '--config.model.num_layers=2', '--config.model.head_dim=16',
         '--config.model.d_expert=64', '--config.data.seq_len=32', '--config.data.batch_size=8',
         '--config.train.log_every=10', '--config.train.steps=60']


def test_launch_train_loss_falls(tmp_path):
  workdir = tmp_path / 'run'
  proc = subprocess.run(
      [sys.executable, '-m', 'launch.train', '--config=experiments/tiny_moe.py', f'--workdir={workdir}',
       '--config.model.num_experts=16', '--config.mesh=fsdp:2,expert:4', *SMALL,
       '--config.train.profile_start=21', '--config.train.profile_steps=2'],
      cwd=runs.ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = runs.metrics(workdir)
  assert [r['step'] for r in rows] == [10, 20, 30, 40, 50, 60]
  for r in rows:
    assert {'step', 'loss', 'tokens_per_s'} <= set(r) and r['tokens_per_s'] > 0
  assert rows[-1]['loss'] < 0.6 * rows[0]['loss'], [r['loss'] for r in rows]
  assert 'loss' in proc.stdout
  # The profile: a trace TensorBoard reads, and its device time by component (experts exchanged
  # over the 4-way expert axis), forward and backward.
  assert glob.glob(str(workdir / 'tensorboard' / 'plugins' / 'profile' / '*' / '*.xplane.pb'))
  prof = json.loads((workdir / 'device_time.json').read_text())
  assert prof['first_step'] == 21 and prof['steps'] == 2
  comps = prof['components']
  assert {'attention', 'router', 'dispatch', 'exchange', 'experts', 'combine', 'optimizer'} <= set(comps), comps
  assert comps['experts']['forward'] > 0 and comps['experts']['backward'] > 0
  assert 'device time per step, steps 21-22' in proc.stdout

