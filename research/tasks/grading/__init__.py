"""Grading: a solution's diff applied to the pristine tree, its tests run in a fresh sandbox, one
reward rule (`reward`). Modules, in the order grading uses them:

  policy.py      which diff sections apply; trying the others is tampering
  tamper.py      static scan of the applied source for constructs that only fool a grader
  testsource.py  test modules as source: locating tests, asserts, parametrize cases; edits
  twins.py       mutant twins of the required tests, and checked tests
  seal.py        sealed asserts: expected values kept outside the sandbox (the harness half)
  isolation.py   required tests that run alone, and their trees
  testrun.py     one pytest run in the sandbox, its report read and cross-checked
  grader.py      the steps of one grading -> Grade
  reward.py      Grade and `reward(grade)`: the reward table
  pool.py        graders in parallel, one uid per slot
  sandboxed/     what runs beside the candidate's code (the trust boundary)
"""
from research.tasks.grading.grader import Planted, grade, limits_for, plant_checks, restored
from research.tasks.grading.policy import apply_checked, filter_sections
from research.tasks.grading.pool import GraderPool, Job
from research.tasks.grading.reward import Grade, reward
from research.tasks.grading.testrun import PASSED, TestRun, cross_check, merged, read_report
from research.tasks.grading.testrun import run_pytest
