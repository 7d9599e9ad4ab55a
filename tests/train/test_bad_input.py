"""Bad input fails early with an error naming the problem, and deletes nothing."""

import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import runs
from research.checkpoint import manager
from research.train import loop


def _files(d):
  return sorted((os.path.relpath(os.path.join(r, f), d), os.path.getsize(os.path.join(r, f)))
                for r, _, fs in os.walk(d) for f in fs)


def test_unwritable_workdir_is_named(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  workdir = str(blocker / 'run')
  with pytest.raises(PermissionError, match=f'workdir {workdir!r} is not writable'):
    loop.train(runs.config(), workdir)
  assert blocker.read_text() == 'not a directory'


def test_override_of_the_wrong_type_names_the_field(tmp_path):
  p = subprocess.run([sys.executable, '-m', 'launch.train', '--config=experiments/tiny_moe.py',
                      f'--workdir={tmp_path}/run', '--config.train.steps=abc'],
                     cwd=runs.ROOT, env=runs.env(), capture_output=True, text=True, timeout=120)
  assert p.returncode != 0
  assert "--config.train.steps=abc: invalid literal for int()" in p.stderr
  assert not os.path.exists(tmp_path / 'run')


def test_checkpoint_of_another_config_is_refused_and_kept(tmp_path):
  workdir = str(tmp_path / 'run')
  old = runs.config(model__num_experts=8)
  trainer = loop.make_trainer(old)
  mesh, rng = trainer.mesh, jax.random.key(0)
  tree = loop.checkpoint_tree(trainer.init(rng), jax.device_put(jax.random.key_data(rng),
                                                                NamedSharding(mesh, P())))
  ckpt = manager.Checkpointer(os.path.join(workdir, 'checkpoints'), save_every=4,
                              config=old.to_dict())
  ckpt.save(4, tree, data={}, meta={})
  ckpt.close()
  before = _files(workdir)
  with pytest.raises(manager.IncompatibleCheckpointError) as e:
    loop.train(runs.config(model__num_experts=4), workdir)
  msg = str(e.value)
  assert 'params/moe_layers/moe/wi_gate is (2, 8, 64, 64) in the checkpoint but (2, 4, 64, 64) now' in msg
  assert 'model.num_experts: 8 in the checkpoint, 4 now' in msg
  assert 'nothing was deleted' in msg
  assert _files(workdir) == before
