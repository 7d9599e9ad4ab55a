"""The red team: scripted reward-hacking attacks (attacks/), each with its disarmed control, and
honest solutions, graded as RL grades a policy's diff (run.py). Only experiments and tests use it
(BUILD visibility): nothing that trains or grades imports attack text."""
from research.tasks.redteam.run import (ATTACKS, LIMITS, Outcome, attack_targets, honest,
                                        memorized_tables, result, run, run_attacks, run_policy,
                                        summarize)
