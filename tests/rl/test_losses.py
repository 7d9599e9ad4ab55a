"""Each RL loss against a direct numpy computation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from research.rl.update import losses


def _logp(rng, *shape):
  x = rng.normal(size=shape) * 2
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_group_advantages_drgrpo_and_std():
  r = np.array([1.0, 0.0, 0.0, 0.0, -1.0, 1.0, 5.0, 2.0])
  g = np.array([0, 0, 0, 0, 1, 1, 2, 2])
  v = np.array([1, 1, 1, 1, 1, 1, 0, 1], bool)  # A fault in group 2 is excluded from its baseline.
  a = losses.group_advantages(r, g, v)
  np.testing.assert_allclose(a, [0.75, -0.25, -0.25, -0.25, -1, 1, 0, 0], atol=1e-6)
  s = losses.group_advantages(r, g, v, std_norm=True, eps=1e-12)
  np.testing.assert_allclose(s[:4], np.array([0.75, -0.25, -0.25, -0.25]) / np.std([1, 0, 0, 0]), atol=1e-5)


@pytest.mark.parametrize('clip', [0.0, 0.2])
def test_pg_loss(clip):
  rng = np.random.default_rng(0)
  logp, old = -rng.random((3, 5)), -rng.random((3, 5))
  adv, mask = np.array([1.0, -0.5, 0.0]), (rng.random((3, 5)) > 0.3).astype(np.float32)
  adv_BxT = jnp.array(np.repeat(adv[:, None], 5, 1))  # Per token (a trajectory's own in a row).
  got, _ = losses.pg_loss(jnp.array(logp), jnp.array(old), adv_BxT, jnp.array(mask), 7.0, clip_eps=clip)
  # Truncated importance sampling weights each token by min(ratio, cap), with no gradient through it.
  capped, st = losses.pg_loss(jnp.array(logp), jnp.array(old), adv_BxT, jnp.array(mask), 7.0, is_cap=1.2)
  if clip:
    ratio = np.exp(logp - old)
    per = -np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - clip, 1 + clip) * adv[:, None])
  else:
    per = -adv[:, None] * logp
    w = np.minimum(np.exp(logp - old), 1.2)
    np.testing.assert_allclose(capped, (per * w * mask).sum() / 7.0, rtol=1e-5)
    np.testing.assert_allclose(st['is_capped'], ((np.exp(logp - old) > 1.2) * mask).sum() / mask.sum(), rtol=1e-6)
    np.testing.assert_allclose(st['is_ess'], (w * mask).sum() ** 2 / (mask.sum() * (w * w * mask).sum()), rtol=1e-5)
    grad = jax.grad(lambda lp: losses.pg_loss(lp, jnp.array(old), adv_BxT, jnp.array(mask), 7.0,
                                              is_cap=1.2)[0])(jnp.array(logp))
    np.testing.assert_allclose(grad, -adv[:, None] * w * mask / 7.0, rtol=1e-5)
  np.testing.assert_allclose(got, (per * mask).sum() / 7.0, rtol=1e-5)


def _np_kl(p, q):
  return (np.exp(p) * (p - q)).sum(-1)


def _np_ref(kind, s, t, y, k):
  if kind == 'reverse_kl':
    return _np_kl(s, t)
  if kind == 'forward_kl':
    return _np_kl(t, s)
  if kind == 'jsd':
    m = np.log((np.exp(s) + np.exp(t)) / 2)
    return 0.5 * (_np_kl(t, m) + _np_kl(s, m))
  if kind == 'topk':
    idx = np.argsort(-t, -1)[..., :k]
    tk, sk = np.take_along_axis(t, idx, -1), np.take_along_axis(s, idx, -1)
    norm = lambda x: x - np.log(np.exp(x).sum(-1, keepdims=True))
    return _np_kl(norm(tk), norm(sk))
  sy, ty = np.take_along_axis(s, y[..., None], -1)[..., 0], np.take_along_axis(t, y[..., None], -1)[..., 0]
  return -(ty - sy) * sy


@pytest.mark.parametrize('kind', losses.DISTILL_KINDS)
def test_distill_loss_matches_numpy(kind):
  rng = np.random.default_rng(1)
  s, t = _logp(rng, 2, 4, 11), _logp(rng, 2, 4, 11)
  y = rng.integers(0, 11, size=(2, 4))
  mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
  stats = losses.position_stats(jnp.array(s), jnp.array(t), jnp.array(y), kind=kind, top_k=3)
  loss, kl_n, frac = losses.distill_loss(stats, jnp.array(y), jnp.array(mask))
  ref = _np_ref(kind, s, t, y, 3)
  np.testing.assert_allclose(loss, (ref * mask).sum() / mask.sum(), rtol=1e-5, atol=1e-6)
  rkl = _np_kl(s, t)
  np.testing.assert_allclose(kl_n, (rkl * mask).sum(-1) / mask.sum(-1), rtol=1e-5)
  assert frac == 1.0


def test_sampled_estimator_gradient_is_reverse_kl_in_expectation():
  """Averaged over the student's own tokens, the sampled-token gradient equals the full reverse KL's."""
  rng = np.random.default_rng(2)
  z, t = jnp.array(rng.normal(size=(1, 1, 6))), jnp.array(_logp(rng, 1, 1, 6))
  p = np.exp(jax.nn.log_softmax(z))[0, 0]
  full = jax.grad(lambda z: losses.distill_per_position(jax.nn.log_softmax(z), t, None, kind='reverse_kl').sum())(z)
  g = jax.jit(jax.grad(lambda z, y: losses.distill_per_position(jax.nn.log_softmax(z), t, y, kind='sampled').sum()))
  est = sum(p[y] * g(z, jnp.array([[y]])) for y in range(6))
  np.testing.assert_allclose(est, full, atol=1e-5)


def test_confident_gate():
  s = np.log(np.array([[[0.5, 0.5], [0.9, 0.1]]]))
  t = np.log(np.array([[[0.8, 0.2], [0.6, 0.4]]]))
  mask = np.ones((1, 2), np.float32)
  y = jnp.zeros((1, 2), jnp.int32)
  stats = losses.position_stats(jnp.array(s), jnp.array(t), y, kind='reverse_kl')
  loss, _, frac = losses.distill_loss(stats, y, jnp.array(mask), gate='confident')
  assert frac == 0.5  # Only position 0, where the teacher is more confident than the student.
  np.testing.assert_allclose(loss, _np_kl(s, t)[0, 0], rtol=1e-5)


def test_bad_kind_names_the_field():
  with pytest.raises(ValueError, match='distill_kind'):
    losses.distill_per_position(jnp.zeros((1, 1, 2)), jnp.zeros((1, 1, 2)), None, kind='kl')
  with pytest.raises(ValueError, match='distill_top_k'):
    losses.distill_per_position(jnp.zeros((1, 1, 2)), jnp.zeros((1, 1, 2)), None, kind='topk')


def test_until_divergence_mask():
  t = np.log(np.full((2, 4, 3), 0.1))
  t[0, :, 0] = t[1, :, 0] = np.log(0.8)       # The teacher's top token is 0 everywhere.
  y = np.array([[0, 0, 2, 0], [1, 0, 0, 0]])   # Row 0 leaves it at position 2, row 1 at once.
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], np.float32)
  got = losses.divergence_mask(jnp.argmax(jnp.array(t), -1), jnp.array(y), jnp.array(mask))
  np.testing.assert_array_equal(got, [[1, 1, 1, 0], [1, 0, 0, 0]])
