"""Fingerprints of the user's samples: a cheap 64-bit digest of each sample of a collated
batch, so that `loader --factory` and `watch` can tell the right data from fast data
(the same sample twice in an epoch, ranks on the same batches) without keeping or
hashing whole batches.

A sample's digest covers, for every field of the batch whose leading size is the batch's
(a tensor's or array's first dimension, a list's length): its shape past that dimension,
its dtype, its first FIRST_BYTES bytes and SPREAD_BYTES more read at even steps across
the rest, so a 19 MB image batch costs a few KiB per sample. Strings and bytes are
hashed whole (up to FIRST_BYTES) by CRC-32, never Python's hash(), which differs from
one process to the next: ranks compare their digests. Numbers are mixed in as they are.

Two different samples get the same digest only where they agree in every byte read
(a fixed header, padding) and in shape: a digest is evidence, and callers compare
against the same pipeline where workers cannot be the cause (num_workers=0, another
pass) before they blame anything.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from starvecheck.core.signals import importing

FIRST_BYTES = 2048  # read from each sample's start
SPREAD_BYTES = 1024  # and this many more at even steps across the rest
MAX_FIELDS = 16  # fields of a batch read at most
_MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing's odd constant


def leading(batch: Any) -> int:
    """A batch's samples where no batch size is known: the first field's leading size
    (a tensor's first dimension, a list's length); 0 where there is none."""
    for leaf in _fields(batch):
        shape = getattr(leaf, "shape", None) if _is_array(leaf) else None
        if shape:
            return int(shape[0])
        if isinstance(leaf, list | tuple) and leaf:
            return len(leaf)
    return 0


def digests(batch: Any, samples: int) -> list[int] | None:
    """One digest per sample of `batch` (`samples` of them: its leading size), or None
    where no field of the batch has that leading size (nothing to tell samples apart)
    or a field sits on a device other than the CPU (reading it would wait for it)."""
    if samples <= 0:
        return None
    out = [0] * samples
    used = 0
    for leaf in _fields(batch):
        rows = _rows(leaf, samples)
        if rows is _ON_DEVICE:
            return None
        if rows is None:
            continue
        used += 1
        out = [((h * _MIX) ^ r) & _MASK for h, r in zip(out, rows, strict=True)]
    return out if used else None


_ON_DEVICE = object()


def _fields(batch: Any) -> Iterable[Any]:
    """The batch's fields, a level deep: a tensor alone, or a tuple/list/dict of them
    (a list of samples is itself the field)."""
    if isinstance(batch, dict):
        return list(batch.values())[:MAX_FIELDS]
    if isinstance(batch, tuple):
        return list(batch)[:MAX_FIELDS]
    if isinstance(batch, list) and batch and all(_is_array(x) for x in batch[:MAX_FIELDS]):
        # A list of per-field tensors (default_collate of a list sample), or of samples.
        return [*list(batch)[:MAX_FIELDS], batch]
    return [batch]


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _rows(leaf: Any, samples: int) -> list[int] | object | None:
    if _is_array(leaf):
        shape = tuple(leaf.shape)
        if not shape or shape[0] != samples:
            return None
        if getattr(getattr(leaf, "device", None), "type", "cpu") != "cpu":
            return _ON_DEVICE
        return _array_rows(leaf, samples)
    if isinstance(leaf, list | tuple) and len(leaf) == samples:
        return [_one(x) for x in leaf]
    return None


def _array_rows(leaf: Any, samples: int) -> list[int]:
    """Each row's digest, vectorised: the bytes read from every row at once (a slice
    and a strided slice, no gather), as 64-bit words, weighted and summed (wrapping)."""
    import numpy as np

    tag = zlib.crc32(f"{tuple(leaf.shape[1:])}|{leaf.dtype}".encode())
    a = _as_numpy(leaf).reshape(samples, -1)
    if a.dtype.hasobject:
        return [zlib.crc32(repr(row[:64].tolist()).encode(), tag) for row in a]
    head, step, spread = _reads(a.shape[1], a.dtype.itemsize)
    total = np.zeros(samples, dtype=np.uint64)
    parts = ((0, a[:, :head]), (1, a[:, head::step][:, :spread]))
    with np.errstate(over="ignore"):
        for which, part in parts:
            if not part.shape[1]:
                continue
            raw = np.ascontiguousarray(part).view(np.uint8).reshape(samples, -1)
            pad = (-raw.shape[1]) % 8
            if pad:
                raw = np.concatenate([raw, np.zeros((samples, pad), dtype=np.uint8)], axis=1)
            words = raw.view(np.uint64)
            total += (words * _weights(words.shape[1], which)).sum(axis=1, dtype=np.uint64)
    return [(s ^ tag) & _MASK for s in total.tolist()]


def _as_numpy(leaf: Any) -> Any:
    """The array's memory as numpy, without a copy where it is contiguous: a torch
    tensor of a dtype numpy lacks (bfloat16) as integers of its size."""
    import numpy as np

    if not (hasattr(leaf, "numpy") and hasattr(leaf, "detach")):
        return np.asarray(leaf)
    t = leaf.detach()
    try:
        return t.numpy()
    except TypeError:
        return t.view(_torch_int(t.element_size())).numpy()


def _reads(width: int, item: int) -> tuple[int, int, int]:
    """What is read of a row of `width` elements of `item` bytes: the first
    FIRST_BYTES (`head` elements), then `spread` elements every `step` across the rest."""
    head = min(width, max(1, FIRST_BYTES // item))
    rest = width - head
    spread = min(rest, SPREAD_BYTES // item)
    step = max(1, rest // spread) if spread else 1
    return head, step, spread


def _torch_int(size: int) -> Any:
    with importing():  # torch is there already: the batch holds its tensors
        import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]


_WEIGHTS: dict[tuple[int, int], Any] = {}


def _weights(n: int, which: int) -> Any:
    """n odd 64-bit weights, the same in every process (ranks compare digests); another
    set for each part of a row read."""
    w = _WEIGHTS.get((n, which))
    if w is None:
        import numpy as np

        rng = np.random.default_rng((0x5EED, which))
        w = rng.integers(0, 1 << 63, size=n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        _WEIGHTS[(n, which)] = w
    return w


def _one(x: Any) -> int:
    """A digest of one sample that is not part of an array: a string, bytes, a number,
    a small tensor, or a nest of them."""
    if isinstance(x, str):
        return zlib.crc32(x[:FIRST_BYTES].encode("utf-8", "replace"), len(x))
    if isinstance(x, bytes | bytearray | memoryview):
        b = bytes(x[:FIRST_BYTES])
        return zlib.crc32(b, len(x))
    if isinstance(x, bool | int | float):
        return zlib.crc32(repr(x).encode())
    if _is_array(x):
        shape = tuple(x.shape)
        rows = _array_rows(x.reshape(1, -1) if shape else x.reshape(1), 1)
        return rows[0] if isinstance(rows, list) else 0
    if isinstance(x, list | tuple):
        h = len(x)
        for y in x[:MAX_FIELDS]:
            h = ((h * _MIX) ^ _one(y)) & _MASK
        return h
    if isinstance(x, dict):
        h = len(x)
        for k, v in list(x.items())[:MAX_FIELDS]:
            h = ((h * _MIX) ^ zlib.crc32(str(k).encode()) ^ _one(v)) & _MASK
        return h
    return zlib.crc32(type(x).__name__.encode())


# Of each epoch, the samples read for repeats: the same stretch for every configuration,
# so a faster one, which reads further into its epoch in the same time, is not the one
# that finds more of a dataset's own duplicates.
EPOCH_SAMPLES = 4096


class Repeats:
    """Of the first EPOCH_SAMPLES samples of each epoch, how many came again."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.read = 0  # samples fingerprinted (counted)
        self.repeats = 0  # of them, a digest already seen this epoch
        self.unreadable = 0  # batches that could not be fingerprinted
        self.taken = 0  # samples of this epoch read for repeats

    def new_epoch(self) -> None:
        self.seen = set()
        self.taken = 0

    def add(self, batch: Any, samples: int, count: bool = True) -> None:
        if self.taken >= EPOCH_SAMPLES:
            return
        self.taken += samples
        d = digests(batch, samples)
        if d is None:
            self.unreadable += count
            return
        for h in d:
            if h in self.seen:
                self.repeats += count
            else:
                self.seen.add(h)
        self.read += len(d) if count else 0
