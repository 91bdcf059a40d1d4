"""Multi-process pieces of the runtime: EP x DP checks and launchers (the sharded model is models/*/parallel.py)."""
