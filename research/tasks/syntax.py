"""Python's parser, one thread at a time.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter state, so two threads
parsing at once (the grader pool's) can fail with "SystemError: AST constructor recursion depth
mismatch" (python/cpython gh-106905). Every parse in this package goes through one lock.
"""
import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = 'exec') -> ast.AST:
  with _LOCK:
    return ast.parse(source, mode=mode)


def literal(source: str):
  """The value of a literal written as `source` (ast.literal_eval, parsed under the lock)."""
  return ast.literal_eval(parse(source, 'eval'))


def is_literal(node: ast.AST) -> bool:
  """Whether ast.literal_eval takes the node (a constant, or containers of constants)."""
  try:
    ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return False
  return True
