"""Coefficient schedules, NS against optax's, and the FLOP formula against XLA's count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optax.contrib import _muon as optax_muon

from research.optim import newton_schulz


def test_schedules():
  assert newton_schulz.schedule('standard') == ((3.4445, -4.7750, 2.0315),) * 5
  assert newton_schulz.schedule((1.0, 2.0, 3.0), 2) == ((1.0, 2.0, 3.0),) * 2
  dion = newton_schulz.schedule('dion')
  assert len(dion) == 5 and dion[0] != dion[1]
  polar = newton_schulz.PRESETS['polar_express']
  assert newton_schulz.schedule('polar_express', 5) == polar[:5]
  assert newton_schulz.schedule('polar_express', 10) == polar + polar[-1:] * 2
  assert polar[0][0] == pytest.approx(8.28721201814563 / 1.01)
  assert polar[-1] == (1.875, -1.25, 0.375)
  with pytest.raises(ValueError, match="ns_coeffs: unknown preset 'cubic'"):
    newton_schulz.schedule('cubic')
  with pytest.raises(ValueError, match='ns_steps'):
    newton_schulz.schedule('standard', -1)


@pytest.mark.parametrize('shape', [(3, 16, 40), (2, 24, 24)])
def test_orthogonalize_matches_optax(shape):
  x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)
  coeffs = newton_schulz.schedule('standard')
  ours = newton_schulz.orthogonalize(x, coeffs)
  ref = optax_muon.orthogonalize_via_newton_schulz(
      x, jnp.asarray(coeffs[0]), 5, dimension_numbers=optax_muon.MuonDimensionNumbers(1, 2))
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
  # Polar Express gets closer to orthogonal in the same 5 steps; bf16 iterations stay close.
  svals = lambda y: np.linalg.svd(np.asarray(y, np.float32), compute_uv=False)
  polar = newton_schulz.orthogonalize(x, newton_schulz.schedule('polar_express', 5))
  assert np.abs(svals(polar) - 1).max() < np.abs(svals(ours) - 1).max()
  bf16 = newton_schulz.orthogonalize(x, coeffs, dtype=jnp.bfloat16)
  assert bf16.dtype == jnp.float32
  assert np.linalg.norm(bf16 - ours) < 0.1 * np.linalg.norm(ours)
  assert svals(bf16).max() < 1.2


def test_flops_formula_matches_xla():
  x = jax.ShapeDtypeStruct((4, 32, 96), jnp.float32)
  compiled = jax.jit(lambda y: newton_schulz.orthogonalize(
      y, newton_schulz.schedule('standard'))).lower(x).compile()
  matmul = 4 * newton_schulz.flops(96, 32, 5)
  assert newton_schulz.flops(32, 96, 5) == 5 * 2 * 32 * 32 * (2 * 96 + 32)
  assert compiled.cost_analysis()['flops'] == pytest.approx(matmul, rel=0.03)
