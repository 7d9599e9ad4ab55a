"""Metrics: metrics.jsonl, TensorBoard event files, console progress, FLOPs per token and MFU."""
