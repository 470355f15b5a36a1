"""A training loop attach is tried on (tests/test_attach.py, benchmarks/attach_*.py):
it times its own wait for data with perf_counter and writes, after every step, its
totals (seconds waiting, seconds in all, steps) to STATE, so that a reader takes the
loop's own share over any window.

    python attach_loop.py MODE STATE [SECONDS]

MODE: data (num_workers=0, CPU work in __getitem__ slower than the step), compute
(a step far longer than loading), cpu (2 workers burning CPU, each batch longer than
the step), io (2 workers blocked in sleep, as on slow storage), handover (2 workers
sending 32 MiB of numpy arrays a batch, pickled through the pipe), bursty (num_workers=0,
every 10th sample a 0.4 s read, a 40 ms step: the wait in runs), bursts (num_workers=0,
a 300-800 ms read every 3-9 samples, an 80 ms step: runs of different lengths;
WAIT_LOG=PATH logs each wait's wall-clock start and end), steady (a 10 ms
step, two light workers: attach's overhead), slow-rank (under torchrun with
gloo: rank 1 loads 4x slower; every step all-reduces), thread (data's loop run in a
thread named `train` while the main thread waits in join(), as Ray Train runs
`train_func`), exec (data's loop, which on SIGUSR1 execs into a Python without torch
that sleeps), epochs (one worker, not persistent, an epoch every second or so: each
epoch starts a new worker). `threads:N` and `children:N`: steady, in a process that
also holds N idle threads (blocked in Event.wait, beside torch's own) or N idle child
processes (forks of it, as many as a heavy job has: benchmarks/attach_overhead.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch
from loopstate import write_state
from torch.utils.data import DataLoader, Dataset


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


class Work(Dataset):
    def __init__(self, cpu_s: float = 0.0, sleep_s: float = 0.0, shape=(8,), n=1_000_000) -> None:
        self.cpu_s, self.sleep_s, self.shape, self.n = cpu_s, sleep_s, shape, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.cpu_s:
            spin(self.cpu_s)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.zeros(self.shape)


class Arrays(Dataset):
    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int):
        import numpy as np

        return np.ones(1 << 20, dtype=np.float32)  # 4 MiB


class Bursty(Dataset):
    """Every 10th sample a 0.4 s read (sleep), the others at once: the loop's wait comes
    as runs of one long wait, half the time in all with a 40 ms step."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        if i % 10 == 0:
            time.sleep(0.4)
        return torch.zeros(8)


class Bursts(Dataset):
    """A wait of 300-800 ms every 3 to 9 samples (both drawn, seeded), the others at
    once: with an 80 ms step about half the time waiting, in runs of different lengths
    (benchmarks/attach_intervals.py)."""

    def __init__(self) -> None:
        import random

        self.rng = random.Random(57)
        self.next = self.rng.randint(3, 9)

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> torch.Tensor:
        self.next -= 1
        if self.next <= 0:
            time.sleep(self.rng.uniform(0.3, 0.8))
            self.next = self.rng.randint(3, 9)
        return torch.zeros(8)


def keep(batch: list) -> list:
    return batch


def loader(mode: str, rank: int) -> tuple[DataLoader, float]:
    """(the DataLoader, the step's seconds)."""
    if mode in ("data", "thread", "exec"):
        return DataLoader(Work(cpu_s=0.004), batch_size=8, num_workers=0), 0.010
    if mode == "compute":
        # a 60 ms step: its wait (about 1%) clear of the 5% line within the interval
        # 500 samples give, so that "not input-bound" is a verdict, not "too few"
        return DataLoader(Work(cpu_s=0.00005), batch_size=8, num_workers=0), 0.060
    if mode == "cpu":
        return DataLoader(Work(cpu_s=0.006), batch_size=8, num_workers=2), 0.005
    if mode == "io":
        return DataLoader(Work(sleep_s=0.01), batch_size=8, num_workers=2), 0.010
    if mode == "handover":
        # numpy arrays through a collate that keeps them: pickled by value through the
        # pipe, unpickled by the training process (tensors would go by shared memory).
        return DataLoader(Arrays(), batch_size=8, num_workers=2, collate_fn=keep), 0.001
    if mode == "steady":  # attach's overhead: a 10 ms step, two light workers
        return DataLoader(Work(cpu_s=0.0002), batch_size=8, num_workers=2), 0.010
    if mode == "epochs":  # 8 batches of 8 at 15 ms a sample: about 1 s an epoch
        return DataLoader(Work(cpu_s=0.015, n=64), batch_size=8, num_workers=1), 0.010
    if mode == "bursty":  # every 10th sample a 0.4 s read: the wait comes in long runs
        return DataLoader(Bursty(), batch_size=1, num_workers=0), 0.040
    if mode == "bursts":  # 300-800 ms every 3-9 samples: long runs of different lengths
        return DataLoader(Bursts(), batch_size=1, num_workers=0), 0.080
    if mode == "slow-rank":
        cpu = 0.002 if rank == 1 else 0.0005
        return DataLoader(Work(cpu_s=cpu), batch_size=8, num_workers=0), 0.010
    raise SystemExit(f"no mode {mode}")


def idle_child() -> None:
    """A forked child that waits for ever, and dies with the loop however it ends (a
    parent-death signal: a loop killed with SIGKILL leaves none behind)."""
    import ctypes
    import signal
    import threading

    ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    threading.Event().wait()


def heavy(kind: str, n: int) -> list:
    """N idle threads or N idle forked children, kept for the loop's life."""
    import multiprocessing
    import threading

    if kind == "threads":
        held = [threading.Thread(target=threading.Event().wait, daemon=True) for _ in range(n)]
    else:
        ctx = multiprocessing.get_context("fork")
        held = [ctx.Process(target=idle_child, daemon=True) for _ in range(n)]
    for x in held:
        x.start()
    return held


def main() -> None:
    mode, state = sys.argv[1], sys.argv[2]
    kind, _, count = mode.partition(":")
    held = heavy(kind, int(count)) if kind in ("threads", "children") and count.isdigit() else []
    mode = "steady" if held or kind in ("threads", "children") else mode
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(1)
    if mode == "slow-rank":
        import torch.distributed as dist

        dist.init_process_group("gloo")
    dl, step_s = loader(mode, rank)
    path = f"{state}.{rank}" if mode == "slow-rank" else state
    if mode == "exec":
        import signal

        sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
        signal.signal(signal.SIGUSR1, lambda *_: os.execv(sys.executable, sleep))
    if mode == "thread":
        import threading

        t = threading.Thread(target=run, args=(mode, dl, step_s, path, seconds), name="train")
        t.start()
        t.join()
    else:
        run(mode, dl, step_s, path, seconds)


def run(mode: str, dl: DataLoader, step_s: float, path: str, seconds: float) -> None:
    # WAIT_LOG: each wait's start and end (wall clock, time.time()), a line each, so that
    # a reader takes the loop's own share over any seconds (benchmarks/attach_intervals.py)
    named = os.environ.get("WAIT_LOG")
    with open(named, "a", buffering=1) if named else contextlib.nullcontext() as log:
        _steps(mode, dl, step_s, path, seconds, log)


def _steps(mode: str, dl: DataLoader, step_s: float, path: str, seconds: float, log) -> None:
    waited = total = 0.0
    steps = 0
    wall = time.time() - time.perf_counter()
    start = time.perf_counter()
    it = iter(dl)
    next(it)  # workers started: the loop's clock starts here
    t = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(dl)
            batch = next(it)
        b = time.perf_counter()
        spin(step_s)
        if mode == "slow-rank":
            import torch.distributed as dist

            dist.all_reduce(torch.ones(1))
        del batch
        now = time.perf_counter()
        waited += b - a
        total = now - t
        steps += 1
        write_state(path, waited, total, steps)
        if log is not None:
            log.write(f"{wall + a:.6f} {wall + b:.6f}\n")


if __name__ == "__main__":
    main()
