"""Data: grain pipelines (packing, per-host shards, checkpointable state), file readers, the synthetic corpus."""
