"""launch.plan builds the Kimi-K2 shape abstractly and reports the published counts."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_kimi_k2_counts():
  proc = subprocess.run(
      [sys.executable, '-m', 'launch.plan', '--config=experiments/kimi_k2.py',
       '--mesh=data:8,fsdp:64,expert:32', '--json'],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert abs(out['total_params'] / 1.03e12 - 1) < 0.01
  assert abs(out['active_params'] / 3.3e10 - 1) < 0.02
  assert out['devices'] == 8 * 64 * 32
  # Experts (~97% of the weights) split 2048 ways, the rest 64 ways: ~1.3 GiB per device in bf16.
  assert 1e9 < out['param_bytes_per_device'] < 2e9
  opt = out['optimizer']
  assert opt['exchange_ratio'] < 4 and 0 < opt['step_seconds'] < 1.0
