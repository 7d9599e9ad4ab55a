"""Rollouts: batched multi-turn sampling on the KV cache, and the trajectories it records."""
