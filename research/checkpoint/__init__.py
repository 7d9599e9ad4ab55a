"""Checkpointing: orbax CheckpointManager with data-iterator state and compatibility checks."""
