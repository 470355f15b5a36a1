"""`profile`: a real training loop under torch.profiler: the stage, its data and its
figures (stage.py), and the profiled loop one scenario runs (loop.py)."""
