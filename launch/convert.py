"""Hugging Face checkpoints in and out (Qwen3-MoE, DeepSeek-V3 / Kimi K2 / K2.5), streaming shard by shard.

Import (writes an orbax params checkpoint and our model config as JSON):
python -m launch.convert --from_hf=/data/Qwen3-30B-A3B --to=/ckpt/qwen3_30b --config_out=/ckpt/qwen3_30b.json
Export (a folder transformers.AutoModelForCausalLM.from_pretrained loads):
python -m launch.convert --from_ckpt=/ckpt/qwen3_30b --to_hf=/export/qwen3_30b --copy_from=/data/Qwen3-30B-A3B
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
from research.hf import malloc

malloc.tune_for_streaming()  # Before jax / tensorstore start threads: keeps RSS flat while streaming.

import time

from absl import app, flags

from research.hf import config_map
from research.hf import convert
from research.hf import weights

_FROM_HF = flags.DEFINE_string('from_hf', None, 'Hugging Face folder to import (config.json + safetensors).')
_TO = flags.DEFINE_string('to', None, 'Orbax checkpoint directory to write (import).')
_CONFIG_OUT = flags.DEFINE_string('config_out', None, 'Where to write our model config as JSON (import).')
_FROM_CKPT = flags.DEFINE_string('from_ckpt', None, 'Orbax params checkpoint to export.')
_TO_HF = flags.DEFINE_string('to_hf', None, 'Hugging Face folder to write (export).')
_CONFIG = flags.DEFINE_string('config', None, 'Model config JSON for export, if the checkpoint has none.')
_SUBTREE = flags.DEFINE_string('subtree', '', 'Dotted path of the params inside the checkpoint (e.g. params).')
_LAYOUT = flags.DEFINE_enum('expert_layout', weights.PER_EXPERT, weights.LAYOUTS, 'Expert tensors on export.')
_DTYPE = flags.DEFINE_enum('dtype', None, ['float32', 'bfloat16'], 'Export dtype (default: the params\').')
_SHARD_GB = flags.DEFINE_float('max_shard_gb', 5.0, 'Largest safetensors shard on export, GiB.')
_COPY_FROM = flags.DEFINE_string('copy_from', None, 'HF folder whose tokenizer/generation files to copy.')
_IGNORE = flags.DEFINE_list('ignore_fields', [], 'config.json fields known not to change the math.')
_OVERWRITE = flags.DEFINE_bool('overwrite', False, 'Replace an existing destination.')


def main(argv):
  del argv
  t0 = time.perf_counter()
  if _FROM_HF.value:
    if not _TO.value:
      raise app.UsageError('--from_hf needs --to')
    cfg = convert.hf_to_orbax(_FROM_HF.value, _TO.value, ignore_fields=_IGNORE.value,
                              overwrite=_OVERWRITE.value)
    if _CONFIG_OUT.value:
      config_map.save_model_config(cfg, _CONFIG_OUT.value)
    print(f'imported {_FROM_HF.value} -> {_TO.value} in {time.perf_counter() - t0:.1f}s'
          + (f'; model config in {_CONFIG_OUT.value}' if _CONFIG_OUT.value else ''))
    source, skipped = convert.read_hf_source(_TO.value)
    if skipped:
      print(f'vision tower not converted (the model is text-only): {len(skipped)} tensors skipped: '
            + ', '.join(skipped))
    if source and config_map.multimodal_fields(source):
      print('multimodal config fields kept in the checkpoint metadata (convert.read_hf_source): '
            + ', '.join(sorted(config_map.multimodal_fields(source))))
  elif _FROM_CKPT.value:
    if not _TO_HF.value:
      raise app.UsageError('--from_ckpt needs --to_hf')
    cfg = config_map.load_model_config(_CONFIG.value) if _CONFIG.value else None
    convert.orbax_to_hf(_FROM_CKPT.value, _TO_HF.value, cfg=cfg, expert_layout=_LAYOUT.value,
                        dtype=_DTYPE.value, max_shard_bytes=int(_SHARD_GB.value * 2**30),
                        copy_from=_COPY_FROM.value, subtree=tuple(filter(None, _SUBTREE.value.split('.'))),
                        overwrite=_OVERWRITE.value)
    print(f'exported {_FROM_CKPT.value} -> {_TO_HF.value} in {time.perf_counter() - t0:.1f}s')
  else:
    raise app.UsageError('pass --from_hf (import) or --from_ckpt (export)')


if __name__ == '__main__':
  app.run(main)
