"""A tiny MoE's parameter tree as shapes only: what the Muon benchmarks time and the optimizer
tests check, kept apart from both so neither depends on the other."""

import jax
import jax.numpy as jnp
from optax.contrib import MuonDimensionNumbers as Dims


# pylint: disable-next=invalid-name
def moe_tree(L=4, D=256, H=4, K=2, Dh=64, E=16, F=256, Fs=256, V=1024):
  """(shapes, logical axes, dimension numbers) of a tiny MoE shaped like research/model's.

  Dimension numbers are None for AdamW leaves (embedding, norms, head).
  """
  leaves = {
      'embed/embedding': ((V, D), ('vocab', 'embed'), None),
      'layers/attn/q': ((L, D, H, Dh), ('layers', 'embed', 'heads', 'head_dim'), Dims(1, (2, 3))),
      'layers/attn/k': ((L, D, K, Dh), ('layers', 'embed', 'kv_heads', 'head_dim'),
                        Dims(1, (2, 3))),
      'layers/attn/v': ((L, D, K, Dh), ('layers', 'embed', 'kv_heads', 'head_dim'),
                        Dims(1, (2, 3))),
      'layers/attn/o': ((L, H, Dh, D), ('layers', 'heads', 'head_dim', 'embed'), Dims((1, 2), 3)),
      'layers/attn_norm/scale': ((L, D), ('layers', 'norm'), None),
      'layers/mlp_norm/scale': ((L, D), ('layers', 'norm'), None),
      'layers/moe/router': ((L, D, E), ('layers', 'embed', None), Dims(1, 2)),
      'layers/moe/wi_gate': ((L, E, D, F), ('layers', 'experts', 'expert_embed', 'expert_mlp'),
                             Dims(2, 3)),
      'layers/moe/wi_up': ((L, E, D, F), ('layers', 'experts', 'expert_embed', 'expert_mlp'),
                           Dims(2, 3)),
      'layers/moe/wo': ((L, E, F, D), ('layers', 'experts', 'expert_mlp', 'expert_embed'),
                        Dims(2, 3)),
      'layers/moe/shared/wi_gate': ((L, D, Fs), ('layers', 'embed', 'mlp'), Dims(1, 2)),
      'layers/moe/shared/wi_up': ((L, D, Fs), ('layers', 'embed', 'mlp'), Dims(1, 2)),
      'layers/moe/shared/wo': ((L, Fs, D), ('layers', 'mlp', 'embed'), Dims(1, 2)),
      'final_norm/scale': ((D,), ('norm',), None),
      'lm_head/kernel': ((D, V), ('embed', 'vocab'), None),
  }
  shapes, axes, dims = {}, {}, {}
  for path, (shape, names, dim_nums) in leaves.items():
    *parents, name = path.split('/')
    for tree, value in ((shapes, jax.ShapeDtypeStruct(shape, jnp.float32)), (axes, names),
                        (dims, dim_nums)):
      for p in parents:
        tree = tree.setdefault(p, {})
      tree[name] = value
  return shapes, axes, dims
