#!/bin/sh
# The interpreter of every py_binary / py_test: the project's .venv. A py_test's main file
# (test_*.py, plain pytest functions) runs under pytest, so BUILD files need no test runner.
py="${RESEARCH_VENV:?set RESEARCH_VENV to the project .venv (make bazel-test does)}/bin/python"
case "$1" in
  */test_*.py) exec "$py" -m pytest -q -p no:cacheprovider "$@" ;;
  *) exec "$py" "$@" ;;
esac
