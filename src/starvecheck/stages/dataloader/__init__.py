"""Every torch DataLoader starvecheck runs: batches within a time limit (batches.py),
what each worker runs first and how workers are stopped (workers.py), and the
open-file and /dev/shm checks before any worker starts (preflight.py)."""
