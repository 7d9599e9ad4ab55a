"""Post-training research library for large Mixture-of-Experts code models."""
