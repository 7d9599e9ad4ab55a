"""config.json <-> ModelConfig: published model shapes, round trips, and rejected configs."""

import copy
import dataclasses

import pytest

from experiments import kimi_k2
from research.hf import config_map
from research.hf.config_map import UnsupportedConfigError
from research.model import stats

# Shaped as published for moonshotai/Kimi-K2-Instruct and Qwen/Qwen3-30B-A3B (transcribed).
KIMI_K2 = {
    'architectures': ['DeepseekV3ForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'auto_map': {'AutoConfig': 'configuration_deepseek.DeepseekV3Config'}, 'aux_loss_alpha': 0.001,
    'bos_token_id': 163584, 'eos_token_id': 163585, 'first_k_dense_replace': 1, 'hidden_act': 'silu',
    'hidden_size': 7168, 'initializer_range': 0.02, 'intermediate_size': 18432, 'kv_lora_rank': 512,
    'max_position_embeddings': 131072, 'model_type': 'kimi_k2', 'moe_intermediate_size': 2048,
    'moe_layer_freq': 1, 'n_group': 1, 'n_routed_experts': 384, 'n_shared_experts': 1,
    'norm_topk_prob': True, 'num_attention_heads': 64, 'num_experts_per_tok': 8,
    'num_hidden_layers': 61, 'num_key_value_heads': 64, 'num_nextn_predict_layers': 0,
    'pretraining_tp': 1, 'q_lora_rank': 1536, 'qk_nope_head_dim': 128, 'qk_rope_head_dim': 64,
    'quantization_config': {'activation_scheme': 'dynamic', 'fmt': 'e4m3', 'quant_method': 'fp8',
                            'weight_block_size': [128, 128]},
    'rms_norm_eps': 1e-06, 'rope_scaling': {
        'beta_fast': 1.0, 'beta_slow': 1.0, 'factor': 32.0, 'mscale': 1.0, 'mscale_all_dim': 1.0,
        'original_max_position_embeddings': 4096, 'type': 'yarn'},
    'rope_theta': 50000.0, 'routed_scaling_factor': 2.827, 'scoring_func': 'sigmoid', 'seq_aux': True,
    'tie_word_embeddings': False, 'topk_group': 1, 'topk_method': 'noaux_tc', 'torch_dtype': 'bfloat16',
    'transformers_version': '4.48.3', 'use_cache': True, 'v_head_dim': 128, 'vocab_size': 163840,
}
QWEN3_30B_A3B = {
    'architectures': ['Qwen3MoeForCausalLM'], 'attention_bias': False, 'attention_dropout': 0.0,
    'bos_token_id': 151643, 'decoder_sparse_step': 1, 'eos_token_id': 151645, 'head_dim': 128,
    'hidden_act': 'silu', 'hidden_size': 2048, 'initializer_range': 0.02, 'intermediate_size': 6144,
    'max_position_embeddings': 40960, 'max_window_layers': 48, 'mlp_only_layers': [],
    'model_type': 'qwen3_moe', 'moe_intermediate_size': 768, 'norm_topk_prob': True,
    'num_attention_heads': 32, 'num_experts': 128, 'num_experts_per_tok': 8, 'num_hidden_layers': 48,
    'num_key_value_heads': 4, 'output_router_logits': False, 'rms_norm_eps': 1e-06, 'rope_scaling': None,
    'rope_theta': 1000000.0, 'router_aux_loss_coef': 0.001, 'sliding_window': None,
    'tie_word_embeddings': False, 'torch_dtype': 'bfloat16', 'transformers_version': '4.51.0',
    'use_cache': True, 'use_sliding_window': False, 'vocab_size': 151936,
}


def test_kimi_k2_maps_to_our_kimi_config():
  cfg = config_map.from_hf(KIMI_K2)
  ours = kimi_k2.get_config().model
  for field in ('vocab_size', 'd_model', 'num_layers', 'num_heads', 'attention', 'q_lora_rank',
                'kv_lora_rank', 'qk_nope_head_dim', 'qk_rope_head_dim', 'v_head_dim', 'rope_theta',
                'rope_interleaved', 'd_ff', 'first_k_dense', 'num_experts', 'num_experts_per_tok',
                'd_expert', 'num_shared_experts', 'router', 'norm_topk_prob', 'n_group', 'topk_group',
                'routed_scaling_factor'):
    assert getattr(cfg, field) == ours[field], field
  # YaRN: factor 32, mscale == mscale_all_dim -> cos/sin unscaled, softmax scale * mscale(32)**2.
  assert cfg.rope_yarn_factor == 32.0 and cfg.rope_yarn_attention_factor == 1.0
  assert cfg.attn_scale_mult == pytest.approx((0.1 * 3.4657359 + 1) ** 2)
  assert cfg.param_dtype == 'bfloat16'  # fp8 blocks are dequantized to bfloat16.


def test_qwen3_30b_a3b_parameter_counts():
  cfg = config_map.from_hf(QWEN3_30B_A3B)
  counts = stats.param_counts(cfg)
  assert counts['total_params'] == pytest.approx(30.5e9, rel=0.01)   # "30.5B total"
  assert counts['active_params'] == pytest.approx(3.3e9, rel=0.02)   # "3.3B activated"


@pytest.mark.parametrize('hf', [KIMI_K2, QWEN3_30B_A3B], ids=['kimi_k2', 'qwen3'])
def test_round_trip(hf):
  cfg = config_map.from_hf(hf)
  again = config_map.from_hf(config_map.to_hf(cfg))
  assert dataclasses.replace(again, param_dtype=cfg.param_dtype, dtype=cfg.dtype) == cfg


def _bad(base, path, value):
  hf = copy.deepcopy(base)
  node = hf
  for k in path[:-1]:
    node = node[k]
  node[path[-1]] = value
  return hf


@pytest.mark.parametrize('base, path, value, field', [
    (QWEN3_30B_A3B, ('model_type',), 'llama', 'model_type'),
    (QWEN3_30B_A3B, ('rope_scaling',), {'type': 'linear', 'factor': 2.0}, 'rope_scaling.rope_type'),
    (QWEN3_30B_A3B, ('rope_scaling',), {'rope_type': 'dynamic', 'factor': 2.0}, 'rope_scaling.rope_type'),
    (KIMI_K2, ('rope_scaling', 'truncate'), False, 'rope_scaling.truncate'),
    (QWEN3_30B_A3B, ('use_sliding_window',), True, 'use_sliding_window'),
    (QWEN3_30B_A3B, ('mlp_only_layers',), [3], 'mlp_only_layers'),
    (QWEN3_30B_A3B, ('attention_bias',), True, 'attention_bias'),
    (QWEN3_30B_A3B, ('hidden_act',), 'gelu', 'hidden_act'),
    (QWEN3_30B_A3B, ('qk_layernorm_scale',), 2.0, 'qk_layernorm_scale'),  # Unknown field.
    (KIMI_K2, ('topk_method',), 'group_limited_greedy', 'topk_method'),
    (KIMI_K2, ('scoring_func',), 'softmax', 'scoring_func'),
    (KIMI_K2, ('quantization_config', 'quant_method'), 'awq', 'quantization_config.quant_method'),
    (KIMI_K2, ('rms_norm_eps',), 1e-5, 'rms_norm_eps'),
    (KIMI_K2, ('num_key_value_heads',), 8, 'num_key_value_heads'),
])
def test_rejects_with_field_named(base, path, value, field):
  with pytest.raises(UnsupportedConfigError, match=f'config.json {field}='):
    config_map.from_hf(_bad(base, path, value))


def test_unknown_field_can_be_ignored_explicitly():
  hf = _bad(QWEN3_30B_A3B, ('my_note',), 'harmless')
  with pytest.raises(UnsupportedConfigError, match='my_note'):
    config_map.from_hf(hf)
  assert config_map.from_hf(hf, ignore_fields=['my_note']) == config_map.from_hf(QWEN3_30B_A3B)


def test_transformers5_spelling():
  """rope_parameters and num_local_experts, as transformers 5 writes them."""
  hf = dict(QWEN3_30B_A3B, rope_parameters={'rope_type': 'default', 'rope_theta': 1e6},
            num_local_experts=128)
  del hf['rope_theta'], hf['rope_scaling'], hf['num_experts']
  assert config_map.from_hf(hf) == config_map.from_hf(QWEN3_30B_A3B)
