"""2 processes x 4 CPU devices (gloo on loopback) train like 1 process x 8, and share checkpoints."""

import os
import shutil

import numpy as np
import portpicker

import runs

# AdamW: Muon's Newton-Schulz iterations slow each of the three cold compiles here.
KW = dict(train__steps=8, train__log_every=1, train__eval_every=0, checkpoint__every=4,
          checkpoint__keep=2, optimizer__name='adamw', optimizer__learning_rate=3e-3)


def _losses(workdir):
  return {r['step']: r['loss'] for r in runs.metrics(workdir)}


def test_two_processes_match_one_and_their_checkpoint_restores_in_one(tmp_path):
  cache = str(tmp_path / 'xla_cache')
  two, one, resumed = (str(tmp_path / d) for d in ('two', 'one', 'resumed'))
  port = portpicker.pick_unused_port()
  procs = [runs.launch(two, f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
                       f'--process_id={i}', devices=4, cache_dir=cache, **KW) for i in range(2)]
  outs = [runs.finish(p) for p in procs]
  assert 'loss' in outs[0]
  runs.finish(runs.launch(one, devices=8, cache_dir=cache, **KW))

  l2, l1 = _losses(two), _losses(one)
  assert sorted(l2) == sorted(l1) == list(range(1, 9))
  np.testing.assert_allclose([l2[s] for s in l2], [l1[s] for s in l2], rtol=2e-6)
  assert l1[8] < l1[1]
  # Both processes wrote their data shards into the checkpoint (4 of the 8 each).
  shards = {f for f in os.listdir(os.path.join(two, 'checkpoints', '4', 'data')) if f.startswith('shard')}
  assert shards == {f'shard_{s}.json' for s in range(8)}

  # The 2-process checkpoint at step 4 resumes in 1 process: steps 5-8 as in the 1-process run.
  shutil.copytree(os.path.join(two, 'checkpoints', '4'), os.path.join(resumed, 'checkpoints', '4'))
  runs.finish(runs.launch(resumed, devices=8, cache_dir=cache, **KW))
  lr = _losses(resumed)
  assert sorted(lr) == [5, 6, 7, 8]
  np.testing.assert_allclose([lr[s] for s in lr], [l1[s] for s in lr], rtol=2e-6)
