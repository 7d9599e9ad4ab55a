"""An environment per repository: a venv with the repository's own dependencies and test tools.

The requirements come from the repository's metadata (pyproject dependencies and test extras,
setup.cfg, requirements files, tox's default `deps`, noxfile test sessions' installs), overridden by a per-repository profile where
that is not enough (experiments/task_repos.py). The repository itself is never installed. The venv
is built without pip or setuptools, offline from a wheelhouse when one is given, into a directory
named by the hash of everything that decides its contents, then made read-only: a second build of
the same spec is a cache hit, and concurrent builders of one spec agree. Copies of the
repository's packages that dependencies bring along (vendored or installed) are removed, so the
policy, who can read the environment, does not find the deleted code there.
"""
import ast
import configparser
import dataclasses
import hashlib
import json
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import tomllib

from packaging import requirements as req_lib
from packaging import utils as pkg_utils

from research.tasks import layout

TEST_EXTRAS = ('test', 'tests', 'testing')
TOOLS = ('pytest', 'coverage')  # The factory's runner needs both inside the environment.
_REQUIREMENT_FILES = ('requirements.txt', 'requirements-test.txt', 'requirements-tests.txt',
                      'test-requirements.txt', 'test_requirements.txt', 'requirements/test.txt',
                      'requirements/tests.txt')
MANIFEST = 'environment.json'
# Bump when the build procedure changes what an environment holds.
_BUILD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Profile:
  """Per-repository choices where the metadata is not enough (SWE-smith keeps such profiles)."""
  requirements: tuple[str, ...] = ()  # Pins that replace what the metadata asks for by name.
  extras: tuple[str, ...] = TEST_EXTRAS  # Optional-dependency groups that hold test tools.
  # Makes the creating interpreter's site-packages visible (a .pth): tests and offline use.
  inherit_site_packages: bool = False

  @classmethod
  def from_dict(cls, d: dict) -> 'Profile':
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f'unknown environment profile keys {sorted(unknown)}')
    d = dict(d)
    for key in ('requirements', 'extras'):
      if key in d:
        if isinstance(d[key], str):
          raise ValueError(f'profile {key} must be a list of strings, got {d[key]!r}')
        d[key] = tuple(d[key])
    return cls(**d)


@dataclasses.dataclass(frozen=True)
class Spec:
  """Everything that decides an environment's contents; its hash names the environment."""
  python: str  # The interpreter the venv is made from.
  python_version: str
  requirements: tuple[str, ...]
  remove: tuple[str, ...]  # Top-level module names of the repository: copies are removed.
  inherit: tuple[str, ...]  # Site directories made visible through a .pth.
  wheelhouse: str | None  # Offline: install only from here.

  @property
  def id(self) -> str:
    data = json.dumps({**dataclasses.asdict(self), 'build': _BUILD_VERSION}, sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:20]


@dataclasses.dataclass(frozen=True)
class Env:
  id: str
  path: Path

  @property
  def python(self) -> str:
    return str(self.path / 'bin' / 'python')

  def manifest(self) -> dict:
    with open(self.path / MANIFEST) as f:
      return json.load(f)


def project_name(repo: Path) -> str | None:
  """The distribution name from pyproject.toml or setup.cfg, if either states it."""
  pyproject = repo / 'pyproject.toml'
  if pyproject.is_file():
    with open(pyproject, 'rb') as f:
      name = tomllib.load(f).get('project', {}).get('name')
    if name:
      return name
  cfg = _setup_cfg(repo)
  return cfg.get('metadata', 'name', fallback=None) if cfg else None


def _setup_cfg(repo: Path) -> configparser.ConfigParser | None:
  path = repo / 'setup.cfg'
  if not path.is_file():
    return None
  cfg = configparser.ConfigParser(interpolation=None)
  cfg.read(path)
  return cfg


def _lines(text: str) -> list[str]:
  return [line.strip() for line in text.splitlines() if line.strip()]


def _requirement_file(repo: Path, rel: str, seen: set[str]) -> list[str]:
  """Lines of a requirements file, following `-r` includes inside the repository."""
  path = (repo / rel).resolve()
  if rel in seen or not path.is_file() or not path.is_relative_to(repo.resolve()):
    return []
  seen.add(rel)
  out = []
  for line in _lines(path.read_text(errors='replace')):
    if line.startswith(('-r ', '--requirement ')):
      include = line.split(maxsplit=1)[1]
      out += _requirement_file(repo, (Path(rel).parent / include).as_posix(), seen)
    else:
      out.append(line)
  return out


def _tox_deps(repo: Path, seen: set[str]) -> list[str]:
  """The default [testenv] deps of tox.ini."""
  path = repo / 'tox.ini'
  if not path.is_file():
    return []
  cfg = configparser.ConfigParser(interpolation=None, strict=False)
  cfg.read(path)
  out = []
  for line in _lines(cfg.get('testenv', 'deps', fallback='')):
    if line.startswith('-r'):
      out += _requirement_file(repo, line[2:].strip(), seen)
    else:
      out.append(line)
  return out


def _nox_installs(repo: Path) -> list[str]:
  """Literal `session.install(...)` arguments in the test sessions (name has 'test') of
  noxfile.py, read without running it."""
  path = repo / 'noxfile.py'
  if not path.is_file():
    return []
  try:
    tree = layout.parse_source(path.read_text(errors='replace'))
  except SyntaxError:
    return []
  out = []
  for fn in tree.body:
    if isinstance(fn, ast.FunctionDef) and 'test' in fn.name:
      out += [arg.value for call in ast.walk(fn) if isinstance(call, ast.Call)
              and isinstance(call.func, ast.Attribute) and call.func.attr == 'install'
              for arg in call.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
  return out


def metadata_requirements(repo: Path, extras: tuple[str, ...] = TEST_EXTRAS) -> list[str]:
  """Raw requirement strings the repository's metadata asks for (runtime and tests)."""
  found = []
  pyproject = repo / 'pyproject.toml'
  if pyproject.is_file():
    with open(pyproject, 'rb') as f:
      data = tomllib.load(f)
    project = data.get('project', {})
    found += project.get('dependencies', [])
    for group in (project.get('optional-dependencies', {}), data.get('dependency-groups', {})):
      found += [r for extra in extras for r in group.get(extra, []) if isinstance(r, str)]
  cfg = _setup_cfg(repo)
  if cfg:
    found += _lines(cfg.get('options', 'install_requires', fallback=''))
    found += [r for extra in extras
              for r in _lines(cfg.get('options.extras_require', extra, fallback=''))]
  seen = set()
  for rel in _REQUIREMENT_FILES:
    found += _requirement_file(repo, rel, seen)
  return found + _tox_deps(repo, seen) + _nox_installs(repo)


def requirements(repo: Path, profile: Profile) -> tuple[str, ...]:
  """Requirements by canonical name: the metadata's, the profile's pins over them, plus TOOLS.

  Lines that are not plain requirements (paths, URLs, options, tox substitutions) and the
  repository's own distribution are left out.
  """
  own = {pkg_utils.canonicalize_name(n) for n in (project_name(repo), repo.name) if n}
  by_name = {}
  for raw in metadata_requirements(repo, profile.extras):
    if raw.startswith(('-', '.', '/')) or '{' in raw or '://' in raw:
      continue
    try:
      req = req_lib.Requirement(raw.split(' #')[0])
    except req_lib.InvalidRequirement:
      continue
    name = pkg_utils.canonicalize_name(req.name)
    if name not in own and (req.marker is None or req.marker.evaluate()):
      req.marker = None  # Evaluated here, with the interpreter the environment is made from.
      by_name.setdefault(name, str(req))
  for pin in profile.requirements:
    by_name[pkg_utils.canonicalize_name(req_lib.Requirement(pin).name)] = pin
  for tool in TOOLS:
    by_name.setdefault(tool, tool)
  return tuple(by_name[n] for n in sorted(by_name))


def spec_for(repo: Path, modules: list[str], profile: Profile, *, python: str = sys.executable,
             wheelhouse: str | None = None) -> Spec:
  """The environment spec of a repository whose top-level modules are `modules`."""
  version = subprocess.run([python, '-c', 'import sys; print(sys.version)'], check=True,
                           capture_output=True, text=True).stdout.strip()
  inherit = ()
  if profile.inherit_site_packages:
    inherit = tuple(json.loads(subprocess.run(
        [python, '-c', 'import json, site; print(json.dumps(site.getsitepackages()))'],
        check=True, capture_output=True, text=True).stdout))
  return Spec(os.path.realpath(python), version, requirements(repo, profile),
              tuple(sorted(modules)), inherit, wheelhouse and os.path.abspath(wheelhouse))


def _site_packages(prefix: Path) -> Path:
  found = sorted(prefix.glob('lib/python3*/site-packages'))
  if len(found) != 1:
    raise RuntimeError(f'expected one site-packages under {prefix}, found {found}')
  return found[0]


def remove_copies(site: Path, modules: tuple[str, ...]) -> list[str]:
  """Deletes every copy of `modules` under site (vendored ones too); returns what went."""
  names = set(modules)
  dist_names = {pkg_utils.canonicalize_name(m) for m in modules}
  gone = []
  for dirpath, dirnames, filenames in os.walk(site):
    for d in list(dirnames):
      dist = re.match(r'(.+?)-[^-]+\.(dist|egg)-info$', d)
      package = d in names and Path(dirpath, d, '__init__.py').exists()
      if package or (dist and pkg_utils.canonicalize_name(dist.group(1)) in dist_names):
        shutil.rmtree(Path(dirpath, d))
        dirnames.remove(d)
        gone.append(Path(dirpath, d).relative_to(site).as_posix())
    for f in filenames:
      if f.endswith('.py') and f[:-3] in names:
        os.unlink(Path(dirpath, f))
        gone.append(Path(dirpath, f).relative_to(site).as_posix())
  return sorted(gone)


def _install(spec: Spec, prefix: Path) -> None:
  subprocess.run([spec.python, '-m', 'venv', '--without-pip', str(prefix)], check=True,
                 capture_output=True)
  if spec.inherit:  # First, so that pip counts what it inherits as installed.
    (_site_packages(prefix) / '_inherited.pth').write_text(''.join(p + '\n' for p in spec.inherit))
  source = ['--no-index', '--find-links', spec.wheelhouse] if spec.wheelhouse else []
  done = subprocess.run(
      [sys.executable, '-m', 'pip', '--python', str(prefix / 'bin' / 'python'), 'install',
       '--no-input', '--disable-pip-version-check', '--no-compile', *source,
       *spec.requirements], capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f'environment install failed for {list(spec.requirements)}: '
                       f'{done.stderr.strip()[-800:]}')


def _freeze(prefix: Path) -> list[str]:
  code = ('import importlib.metadata as m, json; '
          'print(json.dumps(sorted(f"{d.name}=={d.version}" for d in m.distributions())))')
  return json.loads(subprocess.run([str(prefix / 'bin' / 'python'), '-I', '-c', code],
                                   check=True, capture_output=True, text=True).stdout)


def build(spec: Spec, cache: Path) -> Env:
  """The environment of spec, built into cache unless it is there; read-only once built."""
  cache.mkdir(parents=True, exist_ok=True)
  env = Env(spec.id, cache / spec.id)
  if (env.path / MANIFEST).is_file():
    return env
  tmp = cache / f'.{spec.id}.{os.getpid()}.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  _install(spec, tmp)
  removed = remove_copies(_site_packages(tmp), spec.remove)
  manifest = {'id': spec.id, 'spec': dataclasses.asdict(spec), 'removed': removed,
              'installed': _freeze(tmp)}
  with open(tmp / MANIFEST, 'w') as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
  subprocess.run(['chmod', '-R', 'a-w', str(tmp)], check=True)
  try:
    os.rename(tmp, env.path)
  except OSError:  # Another worker finished the same spec first: its copy is as good.
    subprocess.run(['chmod', '-R', 'u+w', str(tmp)], check=True)
    shutil.rmtree(tmp)
  return env
