"""launch.rl in 2 processes x 4 CPU devices (gloo on loopback) takes the first RL steps of 1 x 8."""

import json
import os
import subprocess
import sys

import numpy as np
import portpicker

import runs

TINY = {
    'model.d_model': 32, 'model.head_dim': 16, 'model.num_heads': 2, 'model.num_kv_heads': 1,
    'model.d_expert': 32, 'model.num_experts': 4, 'mesh': 'data:2,fsdp:2,expert:2',
    'sft.steps': 2, 'sft.batch_size': 8, 'rl.steps': 2, 'rl.tasks_per_step': 4, 'rl.group_size': 2,
    'rl.max_targets': 8, 'sampler.record_routes': True, 'sampler.max_turns': 2,
    'sampler.max_turn_tokens': 12, 'sampler.max_len': 96, 'eval.num_tasks': 8, 'eval.every': 2,
    'env.toolcalc.max_ops': 1, 'tensorboard': False, 'optimizer.name': 'adamw',
    'critic.rules': "('unknown_tool','wrong_tool','malformed_call')",
}


def _launch(workdir: str, *args: str, devices: int, cache: str) -> subprocess.Popen:
  cmd = [sys.executable, '-m', 'launch.rl', f'--config={runs.ROOT}/experiments/toolcalc_rl.py',
         f'--workdir={workdir}', *[f'--config.{k}={v}' for k, v in TINY.items()], *args]
  return subprocess.Popen(cmd, cwd=runs.ROOT, env=runs.env(devices, cache), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _finish(p: subprocess.Popen) -> str:
  out, _ = p.communicate(timeout=1500)
  assert p.returncode == 0, out[-4000:]
  return out


def _rows(workdir: str) -> dict[int, dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return {r['step']: r for r in map(json.loads, f) if r['step'] > 0}


def test_two_processes_take_the_steps_of_one(tmp_path):
  cache, two, one = str(tmp_path / 'xla_cache'), str(tmp_path / 'two'), str(tmp_path / 'one')
  port = portpicker.pick_unused_port()
  procs = [_launch(two, f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2', f'--process_id={i}',
                   devices=4, cache=cache) for i in range(2)]
  for p in procs:
    _finish(p)
  _finish(_launch(one, devices=8, cache=cache))
  r2, r1 = _rows(two), _rows(one)
  assert sorted(r2) == sorted(r1) == [1, 2]
  for step in (1, 2):
    assert r2[step]['policy_tokens'] == r1[step]['policy_tokens']  # The same rollouts.
    for k in ('reward_mean', 'feedback_count', 'loss', 'pg_loss', 'distill_loss', 'anchor_kl', 'grad_norm'):
      np.testing.assert_allclose(r2[step][k], r1[step][k], rtol=1e-4, atol=1e-6, err_msg=k)
