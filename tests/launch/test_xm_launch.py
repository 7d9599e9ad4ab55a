"""The xmanager launcher builds its jobs (executor, executable, sweep) without launching anything."""

import pytest
from xmanager import xm, xm_local

from launch import xm_launch

CONFIG = 'experiments/tiny_moe.py'


def test_sweep_is_the_product_of_value_lists():
  jobs = xm_launch.parse_sweep('optimizer.learning_rate=1e-3,3e-3; model.num_experts=8,16;tag=a')
  assert len(jobs) == 4
  assert jobs[0] == {'optimizer.learning_rate': 1e-3, 'model.num_experts': 8, 'tag': 'a'}
  assert {(j['optimizer.learning_rate'], j['model.num_experts']) for j in jobs} == {
      (1e-3, 8), (1e-3, 16), (3e-3, 8), (3e-3, 16)}
  assert xm_launch.parse_sweep('') == [{}]
  with pytest.raises(ValueError, match='lr'):
    xm_launch.parse_sweep('lr')


def test_local_jobs_run_launch_train_with_overrides():
  spec = xm_launch.build(CONFIG, 'local', None, 'optimizer.learning_rate=1e-3,3e-3', '/tmp/r', 't')
  assert isinstance(spec.executor, xm_local.Local)
  assert isinstance(spec.packageable.executable_spec, xm.Binary)
  assert list(spec.packageable.args.to_list()) == ['-m', 'launch.train']
  assert spec.jobs == [
      {'config': CONFIG, 'workdir': '/tmp/r/t/0', 'config.optimizer.learning_rate': 1e-3},
      {'config': CONFIG, 'workdir': '/tmp/r/t/1', 'config.optimizer.learning_rate': 3e-3}]


@pytest.mark.parametrize('executor,accelerator,resource,jax_build', [
    ('vertex', None, 'H100', 'jax[cuda12]'), ('vertex', 'A100=4', 'A100', 'jax[cuda12]'),
    ('tpu', None, 'TPU_V5E', 'jax[tpu]')])
def test_cloud_jobs_are_containers_with_accelerators(executor, accelerator, resource, jax_build):
  spec = xm_launch.build(CONFIG, executor, accelerator, '', 'gs://bucket/runs', 't')
  assert isinstance(spec.executor, xm_local.Vertex)
  assert str(spec.executor.requirements.accelerator) == resource
  container = spec.packageable.executable_spec
  assert isinstance(container, xm.PythonContainer)
  assert container.entrypoint == xm.ModuleName('launch.train')
  assert any(jax_build in line for line in container.docker_instructions)
  assert spec.jobs == [{'config': CONFIG, 'workdir': 'gs://bucket/runs/t/0'}]


def test_bad_flags_are_named():
  with pytest.raises(ValueError, match='--accelerator'):
    xm_launch.build(CONFIG, 'vertex', 'H100', '', '/tmp', 't')
  with pytest.raises(FileNotFoundError, match='--config'):
    xm_launch.build('experiments/nope.py', 'local', None, '', '/tmp', 't')
  with pytest.raises(ValueError, match='--executor'):
    xm_launch.build(CONFIG, 'slurm', None, '', '/tmp', 't')
