"""Fingerprints of the user's samples: a cheap 64-bit digest of each sample of a collated
batch, so that `loader --factory` and `watch` can tell the right data from fast data
(the same sample twice in an epoch, ranks on the same batches) without keeping or
hashing whole batches.

A sample's digest covers, for every field of the batch whose leading size is the batch's
(a tensor's or array's first dimension, a list's length): its shape past that dimension,
its dtype, its first FIRST_BYTES bytes and SPREAD_BYTES more read in blocks of
BLOCK_BYTES at even steps across the rest, so a 19 MB image batch costs a few KiB and a
few pages per sample. Few pages matters: a batch a worker handed over sits in shared
memory the training process has not touched yet, and every page read is a fault there
(a 4 MB row read at 256 points took 10 ms a 16-row batch of the factory's own process,
beside workers that needed the CPU). Strings and bytes are
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
from dataclasses import dataclass, field
from typing import Any

from starvecheck.core.signals import importing

FIRST_BYTES = 2048  # read from each sample's start
SPREAD_BYTES = 1024  # and this many more at even steps across the rest
BLOCK_BYTES = 128  # in blocks this long: SPREAD_BYTES // BLOCK_BYTES pages a row at most
MAX_FIELDS = 16  # fields of a batch read at most (and items of a sample)
MAX_DEPTH = 4  # levels of a sample's nest read at most
_MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # Fibonacci hashing's odd constant


def leading(batch: Any) -> int:
    """A batch's samples where no batch size is known: the first field's leading size
    (a tensor's first dimension, a list's length); 0 where there is none."""
    try:
        for leaf in _fields(batch):
            if getattr(leaf, "is_nested", False) is True:
                continue
            shape = getattr(leaf, "shape", None) if _is_array(leaf) else None
            if shape:
                return int(shape[0])
            if isinstance(leaf, list | tuple) and leaf:
                return len(leaf)
    except Exception:  # a field of the user's own class that cannot be read
        return 0
    return 0


@dataclass
class Digest:
    """One batch's digests (None where no field could be read, or one is on a device
    other than the CPU) and the fields left out, each with why."""

    values: list[int] | None
    skipped: list[str] = field(default_factory=list)


def digests(batch: Any, samples: int) -> list[int] | None:
    """One digest per sample of `batch` (`samples` of them: its leading size), or None
    where no field of the batch has that leading size (nothing to tell samples apart),
    none could be read, or a field sits on a device other than the CPU (reading it
    would wait for it)."""
    return digest_batch(batch, samples).values


def digest_batch(batch: Any, samples: int) -> Digest:
    """`digests`, with the fields it could not read named (a sparse or nested tensor, an
    object of the user's own with .shape, items whose code raises): such a field is left
    out, never an error, for the pipeline read it fine; the digest is starvecheck's."""
    if samples <= 0:
        return Digest(None)
    out = [0] * samples
    used = 0
    skipped: list[str] = []
    try:
        fields = list(_fields(batch))
    except Exception as e:  # a batch of the user's own class that cannot be walked
        return Digest(None, [f"the batch ({_kind(batch)}): {_why(e)}"])
    for i, leaf in enumerate(fields):
        try:
            rows = _rows(leaf, samples)
        except _Unreadable as e:
            skipped.append(f"field {i} ({_kind(leaf)}): {e}")
            continue
        except Exception as e:
            skipped.append(f"field {i} ({_kind(leaf)}): {_why(e)}")
            continue
        if rows is _ON_DEVICE:
            return Digest(None, skipped)
        if rows is None:
            continue
        used += 1
        out = [((h * _MIX) ^ r) & _MASK for h, r in zip(out, rows, strict=True)]
    return Digest(out if used else None, skipped)


class _Unreadable(Exception):
    """A field the digest does not read, and why."""


def _kind(x: Any) -> str:
    try:
        return type(x).__name__
    except Exception:  # pragma: no cover - type() of anything has a name
        return "object"


def _why(e: BaseException) -> str:
    try:
        text = " ".join(str(e).split())[:120]
    except Exception:  # an exception whose own __str__ raises
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


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


def _readable(leaf: Any) -> Any:
    """The array whose memory the digest reads: a numpy array, or a strided CPU tensor
    (its conjugate or negative bit cleared, a view of the same memory); anything else
    with .shape and .dtype is not read (`_Unreadable`, with why)."""
    import numpy as np

    if isinstance(leaf, np.ndarray | np.generic):
        return np.asarray(leaf)
    if not (hasattr(leaf, "detach") and hasattr(leaf, "layout")):
        raise _Unreadable("not a tensor or numpy array")
    if getattr(leaf, "is_nested", False):
        raise _Unreadable("a nested tensor")
    layout = str(leaf.layout)
    if layout != "torch.strided":
        raise _Unreadable(f"a {layout.replace('torch.', '')} tensor")
    t = leaf.detach()
    if t.is_conj():
        t = t.conj()  # the same memory, its conjugate bit cleared
    if t.is_neg():
        t = t._neg_view()  # the same memory, its negative bit cleared
    return t


def _rows(leaf: Any, samples: int) -> list[int] | object | None:
    if getattr(leaf, "is_nested", False) is True:  # its .shape raises
        raise _Unreadable("a nested tensor")
    if _is_array(leaf):
        device = getattr(getattr(leaf, "device", None), "type", "cpu")
        if device not in ("cpu", "meta"):
            return _ON_DEVICE
        if device == "meta":
            raise _Unreadable("a tensor on the meta device: it holds no data")
        a = _readable(leaf)
        shape = tuple(a.shape)
        if not shape or shape[0] != samples:
            return None
        return _array_rows(a, samples)
    if isinstance(leaf, list | tuple) and len(leaf) == samples:
        return [_one(x) for x in leaf]
    return None


def _array_rows(leaf: Any, samples: int) -> list[int]:
    """Each row's digest, vectorised: the bytes read from every row at once (a slice
    and a strided slice, no gather), as 64-bit words, weighted and summed (wrapping).
    A row of Python objects: its first MAX_FIELDS items, each read bounded (`_one`)."""
    import numpy as np

    tag = zlib.crc32(f"{tuple(leaf.shape[1:])}|{leaf.dtype}".encode())
    a = _as_numpy(leaf).reshape(samples, -1)
    if a.dtype.hasobject:
        return [_objects(row[:MAX_FIELDS], tag) for row in a]
    head, step, block, blocks = _reads(a.shape[1], a.dtype.itemsize)
    total = np.zeros(samples, dtype=np.uint64)
    parts = ((0, a[:, :head]), (1, _blocks(a, head, step, block, blocks)))
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


def _objects(items: Any, tag: int) -> int:
    h = tag
    for x in items:
        h = ((h * _MIX) ^ _one(x)) & _MASK
    return h


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


def _reads(width: int, item: int) -> tuple[int, int, int, int]:
    """What is read of a row of `width` elements of `item` bytes: the first
    FIRST_BYTES (`head` elements), then `blocks` blocks of `block` elements, one every
    `step` across the rest (step >= block: the blocks never overlap or run past it)."""
    head = min(width, max(1, FIRST_BYTES // item))
    rest = width - head
    block = max(1, BLOCK_BYTES // item)
    blocks = min(max(1, SPREAD_BYTES // (block * item)), rest // block)
    if not blocks:  # less than a block past the head: read it whole
        return head, 1, rest, 1 if rest else 0
    return head, rest // blocks, block, blocks


def _blocks(a: Any, head: int, step: int, block: int, blocks: int) -> Any:
    """The blocks `_reads` names of every row of the 2-D array `a`, as (rows, blocks x
    block): a strided view (no gather) of the rows' memory."""
    import numpy as np

    if not blocks:
        return a[:, head:head]
    rest = a[:, head:]
    view = np.lib.stride_tricks.as_strided(
        rest,
        shape=(a.shape[0], blocks, block),
        strides=(rest.strides[0], rest.strides[1] * step, rest.strides[1]),
        writeable=False,
    )
    return view.reshape(a.shape[0], blocks * block)


def _torch_int(size: int) -> Any:
    with importing("torch"):  # torch is there already: the batch holds its tensors
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


def _one(x: Any, depth: int = 0) -> int:
    """A digest of one sample that is not part of an array: a string, bytes, a number,
    a small tensor, or a nest of them (MAX_FIELDS items, MAX_DEPTH levels). What is read
    is bounded (FIRST_BYTES of a string); no object's own __repr__ or __str__ is
    called: another object is its type's name."""
    if isinstance(x, str):
        return zlib.crc32(x[:FIRST_BYTES].encode("utf-8", "replace"), len(x) & 0xFFFFFFFF)
    if isinstance(x, bytes | bytearray | memoryview):
        b = bytes(x[:FIRST_BYTES])
        return zlib.crc32(b, len(x) & 0xFFFFFFFF)
    if isinstance(x, bool):
        return zlib.crc32(b"True" if x is True else b"False")
    if isinstance(x, int | float):  # their own __repr__, not a subclass's
        text = int.__repr__(x) if isinstance(x, int) else float.__repr__(x)
        return zlib.crc32(text[:64].encode())
    if _is_array(x):
        a = _readable(x)
        rows = _array_rows(a.reshape(1, -1) if tuple(a.shape) else a.reshape(1), 1)
        return rows[0] if isinstance(rows, list) else 0
    if depth >= MAX_DEPTH:
        return zlib.crc32(_kind(x).encode())
    if type(x) in (list, tuple):
        h = len(x)
        for y in x[:MAX_FIELDS]:
            h = ((h * _MIX) ^ _one(y, depth + 1)) & _MASK
        return h
    if type(x) is dict:
        h = len(x)
        for k, v in list(x.items())[:MAX_FIELDS]:
            h = ((h * _MIX) ^ _one(k, depth + 1) ^ _one(v, depth + 1)) & _MASK
        return h
    return zlib.crc32(_kind(x).encode())


# Of each epoch, the samples read for repeats: the same stretch for every configuration,
# so a faster one, which reads further into its epoch in the same time, is not the one
# that finds more of a dataset's own duplicates.
EPOCH_SAMPLES = 4096


class Repeats:
    """Of the first EPOCH_SAMPLES samples of each epoch, how many came again; the
    fields the digest left out, each with why and how many batches (`skipped`)."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.read = 0  # samples fingerprinted (counted)
        self.repeats = 0  # of them, a digest already seen this epoch
        self.unreadable = 0  # batches that could not be fingerprinted
        self.taken = 0  # samples of this epoch read for repeats
        self.skipped: dict[str, int] = {}  # a field left out, with why -> batches

    def new_epoch(self) -> None:
        self.seen = set()
        self.taken = 0

    def add(self, batch: Any, samples: int, count: bool = True) -> None:
        if self.taken >= EPOCH_SAMPLES:
            return
        self.taken += samples
        d = digest_batch(batch, samples)
        for why in d.skipped[:MAX_FIELDS]:
            if len(self.skipped) < MAX_FIELDS or why in self.skipped:
                self.skipped[why] = self.skipped.get(why, 0) + 1
        if d.values is None:
            self.unreadable += count
            return
        for h in d.values:
            if h in self.seen:
                self.repeats += count
            else:
                self.seen.add(h)
        self.read += len(d.values) if count else 0
