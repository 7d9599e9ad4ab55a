"""Tokenizers: one interface, a byte-level default, and chat rendering straight to token ids."""
