"""Typed configs: experiment files hold every field, overrides reach them, bad input names the field."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
from absl import flags
from ml_collections import config_flags

from experiments import tiny_moe, toolcalc_rl
from research import configs
from research.rl import config as rl_config
from research.train import loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = [(loop.ExperimentConfig, tiny_moe), (rl_config.RLExperimentConfig, toolcalc_rl)]


def _fields(cls, prefix=''):
  """Every dotted field name of a config dataclass, sections included."""
  for f in dataclasses.fields(cls):
    yield prefix + f.name
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if dataclasses.is_dataclass(default):
      yield from _fields(type(default), f'{prefix}{f.name}.')


@pytest.mark.parametrize('cls,module', EXPERIMENTS)
def test_experiment_files_hold_every_field(cls, module):
  flat = json.loads(module.get_config().to_json())
  for name in _fields(cls):
    node = flat
    for part in name.split('.'):
      assert part in node, f'{module.__name__} lacks {name}'
      node = node[part]


@pytest.mark.parametrize('cls', [loop.ExperimentConfig, rl_config.RLExperimentConfig])
def test_round_trip_dataclass_config_dict_json(cls):
  default = cls()
  assert configs.from_dict(cls, configs.to_config_dict(default)) == default
  # Non-default values of every kind (nested, tuples of tuples, None -> tuple) survive JSON.
  changed = dataclasses.replace(
      default, seed=3, model=dataclasses.replace(default.model, dtype='bfloat16'),
      optimizer=dataclasses.replace(default.optimizer, muon=dataclasses.replace(
          default.optimizer.muon, spread_axes=('fsdp',), ns_dtype='bfloat16')))
  if cls is rl_config.RLExperimentConfig:
    changed = dataclasses.replace(changed, sampler=dataclasses.replace(changed.sampler, stop_seqs=((1, 2), (3,))))
  back = configs.from_dict(cls, json.loads(json.dumps(configs.to_dict(changed))))
  assert back == changed and back != default
  assert configs.from_dict(cls, configs.to_config_dict(changed)) == changed


@pytest.mark.parametrize('cls,module,key', [
    (loop.ExperimentConfig, tiny_moe, 'optimizer.muon.foo'),
    (loop.ExperimentConfig, tiny_moe, 'model.num_expertz'),
    (loop.ExperimentConfig, tiny_moe, 'trian'),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'sft.optimizer.muon.bar'),
])
def test_unknown_key_is_named_by_its_dotted_path(cls, module, key):
  d = module.get_config().to_dict()
  node = d
  *path, leaf = key.split('.')
  for p in path:
    node = node[p]
  node[leaf] = 1
  with pytest.raises(ValueError, match=rf"unknown config field\(s\) \['{key}'\]"):
    configs.from_dict(cls, d)


@pytest.mark.parametrize('cls,module,key,value', [
    (loop.ExperimentConfig, tiny_moe, 'optimizer.muon.ns_dtype', 'float8'),
    (loop.ExperimentConfig, tiny_moe, 'optimizer.muon.exchange', 'ring'),
    (loop.ExperimentConfig, tiny_moe, 'optimizer.name', 'lion'),
    (loop.ExperimentConfig, tiny_moe, 'data.source', 'parquet'),
    (loop.ExperimentConfig, tiny_moe, 'checkpoint.best_mode', 'lowest'),
    (loop.ExperimentConfig, tiny_moe, 'model.router', 'relu'),
    (loop.ExperimentConfig, tiny_moe, 'train.profile_start', 10**6),  # Past the run's last step.
    (rl_config.RLExperimentConfig, toolcalc_rl, 'sft.optimizer.name', 'lion'),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'loss.gate', 'sometimes'),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'teacher.kind', 'oracle'),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'critic.rules', ('unknown_tool', 'vibes')),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'sampler.top_p', 0.0),
    (rl_config.RLExperimentConfig, toolcalc_rl, 'env.toolcalc.tools', 'all'),
])
def test_bad_value_is_named(cls, module, key, value):
  c = module.get_config()
  *path, leaf = key.split('.')
  node = c
  for p in path:
    node = node[p]
  node[leaf] = value
  with pytest.raises(ValueError, match=rf'^{key}='):
    configs.from_dict(cls, c)


def test_command_line_overrides_reach_the_typed_config():
  argv = [sys.argv[0], f'--config={REPO}/experiments/tiny_moe.py', '--config.model.dtype=bfloat16',
          '--config.optimizer.muon.ns_dtype=bfloat16', '--config.optimizer.muon.spread_axes=("fsdp",)',
          '--config.optimizer.muon.chunk_bytes=1024', '--config.train.steps=5']
  fv = flags.FlagValues()  # As launch/train.py defines it, on its own flags.
  config_flags.DEFINE_config_file('config', None, '', flag_values=fv, lock_config=True, sys_argv=argv)
  fv(argv)
  c = configs.from_dict(loop.ExperimentConfig, fv.config)
  assert (c.model.dtype, c.optimizer.muon.ns_dtype, c.optimizer.muon.spread_axes) == ('bfloat16', 'bfloat16', ('fsdp',))
  assert (c.optimizer.muon.chunk_bytes, c.train.steps) == (1024, 5)
  assert c.optimizer.learning_rate == tiny_moe.get_config().optimizer.learning_rate  # Untouched.


def test_launch_train_names_a_bad_override(tmp_path):
  p = subprocess.run([sys.executable, '-m', 'launch.train', '--config=experiments/tiny_moe.py',
                      f'--workdir={tmp_path}', '--config.optimizer.muon.ns_dtype=float16'],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode != 0
  assert "optimizer.muon.ns_dtype='float16': expected one of" in p.stderr, p.stderr[-2000:]


def test_docs_list_every_field():
  with open(os.path.join(REPO, 'docs', 'training.md')) as f:
    doc = f.read()
  for cls in (loop.ExperimentConfig, rl_config.RLExperimentConfig):
    missing = [n for n in _fields(cls) if f'`{n}`' not in doc and f'`{n.rsplit(".", 1)[-1]}`' not in doc]
    assert not missing, f'docs/training.md does not describe {missing}'


def test_profile_window_checked_only_when_profiling():
  loop.TrainConfig(steps=1).validate()  # Shorter than profile_steps, no profile: fine.
  loop.TrainConfig(steps=5, profile_start=3).validate()  # Steps 3-5.
  with pytest.raises(ValueError, match=r'^train.profile_start=4'):
    loop.TrainConfig(steps=5, profile_start=4).validate()
