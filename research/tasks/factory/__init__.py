"""The task factory: "restore the deleted code" tasks from repositories with pytest suites.

  candidates.py  repository-level gates and the candidates (function x mode) tests execute
  deletion.py    what a deletion removes: a body, a function, a feature (symbol + helpers)
  scrub.py       the policy's tree rebuilt without artifacts; fingerprints; leak scans
  gates.py       the gates of one candidate -> a task and its solution, or a rejection
  make.py        one repository -> a task set (`make_tasks`)
  venvs.py       an interpreter environment per repository, cached
  sources.py     repository lists: sdists, git URLs, paths
  taskset.py     near duplicates, difficulty statistics, summary table and figure
  beam.py        the factory over many repositories as an Apache Beam pipeline
"""
from research.tasks.factory.candidates import Candidate, Prepared, Rejected, Settings, Summary
from research.tasks.factory.candidates import delete, list_candidates, prepare, stable_tests
from research.tasks.factory.gates import GATES, try_candidate, venv_leaks
from research.tasks.factory.make import make_tasks
