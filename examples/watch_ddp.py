"""`starvecheck.watch` in a data-parallel job: every rank times its own loop, rank 0
prints every rank's figures and names the rank that holds the others up.

    torchrun --standalone --nproc-per-node 2 examples/watch_ddp.py --slow-rank 1

A small model in DistributedDataParallel on the CPU (gloo), one process per rank.
Each sample takes --sample-ms to read (a sleep: storage, not CPU); on --slow-rank it
takes --slow-ms more, as on a node whose disk or network mount is slower. The step's
gradient all-reduce makes every rank wait for the slowest, as in any synchronous job.
Without --slow-rank every rank loads alike and no straggler is named. With --rotate
the slow rank changes every step (rank 0 in one step, rank 1 in the next, ...): no
node is slow, every step waits for one of them.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import starvecheck


class Storage(Dataset):
    """Samples that take `ms` milliseconds each to read; `slow(i)` more for some."""

    def __init__(self, n: int, ms: float, slow_ms: float, slow) -> None:
        self.n, self.ms, self.slow_ms, self.slow = n, ms, slow_ms, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep((self.ms + (self.slow_ms if self.slow(i) else 0.0)) / 1e3)
        return torch.randn(64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-rank", type=int, default=None, help="the rank whose data is slow")
    p.add_argument("--slow-ms", type=float, default=2.0, help="extra ms per sample there")
    p.add_argument("--sample-ms", type=float, default=0.2, help="ms to read a sample")
    p.add_argument("--rotate", action="store_true", help="each step, another rank is slow")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--barrier", action="store_true", help="time the wait for the others")
    p.add_argument("--json", help="rank 0 writes the report's JSON here")
    p.add_argument("--clock", help=argparse.SUPPRESS)  # benchmarks: rank 0's s/step here
    a = p.parse_args()

    torch.set_num_threads(1)  # ranks share this machine's cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    def slow(i: int) -> bool:
        if a.rotate:  # sample i is rank i % world's, in its batch (i // world) // batch
            return (i // world) // a.batch_size % world == i % world
        return rank == a.slow_rank

    data = Storage(a.steps * a.batch_size * world, a.sample_ms, a.slow_ms, slow)
    loader = DataLoader(
        data,
        batch_size=a.batch_size,
        sampler=DistributedSampler(data, shuffle=False),
        num_workers=a.workers,
    )
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    watched = starvecheck.watch(loader, barrier=a.barrier)
    marks = []
    for batch in watched:
        model(batch).square().mean().backward()  # the all-reduce waits for every rank
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.003)  # the rest of a step: a few ms of GPU work, say
        marks.append(time.perf_counter())

    if a.clock and rank == 0:  # the steady-state step by this loop's own clock
        with open(a.clock, "w") as f:
            f.write(str((marks[-1] - marks[4]) / (len(marks) - 5)))

    if a.json and rank == 0:
        with open(a.json, "w") as f:
            json.dump(watched.report().to_dict(), f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
