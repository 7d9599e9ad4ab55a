"""xmanager launcher: one launch.train job per point of a hyperparameter sweep.

python -m launch.xm_launch --config=experiments/tiny_moe.py --executor=local \
    --sweep='optimizer.learning_rate=1e-3,3e-3;model.num_experts=8,16' --workdir_root=/tmp/sweep
python -m launch.xm_launch --config=experiments/tiny_moe.py --executor=vertex --accelerator=H100=8 \
    --workdir_root=gs://BUCKET/runs
python -m launch.xm_launch ... --executor=tpu --accelerator=TPU_V5E=8 --dry_run

Executors: `local` (this machine, the project's own interpreter), `vertex` (a GPU container on
Vertex AI) and `tpu` (a TPU container on Vertex AI). --dry_run prints the jobs without launching.
xmanager is an optional extra (`pip install -r requirements-xm.lock`): nothing else imports it.
"""

import dataclasses
import itertools
import os
import sys
from typing import Any

from absl import app, flags
from xmanager import xm, xm_local

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXECUTORS = ('local', 'vertex', 'tpu')
DEFAULT_ACCELERATOR = {'local': '', 'vertex': 'H100=8', 'tpu': 'TPU_V5E=8'}
# The container's JAX build, on top of requirements.lock (jax versions must match).
JAX_EXTRA = {'vertex': 'jax[cuda12]==0.10.2', 'tpu': 'jax[tpu]==0.10.2'}

_CONFIG = flags.DEFINE_string('config', None, 'Experiment config file, relative to the repository.')
_EXECUTOR = flags.DEFINE_enum('executor', 'local', EXECUTORS, 'Where the jobs run.')
_ACCELERATOR = flags.DEFINE_string('accelerator', None, 'NAME=COUNT, e.g. H100=8 or TPU_V5E=8; '
                                   'default by executor: ' + str(DEFAULT_ACCELERATOR))
_SWEEP = flags.DEFINE_string('sweep', '', "'a.b=1,2;c=x,y': the product of the value lists.")
_WORKDIR_ROOT = flags.DEFINE_string('workdir_root', '/tmp/xm_runs', 'Each job writes to ROOT/TITLE/ID.')
_TITLE = flags.DEFINE_string('title', None, 'Experiment title (default: the config name).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the jobs instead of launching them.')


def _value(text: str) -> Any:
  for cast in (int, float):
    try:
      return cast(text)
    except ValueError:
      pass
  return {'true': True, 'false': False}.get(text.lower(), text)


def parse_sweep(spec: str) -> list[dict[str, Any]]:
  """'lr=1,2;e=8' -> [{'lr': 1, 'e': 8}, {'lr': 2, 'e': 8}]; '' -> [{}]."""
  axes = []
  for part in filter(None, (p.strip() for p in spec.split(';'))):
    name, sep, values = part.partition('=')
    if not sep or not name.strip() or not values.strip():
      raise ValueError(f'--sweep {spec!r}: expected "field=v1,v2;field=..." but got {part!r}')
    axes.append([(name.strip(), _value(v.strip())) for v in values.split(',')])
  return [dict(point) for point in itertools.product(*axes)]


def requirements(accelerator: str) -> xm.JobRequirements:
  if not accelerator:
    return xm.JobRequirements()
  name, sep, count = accelerator.partition('=')
  if not sep or not count.isdigit():
    raise ValueError(f'--accelerator={accelerator!r}: expected NAME=COUNT, e.g. H100=8')
  return xm.JobRequirements(**{name.strip().lower(): int(count)})


@dataclasses.dataclass
class Launch:
  """Everything xmanager needs, built without contacting anything: one executable, N jobs."""
  packageable: xm.Packageable
  executor: xm.Executor
  jobs: list[dict[str, Any]]  # Per-job flags for launch.train.


def build(config: str, executor: str, accelerator: str | None, sweep: str, workdir_root: str,
          title: str) -> Launch:
  if executor not in EXECUTORS:
    raise ValueError(f'--executor={executor!r}: expected one of {EXECUTORS}')
  if not os.path.exists(os.path.join(ROOT, config)):
    raise FileNotFoundError(f'--config={config!r}: no such file under {ROOT}')
  reqs = requirements(DEFAULT_ACCELERATOR[executor] if accelerator is None else accelerator)
  if executor == 'local':
    exe = xm_local.Local(requirements=reqs)
    pkg = xm.binary(executor_spec=exe.Spec(), path=sys.executable, args=['-m', 'launch.train'],
                    env_vars={'PYTHONPATH': ROOT})
  else:
    exe = xm_local.Vertex(requirements=reqs)
    pkg = xm.python_container(
        executor_spec=exe.Spec(), path=ROOT, base_image='python:3.11-slim',
        entrypoint=xm.ModuleName('launch.train'), use_deep_module=True,
        docker_instructions=[  # The build context is ROOT's parent.
            'RUN mkdir /workdir', 'WORKDIR /workdir',
            f'COPY {os.path.basename(ROOT)}/requirements.lock /workdir/requirements.lock',
            f'RUN pip install -r requirements.lock "{JAX_EXTRA[executor]}"',
            f'COPY {os.path.basename(ROOT)}/ /workdir',
        ])
  jobs = []
  for i, point in enumerate(parse_sweep(sweep)):
    args = {'config': config, 'workdir': f'{workdir_root}/{title}/{i}'}
    args.update({f'config.{k}': v for k, v in point.items()})
    jobs.append(args)
  return Launch(pkg, exe, jobs)


def main(argv):
  del argv
  title = _TITLE.value or os.path.splitext(os.path.basename(_CONFIG.value))[0]
  spec = build(_CONFIG.value, _EXECUTOR.value, _ACCELERATOR.value, _SWEEP.value,
               _WORKDIR_ROOT.value, title)
  if _DRY_RUN.value:
    print(f'{spec.executor}\n{spec.packageable.executable_spec}')
    for args in spec.jobs:
      print(' '.join(f'--{k}={v}' for k, v in args.items()))
    return
  with xm_local.create_experiment(experiment_title=title) as experiment:
    [executable] = experiment.package([spec.packageable])
    for args in spec.jobs:
      experiment.add(xm.Job(executable=executable, executor=spec.executor, args=args))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  app.run(main)
