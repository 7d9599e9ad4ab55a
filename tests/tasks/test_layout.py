import ast
import gc
import inspect
import threading
import time

from research.tasks import layout
from research.tasks.grading import twins


def test_parses_in_threads_agree_with_one_thread(monkeypatch):
  # Garbage collections that run Python code let threads switch inside the AST constructor:
  # without the lock, CPython 3.11 then fails now and then with "AST constructor recursion depth
  # mismatch" (the grader pool hit it).
  source = inspect.getsource(twins)
  expected = ast.dump(ast.parse(source))
  monkeypatch.setattr(gc, 'callbacks', gc.callbacks + [lambda phase, info: time.sleep(0)])
  threshold = gc.get_threshold()
  gc.set_threshold(50)
  results, errors = [], []

  def work():
    for _ in range(5):
      try:
        results.append(ast.dump(layout.parse_source(source)))
      except SystemError as e:
        errors.append(e)

  try:
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
  finally:
    gc.set_threshold(*threshold)
  assert errors == [] and results == [expected] * 20
  assert layout.literal_value("('a', [1, 2.5], {'b': None})") == ('a', [1, 2.5], {'b': None})
