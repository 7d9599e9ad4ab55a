"""Preemption: a run stopped by SIGTERM and resumed ends bitwise equal to an uninterrupted run."""

import os
import signal
import time

import numpy as np
import orbax.checkpoint as ocp

import runs

STEPS = 40  # Room to land SIGTERM mid-run: steps take milliseconds once compiled.
TIMED = ('tokens_per_s', 'mfu')  # Wall-clock fields; every other field must match exactly.


def _rows(workdir):
  return [{k: v for k, v in r.items() if k not in TIMED} for r in runs.metrics(workdir)]


def _final_state(workdir):
  path = os.path.join(workdir, 'checkpoints', str(STEPS), 'state')
  return ocp.PyTreeCheckpointer().restore(path)


def _steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())


def test_sigterm_then_resume_matches_uninterrupted_run(tmp_path):
  cache = str(tmp_path / 'xla_cache')
  ref_dir, run_dir = str(tmp_path / 'reference'), str(tmp_path / 'preempted')
  kw = dict(cache_dir=cache, train__steps=STEPS, train__log_every=2, train__eval_every=20,
            checkpoint__every=100)
  runs.finish(runs.launch(ref_dir, **kw))  # Fills the compilation cache the other two reuse.
  run = runs.launch(run_dir, **kw)
  metrics = os.path.join(run_dir, 'metrics.jsonl')
  deadline = time.time() + 200
  while not (os.path.exists(metrics) and open(metrics).read().strip()):  # Step 2 logged.
    assert run.poll() is None and time.time() < deadline, run.communicate()[0][-3000:]
    time.sleep(0.005)
  run.send_signal(signal.SIGTERM)
  out = runs.finish(run)
  assert 'SIGTERM: saved a checkpoint at step' in out
  (stopped,) = _steps(run_dir)
  assert 2 <= stopped < STEPS, stopped
  runs.finish(runs.launch(run_dir, **kw))  # Resume.

  assert _rows(run_dir) == _rows(ref_dir)
  assert [r['step'] for r in _rows(ref_dir)] == list(range(2, STEPS + 1, 2))
  a, b = _final_state(run_dir), _final_state(ref_dir)
  flat_a, flat_b = ocp.tree.to_flat_dict(a), ocp.tree.to_flat_dict(b)
  assert flat_a.keys() == flat_b.keys() and len(flat_a) > 10
  for k in flat_a:
    np.testing.assert_array_equal(np.asarray(flat_a[k]), np.asarray(flat_b[k]), err_msg=str(k))
  assert int(np.asarray(a['step'])) == STEPS
