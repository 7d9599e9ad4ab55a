"""Conversion edge cases: bad folders, atomic output, fp8 blocks, tied embeddings, OCDBT export, CLI."""

import json
import os
import subprocess
import sys

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch
import transformers
from etils import epath
from safetensors.torch import load_file, save_file

from research.hf import config_map
from research.hf import convert
from research.hf import safetensors_io
from research.hf import weights

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _qwen(path, **kw):
  torch.manual_seed(0)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4,
      num_experts_per_tok=2, **kw)
  model = transformers.Qwen3MoeForCausalLM(cfg).eval()
  model.save_pretrained(path, max_shard_size='8KB')
  return model


def _no_output(dest):
  parent = os.path.dirname(dest)
  left = [n for n in os.listdir(parent) if n.startswith(os.path.basename(dest))]
  assert not left, left


@pytest.fixture
def hf_dir(tmp_path):
  _qwen(tmp_path / 'hf')
  return tmp_path / 'hf'


def test_missing_shard(hf_dir, tmp_path):
  index = json.loads((hf_dir / safetensors_io.INDEX_FILE).read_text())
  shard = index['weight_map']['model.layers.1.self_attn.q_proj.weight']
  os.remove(hf_dir / shard)
  with pytest.raises(safetensors_io.SafetensorsError, match=f'missing shard.*{shard}'):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  _no_output(str(tmp_path / 'ckpt'))


def test_wrong_shape_named(hf_dir, tmp_path):
  index = json.loads((hf_dir / safetensors_io.INDEX_FILE).read_text())
  name = 'model.layers.0.mlp.experts.2.up_proj.weight'
  path = str(hf_dir / index['weight_map'][name])
  tensors = load_file(path)
  tensors[name] = torch.zeros(9, 16)
  save_file(tensors, path, metadata={'format': 'pt'})
  with pytest.raises(ValueError, match=rf"tensor '{name}' has shape \(9, 16\) but config.json implies \(8, 16\)"):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  _no_output(str(tmp_path / 'ckpt'))


def test_unused_tensor_named(hf_dir, tmp_path):
  save_file({'model.layers.0.self_attn.q_proj.bias': torch.zeros(16)}, str(hf_dir / 'extra.safetensors'))
  index = json.loads((hf_dir / safetensors_io.INDEX_FILE).read_text())
  index['weight_map']['model.layers.0.self_attn.q_proj.bias'] = 'extra.safetensors'
  (hf_dir / safetensors_io.INDEX_FILE).write_text(json.dumps(index))
  with pytest.raises(ValueError, match="'model.layers.0.self_attn.q_proj.bias' is in the checkpoint"):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))


def test_bad_config_named(hf_dir, tmp_path):
  cfg = json.loads((hf_dir / 'config.json').read_text())
  cfg['rope_parameters'] = {'rope_type': 'longrope', 'rope_theta': 1e4}
  (hf_dir / 'config.json').write_text(json.dumps(cfg))
  with pytest.raises(config_map.UnsupportedConfigError, match='rope_parameters.rope_type'):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  _no_output(str(tmp_path / 'ckpt'))


def test_interrupted_conversion_leaves_nothing(hf_dir, tmp_path, monkeypatch):
  calls = []
  real = weights.Rule.to_ours

  def failing(self, x):
    calls.append(1)
    if len(calls) == 20:
      raise KeyboardInterrupt('simulated crash mid-conversion')
    return real(self, x)
  monkeypatch.setattr(weights.Rule, 'to_ours', failing)
  with pytest.raises(KeyboardInterrupt):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  _no_output(str(tmp_path / 'ckpt'))
  monkeypatch.setattr(weights.Rule, 'to_ours', real)
  convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  with pytest.raises(FileExistsError, match='overwrite'):
    convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'), overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ['ckpt', 'hf']


def test_tied_embeddings(tmp_path):
  model = _qwen(tmp_path / 'hf', tie_word_embeddings=True)
  assert 'lm_head.weight' not in safetensors_io.Folder(str(tmp_path / 'hf')).weight_map
  convert.hf_to_orbax(str(tmp_path / 'hf'), str(tmp_path / 'ckpt'))
  params, _ = convert.load_params(str(tmp_path / 'ckpt'))
  np.testing.assert_array_equal(params['lm_head']['kernel'], params['embed']['embedding'].T)
  convert.orbax_to_hf(str(tmp_path / 'ckpt'), str(tmp_path / 'out'))  # Written untied.
  again = transformers.Qwen3MoeForCausalLM.from_pretrained(str(tmp_path / 'out')).eval()
  x = torch.randint(0, 64, (2, 9))
  with torch.no_grad():
    torch.testing.assert_close(again(x).logits, model(x).logits, rtol=0, atol=1e-5)


def _quantize(w, block):
  """Block-fp8 like DeepSeek-V3's release: w ~= fp8 * scale_inv per tile."""
  out, inp = w.shape
  pad = torch.zeros(-(-out // block[0]) * block[0], -(-inp // block[1]) * block[1])
  pad[:out, :inp] = w
  tiles = pad.reshape(pad.shape[0] // block[0], block[0], -1, block[1]).abs().amax((1, 3))
  scale = (tiles / 448).clamp(min=1e-12)
  full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:out, :inp]
  q = (w / full).to(torch.float8_e4m3fn)
  return q, scale, q.float() * full


def test_fp8_blocks_are_dequantized(tmp_path):
  torch.manual_seed(0)
  cfg = transformers.DeepseekV3Config(
      vocab_size=64, hidden_size=16, intermediate_size=24, moe_intermediate_size=8, num_hidden_layers=2,
      num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
      topk_group=1, first_k_dense_replace=1, q_lora_rank=12, kv_lora_rank=8, qk_rope_head_dim=4,
      qk_nope_head_dim=4, v_head_dim=4)
  transformers.DeepseekV3ForCausalLM(cfg).save_pretrained(tmp_path / 'src')
  sd = load_file(str(tmp_path / 'src' / 'model.safetensors'))
  quant, deq = {}, {}
  for name, w in sd.items():
    if w.ndim == 2 and '_proj' in name:  # Linear layers; not the embedding, router or lm_head.
      q, scale, back = _quantize(w, (8, 8))
      quant[name], quant[name + '_scale_inv'], deq[name] = q, scale, back.bfloat16()
    else:
      quant[name], deq[name] = w, w.bfloat16()
  hf = json.loads((tmp_path / 'src' / 'config.json').read_text())
  for folder, tensors, extra in (('fp8', quant, {'quantization_config': {
      'quant_method': 'fp8', 'fmt': 'e4m3', 'weight_block_size': [8, 8], 'activation_scheme': 'dynamic'}}),
                                 ('bf16', deq, {'dtype': 'bfloat16'})):
    os.makedirs(tmp_path / folder)
    save_file(tensors, str(tmp_path / folder / 'model.safetensors'), metadata={'format': 'pt'})
    (tmp_path / folder / 'config.json').write_text(json.dumps({**hf, **extra}))
    convert.hf_to_orbax(str(tmp_path / folder), str(tmp_path / f'ckpt_{folder}'))
  got, cfg_fp8 = convert.load_params(str(tmp_path / 'ckpt_fp8'))
  want, _ = convert.load_params(str(tmp_path / 'ckpt_bf16'))
  assert cfg_fp8.param_dtype == 'bfloat16'
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
  assert got['moe_layers']['attn']['q_b'].dtype == ml_dtypes.bfloat16


def test_export_from_ocdbt_train_state(hf_dir, tmp_path):
  """A checkpoint orbax writes by default (OCDBT), params under a subtree, exports too."""
  cfg = convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  params, _ = convert.load_params(str(tmp_path / 'ckpt'))
  ckptr = ocp.StandardCheckpointer()
  ckptr.save(str(tmp_path / 'state'), {'params': params, 'step': np.int32(7)})
  ckptr.wait_until_finished()
  assert ocp.type_handlers.is_ocdbt_checkpoint(epath.Path(str(tmp_path / 'state')))
  convert.orbax_to_hf(str(tmp_path / 'state'), str(tmp_path / 'out'), cfg=cfg, subtree=('params',))
  a, b = safetensors_io.Folder(str(hf_dir)), safetensors_io.Folder(str(tmp_path / 'out'))
  assert sorted(a.weight_map) == sorted(b.weight_map)
  for name in a.weight_map:
    np.testing.assert_array_equal(a.read(name), b.read(name), err_msg=name)


@pytest.mark.parametrize('layout', weights.LAYOUTS)
def test_params_in_memory_export_as_the_checkpoint_does(hf_dir, tmp_path, layout):
  """params_to_hf (what a serving engine is pushed) writes the tensors and config.json that
  orbax_to_hf writes from the same params, and transformers' folder is read back unchanged."""
  cfg = convert.hf_to_orbax(str(hf_dir), str(tmp_path / 'ckpt'))
  params, _ = convert.load_params(str(tmp_path / 'ckpt'))
  convert.orbax_to_hf(str(tmp_path / 'ckpt'), str(tmp_path / 'disk'), expert_layout=layout)
  convert.params_to_hf(params, str(tmp_path / 'mem'), cfg=cfg, expert_layout=layout, max_shard_bytes=4096)
  a, b = safetensors_io.Folder(str(tmp_path / 'disk')), safetensors_io.Folder(str(tmp_path / 'mem'))
  assert sorted(a.weight_map) == sorted(b.weight_map) and len(set(b.weight_map.values())) > 1
  for name in a.weight_map:
    np.testing.assert_array_equal(a.read(name), b.read(name), err_msg=name)
  assert json.loads((tmp_path / 'mem' / 'config.json').read_text()) == json.loads(
      (tmp_path / 'disk' / 'config.json').read_text())
  if layout == weights.PER_EXPERT:
    source = safetensors_io.Folder(str(hf_dir))
    for name in source.weight_map:
      np.testing.assert_array_equal(source.read(name), b.read(name), err_msg=name)


def test_cli_import_export(hf_dir, tmp_path):
  run = lambda *args: subprocess.run([sys.executable, '-m', 'launch.convert', *args], cwd=ROOT,
                                     capture_output=True, text=True, timeout=300)
  res = run(f'--from_hf={hf_dir}', f'--to={tmp_path / "ckpt"}', f'--config_out={tmp_path / "m.json"}')
  assert res.returncode == 0, res.stderr[-2000:]
  cfg = config_map.load_model_config(str(tmp_path / 'm.json'))
  assert cfg == convert.read_model_config(str(tmp_path / 'ckpt'))
  res = run(f'--from_ckpt={tmp_path / "ckpt"}', f'--to_hf={tmp_path / "out"}', '--expert_layout=fused',
            f'--copy_from={hf_dir}')
  assert res.returncode == 0, res.stderr[-2000:]
  assert (tmp_path / 'out' / 'generation_config.json').exists()
  assert 'model.layers.1.mlp.experts.gate_up_proj' in safetensors_io.Folder(str(tmp_path / 'out')).weight_map
  res = run(f'--from_hf={tmp_path / "nope"}', f'--to={tmp_path / "x"}')
  assert res.returncode != 0 and 'config.json not found' in res.stderr
