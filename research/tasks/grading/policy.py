"""The diff policy: which sections of a solution's diff grading applies, and what trying the
others says (a protected path, a link, code outside the packages: tampering)."""
from pathlib import Path

from research.tasks import layout
from research.tasks import patch as patch_lib
from research.tasks.task import Task


def _judge(rel: str, modes: frozenset[str], binary: bool, task: Task,
           protected: set[str]) -> tuple[str, bool] | None:
  """Why a solution may not change `rel`, and whether trying is tampering; None if it may."""
  if not patch_lib.is_safe_path(rel):
    return f'path escapes the work area: {rel}', True
  if modes & {patch_lib.SYMLINK_MODE, patch_lib.GITLINK_MODE}:
    return f'link in diff: {rel}', True
  if binary:
    return f'binary file in diff: {rel}', False
  if (layout.is_test_path(rel) or layout.is_config_path(rel)
      or rel in protected and rel.endswith('.py')):
    return f'protected path changed: {rel}', True
  if Path(rel).name in layout.AUTOLOADED or rel.endswith('.pth'):
    return f'adds a file Python or pytest loads on its own: {rel}', True
  if not layout.is_editable(rel, task.packages):
    if rel.endswith('.py'):
      return f'adds code outside the packages (shadowing): {rel}', True
    return f'not a source file: {rel}', False
  return None


def filter_sections(sections: list[patch_lib.FileSection], task: Task
                    ) -> tuple[list[patch_lib.FileSection], list[str], list[str]]:
  """Keeps the sections that change Python source in the task's packages.

  Returns (kept, rejected reasons, tamper flags).
  """
  kept, rejected, flags = [], [], []
  protected = set(task.protected_paths)
  for section in sections:
    verdicts = [v for rel in section.paths
                if (v := _judge(rel, section.modes, section.binary, task, protected))]
    if not verdicts:
      kept.append(section)
      continue
    reason, tampering = verdicts[0]
    rejected.append(reason)
    if tampering:
      flags.append(reason)
  return kept, rejected, flags


def apply_checked(work: Path, kept: list[patch_lib.FileSection], task: Task
                  ) -> tuple[str | None, list[str]]:
  """Applies the kept sections to `work`; (why they did not apply or None, tamper flags).

  git must read the sections as the parser did, and the tree is compared file by file before
  and after: every path that changed must be one the patch names and the path policy allows.
  """
  flags = patch_lib.misreadings(work, kept)
  if flags:
    return 'git reads the patch otherwise than the grader', flags
  before = patch_lib.snapshot(work)
  try:
    patch_lib.apply(work, kept)
  except patch_lib.PatchError as e:
    return str(e), e.flags
  after = patch_lib.snapshot(work)
  named = {p for s in kept for p in s.paths}
  protected = set(task.protected_paths)
  for rel in sorted(before.keys() | after.keys()):
    if before.get(rel) == after.get(rel):
      continue
    modes = frozenset({after[rel][1]}) if rel in after else frozenset()
    if verdict := _judge(rel, modes, False, task, protected):
      flags.append(f'patch changed {rel}: {verdict[0]}')
    if rel not in named:
      flags.append(f'patch changed {rel}, which it does not name')
  return None, flags
