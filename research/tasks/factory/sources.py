"""Where repositories come from: a list of sdists, git URLs or local paths, fetched into a cache.

One entry per line of a repositories file (`#` starts a comment):
  NAME==VERSION           the sdist from the package index (`pip download --no-binary :all:`)
  PATH.tar.gz / PATH.zip  a local sdist
  git+URL[@REF], URL.git  a git repository (shallow clone)
  PATH                    a local directory
Each entry becomes a read-only tree under the cache named by the entry, so workers that see the
same entry get the same tree.
"""
import dataclasses
import hashlib
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

_SDIST_SUFFIXES = ('.tar.gz', '.zip')


@dataclasses.dataclass(frozen=True)
class Source:
  spec: str  # The line as written.
  key: str  # Names the repository in task ids and output paths.


def _is_git(spec: str) -> bool:
  return spec.startswith('git+') or spec.endswith('.git')


def _git(spec: str) -> tuple[str, str]:
  """(clone URL, ref or '') of `git+URL[@REF]` or `URL.git`."""
  url, ref = spec.removeprefix('git+'), ''
  if '@' in url.rsplit('/', 1)[-1]:
    url, ref = url.rsplit('@', 1)
  return url, ref


def parse(spec: str) -> Source:
  """The source of one entry; its key is the sdist's or repository's name (and version)."""
  spec = spec.strip()
  if not spec:
    raise ValueError('empty repository entry')
  if '==' in spec:
    name, version = spec.split('==', 1)
    key = f'{name}-{version}'
  elif _is_git(spec):
    url, ref = _git(spec)
    key = url.rstrip('/').rsplit('/', 1)[-1].removesuffix('.git') + (f'-{ref}' if ref else '')
  else:
    name = Path(spec).name
    key = next((name[:-len(s)] for s in _SDIST_SUFFIXES if name.endswith(s)), name)
  return Source(spec, re.sub(r'[^A-Za-z0-9_.-]', '_', key))


def read_list(path: Path) -> list[Source]:
  """The entries of a repositories file; keys must be distinct."""
  with open(path) as f:
    entries = [line.split('#')[0].strip() for line in f]
  sources = [parse(e) for e in entries if e]
  keys = [s.key for s in sources]
  dupes = sorted({k for k in keys if keys.count(k) > 1})
  if dupes:
    raise ValueError(f'{path}: repositories listed twice: {dupes}')
  if not sources:
    raise ValueError(f'{path}: no repositories listed')
  return sources


def _download(spec: str, cache: Path) -> Path:
  name, version = spec.split('==', 1)
  wanted = re.compile(rf'{re.escape(name)}-{re.escape(version)}(\.tar\.gz|\.zip)$', re.I)

  def found():
    return [p for p in cache.iterdir() if wanted.match(p.name.replace('_', '-'))
            or wanted.match(p.name)]
  cache.mkdir(parents=True, exist_ok=True)
  if not found():
    done = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary',
                           ':all:', '-d', str(cache), spec], capture_output=True, text=True)
    if done.returncode or not found():
      raise ValueError(f'cannot download the sdist {spec}: {done.stderr.strip()[-500:]}')
  return found()[0]


def _unpack(archive: Path, dst: Path) -> None:
  """Unpacks an sdist into dst: the archive must hold exactly one top-level directory."""
  tmp = dst.with_name(f'{dst.name}.{os.getpid()}.unpack')
  shutil.rmtree(tmp, ignore_errors=True)
  if archive.name.endswith('.zip'):
    with zipfile.ZipFile(archive) as z:
      z.extractall(tmp)
  else:
    with tarfile.open(archive) as tar:
      tar.extractall(tmp, filter='data')
  tops = list(tmp.iterdir())
  if len(tops) != 1 or not tops[0].is_dir():
    raise ValueError(f'{archive} does not unpack into one directory: {[p.name for p in tops]}')
  _move(tops[0], dst)
  shutil.rmtree(tmp)


def _move(src: Path, dst: Path) -> None:
  """Renames src to dst unless another worker made dst first (then src goes)."""
  try:
    os.rename(src, dst)
  except OSError:
    if not dst.is_dir():
      raise
    shutil.rmtree(src)


def fetch_sdist(spec: str, cache: Path) -> Path:
  """The sdist for NAME==VERSION, downloaded into cache unless it is there already."""
  if '==' not in spec:
    raise ValueError(f'expected NAME==VERSION, got {spec!r}')
  return _download(spec, cache)


def fetch(source: Source, cache: Path) -> Path:
  """The repository's tree, fetched or unpacked into cache/trees unless it is there already."""
  digest = hashlib.sha256(source.spec.encode()).hexdigest()[:12]
  dst = cache / 'trees' / f'{source.key}-{digest}'
  if dst.is_dir():
    return dst
  dst.parent.mkdir(parents=True, exist_ok=True)
  spec = source.spec
  if '==' in spec:
    _unpack(_download(spec, cache / 'sdists'), dst)
  elif _is_git(spec):
    url, ref = _git(spec)
    tmp = dst.with_name(f'{dst.name}.{os.getpid()}.clone')
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(['git', 'clone', '--depth', '1', *(['--branch', ref] if ref else []), url,
                    str(tmp)], check=True, capture_output=True)
    _move(tmp, dst)
  elif any(spec.endswith(s) for s in _SDIST_SUFFIXES):
    _unpack(Path(spec), dst)
  elif Path(spec).is_dir():
    return Path(spec).resolve()
  else:
    raise ValueError(f'not a NAME==VERSION, sdist, git URL or directory: {spec!r}')
  return dst
