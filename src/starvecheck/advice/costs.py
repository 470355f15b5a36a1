"""What the user's pipeline costs the machine, judged for `loader --factory`: the
workers that fit in memory and /dev/shm (`memory_cap`, which lowers the count
advice/factory.py recommends), each worker's private memory growing as it reads
(`loader.copy-on-read`), and large batches crossing from the workers to the training
process (`loader.batch-transfer`).
"""

from __future__ import annotations

import math
import statistics

from starvecheck.advice.configurations import Point
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.parameters import Parameters

MIB = float(1 << 20)
# A worker whose private memory grew this much while reading copies on read.
COPY_ON_READ_BYTES = 64 << 20
# The training process alone growing this share of a worker's growth: the pipeline's
# own buffers, not copies.
OWN_GROWTH_SHARE = 0.5
# Batches this large, with this much of the training process's CPU spent on each, are
# worth shrinking.
LARGE_BATCH_BYTES = 8 << 20
RECEIVE_MS = 2.0
# Of the memory limit, what the loader may take (the training process needs the rest).
MEMORY_SHARE = 0.8


def memory_cap(p: Point, params: Parameters) -> tuple[int | None, str]:
    """The most workers whose private memory fits the memory limit (cgroup, else what was
    available; read when measured), and their batches in flight /dev/shm; None where
    nothing is known."""
    if not p.workers:
        return None, ""
    cap: int | None = None
    why = ""
    worker = p.get("uss_bytes", process="worker")
    main = p.get("uss_bytes", process="main") or 0.0
    limit = params.memory_limit_bytes
    if worker and limit:
        cap = max(0, math.floor((MEMORY_SHARE * limit - main) / worker))
        why = (
            f"{cap} worker(s) of {worker / MIB:,.0f} MiB each fit in {MEMORY_SHARE:.0%} "
            f"of the {limit / MIB:,.0f} MiB memory limit"
        )
    batch = p.get("batch_bytes")
    shm = params.shm_free_bytes
    prefetch = int(p.labels.get("prefetch_factor") or 2)
    if batch and shm:
        fits = max(0, math.floor(MEMORY_SHARE * shm / (batch * prefetch)))
        if cap is None or fits < cap:
            cap, why = (
                fits,
                (
                    f"{fits} worker(s) with {prefetch} batches of {batch / MIB:,.1f} MiB in flight "
                    f"each fit in the {shm / MIB:,.0f} MiB free in /dev/shm"
                ),
            )
    return cap, why


def copy_on_read(loader: StageResult, found: list[Point]) -> list[Finding]:
    grown = [
        (growth, p)
        for p in found
        if p.workers and (growth := p.get("uss_growth_bytes", process="worker")) is not None
    ]
    if not grown:
        return []
    growth, p = max(grown, key=lambda t: t[0])
    end = p.get("uss_bytes", process="worker") or 0.0
    if growth < COPY_ON_READ_BYTES:
        return []
    # The same pipeline in the training process alone (num_workers=0): where it grows as
    # much there, the growth is the pipeline's own (a shuffle buffer, a cache it fills),
    # not pages a fork shares and a worker copies.
    zero = next((q for q in found if q.workers == 0 and q.role in ("workers", "current")), None)
    own = zero.get("uss_growth_bytes", process="main") if zero is not None else None
    if own is not None and own >= OWN_GROWTH_SHARE * growth:
        return []
    samples = _samples_read(loader, p)
    read = f" while the workers read {samples:,} samples" if samples else ""
    return [
        Finding(
            "loader.copy-on-read",
            Severity.WARNING,
            f"Each worker copies the dataset as it reads it: {growth / MIB:,.0f} MiB more "
            "private memory per worker",
            evidence=(
                f"num_workers={p.workers}: each worker's USS (memory no other process shares) "
                f"grew by {growth / MIB:,.0f} MiB{read}, to {end / MIB:,.0f} MiB (median over "
                f"workers); {p.workers} workers hold {p.workers * end / MIB:,.0f} MiB of "
                "copies, and it grows with every worker"
            ),
            recommendation=(
                "The dataset keeps Python objects (lists of str, dicts, lists of tuples): a "
                "forked worker that touches them writes their reference counts, and the "
                "kernel copies every page it touches (pytorch/pytorch#13246). Keep the "
                "samples in numpy arrays (strings as one bytes buffer plus offsets), an "
                "Arrow table, or a memory-mapped file, and build Python objects in "
                "`__getitem__` only."
            ),
        )
    ]


def _samples_read(loader: StageResult, p: Point) -> int | None:
    for c in loader.parameters.configurations:
        if c.get("role") == p.labels.get("role") and c.get("workers") == p.workers:
            return int(c.get("samples") or 0) or None
    return None


def batch_transfer(loader: StageResult, found: list[Point]) -> list[Finding]:
    with_workers = [p for p in found if p.workers and p.labels.get("role") == "workers"]
    zero = next((p for p in found if p.workers == 0 and p.labels.get("role") == "workers"), None)
    if not with_workers:
        return []
    batch = statistics.median(
        [b for p in with_workers if (b := p.get("batch_bytes")) is not None] or [0.0]
    )
    per_sample = statistics.median(
        [c for p in with_workers if (c := p.get("cpu_ms_per_sample", process="main")) is not None]
        or [0.0]
    )
    size = loader.parameters.batch_size or 1
    receive_ms = per_sample * float(size)
    if batch < LARGE_BATCH_BYTES or receive_ms < RECEIVE_MS:
        return []
    # Workers that lose to the training process loading alone, at every count past one:
    # the hand-over costs more than the work they take off it.
    past_one = [p for p in with_workers if p.workers > 1] or with_workers
    slower = zero is not None and all(p.rate < zero.rate for p in past_one)
    worse = [
        f"num_workers={p.workers}: {p.rate:,.0f}"
        for p in with_workers
        if zero and p.rate < zero.rate
    ]
    evidence = (
        f"each batch is {batch / MIB:,.1f} MiB; with workers the training process spends "
        f"{receive_ms:,.1f} ms of CPU per batch taking it over from a worker"
    )
    if slower and zero is not None:
        evidence += f"; slower than num_workers=0 ({zero.rate:,.0f} samples/s): " + ", ".join(worse)
    return [
        Finding(
            "loader.batch-transfer",
            Severity.WARNING if slower else Severity.INFO,
            f"Batches of {batch / MIB:,.1f} MiB cross from the workers to the training process",
            evidence=evidence,
            recommendation=(
                "Make batches smaller before they cross: where they are float32 made from "
                "8-bit images, return uint8 (4x fewer bytes) and convert and normalise on "
                "the GPU (`x = x.cuda(non_blocking=True).float().div_(255).sub_(mean)"
                ".div_(std)`); crop before converting."
            ),
        )
    ]
