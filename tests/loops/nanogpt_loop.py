"""A nanoGPT-style training loop (the shape of karpathy/nanoGPT's train.py): no
DataLoader; each step `get_batch` opens a np.memmap of uint16 tokens (made by the
test), takes random blocks of it and stacks them, then a tiny transformer-free
language model steps (forward, cross-entropy, backward, AdamW). It times its own
`get_batch` with perf_counter and writes its totals to STATE after every step, as
attach_loop.py does (loopstate.write_state), so that attach's share is set beside the
loop's own.

    python nanogpt_loop.py TOKENS STATE [SECONDS]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from loopstate import write_state
from torch import nn
from torch.nn import functional as F

BLOCK = 32
BATCH = 64
VOCAB = 256


def get_batch(path: str) -> tuple[torch.Tensor, torch.Tensor]:
    # nanoGPT recreates the memmap every batch (to avoid a memory leak): so does this
    data = np.memmap(path, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
    x = torch.stack([torch.from_numpy(data[i : i + BLOCK].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + BLOCK].astype(np.int64)) for i in ix])
    return x, y


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.mlp = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, VOCAB))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.mlp(self.emb(x))
        return F.cross_entropy(logits.view(-1, VOCAB), y.view(-1))


def main() -> None:
    tokens, state = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    waited = total = 0.0
    steps = 0
    start = t = time.perf_counter()
    while time.perf_counter() - start < seconds:
        a = time.perf_counter()
        x, y = get_batch(tokens)
        b = time.perf_counter()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        now = time.perf_counter()
        waited += b - a
        total = now - t
        steps += 1
        write_state(state, waited, total, steps)


if __name__ == "__main__":
    main()
