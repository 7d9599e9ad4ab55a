from research.tasks import testing
from research.tasks import layout
from research.tasks.factory import scrub

DELETED = '''\
  decomposed = unicodedata.normalize('NFKD', text)
  ascii_only = decomposed.encode('ascii', 'ignore').decode('ascii')
  return ascii_only.lower()
'''


def test_fingerprints_skip_short_and_still_visible_lines():
  kept = "  ascii_only = decomposed.encode('ascii', 'ignore').decode('ascii')  # still there"
  assert scrub.fingerprints(DELETED, [kept]) == [
      "decomposed = unicodedata.normalize('NFKD', text)", 'return ascii_only.lower()']


def test_policy_tree_drops_artifacts_and_history(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx', artifacts=True)
  prints = scrub.fingerprints(DELETED, [])
  leaks = scrub.scan_tree(fx.repo, prints)
  # The checkout leaks through history and every kind of artifact.
  for where in ('.git (objects)', 'textops/__pycache__/core.cpython-', '.mypy_cache',
                '.pytype', 'htmlcov', 'build/lib', 'docs/_build', '.coverage',
                'dist/textops-0.1.tar.gz: artifact', 'textops.egg-info/SOURCES.txt: artifact'):
    assert any(where in leak for leak in leaks), where
  src = tmp_path / 'deleted'
  layout.copy_tree(fx.repo, src)
  core = src / 'textops/core.py'
  core.write_text(core.read_text().replace(DELETED, '  raise NotImplementedError\n'))
  tree = tmp_path / 'policy'
  scrub.build_policy_tree(src, tree)
  assert scrub.scan_tree(tree, prints) == []
  names = {p.name for p in tree.rglob('*')}
  assert not names & {'__pycache__', '.mypy_cache', '.pytype', '.pytest_cache', 'htmlcov',
                      'build', 'dist', '_build', 'textops.egg-info', '.coverage'}
  assert len(list((tree / '.git').rglob('*'))) > 0  # One fresh commit, nothing older.


def test_environment_scan_finds_an_installed_copy(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  site = tmp_path / 'site'
  testing.install_copy(fx, site)
  prints = {'fold': scrub.fingerprints(DELETED, [])}
  assert scrub.scan_venv([str(site)], prints) == {
      'fold': [str(site / 'textops/core.py')]}
  assert scrub.scan_venv([str(fx.site)], prints) == {}
