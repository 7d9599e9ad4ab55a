"""optax's own Muon tests, from the pinned optax, run against our `muon` and `scale_by_muon`.

The test module is read from the installed package and executed here; its `_muon` global is then
rebound to a copy of optax's `contrib._muon` module whose public optimizers are ours, so every
`_muon.muon(...)` the tests build is research.optim.muon.muon. The tests of optax's private helpers
(`_compute_muon_reshape`, `orthogonalize_via_newton_schulz`) keep calling optax's.
"""

import os
import types

from optax.contrib import _muon as optax_muon

from research.optim import muon as muon_lib

_SOURCE = os.path.join(os.path.dirname(optax_muon.__file__), '_muon_test.py')
SUBSTITUTED = ('muon', 'scale_by_muon')


def _load_optax_tests() -> dict:
  """The namespace of optax's test module, with our optimizers behind its `_muon`."""
  ours = types.ModuleType('optax_muon_ours')
  ours.__dict__.update(vars(optax_muon))
  ours.__dict__.update({name: getattr(muon_lib, name) for name in SUBSTITUTED})
  namespace = {'__name__': 'optax_muon_test', '__file__': _SOURCE}
  with open(_SOURCE) as f:
    exec(compile(f.read(), _SOURCE, 'exec'), namespace)  # pylint: disable=exec-used
  assert namespace['_muon'] is optax_muon, 'optax _muon_test.py no longer imports contrib._muon'
  namespace['_muon'] = ours
  return namespace


_OPTAX_TESTS = _load_optax_tests()
MuonTest = _OPTAX_TESTS['MuonTest']


def test_the_substitution_is_ours():
  """Guards against a harness that silently runs optax's optimizer, or collects fewer tests."""
  module = _OPTAX_TESTS['_muon']
  assert module.muon is muon_lib.muon and module.scale_by_muon is muon_lib.scale_by_muon
  assert module.muon is not optax_muon.muon
  assert len([name for name in dir(MuonTest) if name.startswith('test')]) == 32  # optax 0.2.8.
