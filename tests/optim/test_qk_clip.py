"""QK-clip brings every head's max logit to at most tau and leaves the other heads alone."""

import jax.numpy as jnp
import numpy as np
import pytest

from research.optim.qk_clip import QKClipTarget, qk_clip

T, D, H, DH = 16, 12, 4, 8


def _max_logits(x, q, k):
  """Per-head max of q.k logits; k may have fewer (shared) heads than q."""
  qh = np.einsum('td,dhe->the', x, q)
  kh = np.repeat(np.einsum('td,dhe->the', x, k), q.shape[1] // k.shape[1], axis=1)
  return np.einsum('the,she->hts', qh, kh).reshape(q.shape[1], -1).max(-1)


@pytest.mark.parametrize('kv_heads', [H, H // 2])
def test_clipped_heads_reach_tau_others_unchanged(kv_heads):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((T, D)).astype(np.float32)
  q = rng.standard_normal((D, H, DH)).astype(np.float32) * np.array([1, 3, 1, 3])[:, None]
  k = rng.standard_normal((D, kv_heads, DH)).astype(np.float32)
  before = _max_logits(x, q, k)
  tau = float(np.sort(before)[1] + np.sort(before)[2]) / 2  # Two heads above, two below.
  target = QKClipTarget(head_axis=1)
  out = qk_clip({'q': jnp.asarray(q), 'k': jnp.asarray(k), 'o': jnp.ones(3)},
                jnp.asarray(before), {'q': target, 'k': target, 'o': None}, tau=tau)
  after = _max_logits(x, np.asarray(out['q']), np.asarray(out['k']))
  above = before > tau
  assert above.sum() == 2
  assert np.all(after <= tau * (1 + 1e-5))
  np.testing.assert_array_equal(np.asarray(out['o']), np.ones(3))
  if kv_heads == H:  # Bilinear per head: exactly tau above, untouched below.
    np.testing.assert_allclose(after[above], tau, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out['q'])[:, ~above], q[:, ~above])


def test_stacked_mla_parts():
  """(L, R, H, Dn + Dr) query with a shared rope key: nope parts sqrt(gamma), q rope gamma."""
  rng = np.random.default_rng(1)
  layers, rank, dn, dr = 2, 6, 4, 2
  x = rng.standard_normal((layers, T, rank)).astype(np.float32)
  q = rng.standard_normal((layers, rank, H, dn + dr)).astype(np.float32) * 2
  k_nope = rng.standard_normal((layers, rank, H, dn)).astype(np.float32)
  k_rope = rng.standard_normal((layers, rank, dr)).astype(np.float32)

  def logits(q, k_nope):
    qh = np.einsum('ltr,lrhe->lthe', x, q)
    kn = np.einsum('ltr,lrhe->lthe', x, k_nope)
    kr = np.einsum('ltr,lre->lte', x, k_rope)
    s = (np.einsum('lthe,lshe->lhts', qh[..., :dn], kn)
         + np.einsum('lthe,lse->lhts', qh[..., dn:], kr))
    return s.reshape(layers, H, -1).max(-1)

  before = logits(q, k_nope)
  tau = float(np.median(before))
  nope, rope = QKClipTarget(2, 0, 0.5, (3, 0, dn)), QKClipTarget(2, 0, 1.0, (3, dn, dn + dr))
  targets = {'q_b': (nope, rope), 'k_nope': QKClipTarget(2, 0)}
  out = qk_clip({'q_b': jnp.asarray(q), 'k_nope': jnp.asarray(k_nope)}, jnp.asarray(before),
                targets, tau=tau)
  after = logits(np.asarray(out['q_b']), np.asarray(out['k_nope']))
  np.testing.assert_allclose(after, np.minimum(before, tau), rtol=1e-5)


def test_bad_target_names_the_leaf():
  with pytest.raises(ValueError, match='targets at k: head axis 1 has 3 heads'):
    qk_clip({'k': jnp.ones((D, 3, DH))}, jnp.ones(H), {'k': QKClipTarget(1)})
  with pytest.raises(ValueError, match='targets at q: .* needs a layer_axis'):
    qk_clip({'q': jnp.ones((2, D, H, DH))}, jnp.ones((2, H)), {'q': QKClipTarget(2)})
