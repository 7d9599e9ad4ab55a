import dataclasses
import json
import os
import subprocess
import sys

import pytest

from research.tasks import grading
from research.tasks import patch as patch_lib
from research.tasks import task as task_lib
from research.tasks.task import Task


def _task(**overrides):
  fields = dict(id='t', repo='r', file='pkg/mod.py', symbol='f', mode='body', fail_to_pass=[],
                pass_to_pass=[], test_files=['tests/test_mod.py'], test_command=[],
                protected_paths=['tests/test_mod.py', 'README.md', 'pyproject.toml'],
                packages=['pkg'], python_path=[''], site_dirs=[], config_file=None,
                time_limit_s=30.0, cpu_limit_s=10, tree='trees/t', grading_tree='trees/t',
                visible_tests=True, twin_sites=[], max_twins=4, python=sys.executable,
                venv=None, lines_deleted=1, covering_tests=1, cyclomatic=1, sealed=[], calls=[],
                original=None)
  return Task(**{**fields, **overrides})


def test_records_of_earlier_versions_are_upgraded_and_unknown_fields_named():
  record = dataclasses.asdict(_task(sealed=['tests/test_mod.py::test_a@0']))
  assert task_lib.decode(json.dumps(record)) == _task(sealed=['tests/test_mod.py::test_a@0'])
  # Made before sealing and differential checks, and before `environment` was `venv`.
  for old in ('sealed', 'calls', 'original'):
    del record[old]
  record['environment'] = record.pop('venv')
  upgraded = task_lib.decode(json.dumps(record))
  assert upgraded.sealed == [] and upgraded.calls == [] and upgraded.original is None
  with pytest.raises(ValueError, match=r"unknown fields \['colour'\]"):
    task_lib.decode(json.dumps({**record, 'colour': 'red'}))


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
  with pytest.raises(patch_lib.PatchError, match='text before the first file section'):
    patch_lib.parse('hello\nworld\n')
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n'})
  bad = patch_lib.parse(patch_lib.file_diff('pkg/mod.py', (b'zzz\n', '100644'),
                                            (b'b\n', '100644')))
  with pytest.raises(patch_lib.PatchError, match='does not apply'):
    patch_lib.apply(tree, bad)



ALLOWED = ('diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n'
           '@@ -1 +1 @@\n-a\n+b\n')
TEST_HUNK = '@@ -1 +1 @@\n-t\n+def test_nothing(): pass\n'
# What can follow an allowed hunk in a patch that smuggles a change to a protected file.
SMUGGLED = {
    'plain section': f'--- a/tests/test_mod.py\n+++ b/tests/test_mod.py\n{TEST_HUNK}',
    'section without ---': f'+++ b/tests/test_mod.py\n{TEST_HUNK}',
    'mode line': 'old mode 100644\nnew mode 100755\n',
    'rename': 'similarity index 90%\nrename from tests/test_mod.py\nrename to pkg/t.py\n',
    'binary': 'GIT binary patch\nliteral 2\nJcmZ?d00001\n\nliteral 0\nHcmV?d00001\n\n',
    'bare header': f'diff tests/test_mod.py\n{TEST_HUNK}',
    'trailing garbage': 'thanks!\n',
    'trailing blank line': '\n',
}


@pytest.mark.parametrize('name', SMUGGLED)
def test_text_after_an_allowed_hunk_is_an_error(name):
  with pytest.raises(patch_lib.PatchError, match='not part of a file section'):
    patch_lib.parse(ALLOWED + SMUGGLED[name])


def test_a_smuggled_section_is_real_to_git_and_named_smuggling(tmp_path):
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n', 'tests/test_mod.py': 't\n'})
  smuggled = ALLOWED + SMUGGLED['plain section']
  numstat = subprocess.run(['git', 'apply', '--numstat', '-'], cwd=tree, input=smuggled,
                           capture_output=True, text=True, check=True).stdout
  assert 'tests/test_mod.py' in numstat  # git would apply it.
  with pytest.raises(patch_lib.SmuggledSection):
    patch_lib.parse(smuggled)
  # Even if a parser let it through inside an allowed section, git's reading would not match.
  section = patch_lib.parse(ALLOWED)[0]
  hidden = patch_lib.FileSection(section.old_path, section.new_path, smuggled, False,
                                 frozenset(), 1, 1)
  assert patch_lib.misreadings(tree, [section]) == []
  assert 'tests/test_mod.py' in patch_lib.misreadings(tree, [hidden])[0]


@pytest.mark.parametrize('hunk,error', [
    ('@@ -1,2 +1,2 @@\n-a\n+b\n', 'shorter than its header'),
    ('@@ -1 +1 @@\n-a\n-a\n+b\n', 'shorter than its header'),
    ('@@ -1 +1 @@\n-a\n+b\n+c\n', 'not part of a file section'),
    ('@@ -1 +1 @@\n\\ No newline at end of file\n-a\n+b\n', 'shorter than its header'),
    ('@@ -1 +1 @@\n-a\n\\ Hello\n+b\n', 'unknown marker'),
    ('@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n\\ No newline at end of file\n',
     'not part of a file section'),
    ('@@ -1 +1 @\n-a\n+b\n', 'malformed hunk header'),
    ('@@ -1 +1 @@\n-a\n\n', 'shorter than its header'),
    ('', 'without hunks'),
])
def test_hunks_must_be_as_long_as_their_headers_say(hunk, error):
  with pytest.raises(patch_lib.PatchError, match=error):
    patch_lib.parse('diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n'
                    + hunk)


@pytest.mark.parametrize('patch,error', [
    (ALLOWED[:-1], 'does not end with a newline'),
    (ALLOWED.replace('\n', '\r\n', 1), 'control character in header'),
    (ALLOWED.replace('+++ b/pkg/mod.py', '+++ b/tests/test_mod.py'), 'disagree'),
    (ALLOWED.replace('b/pkg/mod.py\n', 'b/tests/test_mod.py\n', 1), 'without a rename'),
    (ALLOWED.replace('--- a/', '--- "a/'), 'quoted path'),
    ('diff --git a/pkg/mod.py b/pkg/mod.py\nold mode 100644\nold mode 100755\n', 'twice'),
    ('diff --git a/x.py b/y.py\nrename from tests/test_mod.py\nrename to y.py\n', 'disagree'),
])
def test_headers_must_agree_and_be_well_formed(patch, error):
  with pytest.raises(patch_lib.PatchError, match=error):
    patch_lib.parse(patch)


def test_crlf_content_round_trips_and_no_newline_marker_counts_nothing(tmp_path):
  old = _tree(tmp_path / 'old', {'pkg/mod.py': 'a\r\nb\r\n', 'pkg/last.py': 'x'})
  new = _tree(tmp_path / 'new', {'pkg/mod.py': 'a\r\nc\r\n', 'pkg/last.py': 'y'})
  sections = patch_lib.parse(patch_lib.diff_trees(old, new))
  assert [(s.added, s.deleted) for s in sections] == [(1, 1), (1, 1)]
  assert patch_lib.misreadings(old, sections) == []
  patch_lib.apply(old, sections)
  assert (old / 'pkg/mod.py').read_bytes() == b'a\r\nc\r\n'
  assert (old / 'pkg/last.py').read_text() == 'y'


def test_plain_unified_diffs_with_timestamps_are_read(tmp_path):
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n'})
  plain = ('--- a/pkg/mod.py\t2026-01-01 00:00:00\n+++ b/pkg/mod.py\t2026-01-02 00:00:00\n'
           '@@ -1 +1 @@\n-a\n+b\n')
  sections = patch_lib.parse(plain)
  assert [(s.old_path, s.new_path) for s in sections] == [('pkg/mod.py', 'pkg/mod.py')]
  assert patch_lib.misreadings(tree, sections) == []
  with pytest.raises(patch_lib.SmuggledSection):
    patch_lib.parse(plain + 'diff --git a/tests/t.py b/tests/t.py\n')


def test_mode_rename_and_binary_sections_are_read_with_their_paths():
  patch = ('diff --git a/pkg/a.py b/pkg/b.py\nsimilarity index 100%\nrename from pkg/a.py\n'
           'rename to pkg/b.py\n'
           'diff --git a/pkg/x.py b/pkg/x.py\nold mode 100644\nnew mode 100755\n'
           'diff --git a/pkg/e.py b/pkg/e.py\nnew file mode 100644\nindex 0000000..e69de29\n'
           'diff --git a/pkg/d.bin b/pkg/d.bin\nnew file mode 100644\nindex 0000000..1234567\n'
           'GIT binary patch\nliteral 2\nJcmZ?d00001\n\nliteral 0\nHcmV?d00001\n\n')
  sections = patch_lib.parse(patch)
  assert [(s.old_path, s.new_path, s.binary) for s in sections] == [
      ('pkg/a.py', 'pkg/b.py', False), ('pkg/x.py', 'pkg/x.py', False),
      (None, 'pkg/e.py', False), (None, 'pkg/d.bin', True)]
  assert sections[1].modes == {'100644', '100755'}
  assert ''.join(s.text for s in sections) == patch


def test_tree_comparison_flags_what_a_misread_patch_changed(tmp_path, monkeypatch):
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n', 'tests/test_mod.py': 't\n'})
  section = patch_lib.parse(ALLOWED)[0]
  hidden = patch_lib.FileSection(section.old_path, section.new_path,
                                 ALLOWED + SMUGGLED['plain section'], False, frozenset(), 1, 1)
  error, flags = grading.apply_checked(tree, [hidden], _task())
  assert error and 'tests/test_mod.py' in flags[0]
  # With the git cross-check switched off, the tree comparison still sees the change.
  monkeypatch.setattr(patch_lib, 'misreadings', lambda *_: [])
  error, flags = grading.apply_checked(tree, [hidden], _task())
  assert error is None and flags == [
      'patch changed tests/test_mod.py: protected path changed: tests/test_mod.py',
      'patch changed tests/test_mod.py, which it does not name']


def test_a_path_git_refuses_is_tampering(tmp_path):
  tree = _tree(tmp_path / 't', {'pkg/mod.py': 'a\n', 'elsewhere/x': 'x\n'})
  os.symlink('../elsewhere', tree / 'pkg/sub')
  sections = patch_lib.parse(patch_lib.file_diff('pkg/sub/evil.py', None, (b'x\n', '100644')))
  error, flags = grading.apply_checked(tree, sections, _task())
  assert 'beyond a symbolic link' in error and flags == [f'Path git refuses: {error}']
  assert not (tmp_path / 't/elsewhere/evil.py').exists()
