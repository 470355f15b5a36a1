"""Pipelines built so that one stage of loading dominates the wait (issue 57;
benchmarks/stage_split.py): each a FUNC that `starvecheck loader --factory` reads and a
loop can iterate, with the settings a job would start from. Keyword arguments are the
DataLoader settings a fix changes.

  read       __getitem__ sleeps 15 ms a sample (a network read: no CPU); 2 workers
  transform  __getitem__ does 4 ms of pure-Python work a sample (a tokenizer); in the
             training process (num_workers=0)
  collate    the samples are ready; collate_fn does 25 ms of pure-Python work a batch;
             num_workers=0
  handover   each item is a whole batch, a fresh 64 MB float32 tensor made by one copy
             (batch_size=None); 2 workers hand them over
  startup    a dataset that carries 200 MB (a table read in __init__), 16 batches an
             epoch of 2 ms samples, 2 workers started under forkserver each epoch
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

WORDS = [f"w{i}" for i in range(2000)]
VOCAB = {w: i for i, w in enumerate(WORDS)}
_TEXT = " ".join(random.Random(0).choice(WORDS) for _ in range(200))
_ROUND_S: list[float] = []
ROUND_ENV = "STAGES_ROUND_S"
# Where the benchmark names a file, every call of python_work, in any process, appends
# its rounds and their CPU seconds: the machine's speed at the work while a loop ran
# (this machine's runs it at two speeds, in episodes of seconds: docs/performance.md).
SPEED_ENV = "STAGES_SPEED_FILE"
SIZING_READINGS = 10
_SPEED_FD: list[int] = []


def round_s() -> float:
    """One round's CPU seconds: STAGES_ROUND_S where the benchmark sized it (so that the
    loop, its workers and `loader --factory` in another process do the same work a
    batch), else sized here once, after a warm-up (a cold first round runs slower): the
    fastest of SIZING_READINGS readings spread over about a second, the machine's speed
    outside its slow episodes (one reading taken in one made a "25 ms" collate 17 ms)."""
    if not _ROUND_S:
        given = os.environ.get(ROUND_ENV, "")
        if given:
            _ROUND_S.append(float(given))
        else:
            for _ in range(100):
                _tokenize()
            readings = []
            for _ in range(SIZING_READINGS):
                start = time.thread_time()
                for _ in range(80):
                    _tokenize()
                readings.append((time.thread_time() - start) / 80)
                time.sleep(0.1)
            _ROUND_S.append(max(min(readings), 1e-6))
    return _ROUND_S[0]


def python_work(ms: float) -> None:
    """About `ms` of pure-Python CPU work (a word-level tokenizer): a fixed number of
    rounds, the same in every process of one benchmark run (round_s)."""
    rounds = max(1, round(ms / 1e3 / round_s()))
    began = time.thread_time()
    for _ in range(rounds):
        _tokenize()
    _record(rounds, time.thread_time() - began)


def _record(rounds: int, cpu_s: float) -> None:
    path = os.environ.get(SPEED_ENV, "")
    if not path:
        return
    if not _SPEED_FD:  # a forked worker shares its parent's: appends stay whole lines
        _SPEED_FD.append(os.open(path, os.O_WRONLY | os.O_APPEND))
    os.write(_SPEED_FD[0], f"{rounds} {cpu_s:.6f}\n".encode())


def speed(path: str, offset: int) -> float | None:
    """µs of CPU a round of python_work in the lines appended since byte `offset`; None
    where there were none."""
    with open(path, "rb") as f:
        f.seek(offset)
        lines = f.read().split(b"\n")
    whole = [line.split() for line in lines if line.count(b" ") == 1]
    rounds = sum(int(r) for r, _ in whole)
    return sum(float(c) for _, c in whole) / rounds * 1e6 if rounds else None


def _tokenize() -> list[int]:
    ids = [VOCAB.get(w, 0) for w in _TEXT.split()]
    return [(i * 31 + 7) % 50021 for i in ids]


class Sized(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Reads(Sized):
    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.015)
        return torch.zeros(64)


class Tokenizes(Sized):
    def __getitem__(self, i: int) -> torch.Tensor:
        python_work(4.0)
        return torch.zeros(64)


class Ready(Sized):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(64)


def heavy_collate(samples: list[torch.Tensor]) -> torch.Tensor:
    python_work(25.0)
    return default_collate(samples)


_BASE: list[torch.Tensor] = []


class WholeBatches(Sized):
    """Each item a batch of 64 MB, made by copying a ready tensor."""

    def __getitem__(self, i: int) -> torch.Tensor:
        if not _BASE:
            _BASE.append(torch.randn(16, 1024, 1024))
        return _BASE[0].clone()


class Carries(Sized):
    """A dataset holding 200 MB (a lookup table read in __init__): every worker a
    forkserver or spawn context starts unpickles it."""

    def __init__(self, n: int, nbytes: int = 200 << 20) -> None:
        super().__init__(n)
        self.table = bytes(nbytes)

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.zeros(64)


def read(**fix: Any) -> DataLoader:
    return DataLoader(Reads(4096), **{"batch_size": 4, "num_workers": 2, **fix})


def transform(**fix: Any) -> DataLoader:
    return DataLoader(Tokenizes(4096), **{"batch_size": 8, "num_workers": 0, **fix})


def collate(**fix: Any) -> DataLoader:
    settings = {"batch_size": 8, "num_workers": 0, "collate_fn": heavy_collate, **fix}
    return DataLoader(Ready(4096), **settings)


def handover(**fix: Any) -> DataLoader:
    return DataLoader(WholeBatches(4096), **{"batch_size": None, "num_workers": 2, **fix})


def startup(**fix: Any) -> DataLoader:
    settings = {"batch_size": 4, "num_workers": 2, "multiprocessing_context": "forkserver"}
    return DataLoader(Carries(64), **{**settings, **fix})
