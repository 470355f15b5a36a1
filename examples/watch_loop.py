"""The README's `starvecheck.watch` example, runnable: a loop whose dataset takes
2 ms a sample (a slow decode) and whose step takes about 10 ms, loading in the
training process (num_workers=0). The model runs on the GPU where torch sees one
(`--sync` then times each step to its end), else on the CPU.

    python examples/watch_loop.py [--workers N] [--sync]
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import starvecheck


class SlowDecode(Dataset):
    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)  # reading and decoding one sample: 2 ms
        return torch.randn(256)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--sync", action="store_true")
    a = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    # The five lines: wrap the loader, train as before.
    loader = DataLoader(SlowDecode(), batch_size=8, num_workers=a.workers)
    for batch in starvecheck.watch(loader, sync=a.sync):
        model(batch.to(device)).square().mean().backward()
        optimizer.step(), optimizer.zero_grad()
        time.sleep(0.008)  # the rest of a ~10 ms step


if __name__ == "__main__":
    main()
