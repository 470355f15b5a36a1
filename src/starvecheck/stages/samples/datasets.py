"""The datasets `loader` and `profile` read: module level, so DataLoader workers can
receive them."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any

from starvecheck.stages.samples.reads import READ_FLAGS

SHARD_INDEX = struct.Struct("<Q")  # one little-endian u64 offset per sample, plus the end


def _pread_full(fd: int, buf: bytearray, offset: int) -> int:
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:  # the file shrank under us
            break
        got += n
    return got


def _tensor(buf: bytearray, got: int) -> Any:
    import torch

    if got == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buf, dtype=torch.uint8, count=got)


class FileSamples:
    """One file per sample, read whole (an ImageFolder-style dataset before decoding)."""

    def __init__(self, names: Sequence[str], dir_fd: int | None, flags: int = READ_FLAGS):
        self.names = list(names)
        self.dir_fd = dir_fd  # inherited by forked workers
        self.flags = flags

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> Any:
        fd = os.open(self.names[i], self.flags | os.O_NOFOLLOW, dir_fd=self.dir_fd)
        try:
            buf = bytearray(os.fstat(fd).st_size)
            got = _pread_full(fd, buf, 0)
        finally:
            os.close(fd)
        return _tensor(buf, got)


class ShardSamples:
    """Samples at offsets of one shard, found through its index. Each process opens the
    shard once, on its first sample, and reads with pread (no shared file offset)."""

    def __init__(self, name: str, dir_fd: int, index_name: str):
        self.name = name
        self.dir_fd = dir_fd
        fd = os.open(index_name, READ_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            raw = bytearray(os.fstat(fd).st_size)
            _pread_full(fd, raw, 0)
        finally:
            os.close(fd)
        self.offsets = [v for (v,) in SHARD_INDEX.iter_unpack(raw)]
        self._fd: int | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Any:
        if self._fd is None or self._pid != os.getpid():
            self._fd = os.open(self.name, READ_FLAGS | os.O_NOFOLLOW, dir_fd=self.dir_fd)
            self._pid = os.getpid()
        start, end = self.offsets[i], self.offsets[i + 1]
        buf = bytearray(end - start)
        return _tensor(buf, _pread_full(self._fd, buf, start))

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_pid": None}


class TextSamples:
    """Raw text at offsets of a shard, tokenized where it is read (in the DataLoader
    worker, or in the training process with num_workers=0): `profile`'s text layout,
    the tokenizer on the data path as in a loop that tokenizes on the fly. Token ids
    are cut or padded (with 0) to `seq_len`, modulo the model's vocabulary."""

    def __init__(self, shard: ShardSamples, tokenizer: Any, seq_len: int, vocab: int):
        self.shard = shard
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.vocab = vocab

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, i: int) -> Any:
        import torch

        text = self.shard[i].numpy().tobytes().decode("utf-8", errors="replace")
        ids = self.tokenizer(
            text, truncation=True, max_length=self.seq_len, add_special_tokens=False
        )["input_ids"]
        ids = [t % self.vocab for t in ids] + [0] * (self.seq_len - len(ids))
        return torch.tensor(ids, dtype=torch.int64)

    def close(self) -> None:
        self.shard.close()


def stack_tokens(batch: list[Any]) -> Any:
    """Token tensors of one length -> [batch, seq_len] (default_collate's stack, without
    its type dispatch)."""
    import torch

    return torch.stack(batch)


def collate_flat(batch: list[Any]) -> tuple[Any, Any]:
    """Samples of different sizes (a user's files) cannot be stacked: one flat tensor of
    their bytes and a tensor of their lengths. In a worker the bytes go straight into
    shared memory, one block per batch, as default_collate's stack does for samples
    of one size (a list of tensors would cost a shared-memory block per sample)."""
    import torch

    out = None
    if torch.utils.data.get_worker_info() is not None:
        numel = sum(int(t.numel()) for t in batch)
        storage = batch[0]._typed_storage()._new_shared(numel, device=batch[0].device)
        out = batch[0].new(storage).resize_(numel)
    return torch.cat(batch, out=out), torch.tensor([int(t.numel()) for t in batch])


def batch_size_of(batch: Any) -> tuple[int, int]:
    """(samples, bytes) of a collated batch: a stacked tensor, a dict of one (MDS), or
    `collate_flat`'s (bytes, lengths)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, tuple):
        data, lengths = batch
        return int(lengths.numel()), int(data.numel())
    return int(batch.shape[0]), int(batch.numel())
