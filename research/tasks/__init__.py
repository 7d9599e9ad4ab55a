"""Synthetic tasks from real repositories, and a grading sandbox that reward hacking cannot fool."""
