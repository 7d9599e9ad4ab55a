"""Walking a jaxpr, and what a backward pass keeps, for tests that assert what a traced program holds."""

import contextlib
import io

import jax
import jax.ad_checkpoint


def eqns(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (pjit, scan, shard_map, custom rules)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          yield from eqns(inner)


def kept_residuals(fn, *args) -> list[str]:
  """What fn's backward keeps besides its arguments and constants: print_saved_residuals' lines
  ('dtype[shape] <where from>')."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(fn, *args)
  return [line for line in out.getvalue().splitlines()
          if line and 'from the argument' not in line and 'from a constant' not in line]
