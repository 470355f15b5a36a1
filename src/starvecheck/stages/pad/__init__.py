"""`pad`: the share of each step spent on padding under every batching strategy
(stage.py), the strategies themselves in numpy (packing.py)."""
