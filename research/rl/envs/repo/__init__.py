"""repo: restore code deleted from a repository, with editor and shell tools, graded by its tests.

  settings.py  env.repo, the config section
  calls.py     the tools' signatures and the call syntax (ChatML, Kimi)
  tools.py     the file tools inside the work area
  env.py       RepoEnv and its episodes (the shell tool in the sandbox, grading at the end)
  rules.py     the critic rules that read its episodes' info
  oracle.py    the task's solution delivered through the tools (demonstrations, checks)
  code_tokenizer/  a BPE for these episodes (`env.tokenizer`; experiments/code_tokenizer.py made it)
"""
import os

CODE_TOKENIZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'code_tokenizer')
