"""Optimizers: sharded Muon (muon.py) with its NS, exchange, plan and QK-clip modules."""
