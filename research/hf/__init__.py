"""Hugging Face checkpoints in and out: config.json mapping, weight layouts, streaming conversion."""
