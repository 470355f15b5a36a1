"""What the user's pipeline costs the machine, judged for `loader --factory`: the
workers that fit in memory and /dev/shm (`memory_cap`, which lowers the count
advice/factory.py recommends, and `loader.shm`, the forecast for the fastest
configuration), each worker's private memory, grown as it reads or held from its first
batch on (`loader.copy-on-read`), torch's threads loading in the training process
(`loader.main-threads`), and large batches crossing from the workers to the training
process (`loader.batch-transfer`).
"""

from __future__ import annotations

import math
import statistics

from starvecheck.advice.configurations import Point, describe
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.paired import spread
from starvecheck.core.schema.factory import SWEPT, Configuration, Role
from starvecheck.core.schema.factory import Parameters as FactoryParameters
from starvecheck.core.schema.figure import value_of

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
# At num_workers=0, the training process on more than this many CPUs at once: the
# pipeline's torch operations ran on its intra-op threads.
THREADED_CPUS = 1.3
# Of the memory limit, what the loader may take (the training process needs the rest).
MEMORY_SHARE = 0.8


def memory_cap(p: Point, params: FactoryParameters) -> tuple[int | None, str]:
    """The most workers whose private memory fits the memory limit (cgroup, else what was
    available; read when measured), and their batches in flight /dev/shm; None where
    nothing is known."""
    if not p.workers:
        return None, ""
    cap: int | None = None
    why = ""
    worker = value_of(p.figures.uss_worker)
    main = value_of(p.figures.uss_main) or 0.0
    limit = params.memory_limit_bytes
    if worker and limit:
        cap = max(0, math.floor((MEMORY_SHARE * limit - main) / worker))
        why = (
            f"{cap} worker(s) of {worker / MIB:,.0f} MiB each fit in {MEMORY_SHARE:.0%} "
            f"of the {limit / MIB:,.0f} MiB memory limit"
        )
    batch = value_of(p.figures.batch_bytes)
    shm = params.shm_free_bytes
    prefetch = p.settings.prefetch_factor or 2
    if batch and shm:
        fits = _shm_fits(batch, prefetch, shm)
        if cap is None or fits < cap:
            cap, why = (
                fits,
                (
                    f"{fits} worker(s) with {prefetch} batches of {batch / MIB:,.1f} MiB in flight "
                    f"each fit in the {shm / MIB:,.0f} MiB free in /dev/shm"
                ),
            )
    return cap, why


def copy_on_read(
    loader: StageResult, found: list[Point], chosen: Point | None = None
) -> list[Finding]:
    """Workers that hold memory of their own: grown while reading (copy-on-read as it
    happens), or held from the first batch on against a worker that has read nothing
    (a copy made at once: a pass over a list of Python objects, the garbage collector),
    projected to the count recommended and to the memory limit."""
    idle = loader.parameters.read(FactoryParameters).idle_worker_uss_bytes
    figures = []
    for p in found:
        if not p.workers:
            continue
        growth = value_of(p.figures.uss_growth_worker)
        end = value_of(p.figures.uss_worker)
        held = end - idle if end is not None and idle is not None else None
        figures.append((max(growth or 0.0, held or 0.0), growth, held, end, p))
    if not figures:
        return []
    _, growth, held, end, p = max(figures, key=lambda t: (t[0], t[4].workers))
    # A worker holds the batch it makes and those it has made in flight: its own, and
    # no copy of the dataset (64 MB batches at prefetch 2 are 192 MB of them).
    in_hand = _in_hand(p)
    grew = growth is not None and growth - in_hand >= COPY_ON_READ_BYTES
    holds = held is not None and held - in_hand >= COPY_ON_READ_BYTES
    if not (grew or holds):
        return []
    if grew and not holds and _own_growth(found, growth or 0.0):
        return []
    assert end is not None
    return [_copy_finding(loader, p, growth, held, end, chosen)]


def _in_hand(p: Point) -> float:
    """The bytes of the batches a worker may hold: the one it makes and its
    prefetch_factor in flight."""
    return ((p.settings.prefetch_factor or 2) + 1) * (value_of(p.figures.batch_bytes) or 0.0)


def _own_growth(found: list[Point], growth: float) -> bool:
    """The same pipeline in the training process alone (num_workers=0) grows as much:
    the growth is the pipeline's own (a shuffle buffer, a cache it fills), not pages a
    fork shares and a worker copies."""
    zero = next((q for q in found if q.workers == 0 and q.role in SWEPT), None)
    own = value_of(zero.figures.uss_growth_main) if zero is not None else None
    return own is not None and own >= OWN_GROWTH_SHARE * growth


def _copy_finding(
    loader: StageResult,
    p: Point,
    growth: float | None,
    held: float | None,
    end: float,
    chosen: Point | None,
) -> Finding:
    params = loader.parameters.read(FactoryParameters)
    samples = _samples_read(loader, p)
    read = f" while the workers read {samples:,} samples" if samples else ""
    parts = [f"num_workers={p.workers}: each worker's USS (memory no other process shares) is "
             f"{end / MIB:,.0f} MiB (median over workers)"]  # fmt: skip
    if held is not None and params.idle_worker_uss_bytes is not None:
        idle = params.idle_worker_uss_bytes
        parts.append(f"{held / MIB:,.0f} MiB more than a worker that has read nothing "
                     f"({idle / MIB:,.0f} MiB, measured, {params.start_method or 'the default'} "
                     "start)")  # fmt: skip
    if growth is not None:
        parts.append(f"it grew by {growth / MIB:,.0f} MiB{read}")
    own = max(held or 0.0, growth or 0.0)
    k = chosen.workers if chosen is not None and chosen.workers else p.workers
    main = value_of(p.figures.uss_main) or 0.0
    total = main + k * end
    parts.append(
        f"at num_workers={k}{' (recommended)' if chosen is not None and chosen.workers else ''}"
        f" the training process and its workers hold {total / MIB:,.0f} MiB"
    )
    limit = params.memory_limit_bytes
    if limit:
        fits = max(0, math.floor((MEMORY_SHARE * limit - main) / end)) if end else None
        parts.append(f"{fits} such workers fit in {MEMORY_SHARE:.0%} of the "
                     f"{limit / MIB:,.0f} MiB memory limit")  # fmt: skip
        rate = _growth_per_s(loader, p, growth)
        room = MEMORY_SHARE * limit - total
        if rate and room > 0:
            parts.append(f"growing {rate * 60 / MIB:,.1f} MiB a minute per worker, "
                         f"{k} reach it in {room / (k * rate) / 60:,.0f} min")  # fmt: skip
        elif room <= 0:
            parts.append("they do not fit now")
        else:
            parts.append("held from the first batch on, not growing")
    over = bool(limit) and total > MEMORY_SHARE * (limit or 0)
    how = "holds" if held is not None and (growth or 0.0) < COPY_ON_READ_BYTES else "copies"
    title = (
        f"Each worker {how} {own / MIB:,.0f} MiB of its own: at num_workers={k}, "
        f"{k * own / MIB:,.0f} MiB in all"
    )
    return Finding(
        catalogue.LOADER_COPY_ON_READ,
        Severity.CRITICAL if over else Severity.WARNING,
        title,
        evidence="; ".join(parts),
        recommendation=(
            "The dataset keeps Python objects (lists of str, dicts, lists of tuples): a "
            "forked worker that touches them (a pass over a list, the garbage collector) "
            "writes their reference counts, and the kernel copies every page it touches "
            "(pytorch/pytorch#13246); under spawn or forkserver each worker unpickles "
            "its own. Keep the samples in numpy arrays (strings as one bytes buffer plus "
            "offsets), an Arrow table, tensors, or a memory-mapped file, and build Python "
            "objects in `__getitem__` only."
        ),
    )


def _growth_per_s(loader: StageResult, p: Point, growth: float | None) -> float | None:
    c = _configuration(loader, p)
    if not growth or growth < MIB or c is None:
        return None
    seconds = c.seconds
    return growth / seconds if seconds > 0 else None


def shm_forecast(loader: StageResult, found: list[Point], chosen: Point | None) -> list[Finding]:
    """Batches in flight (workers x prefetch_factor x the batch's bytes) against the
    /dev/shm free, for the fastest configuration measured: past it, a DataLoader dies
    with "Bus error" (Docker's default is 64 MB)."""
    shm = loader.parameters.read(FactoryParameters).shm_free_bytes
    with_workers = [p for p in found if p.workers and value_of(p.figures.batch_bytes)]
    if not shm or not with_workers:
        return []
    fastest = max(with_workers, key=lambda p: p.rate)
    over = [
        p
        for p in (fastest, chosen)
        if p is not None and p.workers and _in_flight(p) > MEMORY_SHARE * shm
    ]
    if not over:
        return []
    p = over[0]
    need = _in_flight(p)
    batch = value_of(p.figures.batch_bytes) or 0.0
    prefetch = p.settings.prefetch_factor or 2
    fits = _shm_fits(batch, prefetch, shm) if batch else 0
    size = 1 << max(30, math.ceil(math.log2(max(need * 2, 1.0))))
    return [
        Finding(
            catalogue.LOADER_SHM,
            Severity.WARNING,
            f"{describe(p)} needs {need / MIB:,.0f} MiB of /dev/shm; {shm / MIB:,.0f} MiB is free",
            evidence=(
                f"{p.workers} workers x prefetch_factor {prefetch} x {batch / MIB:,.1f} MiB a "
                f"batch (measured) are in /dev/shm at once; {fits} worker(s) fit in "
                f'{MEMORY_SHARE:.0%} of it. Past it the DataLoader dies with "Bus error" '
                "(pytorch/pytorch#16979)"
            ),
            recommendation=(
                f"Give the container more shared memory: `docker run --shm-size={size >> 30}g`, "
                "or in Kubernetes an `emptyDir: {medium: Memory, sizeLimit: "
                f"{size >> 30}Gi}}` mounted at /dev/shm; or keep num_workers at {fits} or less."
            ),
        )
    ]


def _shm_fits(batch: float, prefetch: int, shm: float) -> int:
    """The workers whose batches in flight (prefetch_factor each) fit in MEMORY_SHARE of
    the /dev/shm free."""
    return max(0, math.floor(MEMORY_SHARE * shm / (batch * prefetch)))


def _in_flight(p: Point) -> float:
    return p.workers * (p.settings.prefetch_factor or 2) * (value_of(p.figures.batch_bytes) or 0.0)


def _samples_read(loader: StageResult, p: Point) -> int | None:
    c = _configuration(loader, p)
    return None if c is None else c.samples or None


def _configuration(loader: StageResult, p: Point) -> Configuration | None:
    """`p`'s entry in the run's `configurations` (samples read, seconds)."""
    for c in loader.parameters.read(FactoryParameters).configurations:
        if c.role == p.role and c.workers == p.workers:
            return c
    return None


def batch_transfer(loader: StageResult, found: list[Point]) -> list[Finding]:
    with_workers = [p for p in found if p.workers and p.role == Role.WORKERS]
    zero = next((p for p in found if p.workers == 0 and p.role == Role.WORKERS), None)
    if not with_workers:
        return []
    batch = statistics.median(
        [b for p in with_workers if (b := value_of(p.figures.batch_bytes)) is not None] or [0.0]
    )
    per_sample = statistics.median(
        [c for p in with_workers if (c := value_of(p.figures.cpu_ms_main)) is not None] or [0.0]
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
            catalogue.LOADER_BATCH_TRANSFER,
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


def main_threads(loader: StageResult, found: list[Point]) -> Finding | None:
    """At num_workers=0, the training process on several CPUs at once: torch's intra-op
    threads run the pipeline's operations (ToTensor, Normalize, an STFT) there."""
    zero = next((p for p in found if p.workers == 0 and p.role in SWEPT), None)
    if zero is None:
        return None
    cpu = value_of(zero.figures.cpu_ms_main)
    cpus_busy = value_of(zero.figures.cpus_busy_main)
    if cpu is None or cpus_busy is None or cpus_busy < THREADED_CPUS:
        return None
    threads = loader.parameters.read(FactoryParameters).torch_threads
    moved = spread(zero.rates)
    with_workers = [s for p in found if p.workers and (s := spread(p.rates)) is not None]
    evidence = (
        f"at num_workers=0 the training process kept {cpus_busy:.1f} CPUs busy loading "
        f"({cpu:,.2f} ms of CPU a sample at {zero.rate:,.0f} samples/s)"
        + (f"; torch runs {threads} intra-op threads in it" if threads else "")
    )
    if moved is not None and with_workers:
        evidence += (
            f"; its samples/s moved {moved:.2f}x between rounds, with workers at most "
            f"{max(with_workers):.2f}x"
        )
    return Finding(
        catalogue.LOADER_MAIN_THREADS,
        Severity.INFO,
        "At num_workers=0 your pipeline's torch operations run on the training process's threads",
        evidence=evidence + ".",
        recommendation=(
            "In your training loop those threads compete with the step's own, and they slow "
            "down most when anything else holds a core (a thread waiting for a CPU holds up "
            "the operation it belongs to). A worker runs them on one thread of its own "
            "(DataLoader sets torch.set_num_threads(1) in workers); if you stay at "
            "num_workers=0 on a shared machine, `torch.set_num_threads(N)` with N the cores "
            "you own keeps them from waiting on others'."
        ),
    )
