"""The RL step's memory plan: the KV cache the sampler allocates, logits bounded by the chunk."""
import jax
import numpy as np
import pytest

from research.model import decode
from research.model.config import ModelConfig
from research.rl import plan

GQA = ModelConfig(vocab_size=1000, d_model=64, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16,
                  num_experts=4, d_expert=32, remat='full')
MLA = ModelConfig(vocab_size=1000, d_model=64, num_layers=2, attention='mla', num_heads=4, kv_lora_rank=32,
                  qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, num_experts=4, d_expert=32,
                  dtype='bfloat16')


@pytest.mark.parametrize('cfg', [GQA, MLA], ids=['gqa', 'mla'])
def test_kv_cache_is_what_the_sampler_allocates_per_device(cfg):
  mesh = {'data': 2, 'fsdp': 2, 'tensor': 2}  # Rows split 4 ways.
  cache = jax.eval_shape(lambda: decode.init_cache(cfg, 16 // 4, 96))
  layers = {k: v for k, v in cache.items() if k.endswith('_layers')}
  want = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(layers))
  assert plan.kv_cache_bytes(cfg, mesh, rows=16, context=96) == want


def test_logits_grow_with_the_chunk_not_the_context():
  mem = lambda context, chunk: plan.rl_memory(GQA, {'data': 4}, rows=4, context=context, logit_chunk=chunk,
                                              opt_state_bytes=0)
  assert mem(65536, 256).logits == mem(1024, 256).logits == 4 * 256 * 1000 * 4
  assert mem(65536, 0).logits == 4 * 65536 * 1000 * 4
  big, small = mem(65536, 256), mem(1024, 256)
  assert big.activations > 32 * small.activations  # The saved residual stream and scores still grow.
  assert big.total == big.params + big.kv_cache + big.activations
  with pytest.raises(ValueError, match='context'):
    plan.rl_memory(GQA, {'data': 4}, rows=4, context=0, logit_chunk=256, opt_state_bytes=0)
