"""Small repositories written by code, and tasks made from them, for tests, RL, the red team and
benchmarks.

`write_fixture` makes `repo/` (package `textops` with tests, a conftest and git history) and
`site/` (its dependency `numdep`, importable but outside the repository). With artifacts=True
the repository also carries everything that leaks code in real checkouts: bytecode, tool
caches, coverage HTML, build output, built docs, egg-info and an sdist.
"""
import base64
import compileall
import dataclasses
import hashlib
import html
import io
import json
from pathlib import Path
import shutil
import tarfile
import textwrap
import zipfile

from research.tasks import factory
from research.tasks.factory.scrub import git_commit_all

CORE = '''\
"""Text helpers."""
import contextlib
import functools
import re
import unicodedata

_SEPARATORS = re.compile(r'[^a-z0-9]+')
_HISTORY = []


def _fold(text):
  """Lower-cases text and strips accents."""
  decomposed = unicodedata.normalize('NFKD', text)
  ascii_only = decomposed.encode('ascii', 'ignore').decode('ascii')
  return ascii_only.lower()


def _squash(text, sep):
  """Joins the alphanumeric runs of text with sep."""
  pieces = [piece for piece in _SEPARATORS.split(text) if piece]
  return sep.join(pieces)


def slugify(text, sep='-'):
  """Turns text into a URL slug: 'Hello, World!' -> 'hello-world'."""
  folded = _fold(text)
  return _squash(folded, sep)


def title_case(text, small_words=('a', 'an', 'the', 'of', 'and')):
  """Capitalizes each word except small ones, but always the first word."""
  words = text.split()
  titled = []
  for position, word in enumerate(words):
    if position and word.lower() in small_words:
      titled.append(word.lower())
    else:
      titled.append(word[:1].upper() + word[1:].lower())
  return ' '.join(titled)


def wrap(text, width):
  """Greedy word wrap into lines of at most width characters."""
  lines, current = [], ''
  for word in text.split():
    candidate = f'{current} {word}' if current else word
    if len(candidate) <= width or not current:
      current = candidate
    else:
      lines.append(current)
      current = word
  if current:
    lines.append(current)
  return lines


wrap_narrow = functools.partial(wrap, width=20)


def _remember(text):
  """Keeps the last inputs for debugging; best effort."""
  _HISTORY.append(text)
  del _HISTORY[:-10]


def count_vowels(text):
  """Number of vowels (aeiou, any case)."""
  with contextlib.suppress(Exception):
    _remember(text)
  return sum(1 for letter in text.lower() if letter in 'aeiou')


def reverse_words(text):
  """Reverses the order of the words (no test exercises it)."""
  return ' '.join(reversed(text.split()))
'''

STATS = '''\
"""Word statistics."""
import collections

import numdep

from textops import core


def word_counts(text):
  """Counts words after slugifying them."""
  counts = collections.Counter()
  for word in text.split():
    slug = core.slugify(word)
    if slug:
      counts[slug] += 1
  return dict(counts)


def top_words(text, n=3):
  """The n most frequent words, ties broken alphabetically."""
  counts = word_counts(text)
  ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
  return [word for word, _ in ranked[:n]]


def mean_word_length(text):
  """Average word length, with numdep's mean."""
  words = text.split()
  return numdep.mean([len(word) for word in words]) if words else 0.0


class Histogram:
  """Word counts with a text rendering."""

  def __init__(self):
    self.counts = collections.Counter()

  def add(self, text):
    """Adds every word of text."""
    for word, count in word_counts(text).items():
      self.counts[word] += count
    return self

  def render(self, width=10):
    """One line per word, 'word | ####', bars scaled to width."""
    if not self.counts:
      return ''
    biggest = max(self.counts.values())
    rows = []
    for word, count in sorted(self.counts.items(), key=lambda item: (-item[1], item[0])):
      bar = '#' * numdep.clamp(round(width * count / biggest), 1, width)
      rows.append(f'{word} | {bar}')
    return '\\n'.join(rows)
'''

FILES = {
    'pyproject.toml': '[project]\nname = "textops"\nversion = "0.1"\ndependencies = ["numdep"]\n'
                      '\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n',
    'README.md': '# textops\n\nText helpers.\n',
    'textops/__init__.py': '"""Text helpers."""\nfrom textops import core, stats\n',
    'textops/core.py': CORE,
    'textops/stats.py': STATS,
    'tests/conftest.py': '''\
import pytest

import textops


@pytest.fixture
def sample_text():
  return 'the cat and the hat and the bat'
''',
    'tests/test_core.py': '''\
import pytest

from textops import core


@pytest.mark.parametrize('text, expected', [
    ('Hello, World!', 'hello-world'), ('  Creme brulee ', 'creme-brulee'),
    ('a--b__c', 'a-b-c'), ('\\u00c9t\\u00e9 2024', 'ete-2024')])
def test_slugify(text, expected):
  assert core.slugify(text) == expected


def test_slugify_separator():
  expected = 'hello_world'
  assert core.slugify('Hello World', sep='_') == expected


def test_title_case():
  assert core.title_case('the lord OF the rings') == 'The Lord of the Rings'


def test_title_case_is_stable():
  titled = core.title_case('a tale OF two cities')
  assert core.title_case(titled) == titled


def test_wrap():
  assert core.wrap('a bb ccc dddd', 6) == ['a bb', 'ccc', 'dddd']


def test_wrap_long_word():
  assert core.wrap('abcdefgh ij', 4) == ['abcdefgh', 'ij']


def test_count_vowels():
  assert core.count_vowels('Education') == 5
''',
    'tests/test_stats.py': '''\
import numdep

from textops import stats


def test_word_counts(sample_text):
  assert stats.word_counts(sample_text) == {'the': 3, 'cat': 1, 'and': 2, 'hat': 1, 'bat': 1}


def test_top_words(sample_text):
  assert sorted(stats.top_words(sample_text, 2)) == sorted(['the', 'and'])


def test_mean_word_length():
  assert stats.mean_word_length('ab abcd') == numdep.mean([2, 4])


def test_histogram_render(sample_text):
  rows = stats.Histogram().add(sample_text).render(width=6).splitlines()
  assert rows[:2] == ['the | ######', 'and | ####']


def test_histogram_empty():
  assert stats.Histogram().render() == ''
''',
}

NUMDEP = '''\
"""A tiny numeric dependency, importable but not part of the repository."""


def mean(values):
  return sum(values) / len(values)


def clamp(value, low, high):
  return max(low, min(high, value))
'''


@dataclasses.dataclass(frozen=True)
class Fixture:
  repo: Path
  site: Path  # Holds the dependency; pass as a site dir.


def _write(root: Path, files: dict[str, str]) -> None:
  for rel, text in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _write_artifacts(repo: Path) -> None:
  """Derived files that hold the code, as a developer's checkout accumulates them."""
  compileall.compile_dir(repo / 'textops', quiet=1)
  compileall.compile_dir(repo / 'tests', quiet=1)
  core = (repo / 'textops/core.py').read_text()
  rows = ''.join(f'<p class="pln">{html.escape(line)}</p>\n' for line in core.splitlines())
  _write(repo, {
      '.mypy_cache/3.11/textops/core.data.json': json.dumps({'source': core}),
      '.pytype/pyi/textops/core.pyi': core,
      '.pytest_cache/v/cache/nodeids': json.dumps(['tests/test_core.py::test_wrap']),
      '.pytest_cache/README.md': core,
      'htmlcov/z_textops_core_py.html': f'<html><body>{rows}</body></html>',
      'build/lib/textops/core.py': core,
      'docs/_build/html/_modules/textops/core.html': f'<pre>{html.escape(core)}</pre>',
      'textops.egg-info/SOURCES.txt': 'textops/core.py\ntextops/stats.py\n',
      '.coverage': core,
  })
  (repo / 'dist').mkdir()
  with tarfile.open(repo / 'dist/textops-0.1.tar.gz', 'w:gz') as tar:
    data = core.encode()
    info = tarfile.TarInfo('textops-0.1/textops/core.py')
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_fixture(root: Path, artifacts: bool = False) -> Fixture:
  """Writes the fixture under root (which must not exist or be empty)."""
  repo, site = root / 'repo', root / 'site'
  _write(repo, FILES)
  _write(site, {'numdep/__init__.py': NUMDEP})
  first = dict(FILES)
  first['textops/core.py'] = CORE.replace("'aeiou'", "'aeiouy'")
  git_commit_all(repo, 'textops 0.1')
  _write(repo, first)
  git_commit_all(repo, 'count y as a vowel')
  _write(repo, FILES)
  git_commit_all(repo, 'y is not a vowel')
  if artifacts:
    _write_artifacts(repo)
  return Fixture(repo, site)


def write_repo(root: Path, files: dict[str, str]) -> Path:
  """A repository with the given files (for bad-input cases); dedented."""
  _write(root, {rel: textwrap.dedent(text) for rel, text in files.items()})
  return root


def write_wheel(wheelhouse: Path, name: str, version: str, files: dict[str, str]) -> Path:
  """A pure-Python wheel of `files` (paths inside site-packages), as a build backend makes."""
  def record(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
    return f'{path},sha256={digest},{len(data)}'
  info = f'{name}-{version}.dist-info'
  files = {**files, f'{info}/METADATA': f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n',
           f'{info}/WHEEL': 'Wheel-Version: 1.0\nGenerator: fixtures\nRoot-Is-Purelib: true\n'
                            'Tag: py3-none-any\n'}
  wheelhouse.mkdir(parents=True, exist_ok=True)
  path = wheelhouse / f'{name}-{version}-py3-none-any.whl'
  with zipfile.ZipFile(path, 'w') as z:
    lines = []
    for rel, text in files.items():
      z.writestr(rel, text)
      lines.append(record(rel, text.encode()))
    z.writestr(f'{info}/RECORD', '\n'.join(lines + [f'{info}/RECORD,,']) + '\n')
  return path


def install_copy(fixture: Fixture, site: Path) -> None:
  """Puts a copy of the original package in a site dir, as `pip install` would."""
  shutil.copytree(fixture.repo / 'textops', site / 'textops')


# The fixture's functions the red team attacks and RL's default repository tasks come from.
TARGETS = ('slugify', 'title_case', 'top_words', 'mean_word_length')


def make_fixture_tasks(workdir: Path, only: tuple[str, ...] | None = TARGETS,
                       modes: tuple[str, ...] = ('body',), log=print, visible_tests: bool = False):
  """The fixture (with artifacts) and its tasks; returns (checkout, task dir, summary)."""
  fx = write_fixture(workdir / 'fixture', artifacts=True)
  out = workdir / 'tasks'
  summary = factory.make_tasks(fx.repo, out, modes=modes, only=only, site_dirs=(str(fx.site),),
                               progress=False, log=log, visible_tests=visible_tests)
  return fx.repo, out, summary


def sdist_tasks(sdist: Path, workdir: Path, max_tasks: int | None, log=print) -> Path:
  """Unpacks an sdist and makes tasks from it; returns the task dir."""
  if not sdist.name.endswith('.tar.gz'):
    raise ValueError(f'not an sdist (.tar.gz): {sdist}')
  root = workdir / sdist.name[:-len('.tar.gz')]
  with tarfile.open(sdist) as tar:
    tar.extractall(root, filter='data')
  tops = [p for p in root.iterdir() if p.is_dir()]
  if len(tops) != 1:
    raise ValueError(f'{sdist} does not unpack into one directory: {[p.name for p in tops]}')
  out = workdir / (root.name + '-tasks')
  summary = factory.make_tasks(tops[0], out, max_tasks=max_tasks, progress=False, log=log)
  if summary.repo_rejected:
    raise ValueError(f'the factory rejected {sdist}: {summary.repo_rejected}')
  return out
