import os

import pytest

from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks.task import Task


def _task(**overrides):
  fields = dict(id='t', repo='r', file='pkg/mod.py', symbol='f', mode='body', fail_to_pass=[],
                pass_to_pass=[], test_files=['tests/test_mod.py'], test_command=[],
                protected_paths=['tests/test_mod.py', 'README.md', 'pyproject.toml'],
                packages=['pkg'], python_path=[''], site_dirs=[], config_file=None,
                time_limit_s=30.0, cpu_limit_s=10, tree='trees/t', grading_tree='trees/t',
                visible_tests=True, twin_sites=[], max_twins=4)
  return Task(**{**fields, **overrides})


def _tree(root, files):
  for rel, data in files.items():
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
  return root


def test_diff_trees_round_trips_through_git_apply(tmp_path):
  old = _tree(tmp_path / 'old', {'pkg/mod.py': 'a\nb\n', 'pkg/gone.py': 'x\n',
                                 'pkg/__pycache__/mod.cpython-311.pyc': b'\0junk'})
  new = _tree(tmp_path / 'new', {'pkg/mod.py': 'a\nc', 'pkg/added.py': 'y\n'})
  diff = patch_lib.diff_trees(old, new)
  assert '__pycache__' not in diff and '\\ No newline at end of file' in diff
  sections = patch_lib.parse(diff)
  assert [s.paths for s in sections] == [['pkg/added.py'], ['pkg/gone.py'], ['pkg/mod.py']]
  patch_lib.apply(old, sections)
  assert (old / 'pkg/mod.py').read_text() == 'a\nc'
  assert not (old / 'pkg/gone.py').exists() and (old / 'pkg/added.py').read_text() == 'y\n'


def test_filter_keeps_source_and_records_why_the_rest_was_dropped(tmp_path):
  old = _tree(tmp_path / 'old', {'pkg/mod.py': 'a\n', 'tests/test_mod.py': 't\n',
                                 'README.md': 'r\n'})
  new = _tree(tmp_path / 'new', {'pkg/mod.py': 'b\n', 'tests/test_mod.py': 'changed\n',
                                 'README.md': 'edited\n', 'pkg/data.bin': b'\0\1\2',
                                 'sitecustomize.py': 'x\n', 'json.py': 'x\n', 'pkg/x.pth': 'x\n'})
  os.symlink('/etc/passwd', new / 'pkg/link.py')
  diff = patch_lib.diff_trees(old, new)
  diff += patch_lib.file_diff('pkg/../../escape.py', None, (b'x\n', '100644'))
  kept, rejected, flags = grading.filter_sections(patch_lib.parse(diff), _task())
  assert [s.paths for s in kept] == [['pkg/mod.py']]
  assert 'binary file in diff: pkg/data.bin' in rejected
  assert 'not a source file: README.md' in rejected
  assert set(flags) == {
      'protected path changed: tests/test_mod.py', 'link in diff: pkg/link.py',
      'adds a file Python or pytest loads on its own: sitecustomize.py',
      'adds a file Python or pytest loads on its own: pkg/x.pth',
      'adds code outside the packages (shadowing): json.py',
      'path escapes the work area: pkg/../../escape.py'}


def test_malformed_and_non_applying_patches_are_errors(tmp_path):
  with pytest.raises(patch_lib.PatchError, match='no file sections'):
    patch_lib.parse('hello\nworld\n')
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n'})
  bad = patch_lib.parse(patch_lib.file_diff('pkg/mod.py', (b'zzz\n', '100644'),
                                            (b'b\n', '100644')))
  with pytest.raises(patch_lib.PatchError, match='does not apply'):
    patch_lib.apply(tree, bad)
