"""Hugging Face config.json <-> ModelConfig, for Qwen3-MoE and DeepSeek-V3 (Kimi K2) checkpoints.

Every config.json field is either mapped, checked against the one value our model implements, or
known not to change the forward math; any other field is an error naming it (pass `ignore_fields`
once you know it is harmless). Both transformers 4 (`rope_theta` + `rope_scaling`) and 5
(`rope_parameters`) spellings are read; transformers 5 spellings are written.
"""

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from research.hf import pack_quantized as pq
from research.model.config import ModelConfig, from_dict

QWEN3_MOE = 'qwen3_moe'
DEEPSEEK_V3 = 'deepseek_v3'
MODEL_TYPES = {QWEN3_MOE: QWEN3_MOE, DEEPSEEK_V3: DEEPSEEK_V3, 'kimi_k2': DEEPSEEK_V3}
ARCHITECTURES = {QWEN3_MOE: 'Qwen3MoeForCausalLM', DEEPSEEK_V3: 'DeepseekV3ForCausalLM'}
ROPE_TYPES = ('default', 'yarn')
# Multimodal containers: the language model's config is `text_config` (with its quantization_config).
CONTAINERS = ('kimi_k25',)

# Fields that do not change the logits: generation ids, training-only knobs, bookkeeping.
HARMLESS = frozenset({
    'architectures', 'auto_map', 'model_type', 'transformers_version', '_name_or_path', 'name_or_path',
    'bos_token_id', 'eos_token_id', 'pad_token_id', 'sep_token_id', 'decoder_start_token_id',
    'dtype', 'torch_dtype', 'use_cache', 'initializer_range', 'output_router_logits',
    'router_aux_loss_coef', 'aux_loss_alpha', 'seq_aux', 'ep_size', 'max_position_embeddings',
    'attention_dropout', 'id2label', 'label2id', 'return_dict', 'output_attentions',
    'output_hidden_states', 'tokenizer_class', 'task_specific_params', 'problem_type',
    'is_encoder_decoder', 'chunk_size_feed_forward', 'use_return_dict', 'pretraining_tp',
    # Multi-token-prediction modules (DeepSeek-V3 layer 61): extra weights, ignored on import.
    'num_nextn_predict_layers', 'num_mtp_layers',
    'tie_word_embeddings',      # Read by the weight mapping (lm_head copied from the embedding).
    'quantization_config',      # Read by the weight mapping (fp8 blocks dequantized).
})


class UnsupportedConfigError(ValueError):
  pass


def _err(field: str, value: Any, msg: str):
  raise UnsupportedConfigError(f'config.json {field}={value!r}: {msg}')


def get_mscale(scale: float, mscale: float = 1.0) -> float:
  """YaRN's attention temperature (transformers `get_mscale` / DeepSeek `yarn_get_mscale`)."""
  return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope(hf: Mapping[str, Any], family: str) -> dict:
  """rope_parameters (tf5) or rope_theta + rope_scaling (tf4) -> ModelConfig rope fields."""
  params = dict(hf.get('rope_parameters') or {})
  field = 'rope_parameters'
  if hf.get('rope_scaling'):
    params = {**params, **hf['rope_scaling']}
    field = 'rope_scaling'
  theta = params.get('rope_theta', hf.get('rope_theta', 10000.0))
  rope_type = params.get('rope_type', params.get('type', 'default'))
  if rope_type not in ROPE_TYPES:
    _err(f'{field}.rope_type', rope_type, f'unsupported RoPE scaling; supported: {ROPE_TYPES}')
  if params.get('partial_rotary_factor', 1.0) != 1.0:
    _err(f'{field}.partial_rotary_factor', params['partial_rotary_factor'], 'only 1.0 is supported')
  out = {'rope_theta': float(theta)}
  if rope_type == 'default':
    return out
  known = {'rope_type', 'type', 'rope_theta', 'factor', 'original_max_position_embeddings',
           'beta_fast', 'beta_slow', 'attention_factor', 'mscale', 'mscale_all_dim', 'truncate',
           'partial_rotary_factor'}
  for k in params:
    if k not in known:
      _err(f'{field}.{k}', params[k], 'unknown YaRN parameter')
  if not params.get('truncate', True):
    _err(f'{field}.truncate', params['truncate'], 'only truncate=True YaRN is implemented')
  orig = params.get('original_max_position_embeddings', hf.get('original_max_position_embeddings'))
  factor = params.get('factor')
  if factor is None:
    if not orig:
      _err(f'{field}.factor', None, 'YaRN needs factor or original_max_position_embeddings')
    factor = hf['max_position_embeddings'] / orig
  orig = orig or hf.get('max_position_embeddings')
  mscale, mscale_all = params.get('mscale'), params.get('mscale_all_dim')
  attn_factor = params.get('attention_factor')
  if attn_factor is None:
    attn_factor = (get_mscale(factor, mscale) / get_mscale(factor, mscale_all) if mscale and mscale_all
                   else get_mscale(factor))
  out.update(rope_yarn_factor=float(factor), rope_yarn_original_len=int(orig),
             rope_yarn_beta_fast=float(params.get('beta_fast') or 32),
             rope_yarn_beta_slow=float(params.get('beta_slow') or 1),
             rope_yarn_attention_factor=float(attn_factor))
  if family == DEEPSEEK_V3 and mscale_all:  # DeepseekV3Attention: scaling *= mscale(factor, all)**2.
    out['attn_scale_mult'] = get_mscale(factor, mscale_all) ** 2
  return out


def text_config(config_json: Mapping[str, Any]) -> Mapping[str, Any]:
  """The language model's config: a container's `text_config`, else config.json itself."""
  if config_json.get('model_type') not in CONTAINERS:
    return config_json
  if not isinstance(config_json.get('text_config'), Mapping):
    _err('text_config', config_json.get('text_config'),
         f'model_type {config_json["model_type"]!r} is a container; its text_config object is needed')
  return config_json['text_config']


def multimodal_fields(config_json: Mapping[str, Any]) -> dict:
  """A container's fields other than text_config (vision_config, media tokens); {} for a plain one."""
  if text_config(config_json) is config_json:
    return {}
  return {k: v for k, v in config_json.items() if k != 'text_config'}


def fp8_block_size(hf: Mapping[str, Any]) -> tuple[int, int] | None:
  """The weight tile of a block-fp8 checkpoint (DeepSeek-V3, Kimi K2), None when not fp8."""
  q = hf.get('quantization_config')
  if not q or q.get('quant_method') == pq.QUANT_METHOD:  # Pack-quantized INT: research/hf/pack_quantized.
    return None
  if q.get('quant_method') != 'fp8':
    _err('quantization_config.quant_method', q.get('quant_method'),
         'only block-scaled fp8 (dequantized on import) is supported')
  if q.get('fmt', 'e4m3') != 'e4m3':
    _err('quantization_config.fmt', q.get('fmt'), 'only e4m3 is supported')
  block = tuple(q.get('weight_block_size') or (128, 128))
  if len(block) != 2:
    _err('quantization_config.weight_block_size', block, 'expected two tile sizes')
  return block


class _Reader:
  """Reads config.json fields, remembering which were read (any field left unread is an error)."""

  def __init__(self, hf: Mapping[str, Any], ignore_fields: Iterable[str]):
    self.hf = hf
    self.read = set(HARMLESS) | set(ignore_fields)

  def take(self, key: str, default=None, *aliases):
    for k in (key, *aliases):
      if k in self.hf:
        self.read.add(k)
        return self.hf[k]
    return default

  def require(self, key: str, allowed: tuple, default):
    value = self.take(key, default)
    if value not in allowed:
      _err(key, value, f'only {allowed} is implemented')
    return value


def from_hf(hf: Mapping[str, Any], ignore_fields: Iterable[str] = ()) -> ModelConfig:
  """A parsed config.json -> ModelConfig (architecture fields; training knobs keep their defaults).

  A multimodal container (Kimi K2.5) maps its text_config. Raises UnsupportedConfigError naming the
  field for anything our model would compute differently.
  """
  container, hf = hf, text_config(hf)
  model_type = hf.get('model_type')
  if model_type not in MODEL_TYPES:
    _err('model_type', model_type, f'unsupported; supported: {sorted(MODEL_TYPES)}')
  family = MODEL_TYPES[model_type]
  r = _Reader(hf, ignore_fields)
  d = _common_fields(r, family)
  d.update(_qwen3_fields(r, d) if family == QWEN3_MOE else _deepseek_fields(r, d))
  if fp8_block_size(hf) is None and hf.get('quantization_config'):
    pq.Scheme.from_json(hf['quantization_config'])  # Names a compressed-tensors field we cannot read.
  unknown = sorted(set(hf) - r.read)
  if unknown:
    _err(unknown[0], hf[unknown[0]], f'field not understood for model_type={model_type!r} (it may change '
         f'the math; pass ignore_fields/--ignore_fields if it does not). All unknown: {unknown}')
  missing = sorted(k for k, v in d.items() if v is None)
  if missing:
    _err(missing[0], None, 'required field missing')
  dtype = _dtype(hf, container)
  return ModelConfig(**d, param_dtype=dtype, dtype=dtype).validate()


def _common_fields(r: _Reader, family: str) -> dict:
  """The fields both families spell alike, and RoPE."""
  r.require('hidden_act', ('silu',), 'silu')
  r.require('attention_bias', (False,), False)
  r.read.update({'rope_parameters', 'rope_scaling', 'rope_theta', 'original_max_position_embeddings'})
  return dict(
      vocab_size=r.take('vocab_size'), d_model=r.take('hidden_size'), num_layers=r.take('num_hidden_layers'),
      num_heads=r.take('num_attention_heads'), norm_eps=float(r.take('rms_norm_eps', 1e-6)),
      d_ff=r.take('intermediate_size'), d_expert=r.take('moe_intermediate_size'),
      num_experts_per_tok=r.take('num_experts_per_tok'), **_rope(r.hf, family))


def _qwen3_fields(r: _Reader, d: dict) -> dict:
  """Qwen3-MoE: GQA with q/k norms, softmax router, optional leading dense layers."""
  heads = d['num_heads']
  if r.take('use_sliding_window', False):
    _err('use_sliding_window', True, 'sliding-window attention is not implemented')
  r.read.update({'sliding_window', 'max_window_layers'})
  if r.take('decoder_sparse_step', 1) != 1:
    _err('decoder_sparse_step', r.hf['decoder_sparse_step'], 'only 1 (every layer MoE) is implemented')
  dense = sorted(r.take('mlp_only_layers', None) or [])
  if dense != list(range(len(dense))):
    _err('mlp_only_layers', dense, 'only a prefix [0..k-1] of dense layers is implemented')
  return dict(attention='gqa', num_kv_heads=r.take('num_key_value_heads', heads),
              head_dim=r.take('head_dim', d['d_model'] // heads), qk_norm=True, rope_interleaved=False,
              first_k_dense=len(dense), num_experts=r.take('num_experts', None, 'num_local_experts'),
              num_shared_experts=0, router='softmax', norm_topk_prob=bool(r.take('norm_topk_prob', False)))


def _deepseek_fields(r: _Reader, d: dict) -> dict:
  """DeepSeek-V3 / Kimi K2: MLA, sigmoid router with group-limited routing, shared experts."""
  r.require('scoring_func', ('sigmoid',), 'sigmoid')
  r.require('topk_method', ('noaux_tc',), 'noaux_tc')
  r.require('moe_layer_freq', (1,), 1)
  if d['norm_eps'] != 1e-6:  # transformers builds q_a_layernorm / kv_a_layernorm with eps=1e-6.
    _err('rms_norm_eps', d['norm_eps'], 'DeepSeek-V3 latent norms use 1e-6 in transformers; other '
         'values would need a separate eps for them')
  heads = d['num_heads']
  kv_heads = r.take('num_key_value_heads', heads)
  if kv_heads != heads:
    _err('num_key_value_heads', kv_heads, f'MLA needs it equal to num_attention_heads={heads}')
  nope, rope_dim = r.take('qk_nope_head_dim'), r.take('qk_rope_head_dim')
  for key, want in (('head_dim', rope_dim), ('qk_head_dim', nope + rope_dim)):
    if r.take(key, want) != want:
      _err(key, r.hf[key], f'transformers derives it as {want}')
  return dict(attention='mla', q_lora_rank=r.take('q_lora_rank') or 0, kv_lora_rank=r.take('kv_lora_rank'),
              qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim, v_head_dim=r.take('v_head_dim'),
              rope_interleaved=bool(r.take('rope_interleave', True)),
              first_k_dense=r.take('first_k_dense_replace', 0),
              num_experts=r.take('n_routed_experts', None, 'num_local_experts'),
              num_shared_experts=r.take('n_shared_experts', 0), router='sigmoid',
              norm_topk_prob=bool(r.take('norm_topk_prob', True)), n_group=r.take('n_group', 1) or 1,
              topk_group=r.take('topk_group', 1) or 1,
              routed_scaling_factor=float(r.take('routed_scaling_factor', 1.0)))


def _dtype(hf: Mapping[str, Any], container: Mapping[str, Any]) -> str:
  """Parameter dtype: the checkpoint's (text_config's, else the container's) when it is float32 or
  bfloat16, else float32."""
  default = container.get('torch_dtype', container.get('dtype', 'float32'))
  dtype = str(hf.get('torch_dtype', hf.get('dtype', default)) or 'float32')
  if fp8_block_size(hf):
    dtype = 'bfloat16'  # fp8 weights are dequantized to bfloat16 on import (INT4 ones to the dtype).
  return dtype if dtype in ('float32', 'bfloat16') else 'float32'


def family_of(cfg: ModelConfig) -> str:
  if cfg.attention == 'gqa' and cfg.router == 'softmax' and cfg.qk_norm and not cfg.num_shared_experts:
    return QWEN3_MOE
  if cfg.attention == 'mla' and cfg.router == 'sigmoid':
    return DEEPSEEK_V3
  raise UnsupportedConfigError(
      f'no Hugging Face architecture for attention={cfg.attention!r}, router={cfg.router!r}, '
      f'qk_norm={cfg.qk_norm}, num_shared_experts={cfg.num_shared_experts}')


def to_hf(cfg: ModelConfig, dtype: str | None = None) -> dict:
  """ModelConfig -> config.json dict that transformers builds the same model from."""
  family = family_of(cfg)
  rope = {'rope_type': 'default', 'rope_theta': cfg.rope_theta}
  if cfg.rope_yarn_factor != 1.0:
    rope.update(rope_type='yarn', factor=cfg.rope_yarn_factor,
                original_max_position_embeddings=cfg.rope_yarn_original_len,
                beta_fast=cfg.rope_yarn_beta_fast, beta_slow=cfg.rope_yarn_beta_slow,
                attention_factor=cfg.rope_yarn_attention_factor)
  if cfg.attn_scale_mult != 1.0:
    if family != DEEPSEEK_V3 or cfg.rope_yarn_factor == 1.0:
      raise UnsupportedConfigError(f'model.attn_scale_mult={cfg.attn_scale_mult}: transformers has it only '
                                   'as DeepSeek-V3 YaRN mscale_all_dim')
    rope['mscale_all_dim'] = (math.sqrt(cfg.attn_scale_mult) - 1) / (0.1 * math.log(cfg.rope_yarn_factor))
  hf = {
      'architectures': [ARCHITECTURES[family]], 'model_type': family,
      'vocab_size': cfg.vocab_size, 'hidden_size': cfg.d_model, 'num_hidden_layers': cfg.num_layers,
      'num_attention_heads': cfg.num_heads, 'intermediate_size': cfg.d_ff,
      'moe_intermediate_size': cfg.d_expert, 'num_experts_per_tok': cfg.num_experts_per_tok,
      'norm_topk_prob': cfg.norm_topk_prob, 'rms_norm_eps': cfg.norm_eps, 'hidden_act': 'silu',
      'attention_bias': False, 'tie_word_embeddings': False, 'rope_parameters': rope,
      'max_position_embeddings': (int(cfg.rope_yarn_original_len * cfg.rope_yarn_factor)
                                  if cfg.rope_yarn_factor != 1.0 else 4096),
      'dtype': dtype or cfg.param_dtype,
  }
  if family == QWEN3_MOE:
    hf.update(num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, num_experts=cfg.num_experts,
              mlp_only_layers=list(range(cfg.first_k_dense)), decoder_sparse_step=1,
              use_sliding_window=False)
  else:
    hf.update(num_key_value_heads=cfg.num_heads, q_lora_rank=cfg.q_lora_rank or None,
              kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
              qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
              rope_interleave=cfg.rope_interleaved, first_k_dense_replace=cfg.first_k_dense,
              n_routed_experts=cfg.num_experts, n_shared_experts=cfg.num_shared_experts,
              n_group=cfg.n_group, topk_group=cfg.topk_group,
              routed_scaling_factor=cfg.routed_scaling_factor, num_nextn_predict_layers=0,
              # transformers assumes both; vLLM builds the router's correction bias only when told.
              scoring_func='sigmoid', topk_method='noaux_tc')
  return hf


def read(path: str, ignore_fields: Iterable[str] = ()) -> ModelConfig:
  with open(path) as f:
    return from_hf(json.load(f), ignore_fields)


def save_model_config(cfg: ModelConfig, path: str):
  """Our config as JSON (every field), for experiment configs: `c.model = ConfigDict(json.load(...))`."""
  with open(path, 'w') as f:
    json.dump(dataclasses.asdict(cfg), f, indent=2)


def load_model_config(path: str) -> ModelConfig:
  with open(path) as f:
    return from_dict(json.load(f))
