"""Kimi K2.5 checkpoints: container config, prefixed names, INT4 pack-quantized experts, both ways.

compressed-tensors is the independent reference for the bit layout, the scales and the dequantized
values; transformers' DeepseekV3ForCausalLM, run on compressed-tensors' dequantized weights, for the
logits. The tiny checkpoint has K2.5's real container, tensor names, quantization_config and
(K2.6's) ignore list, plus vision tower / projector tensors that must be skipped.
"""

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from compressed_tensors.compressors.pack_quantized import (PackedQuantizationCompressor, pack_to_int32,
                                                           unpack_from_int32)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams
from compressed_tensors.utils.match import match_name
from safetensors.torch import load_file, save_file

from experiments.benchmarks import convert_memory
from research.hf import config_map
from research.hf import convert
from research.hf import kimi_k25
from research.hf import safetensors_io
from research.hf import weights
from research.hf import pack_quantized as pq
from research.model import decode
from research.model import transformer
from research.model.config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-4
GROUP = 32
IGNORE = ['re:.*self_attn.*', 're:.*shared_experts.*', r're:.*mlp\.(gate|up|gate_up|down)_proj.*',
          're:.*lm_head.*', 're:vision_tower.*', 're:mm_projector.*']
QUANT_JSON = {
    'quant_method': 'compressed-tensors', 'format': 'pack-quantized', 'quantization_status': 'compressed',
    'config_groups': {'group_0': {'targets': ['Linear'], 'input_activations': None, 'output_activations': None,
                                  'weights': {'num_bits': 4, 'type': 'int', 'symmetric': True,
                                              'strategy': 'group', 'group_size': GROUP, 'dynamic': False,
                                              'observer': 'minmax', 'actorder': None}}},
    'ignore': IGNORE, 'kv_cache_scheme': None, 'sparsity_config': {}}
SCHEME = pq.Scheme.from_json(QUANT_JSON)
CT_SCHEME = QuantizationScheme(targets=['Linear'], weights=QuantizationArgs(
    num_bits=4, type='int', symmetric=True, strategy='group', group_size=GROUP))
EXPERT = re.compile(r'model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight')


def _ct_compress(w: torch.Tensor, scale_dtype=torch.bfloat16) -> dict:
  """compressed-tensors: min-max group scales, then its pack-quantized compressor."""
  groups = w.float().unflatten(-1, (-1, GROUP))
  scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), CT_SCHEME.weights)
  out = PackedQuantizationCompressor.compress({'weight': w.float(), 'weight_scale': scale.to(scale_dtype)},
                                              CT_SCHEME)
  return {k: v for k, v in out.items() if k in (pq.PACKED, pq.SCALE, pq.SHAPE)}


def _ct_decompress(parts: dict) -> torch.Tensor:
  return PackedQuantizationCompressor.decompress(dict(parts), CT_SCHEME)['weight']


# ---- bit layout, scales, matching against compressed-tensors ----

def test_pack_unpack_match_compressed_tensors():
  rng = np.random.RandomState(0)
  q = rng.randint(-8, 8, (6, 72)).astype(np.int8)  # 72: a padded last word.
  ref = pack_to_int32(torch.tensor(q), 4).numpy()
  np.testing.assert_array_equal(pq.pack(q, 4), ref)
  np.testing.assert_array_equal(pq.unpack(ref, 72, 4), q)
  np.testing.assert_array_equal(unpack_from_int32(torch.tensor(pq.pack(q, 4)), 4, torch.Size([6, 72])), q)
  # The layout spelled out: column 8j+i is bits [4i, 4i+3] of word j, offset by 8.
  word = int(ref[2, 1]) & 0xFFFFFFFF
  assert [(word >> 4 * i & 0xF) - 8 for i in range(8)] == list(q[2, 8:16])
  assert (ref < 0).any()  # Words with the top nibble >= 8 are negative int32 and still unpack right.


@pytest.mark.parametrize('scale_dtype', [torch.bfloat16, torch.float16, torch.float32])
def test_dequantize_bit_identical(scale_dtype):
  w = torch.randn(64, 128, generator=torch.Generator().manual_seed(1))
  parts = _ct_compress(w, scale_dtype)
  np_dtype = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32}
  scale = parts[pq.SCALE].float().numpy().astype(np_dtype[scale_dtype])
  ours = pq.dequantize(parts[pq.PACKED].numpy(), scale, 128, SCHEME)
  ref = _ct_decompress(parts)
  assert ours.dtype == scale.dtype and ref.dtype == scale_dtype
  np.testing.assert_array_equal(ours.astype(np.float32), ref.float().numpy())  # Bit for bit.


def test_quantize_matches_compressed_tensors():
  w = torch.randn(48, 96, generator=torch.Generator().manual_seed(2))
  w[3, :GROUP] = 0  # An all-zero group: eps scale, zeros.
  ref = _ct_compress(w, torch.float32)
  packed, scale = pq.quantize(w.numpy(), SCHEME, np.dtype(np.float32))
  np.testing.assert_array_equal(scale, ref[pq.SCALE].numpy())
  np.testing.assert_array_equal(packed, ref[pq.PACKED].numpy())
  assert tuple(ref[pq.SHAPE].tolist()) == (48, 96)


def test_ignore_matching_matches_compressed_tensors():
  names = ['language_model.model.layers.0.mlp.gate_proj', 'language_model.model.layers.1.mlp.experts.3.up_proj',
           'language_model.model.layers.1.mlp.shared_experts.down_proj', 'language_model.lm_head',
           'language_model.model.layers.1.self_attn.kv_b_proj', 'vision_tower.encoder.blocks.0.mlp.fc0',
           'language_model.vision_tower.x', 'mm_projector.proj.0', 'lm_head']
  for name in names:
    for target in IGNORE + ['lm_head', 'Linear']:
      assert pq.match_name(name, target) == match_name(name, target), (name, target)
  assert not SCHEME.ignored('language_model.model.layers.1.mlp.experts.3.up_proj')
  assert SCHEME.ignored('language_model.model.layers.0.mlp.down_proj')


@pytest.mark.parametrize('field,value,msg', [
    ('format', 'int-quantized', 'pack-quantized'),
    ('config_groups.group_0.weights.symmetric', False, 'symmetric'),
    ('config_groups.group_0.weights.strategy', 'channel', 'strategy'),
    ('config_groups.group_0.weights.actorder', 'group', 'actorder'),
])
def test_unsupported_scheme_named(field, value, msg):
  qc = json.loads(json.dumps(QUANT_JSON))
  node = qc
  *path, last = field.split('.')
  for k in path:
    node = node[k]
  node[last] = value
  with pytest.raises(pq.QuantizationConfigError, match=msg):
    pq.Scheme.from_json(qc)


def test_kimi_k25_container_errors_named():
  with pytest.raises(config_map.UnsupportedConfigError, match='text_config'):
    config_map.from_hf({'model_type': 'kimi_k25', 'vision_config': {}})
  bad = _container({**config_map.to_hf(ModelConfig(attention='mla', router='sigmoid', q_lora_rank=8,
                                                    kv_lora_rank=8, num_shared_experts=1).validate())})
  bad['text_config']['quantization_config'] = {**QUANT_JSON, 'format': 'float-quantized'}
  with pytest.raises(pq.QuantizationConfigError, match='format'):
    config_map.from_hf(bad)


# ---- a tiny K2.5 checkpoint ----

def _model():
  cfg = transformers.DeepseekV3Config(
      vocab_size=96, hidden_size=64, intermediate_size=48, moe_intermediate_size=32,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
      num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
      q_lora_rank=12, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12,
      routed_scaling_factor=2.827, eos_token_id=None, bos_token_id=None, rms_norm_eps=1e-6)
  model = transformers.DeepseekV3ForCausalLM(cfg)
  g = torch.Generator().manual_seed(3)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g) if p.ndim == 1
              else torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    for name, b in model.named_buffers():
      if name.endswith('e_score_correction_bias'):
        b.copy_(0.05 * torch.randn(b.shape, generator=g))
  return model.eval()


def _container(text_json: dict) -> dict:
  text_json = {**text_json, 'model_type': 'kimi_k2', 'quantization_config': QUANT_JSON}
  return {'architectures': ['KimiK25ForConditionalGeneration'], 'model_type': 'kimi_k25',
          'media_placeholder_token_id': 163605, 'pad_token_id': 163839, 'bos_token_id': 163584,
          'eos_token_id': 163585, 'tie_word_embeddings': False, 'use_unified_vision_chunk': True,
          'video_placeholder': '<|kimi_k25_video_placeholder|>', 'text_config': text_json,
          'vision_config': {'patch_size': 14, 'merge_kernel_size': [2, 2], 'mm_projector_type': 'patchmerger'}}


def _write_k25(model, root) -> tuple[str, object]:
  """K2.5 folder (INT4 experts packed by compressed-tensors) and the reference on dequantized weights."""
  model.save_pretrained(root / 'plain')
  tensors = {}
  for f in sorted(os.listdir(root / 'plain')):
    if f.endswith('.safetensors'):
      tensors.update(load_file(root / 'plain' / f))
  stored, ref_state = {}, {}
  for name, w in tensors.items():
    if EXPERT.fullmatch(name):
      parts = _ct_compress(w)
      stored.update({f'language_model.{name[:-len("weight")]}{k}': v for k, v in parts.items()})
      w = _ct_decompress(parts).float()  # The reference runs on exactly these values.
    else:
      stored[f'language_model.{name}'] = w
    ref_state[name] = w
  stored = {k: v.contiguous() for k, v in stored.items()}
  stored['vision_tower.encoder.blocks.0.mlp.fc0.weight'] = torch.randn(8, 4).to(torch.bfloat16)
  stored['mm_projector.proj.0.weight'] = torch.randn(4, 4).to(torch.bfloat16)
  hf = root / 'k25'
  os.makedirs(hf)
  names = sorted(stored)
  shards = [names[:len(names) // 2], names[len(names) // 2:]]
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f'model-{i + 1:05d}-of-00002.safetensors'
    save_file({k: stored[k] for k in shard}, hf / fname, metadata={'format': 'pt'})
    weight_map.update(dict.fromkeys(shard, fname))
  (hf / 'model.safetensors.index.json').write_text(json.dumps({'metadata': {}, 'weight_map': weight_map}))
  text_json = json.loads((root / 'plain' / 'config.json').read_text())
  (hf / 'config.json').write_text(json.dumps(_container(text_json)))
  os.makedirs(root / 'ref')  # transformers 5 fuses experts in memory: reload from per-expert files.
  save_file({k: v.contiguous() for k, v in ref_state.items()}, root / 'ref' / 'model.safetensors',
            metadata={'format': 'pt'})
  (root / 'ref' / 'config.json').write_text(json.dumps(text_json))
  ref = type(model).from_pretrained(root / 'ref', attn_implementation='eager').eval()
  return str(hf), ref


@pytest.fixture(scope='module')
def k25(tmp_path_factory):
  root = tmp_path_factory.mktemp('k25')
  hf, ref = _write_k25(_model(), root)
  ckpt, cfg_json = root / 'ckpt', root / 'cfg.json'
  out = subprocess.run([sys.executable, '-m', 'launch.convert', f'--from_hf={hf}', f'--to={ckpt}',
                        f'--config_out={cfg_json}'], cwd=ROOT, capture_output=True, text=True, check=True)
  params, cfg = convert.load_params(str(ckpt))
  return root, hf, ref, dataclasses.replace(cfg, moe_impl='dense'), params, out.stdout


def _our_logits(params, cfg, tokens):
  logits, _, _ = jax.jit(functools.partial(transformer.forward, cfg=cfg))(params, jnp.asarray(tokens))
  return np.asarray(logits)


def test_kimi_k25_cli_import_reports_skipped_and_keeps_metadata(k25):
  root, hf, _, cfg, _, stdout = k25
  assert 'vision tower not converted' in stdout and 'vision_tower.encoder.blocks.0.mlp.fc0.weight' in stdout
  assert 'mm_projector.proj.0.weight' in stdout
  assert config_map.load_model_config(str(root / 'cfg.json')) == convert.read_model_config(str(root / 'ckpt'))
  assert cfg.param_dtype == 'float32' and cfg.routed_scaling_factor == 2.827 and cfg.num_experts == 8
  source, skipped = convert.read_hf_source(str(root / 'ckpt'))
  assert source['vision_config']['patch_size'] == 14 and source['media_placeholder_token_id'] == 163605
  assert sorted(skipped) == ['mm_projector.proj.0.weight', 'vision_tower.encoder.blocks.0.mlp.fc0.weight']


def test_kimi_k25_logits_match_deepseek_v3_on_dequantized_weights(k25):
  _, _, ref, cfg, params, _ = k25
  tokens = np.random.RandomState(0).randint(0, cfg.vocab_size, (3, 12))
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(tokens)).logits.numpy()
  assert np.abs(want).max() > 1.0
  diff = float(np.abs(_our_logits(params, cfg, tokens) - want).max())
  print(f'kimi_k25 import max |logits diff| = {diff:.2e}')
  assert diff <= TOL


def test_kimi_k25_greedy_32_tokens_match(k25):
  _, _, ref, cfg, params, _ = k25
  tokens = np.random.RandomState(1).randint(0, cfg.vocab_size, (2, 6))
  mask = np.ones_like(tokens, bool)
  with torch.no_grad():
    want = ref.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                        max_new_tokens=32, do_sample=False, pad_token_id=0)[:, 6:].numpy()
  ours, _ = jax.jit(functools.partial(decode.greedy_generate, cfg=cfg, num_steps=32))(
      params, jnp.asarray(tokens), jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(ours), want)
  assert len(np.unique(want)) > 3


def test_kimi_k25_export_reimport_round_trip(k25):
  root, hf, _, cfg, params, _ = k25
  out = root / 'export'
  subprocess.run([sys.executable, '-m', 'launch.convert', f'--from_ckpt={root / "ckpt"}', f'--to_hf={out}',
                  f'--copy_from={hf}'], cwd=ROOT, capture_output=True, text=True, check=True)
  assert json.loads((out / 'config.json').read_text()) == json.loads(open(os.path.join(hf, 'config.json')).read())
  exported = {}
  for f in os.listdir(out):
    if f.endswith('.safetensors'):
      exported.update(load_file(out / f))
  original = {}
  for f in os.listdir(hf):
    if f.endswith('.safetensors'):
      original.update(load_file(os.path.join(hf, f)))
  assert sorted(exported) == sorted(original)  # Same names, parts, vision tower included.
  for name, x in original.items():
    assert exported[name].dtype == x.dtype and exported[name].shape == x.shape, name
  torch.testing.assert_close(exported['vision_tower.encoder.blocks.0.mlp.fc0.weight'],
                             original['vision_tower.encoder.blocks.0.mlp.fc0.weight'], rtol=0, atol=0)
  name = 'language_model.model.layers.1.mlp.experts.5.down_proj.'
  parts = {k: exported[name + k] for k in (pq.PACKED, pq.SCALE, pq.SHAPE)}
  w = params['moe_layers']['moe']['wo'][0, 5].T  # What was imported, (out, in).
  # Re-quantization is compressed-tensors' own (scales from the imported weights).
  torch.testing.assert_close(parts[pq.PACKED], _ct_compress(torch.tensor(np.asarray(w)), torch.float32)[pq.PACKED])
  back = _ct_decompress(parts).float().numpy()
  scale = np.repeat(parts[pq.SCALE].float().numpy(), GROUP, axis=1)
  # Within the quantization error: half a step, plus the bfloat16 roundings (relative 2**-8) of the
  # scale (times 7.5 steps at a group's clipped maximum) and of the product q * scale (up to 8 steps).
  err = np.abs(back - np.asarray(w))
  print(f'kimi_k25 export re-quantization max |error| / scale = {(err / scale).max():.4f}')
  assert np.all(err <= scale * (0.5 + 15.5 * 2**-8)) and err.max() > 0
  again = convert.hf_to_orbax(str(out), str(root / 'ckpt2'))
  params2, _ = convert.load_params(str(root / 'ckpt2'))
  assert again == convert.read_model_config(str(root / 'ckpt'))
  np.testing.assert_array_equal(params2['moe_layers']['moe']['wo'][0, 5].T, back)
  np.testing.assert_array_equal(params2['moe_layers']['attn']['o'], params['moe_layers']['attn']['o'])


def test_kimi_k25_quantized_where_ignore_says(k25, tmp_path):
  root, hf, *_ = k25
  bad = tmp_path / 'bad'
  os.makedirs(bad)
  for f in os.listdir(hf):
    os.symlink(os.path.join(hf, f), bad / f)
  os.remove(bad / 'config.json')
  config_json = json.loads(open(os.path.join(hf, 'config.json')).read())
  config_json['text_config']['quantization_config']['ignore'] = IGNORE + ['re:.*experts\\.5\\.down_proj']
  (bad / 'config.json').write_text(json.dumps(config_json))
  with pytest.raises(ValueError, match=r'experts\.5\.down_proj.*pack-quantized.*ignore'):
    convert.hf_to_orbax(str(bad), str(tmp_path / 'ckpt'))


def synthetic_k25(path, shard_bytes: int, num_layers: int) -> dict:
  """A bigger K2.5-format folder (random INT4 experts, bfloat16 rest) for the memory bound."""
  cfg = ModelConfig(vocab_size=8192, d_model=512, num_layers=num_layers, num_heads=4, attention='mla', q_lora_rank=64,
                    kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, d_ff=1024,
                    first_k_dense=1, num_experts=32, num_experts_per_tok=4, d_expert=256, num_shared_experts=1,
                    router='sigmoid', param_dtype='bfloat16', dtype='bfloat16')
  bf16 = np.dtype(ml_dtypes.bfloat16)
  rules = weights.rules(cfg)
  layout = kimi_k25.Layout.for_export(kimi_k25.PREFIX, SCHEME, rules)
  shapes = {n: r[0].hf_shape for n, r in weights.by_hf_name(rules).items()}
  plan = layout.export_plan([(n, shape, bf16) for n, shape in shapes.items()])
  rng = np.random.default_rng(0)

  def tensor(name):
    shape, dtype, part = next((p[1], p[2], p[4]) for p in plan if p[0] == name)
    if part == pq.SHAPE:
      return [np.asarray(shapes[name[len(kimi_k25.PREFIX):-len(pq.SHAPE)] + 'weight'], np.int64)]
    if part == pq.PACKED:
      return [rng.integers(-2**31, 2**31, shape, dtype=np.int64).astype(np.int32)]
    return [(rng.random(shape, np.float32) * 0.02).astype(dtype)]

  os.makedirs(path)
  weight_map = safetensors_io.write_folder(str(path), safetensors_io.plan_shards([p[:3] for p in plan], shard_bytes),
                                           tensor)
  text_json = {**config_map.to_hf(cfg, 'bfloat16'), 'quantization_config': QUANT_JSON}
  (path / 'config.json').write_text(json.dumps(_container(text_json)))
  sizes = [os.path.getsize(path / n) for n in set(weight_map.values())]
  return {'folder_bytes': sum(sizes), 'largest_shard_bytes': max(sizes), 'shards': len(sizes)}


def test_kimi_k25_streaming_memory_under_twice_the_largest_shard(tmp_path):
  info = synthetic_k25(tmp_path / 'k25', 12 << 20, num_layers=8)
  assert info['shards'] >= 4
  for direction, src, dst in (('import', 'k25', 'ckpt'), ('export', 'ckpt', 'out')):
    m = convert_memory.measure(direction, str(tmp_path / src), str(tmp_path / dst), 12 << 20)
    ratio = m['above_baseline_bytes'] / info['largest_shard_bytes']
    print(f'kimi_k25 {direction}: {m["above_baseline_bytes"] / 2**20:.1f} MiB above baseline = {ratio:.2f}x '
          f'the largest shard ({info["largest_shard_bytes"] / 2**20:.1f} MiB; folder '
          f'{info["folder_bytes"] / 2**20:.1f} MiB in {info["shards"]} shards; {m["seconds"]:.1f}s)')
    assert ratio < 2, (direction, m, info)
  assert sorted(safetensors_io.Folder(str(tmp_path / 'out')).weight_map) == sorted(
      safetensors_io.Folder(str(tmp_path / 'k25')).weight_map)
