"""Training: the pure step, optimizers from config, the loop."""
