"""bf16 compute from float32 parameters: lookups sum their gradients in float32; RMSNorm and the
router keep no float32 copy of their input for the backward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxprs
from research.model import moe, transformer
from research.model.config import ModelConfig
from research.model.layers import rms_norm, take_rows

BF16 = ModelConfig(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8, num_experts=4,
                   d_expert=16, d_ff=32, dtype='bfloat16')


def test_a_frequent_rows_gradient_is_the_float32_sum_of_its_cotangents():
  # 8,192 lookups, 90% of them row 3: a bf16 sum would stop near 256 x a term.
  idx = jnp.where(jax.random.bernoulli(jax.random.key(0), 0.9, (4, 2048)), 3,
                  jax.random.randint(jax.random.key(1), (4, 2048), 0, 64))
  table = jax.random.normal(jax.random.key(2), (64, 16))
  rows, vjp = jax.vjp(lambda t: take_rows(t, idx, jnp.dtype(jnp.bfloat16)), table)
  np.testing.assert_array_equal(rows, table.astype(jnp.bfloat16)[idx])
  ct = (1.0 + jax.random.uniform(jax.random.key(3), rows.shape)).astype(jnp.bfloat16)  # All positive.
  (grad,) = vjp(ct)
  want = np.zeros(table.shape)
  np.add.at(want, np.asarray(idx), np.asarray(ct, np.float64))
  assert grad.dtype == jnp.float32 and want[3, 0] > 10_000
  np.testing.assert_allclose(grad, want, rtol=1e-5)


@pytest.mark.parametrize('moe_impl', ['blocked', 'ragged'])
def test_a_bf16_models_gradients_scatter_into_parameters_in_float32(moe_impl):
  """Scatter-adds into a parameter-shaped buffer (the embedding; the blocked experts' weights, gathered
  per block) run in float32; the one-hot of the tokens' rows loses the same gradient's sum otherwise."""
  cfg = dataclasses.replace(BF16, moe_impl=moe_impl)
  params = transformer.init(cfg, jax.random.key(0))
  tokens = jnp.zeros((2, 12), jnp.int32)  # 24 rows: no parameter has a 24 x E shape.
  loss = lambda p: jnp.sum(transformer.forward(p, tokens, cfg)[0])
  shapes = {s for x in jax.tree.leaves(params) for s in (x.shape, x.shape[1:])}  # [1:]: a layer's.
  into_params = [(eqn.invars[0].aval.shape, eqn.invars[0].aval.dtype)
                 for eqn in jaxprs.eqns(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
                 if eqn.primitive.name == 'scatter-add' and eqn.invars[0].aval.shape in shapes]
  want = {params['embed']['embedding'].shape}
  if moe_impl == 'blocked':
    want |= {params['moe_layers']['moe'][k].shape[1:] for k in ('wi_gate', 'wo')}
  assert {s for s, _ in into_params} == want
  assert all(dt == jnp.float32 for _, dt in into_params), into_params

  # A batch of one token 2,048 times: its row's gradient is that of the float32 model (bf16's own
  # sum would stop near 256 positions' worth).
  tokens = jnp.zeros((2, 1024), jnp.int32)
  grad = lambda c: jax.grad(lambda p: jnp.mean(transformer.forward(p, tokens, c)[0][..., 0]) * tokens.size)(
      params)['embed']['embedding'][0]
  want = grad(dataclasses.replace(cfg, dtype='float32'))
  np.testing.assert_allclose(grad(cfg), want, rtol=0.05, atol=0.05 * float(jnp.max(jnp.abs(want))))


def test_rms_norm_and_router_backward_keep_no_float32_copy_of_x():
  x = jax.random.normal(jax.random.key(0), (4, 24, 32), jnp.bfloat16)
  scale = 1.0 + jax.random.uniform(jax.random.key(1), (32,))
  assert jaxprs.kept_residuals(lambda x, s: rms_norm(x, s, 1e-6), x, scale) == []
  router = jax.random.normal(jax.random.key(2), (32, 8))
  assert jaxprs.kept_residuals(moe._router_logits, x.reshape(-1, 32), router) == []  # pylint: disable=protected-access

  def plain(x, s):  # The same formula, left to jax's AD.
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * s).astype(x.dtype)
  ct = jax.random.normal(jax.random.key(3), x.shape, jnp.bfloat16)
  got = jax.vjp(lambda x, s: rms_norm(x, s, 1e-6), x, scale)[1](ct)
  want = jax.vjp(plain, x, scale)[1](ct)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
