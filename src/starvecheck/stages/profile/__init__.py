"""`profile`: a real training loop under torch.profiler (stage.py)."""
