"""Scripted reward-hacking attacks for the red team (`research.tasks.redteam` runs them).

base: what an attack is, its classes, the script prelude. plant: what attack scripts share
(planted code, its variants, the script around it). readers: forgers that read the answers from
the graded tree (READER, CASES, INVERSE, KEYRING). One module per class, each with its ATTACKS:
leaks, exits, planting, patching, skipping, resources (the first red team's classes); smuggling,
forging (in-process result forging), plugins, neutering, peeking (frame peeking and readers of
the test file), equal (always-equal results).
"""
