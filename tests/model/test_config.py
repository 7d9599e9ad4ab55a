"""Bad configs fail at start with an error that names the field."""

import dataclasses

import pytest

from experiments import tiny_moe
from research.model import transformer
from research.model.config import ModelConfig, from_dict
from research.parallel import mesh as mesh_lib
from research.train import loop


@pytest.mark.parametrize('field,value', [('attention', 'linear'), ('router', 'relu'),
                                         ('moe_impl', 'magic'), ('ep_exchange', 'nccl'),
                                         ('num_experts_per_tok', 99), ('n_group', 3),
                                         ('num_kv_heads', 3), ('moe_fallback_impl', 'padded'),
                                         ('moe_capacity_factor', 0.5)])
def test_invalid_field_is_named(field, value):
  with pytest.raises(ValueError, match=f'model.{field}'):
    transformer.param_specs(dataclasses.replace(ModelConfig(), **{field: value}))


def test_unknown_field_is_rejected():
  with pytest.raises(ValueError, match='num_expertz'):
    from_dict({'num_expertz': 8})


@pytest.mark.parametrize('mesh,override,field', [
    ('expert:8', {'model.num_experts': 12}, 'model.num_experts'),
    ('fsdp:8', {'model.d_model': 100}, 'model.d_model'),
    ('data:8', {'data.batch_size': 12}, 'data.batch_size'),
    ('tensor:8', {'model.num_heads': 4}, 'model.num_heads'),
])
def test_dimensions_that_do_not_divide_the_mesh(mesh, override, field):
  config = tiny_moe.get_config()
  config.mesh = mesh
  for k, v in override.items():
    section, name = k.split('.')
    config[section][name] = v
  with pytest.raises(ValueError, match=field.replace('.', r'\.')):
    loop.setup(config)


def test_mesh_larger_than_device_count():
  with pytest.raises(ValueError, match='needs 16 devices but only 8'):
    mesh_lib.make_mesh('data:4,expert:4')


@pytest.mark.parametrize('spec,msg', [('data:2,pipeline:4', 'unknown axis'), ('data=2', 'axis:size'),
                                      ('data:0', '>= 1')])
def test_bad_mesh_spec(spec, msg):
  with pytest.raises(ValueError, match=msg):
    mesh_lib.parse_mesh_spec(spec)
