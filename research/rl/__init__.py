"""Reinforcement learning with targeted feedback: rollouts, environments, critics, teacher, losses."""
