import stat
import subprocess

import pytest

from research.tasks.factory import venvs
from research.tasks import testing
from research.tasks import sandbox
from research.tasks.factory import sources


def test_requirements_come_from_every_kind_of_metadata(tmp_path):
  repo = testing.write_repo(tmp_path / 'lib', {
      'lib/__init__.py': '',
      'pyproject.toml': '[project]\nname = "Lib"\ndependencies = ["attrs>=20", "lib[extra]"]\n'
                        '[project.optional-dependencies]\ntest = ["hypothesis", "lib[test]"]\n'
                        'docs = ["sphinx"]\n',
      'setup.cfg': '[options]\ninstall_requires =\n  six\n  old; python_version < "3"\n'
                   '[options.extras_require]\ntests = mock\n',
      'requirements-test.txt': '-r requirements/base.txt\nfreezegun==1.0  # pinned\n-e .\n',
      'requirements/base.txt': 'toolz\n',
      'tox.ini': '[testenv]\ndeps =\n  pytest<8\n  {toxinidir}/x\n  -rrequirements-test.txt\n'
                 '[testenv:docs]\ndeps = sphinx-rtd-theme\n',
      'noxfile.py': 'import nox\n\n@nox.session\ndef tests(session):\n'
                    '  session.install("-e", ".", "pytest-timeout==2.1")\n  session.run("pytest")\n\n'
                    '@nox.session\ndef lint(session):\n  session.install("flake8")\n'})
  profile = venvs.Profile.from_dict({'requirements': ['attrs==23.1.0', 'coverage==7.0']})
  # The profile's pins win, the repository itself and markers that do not hold are left out,
  # tox's `pytest<8` stands in for the default tool, and only test extras and sessions count.
  assert venvs.requirements(repo, profile) == (
      'attrs==23.1.0', 'coverage==7.0', 'freezegun==1.0', 'hypothesis', 'mock', 'pytest<8',
      'pytest-timeout==2.1', 'six', 'toolz')


def test_profiles_reject_unknown_keys_and_bare_strings():
  with pytest.raises(ValueError, match="unknown environment profile keys \\['pins'\\]"):
    venvs.Profile.from_dict({'pins': ['pytest==7.4.4']})
  with pytest.raises(ValueError, match='must be a list of strings'):
    venvs.Profile.from_dict({'requirements': 'pytest==7.4.4'})


def _wheelhouse(tmp_path):
  """numdep, and a dependency that vendors and installs copies of the fixture's package."""
  wheels = tmp_path / 'wheels'
  testing.write_wheel(wheels, 'numdep', '1.0', {'numdep.py': testing.NUMDEP})
  testing.write_wheel(wheels, 'vendorer', '2.0', {
      'vendorer/__init__.py': 'from vendorer._vendor import textops\n',
      'vendorer/_vendor/__init__.py': '',
      'vendorer/_vendor/textops/__init__.py': 'def slugify(text): return text\n',
      'textops/__init__.py': 'installed = True\n'})
  return wheels


def test_an_environment_is_built_offline_cached_read_only_and_without_copies(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  wheels = _wheelhouse(tmp_path)
  profile = venvs.Profile(requirements=('vendorer==2.0',), inherit_site_packages=True)
  spec = venvs.spec_for(fx.repo, ['textops'], profile, wheelhouse=str(wheels))
  assert spec.requirements == ('coverage', 'numdep', 'pytest', 'vendorer==2.0')
  env = venvs.build(spec, tmp_path / 'cache')
  manifest = env.manifest()
  assert manifest['id'] == spec.id == env.path.name
  assert manifest['removed'] == ['textops', 'vendorer/_vendor/textops']
  assert {'numdep==1.0', 'vendorer==2.0'} <= set(manifest['installed'])
  site = next(env.path.glob('lib/python3*/site-packages'))
  assert not (site / 'textops').exists() and not (site / 'vendorer/_vendor/textops').exists()
  assert not any(p.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
                 for p in [env.path, site / 'numdep.py'])
  # Its interpreter finds the dependency, and in the sandbox nothing of the base interpreter's
  # own site-packages.
  done = sandbox.run([env.python, '-I', '-c', 'import numdep, pytest; print(numdep.mean([1, 3]))'],
                     cwd='/', ro=sandbox.python_roots(env.python),
                     hide=sandbox.python_hidden(env.python))
  assert (done.returncode, done.output.strip()) == (0, '2.0')
  for hidden in sandbox.python_hidden(env.python):
    listed = sandbox.run(['/bin/ls', '-A', hidden], cwd='/', ro=sandbox.python_roots(env.python),
                         hide=[hidden])
    assert listed.returncode == 0 and listed.output == ''
  # The same spec again is the same directory, not a second build.
  (tmp_path / 'marker').write_text('')
  assert venvs.build(spec, tmp_path / 'cache') == env
  assert sorted(p.name for p in (tmp_path / 'cache').iterdir()) == [spec.id]


def test_a_failed_install_names_the_requirements(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  spec = venvs.spec_for(fx.repo, ['textops'], venvs.Profile(requirements=('nosuchthing==9',)),
                       wheelhouse=str(_wheelhouse(tmp_path)))
  with pytest.raises(RuntimeError, match="environment install failed for .*'nosuchthing==9'"):
    venvs.build(spec, tmp_path / 'cache')


def test_sources_are_parsed_fetched_and_listed(tmp_path):
  fx = testing.write_fixture(tmp_path / 'fx')
  sdist = tmp_path / 'textops-0.1.tar.gz'
  subprocess.run(['tar', 'czf', str(sdist), '-C', str(fx.repo.parent), fx.repo.name], check=True)
  listing = tmp_path / 'repos.txt'
  listing.write_text(f'# a comment\n{sdist}\n{fx.repo}  # the checkout\n'
                     'git+https://example.com/a/b.git@v1\nboltons==24.0.0\n')
  parsed = sources.read_list(listing)
  assert [s.key for s in parsed] == ['textops-0.1', 'repo', 'b-v1', 'boltons-24.0.0']
  tree = sources.fetch(parsed[0], tmp_path / 'cache')
  assert (tree / 'textops' / 'core.py').read_text() == (fx.repo / 'textops/core.py').read_text()
  assert sources.fetch(parsed[0], tmp_path / 'cache') == tree
  assert sources.fetch(parsed[1], tmp_path / 'cache') == fx.repo
  listing.write_text(f'{fx.repo}\n{fx.repo}\n')
  with pytest.raises(ValueError, match="repositories listed twice: \\['repo'\\]"):
    sources.read_list(listing)
  with pytest.raises(ValueError, match='not a NAME==VERSION, sdist, git URL or directory'):
    sources.fetch(sources.parse(str(tmp_path / 'missing')), tmp_path / 'cache')


def test_the_spec_hash_names_what_decides_the_contents():
  spec = venvs.Spec('/usr/bin/python3', '3.11', ('pytest',), ('m',), (), None)
  assert spec.id == venvs.Spec('/usr/bin/python3', '3.11', ('pytest',), ('m',), (), None).id
  assert spec.id != venvs.Spec('/usr/bin/python3', '3.11', ('pytest==7.4.4',), ('m',), (), None).id
  assert spec.id != venvs.Spec('/usr/bin/python3', '3.12', ('pytest',), ('m',), (), None).id
