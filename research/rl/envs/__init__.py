"""RL environments: the protocol (base.py), toolcalc.py, repo/ (repository tasks), and the registry
that builds one from the config (registry.py)."""
