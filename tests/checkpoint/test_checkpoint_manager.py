"""The checkpoint manager: restore onto another mesh, retention, corrupt/partial checkpoints, shapes."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from research.checkpoint import manager
from research.parallel import mesh as mesh_lib


def _state(mesh, experts=8, seed=0):
  k = jax.random.split(jax.random.key(seed), 2)
  tree = {'params': {'w': jax.random.normal(k[0], (experts, 16, 32)), 'b': jax.random.normal(k[1], (32,))},
          'step': jnp.asarray(7, jnp.int32)}
  specs = {'params': {'w': P('expert', 'fsdp'), 'b': P()}, 'step': P()}
  return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs)


def _files(d):
  return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def test_restores_bitwise_onto_another_mesh(tmp_path):
  saved = _state(mesh_lib.make_mesh('fsdp:2,expert:4'))
  ck = manager.Checkpointer(str(tmp_path), save_every=1)
  ck.save(3, saved, data={'0': {'next': 5}}, meta={'note': 'x'})
  ck.close()
  other = mesh_lib.make_mesh('data:2,expert:2', jax.devices()[:4])
  target = manager.abstract(_state(other, seed=1))
  r = manager.Checkpointer(str(tmp_path), save_every=1).restore(target)
  assert (r.step, r.data, r.meta['note']) == (3, {'0': {'next': 5}}, 'x')
  for a, b, t in zip(jax.tree.leaves(r.state), jax.tree.leaves(saved), jax.tree.leaves(target)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert a.sharding == t.sharding


def test_keeps_last_k_and_the_best(tmp_path):
  mesh = mesh_lib.make_mesh('data:8')
  ck = manager.Checkpointer(str(tmp_path), save_every=1, keep=2, best_metric='eval_loss')
  losses = {1: 3.0, 2: 1.0, 3: 2.0, 4: 2.5, 5: 2.2, 6: 2.4}
  for step, loss in losses.items():
    ck.save(step, _state(mesh), metrics={'eval_loss': loss})
  ck.close()
  assert ck.all_steps() == [2, 5, 6]
  ck = manager.Checkpointer(str(tmp_path / 'max'), save_every=1, keep=1, best_metric='acc',
                            best_mode='max')
  for step in (7, 8):
    ck.save(step, _state(mesh), metrics={'acc': 9.0 - step})
  ck.close()
  assert ck.all_steps() == [7, 8]


def test_corrupt_and_partial_checkpoints_are_skipped(tmp_path, caplog):
  mesh = mesh_lib.make_mesh('data:8')
  ck = manager.Checkpointer(str(tmp_path), save_every=1, keep=5)
  good, bad = _state(mesh, seed=1), _state(mesh, seed=2)
  ck.save(1, good)
  ck.save(2, bad)
  ck.close()
  for f in _files(tmp_path / '2' / 'state'):  # Bit rot in every file of step 2's arrays.
    with open(tmp_path / '2' / 'state' / f, 'r+b') as fh:
      fh.write(b'\xff' * 64)
  os.makedirs(tmp_path / '3.orbax-checkpoint-tmp-123' / 'state')  # A save that crashed midway.
  ck = manager.Checkpointer(str(tmp_path), save_every=1, keep=5)
  assert ck.latest_step() == 2
  with caplog.at_level(logging.WARNING):
    r = ck.restore(manager.abstract(good))
  assert r.step == 1
  np.testing.assert_array_equal(np.asarray(r.state['params']['w']), np.asarray(good['params']['w']))
  assert 'step 2' in caplog.text and 'unreadable' in caplog.text
  moved = os.listdir(tmp_path / manager.CORRUPT_DIR)
  assert len(moved) == 1 and moved[0].startswith('2.'), 'kept for inspection, not deleted'
  assert ck.all_steps() == [1]
  ck.save(2, good)  # The step can be saved again.
  ck.close()
  assert ck.all_steps() == [1, 2]


def test_incompatible_checkpoint_names_the_arrays_and_deletes_nothing(tmp_path):
  mesh = mesh_lib.make_mesh('data:8')
  ck = manager.Checkpointer(str(tmp_path), save_every=1, config={'model': {'num_experts': 8}})
  ck.save(1, _state(mesh, experts=8))
  ck.close()
  before = _files(tmp_path)
  ck = manager.Checkpointer(str(tmp_path), save_every=1, config={'model': {'num_experts': 4}})
  with pytest.raises(manager.IncompatibleCheckpointError) as e:
    ck.restore(manager.abstract(_state(mesh, experts=4)))
  msg = str(e.value)
  assert 'params/w is (8, 16, 32) in the checkpoint but (4, 16, 32) now' in msg
  assert 'model.num_experts: 8 in the checkpoint, 4 now' in msg
  assert _files(tmp_path) == before
