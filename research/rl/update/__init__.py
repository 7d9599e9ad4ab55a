"""The RL update: the objective, its losses and log-probs, the teacher pass on hinted contexts."""
