"""Logits parity with transformers for tiny random Qwen3-MoE and DeepSeek-V3 models, both ways.

Each model: save with transformers (several shards), import, compare float32 logits on a padded
batch, greedy-generate 32 tokens in both, export (both expert layouts), reload in transformers.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from research.hf import convert
from research.hf import safetensors_io
from research.hf import weights
from research.model import decode
from research.model import transformer
from research.parallel import mesh as mesh_lib

TOL = 1e-4
B, T, GEN = 4, 12, 32


def _randomize(model, seed):
  """Every weight O(1)-scaled so that a mapping error shows up far above TOL; norms near 1."""
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
      else:
        p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    for name, b in model.named_buffers():
      if name.endswith('e_score_correction_bias'):  # Small: biased scores stay in sigmoid's range.
        b.copy_(0.05 * torch.randn(b.shape, generator=g))
  return model.eval()


def _qwen(**kw):
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=8,
      num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0], eos_token_id=None, **kw)
  return _randomize(transformers.Qwen3MoeForCausalLM(cfg), 0)


def _deepseek(q_lora_rank, **kw):
  cfg = transformers.DeepseekV3Config(
      vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=16,
      num_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1, n_shared_experts=1,
      q_lora_rank=q_lora_rank, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
      v_head_dim=12, routed_scaling_factor=2.5, eos_token_id=None, bos_token_id=None, **kw)
  return _randomize(transformers.DeepseekV3ForCausalLM(cfg), 1)


MODELS = {
    'qwen3_moe': _qwen,
    'deepseek_v3_q_lora': functools.partial(_deepseek, 12),
    'deepseek_v3_no_q_lora': functools.partial(_deepseek, None),
    'deepseek_v3_yarn': functools.partial(_deepseek, 12, max_position_embeddings=256, rope_parameters={
        'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 8.0, 'original_max_position_embeddings': 32,
        'beta_fast': 32, 'beta_slow': 1, 'mscale': 0.8, 'mscale_all_dim': 0.7}),
    'qwen3_moe_yarn': functools.partial(_qwen, max_position_embeddings=256, rope_parameters={
        'rope_type': 'yarn', 'rope_theta': 10000.0, 'factor': 4.0, 'original_max_position_embeddings': 64}),
}

# Generation and the fused layout: checked once per family (the module's fixture is shared).
ONE_PER_FAMILY = pytest.mark.parametrize('case', ['qwen3_moe', 'deepseek_v3_q_lora'], indirect=True)


def _batch(vocab, seed=0):
  """Random tokens; rows 1 and 3 right-padded, row 2 left-padded."""
  rng = np.random.RandomState(seed)
  tokens = rng.randint(0, vocab, (B, T))
  mask = np.ones((B, T), bool)
  mask[1, 7:] = False
  mask[2, :5] = False
  mask[3, 10:] = False
  return tokens, mask


def _hf_logits(model, tokens, mask):
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                position_ids=torch.tensor(pos))
  return out.logits.numpy()


def _our_logits(params, cfg, tokens, mask):
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  logits, _, _ = jax.jit(functools.partial(transformer.forward, cfg=cfg))(
      params, jnp.asarray(tokens), positions_BxT=jnp.asarray(pos),
      segment_ids_BxT=jnp.asarray(mask.astype(np.int32)))
  return np.asarray(logits)


def _max_diff(a, b, mask):
  return float(np.abs(a - b)[mask].max())


@pytest.fixture(scope='module', params=sorted(MODELS))
def case(request, tmp_path_factory):
  model = MODELS[request.param]()
  root = tmp_path_factory.mktemp(request.param)
  model.save_pretrained(root / 'hf', max_shard_size='40KB')  # Per-expert layout, several shards.
  cfg = convert.hf_to_orbax(str(root / 'hf'), str(root / 'ckpt'))
  params, cfg2 = convert.load_params(str(root / 'ckpt'))
  assert cfg2 == cfg
  # The all-experts path compiles fastest; the grouped paths match it (tests/model).
  return request.param, model, root, dataclasses.replace(cfg, moe_impl='dense'), params


def test_import_logits_match(case):
  name, model, _, cfg, params = case
  tokens, mask = _batch(cfg.vocab_size)
  ref = _hf_logits(model, tokens, mask)
  assert np.abs(ref[mask]).max() > 1.0  # The comparison is not trivially small.
  diff = _max_diff(_our_logits(params, cfg, tokens, mask), ref, mask)
  print(f'{name}: import max |logits diff| = {diff:.2e}')
  assert diff <= TOL


@ONE_PER_FAMILY
def test_greedy_generation_matches(case):
  name, model, _, cfg, params = case
  tokens, mask = _batch(cfg.vocab_size, seed=1)
  mask[:, 5:] = True  # generate() continues after the last prompt token: left padding only.
  mask[3, :3] = False
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                         max_new_tokens=GEN, do_sample=False, pad_token_id=0)
  ref = out[:, T:].numpy()
  ours, _ = jax.jit(functools.partial(decode.greedy_generate, cfg=cfg, num_steps=GEN))(
      params, jnp.asarray(tokens), jnp.asarray(mask))
  np.testing.assert_array_equal(np.asarray(ours), ref)
  assert len(np.unique(ref)) > 3  # Not a degenerate repetition of one token.


@pytest.mark.parametrize('layout', weights.LAYOUTS)
def test_export_reload_matches(case, layout):
  name, model, root, cfg, _ = case
  out = root / f'export_{layout}'
  convert.orbax_to_hf(str(root / 'ckpt'), str(out), expert_layout=layout, max_shard_bytes=30_000)
  assert (out / 'model.safetensors.index.json').exists()
  reloaded = type(model).from_pretrained(str(out), attn_implementation='eager').eval()
  for (k, a), (k2, b) in zip(sorted(model.state_dict().items()), sorted(reloaded.state_dict().items())):
    assert k == k2
    torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
  tokens, mask = _batch(cfg.vocab_size, seed=2)
  diff = _max_diff(_hf_logits(reloaded, tokens, mask), _hf_logits(model, tokens, mask), mask)
  assert diff <= TOL


def _fused_folder(model, root):
  path = root / 'hf_fused'
  if not path.exists():
    model.save_pretrained(path, max_shard_size='40KB', save_original_format=False)
  assert any(k.endswith('experts.gate_up_proj') for k in safetensors_io.Folder(str(path)).weight_map)
  return str(path)


@ONE_PER_FAMILY
def test_fused_layout_import(case):
  """transformers 5's fused gate_up_proj / down_proj checkpoints import to the same params."""
  name, model, root, cfg, params = case
  convert.hf_to_orbax(_fused_folder(model, root), str(root / 'ckpt_fused'))
  fused, _ = convert.load_params(str(root / 'ckpt_fused'))
  jax.tree.map(np.testing.assert_array_equal, fused, params)


@pytest.mark.parametrize('case', ['deepseek_v3_q_lora'], indirect=True)  # One model is enough.
def test_load_onto_mesh(case):
  """Both mesh paths (orbax checkpoint, straight from the HF folder) give training's shardings."""
  name, model, root, cfg, params = case
  mesh = mesh_lib.make_mesh('fsdp:2,expert:4')
  want = convert.param_targets(cfg, mesh)
  from_ckpt, _ = convert.load_params(str(root / 'ckpt'), mesh=mesh)
  from_hf, _ = convert.hf_to_mesh(str(root / 'hf'), mesh)
  fused_hf, _ = convert.hf_to_mesh(_fused_folder(model, root), mesh)
  for tree in (from_ckpt, from_hf, fused_hf):
    jax.tree.map(lambda x, s: (x.sharding.is_equivalent_to(s.sharding, x.ndim) or
                               pytest.fail(f'{x.sharding} != {s.sharding}')), tree, want)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), tree, params)
  assert from_ckpt['moe_layers']['moe']['wi_gate'].sharding.spec[1] == 'expert'
  tokens, mask = _batch(cfg.vocab_size)
  with jax.set_mesh(mesh):
    sharded = _our_logits(from_hf, cfg, tokens, mask)
  assert _max_diff(sharded, _hf_logits(model, tokens, mask), mask) <= TOL
