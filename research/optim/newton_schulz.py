"""Newton–Schulz orthogonalization of batched matrices and its coefficient schedules.

A schedule is a tuple of per-step `(a, b, c)` triples for the odd quintic
`X <- a X + (b A + c A A) X`, `A = X X^T`. Presets:

  'standard'       Keller Jordan's quintic, the same triple every step (optax's default).
  'dion'           optax's 'dion' preset: five tuned per-step triples.
  'polar_express'  Amsel et al. 2025 (arXiv:2505.16932), degree 5, with the paper's 1.01 safety
                   factor on all but the last (fixed-point) triple.

A per-step schedule of n triples run for k steps uses its first k triples and repeats the last if
k > n (the Polar Express convention: the last triple is the iteration's fixed point).
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

Coeffs = tuple[tuple[float, float, float], ...]

_POLAR_EXPRESS_RAW = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)

PRESETS: dict[str, tuple[tuple[float, float, float], ...]] = {
    'standard': ((3.4445, -4.7750, 2.0315),),
    'dion': (
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ),
    'polar_express': tuple((a / 1.01, b / 1.01**3, c / 1.01**5)
                           for a, b, c in _POLAR_EXPRESS_RAW[:-1]) + _POLAR_EXPRESS_RAW[-1:],
}
DEFAULT_STEPS = 5
PRECONDITIONINGS = ('frobenius', 'spectral', 'aol', 'schatten')


def schedule(ns_coeffs: str | Sequence[float] | Sequence[Sequence[float]],
             ns_steps: int | None = None) -> Coeffs:
  """Preset name, one (a, b, c) triple or a per-step list -> one triple per step.

  `ns_steps=None` runs 5 steps of a single triple and every triple of a per-step list (what
  optax.contrib.muon does with a list).
  """
  if isinstance(ns_coeffs, str):
    if ns_coeffs not in PRESETS:
      raise ValueError(f'ns_coeffs: unknown preset {ns_coeffs!r}; presets are {sorted(PRESETS)}')
    rows = PRESETS[ns_coeffs]
    if len(rows) == 1 and ns_steps is None:
      ns_steps = DEFAULT_STEPS
  else:
    arr = np.asarray(ns_coeffs, dtype=np.float64)
    if arr.ndim not in (1, 2) or arr.shape[-1] != 3 or arr.size == 0:
      raise ValueError(f'ns_coeffs: expected a preset name, an (a, b, c) triple or a list of '
                       f'triples, got shape {arr.shape}')
    rows = tuple(tuple(float(v) for v in r) for r in arr.reshape(-1, 3))
    if arr.ndim == 1 and ns_steps is None:
      ns_steps = DEFAULT_STEPS
  steps = len(rows) if ns_steps is None else ns_steps
  if not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f'ns_steps: expected a positive int, got {ns_steps!r}')
  return tuple(rows[min(i, len(rows) - 1)] for i in range(steps))


def _psum(x: jax.Array, axis_name) -> jax.Array:
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def _gram(x_BxPxQ: jax.Array, axis_name=None) -> jax.Array:
  """X X^H (the conjugate only matters for complex matrices), summed over the column sets on
  `axis_name`."""
  return _psum(x_BxPxQ @ jnp.swapaxes(x_BxPxQ.conj(), -1, -2), axis_name)


def _frobenius(x: jax.Array, axis_name=None) -> jax.Array:
  return jnp.sqrt(_psum(jnp.sum(jnp.real(x * x.conj()), axis=(-2, -1), keepdims=True), axis_name))


def _rescaled(x_BxPxQ: jax.Array, a_BxPxP: jax.Array, preconditioning: str,
              eps: float) -> tuple[jax.Array, jax.Array]:
  """The first step's X and A = X X^H rescaled from A itself, at no extra matmul: 'aol' scales
  row i by 1/sqrt(sum_j |A_ij|) (arXiv:2512.04632), 'schatten' everything by 1/||X||_S4 =
  ||A||_F^-1/2 (arXiv:2506.10935)."""
  if preconditioning == 'aol':
    s_BxPx1 = jax.lax.rsqrt(jnp.maximum(jnp.abs(a_BxPxP).sum(-1, keepdims=True), eps))
    return x_BxPxQ * s_BxPx1, a_BxPxP * s_BxPx1 * jnp.swapaxes(s_BxPx1, -1, -2)
  s_Bx1x1 = jax.lax.rsqrt(jnp.maximum(_frobenius(a_BxPxP), eps))
  return x_BxPxQ * s_Bx1x1, a_BxPxP * (s_Bx1x1 * s_Bx1x1)


def orthogonalize(x_BxPxQ: jax.Array, coeffs: Coeffs, eps: float = 1e-8,
                  dtype: jnp.dtype | None = None, preconditioning: str = 'frobenius',
                  axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
  """Approximate polar factor of each matrix in a batch; rows <= cols expected (cheaper side).

  `preconditioning` (optax's modes): 'frobenius' and 'spectral' divide each matrix by that norm
  (computed in the input dtype, at least f32) before iterating; 'aol' and 'schatten' rescale
  inside the first step instead (`_rescaled`). Iterations run in `dtype` (default: the input's);
  complex matrices use the conjugate transpose. The result has the input's dtype. With
  `axis_name` (inside shard_map) each device holds a column set of every matrix: norms and
  X X^H are summed over those axes ('spectral' cannot be split).
  """
  if preconditioning not in PRECONDITIONINGS:
    raise ValueError(f'preconditioning: expected one of {PRECONDITIONINGS}, got '
                     f'{preconditioning!r}')
  if axis_name is not None and preconditioning == 'spectral':
    raise ValueError("preconditioning: 'spectral' needs whole matrices, not split ones")
  out_dtype = x_BxPxQ.dtype
  x = x_BxPxQ.astype(jnp.promote_types(out_dtype, jnp.float32))
  if preconditioning == 'frobenius':
    x = x / (_frobenius(x, axis_name) + eps)
  elif preconditioning == 'spectral':
    x = x / (jnp.linalg.norm(x, ord=2, axis=(-2, -1), keepdims=True) + eps)
  x = x.astype(dtype or out_dtype)
  for i, (a, b, c) in enumerate(coeffs):
    a_BxPxP = _gram(x, axis_name)
    if i == 0 and preconditioning in ('aol', 'schatten'):
      x, a_BxPxP = _rescaled(x, a_BxPxP, preconditioning, eps)
    if x.shape[-1] < x.shape[-2]:  # Fewer (local) columns than rows: A (A X) is the cheaper order.
      ax = a_BxPxP @ x
      x = a * x + b * ax + c * a_BxPxP @ ax
    else:
      x = a * x + (b * a_BxPxP + c * a_BxPxP @ a_BxPxP) @ x
  return x.astype(out_dtype)


def flops(p: int, q: int, steps: int, split: int = 1) -> int:
  """Matmul FLOPs of `steps` NS steps on one p x q matrix: X X^T, A A and B X per step; with
  `split`, one device's part when the columns are split that many ways (A A is repeated), or
  X X^T, A X and A (A X) once a device holds fewer columns than rows (`orthogonalize`)."""
  p, q = min(p, q), max(p, q)
  local = q // split
  return steps * 2 * p * p * (3 * local if local < p else 2 * local + p)
