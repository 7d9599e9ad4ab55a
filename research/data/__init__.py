"""Data: the synthetic corpus and packed batches."""
