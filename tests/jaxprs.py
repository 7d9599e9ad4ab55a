"""Walking a jaxpr, for tests that assert what a traced program contains."""


def eqns(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (pjit, scan, shard_map, custom rules)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in v if isinstance(v, (tuple, list)) else (v,):
        inner = getattr(sub, 'jaxpr', sub)
        if hasattr(inner, 'eqns'):
          yield from eqns(inner)
