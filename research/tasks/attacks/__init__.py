"""Scripted reward-hacking attacks for the red team (`research.tasks.redteam` runs them)."""
