"""Plans a model at full scale without allocating it: parameter counts and per-device bytes.

python -m launch.plan --config=experiments/kimi_k2.py --mesh=data:8,fsdp:64,expert:32 [--json]
"""

import json

from absl import app, flags
from ml_collections import config_flags

from research.model import config as model_config
from research.model import stats
from research.parallel import mesh as mesh_lib

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config file.', lock_config=True)
_MESH = flags.DEFINE_string('mesh', None, 'Mesh as axis:size pairs; default: the config\'s mesh.')
_JSON = flags.DEFINE_bool('json', False, 'Print one JSON object instead of a table.')
flags.mark_flags_as_required(['config'])


def plan(config, mesh_spec: str | None = None) -> dict:
  cfg = model_config.from_dict(config.model.to_dict())
  shape = mesh_lib.parse_mesh_spec(mesh_spec or config.mesh)
  counts = stats.param_counts(cfg)
  devices = 1
  for n in shape.values():
    devices *= n
  return {**counts, 'mesh': shape, 'devices': devices,
          'param_bytes_per_device': stats.bytes_per_device(cfg, shape)}


def main(argv):
  del argv
  out = plan(_CONFIG.value, _MESH.value)
  if _JSON.value:
    print(json.dumps(out))
    return
  print(f'mesh                   {out["mesh"]} ({out["devices"]} devices)')
  print(f'total parameters       {out["total_params"]:.4e}')
  print(f'active parameters      {out["active_params"]:.4e}')
  print(f'param bytes / device   {out["param_bytes_per_device"] / 2**30:.2f} GiB')


if __name__ == '__main__':
  app.run(main)
