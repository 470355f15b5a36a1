"""Judging `loader --factory`: the user's own pipeline, measured in every configuration.

- `loader.own-config`: the DataLoader line to use, against the user's current one. The
  worker count is advice/workers' (the one num_workers rule): the fewest within 5% of
  the best samples/s, at or below the effective CPUs unless the workers' measured CPU
  time shows they wait on I/O; then lowered to what fits in memory (each worker's USS)
  and /dev/shm (the batches in flight). prefetch_factor or persistent_workers join it
  where the measurement at that count shows a gain. The gain is the measured samples/s
  of the configuration recommended over the current one's: never a prediction.
- `loader.copy-on-read`: each worker's private memory grew while it read
  (pytorch/pytorch#13246: Python objects' reference counts written on shared pages).
- `loader.batch-transfer`: large batches crossing from the workers to the training
  process, and what that costs the training process per batch.

Reads metrics by labels (layout `own`, role, workers, prefetch_factor,
persistent_workers, pin_memory, current); never by names.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starvecheck.advice.workers import Cpus, Throughput, recommend_workers
from starvecheck.core.metric import Metric, one, select
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.parameters import Parameters

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

LAYOUT = "own"
MIB = float(1 << 20)
# A worker whose private memory grew this much while reading copies on read.
COPY_ON_READ_BYTES = 64 << 20
# Batches this large, with this much of the training process's CPU spent on each, are
# worth shrinking.
LARGE_BATCH_BYTES = 8 << 20
RECEIVE_MS = 2.0
# A setting beside num_workers is recommended when it measured this much faster.
AS_GOOD = 1.05
# persistent_workers: recommended when a later epoch starts this much sooner.
EPOCH_START_SAVED_S = 0.05
# The change is worth a warning from this gain on.
WARN_GAIN = 1.5
MEASURED = "measured: both configurations' samples/s, this machine"
# Of the memory limit, what the loader may take (the training process needs the rest).
MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class Point:
    labels: Mapping[str, Any]
    rate: float  # samples/s, median of windows
    metrics: tuple[Metric, ...]

    def get(self, quantity: str, **more: Any) -> float | None:
        m = one(self.metrics, quantity=quantity, **more)
        return None if m is None else m.value

    @property
    def workers(self) -> int:
        return int(self.labels.get("workers", 0))

    def line(self, batch_size: Any) -> str:
        parts = [f"batch_size={batch_size}", f"num_workers={self.workers}"]
        if self.workers:
            if int(self.labels.get("prefetch_factor") or 2) != 2:
                parts.append(f"prefetch_factor={self.labels['prefetch_factor']}")
            if self.labels.get("persistent_workers"):
                parts.append("persistent_workers=True")
        if self.labels.get("pin_memory"):
            parts.append("pin_memory=True")
        return f"`DataLoader(dataset, {', '.join(parts)}, ...)`"


def points(loader: StageResult) -> list[Point]:
    out = []
    keys = ("role", "workers", "prefetch_factor", "persistent_workers", "pin_memory")
    for m in select(loader.metrics, quantity="samples_per_s", layout=LAYOUT):
        if m.value is None:
            continue
        where = {k: m.labels[k] for k in keys if k in m.labels}
        out.append(Point(m.labels, m.value, tuple(select(loader.metrics, layout=LAYOUT, **where))))
    return out


def rules(results: Results) -> list[Finding]:
    loader = results.get("factory")
    if loader is None:
        return []
    found = points(loader)
    if not found:
        return []
    out = [_config(loader), _demand(loader)]
    out += _copy_on_read(loader, found)
    out += _batch_transfer(loader, found)
    return [f for f in out if f is not None]


def _cpu_work(p: Point, effective: float) -> bool | None:
    """Whether the workers of `p` spend their time on CPU work: their CPU seconds per
    second against the CPUs they can have."""
    per_sample = p.get("cpu_ms_per_sample", process="workers")
    if per_sample is None or not p.workers:
        return None
    busy = per_sample / 1e3 * p.rate  # CPU-seconds per second, all workers together
    return busy >= 0.5 * min(p.workers, max(1.0, effective))


def _memory_cap(p: Point, params: Parameters) -> tuple[int | None, str]:
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


@dataclass(frozen=True)
class Choice:
    current: Point
    chosen: Point
    sweep: Mapping[int, Point]
    notes: tuple[str, ...]

    @property
    def gain(self) -> float | None:
        return round(self.chosen.rate / self.current.rate, 2) if self.current.rate > 0 else None


def choose(loader: StageResult) -> Choice | None:
    """The configuration to recommend (see the module docstring); None where the sweep
    measured nothing to choose from."""
    found = points(loader)
    params = loader.parameters
    effective = float(params.cpus)
    sweep = {p.workers: p for p in found if p.labels.get("role") == "workers"}
    current = next((p for p in found if p.labels.get("current")), None)
    if not sweep or current is None:
        return None
    best_point = max(sweep.values(), key=lambda p: p.rate)
    cpu_work = _cpu_work(best_point, effective) if best_point.workers else True
    advice = recommend_workers(
        Throughput({w: p.rate for w, p in sweep.items()}, cpu_work), Cpus(effective)
    )
    if advice is None:
        return None
    k = advice.workers
    cap, cap_why = _memory_cap(sweep[k], params) if k in sweep else (None, "")
    notes = [advice.why]
    if cap is not None and k > cap:
        fitting = [w for w in sweep if w <= cap]
        k = max(fitting, key=lambda w: sweep[w].rate) if fitting else 0
        notes.append(f"lowered to {k}: {cap_why}")
    chosen = sweep[k]
    extra = _extra_setting(found, chosen)
    if extra is not None:
        chosen, note = extra
        notes.append(note)
    if chosen.rate < AS_GOOD * current.rate:
        chosen = current  # nothing measured faster enough to be worth a change
    return Choice(current, chosen, sweep, tuple(notes))


def complete(loader: StageResult) -> StageResult:
    """The result as the report carries it: the capacity is the samples/s measured at
    the configuration recommended (doctor's loader link)."""
    choice = choose(loader)
    if choice is None:
        return replace(loader, capacity=None)
    at = one(choice.chosen.metrics, quantity="samples_per_s")
    assert at is not None
    return replace(loader, capacity=replace(at, name=f"capacity ({at.name})"))


def basis(loader: StageResult) -> str:
    """What doctor's loader link rests on, in words."""
    choice = choose(loader)
    where = loader.parameters.factory
    said = _describe(choice.chosen) if choice is not None else "no configuration"
    return f"your pipeline {where}, {said}, measured (its decode and collate included)"


def _config(loader: StageResult) -> Finding | None:
    choice = choose(loader)
    if choice is None:
        return None
    params = loader.parameters
    effective = float(params.cpus)
    current, chosen, gain = choice.current, choice.chosen, choice.gain
    evidence = (
        f"current ({_describe(current)}): {current.rate:,.0f} samples/s; "
        f"{_describe(chosen)}: {chosen.rate:,.0f} samples/s; "
        + "; ".join(f"num_workers={w}: {p.rate:,.0f}" for w, p in sorted(choice.sweep.items()))
        + f" (medians, this machine, {effective:g} effective CPUs)"
    )
    if chosen is current:
        return Finding(
            "loader.own-config",
            Severity.OK,
            "Your DataLoader settings load as fast as any measured "
            f"({current.rate:,.0f} samples/s)",
            evidence=evidence,
            recommendation="Keep them. " + "; ".join(choice.notes) + ".",
            fix=_fix(current),
        )
    severity = Severity.WARNING if gain is not None and gain >= WARN_GAIN else Severity.INFO
    return Finding(
        "loader.own-config",
        severity,
        f"{_describe(chosen)} loads {gain:.2f}x faster than your current settings",
        evidence=evidence,
        recommendation=f"Use {chosen.line(params.batch_size)} (the rest as you have "
        "it). Why: " + "; ".join(choice.notes) + ".",
        gain=Gain(GainKind.THROUGHPUT, gain, MEASURED) if gain else None,
        fix=_fix(chosen),
    )


def _demand(loader: StageResult) -> Finding | None:
    """With --step-ms: the configuration recommended against the samples/s the GPU
    consumes (batch size / step), and the current one."""
    params = loader.parameters
    step_ms, batch = params.step_ms, params.batch_size
    choice = choose(loader)
    if not step_ms or not batch or choice is None:
        return None
    demand = float(batch) / (float(step_ms) / 1e3)
    best, now = choice.chosen.rate, choice.current.rate
    evidence = (
        f"the GPU consumes {demand:,.0f} samples/s ({batch} a batch every {step_ms:g} ms, "
        f"your figure); {_describe(choice.chosen)} delivers {best:,.0f}, your current "
        f"settings {now:,.0f} (measured here)"
    )
    if best >= demand:
        said = "keeps" if now >= demand else "would keep"
        return Finding(
            "loader.own-demand",
            Severity.OK if now >= demand else Severity.INFO,
            f"Your pipeline {said} up with the GPU ({best / demand:.1f}x its demand)",
            evidence=evidence,
        )
    idle = 1 - best / demand
    return Finding(
        "loader.own-demand",
        Severity.CRITICAL if idle > 0.2 else Severity.WARNING,
        f"No configuration measured keeps up with the GPU: it would wait {idle:.0%} of each step",
        evidence=evidence,
        recommendation=(
            "More workers do not close this gap on this machine (the sweep above measured "
            "them). Do the per-sample work once, offline (decode and resize to the training "
            "resolution, pre-tokenize), move conversion and augmentation to the GPU, or "
            "give the job more CPUs."
        ),
        gain=Gain(GainKind.STEP_SHARE, round(idle, 4), "the share of each step the GPU waits"),
    )


def _extra_setting(found: list[Point], base: Point) -> tuple[Point, str] | None:
    """prefetch_factor or persistent_workers at the chosen count, where measured better."""
    if not base.workers:
        return None
    same = [
        p
        for p in found
        if p.workers == base.workers and p.labels.get("role") in ("prefetch", "persistent")
    ]
    best: tuple[Point, str] | None = None
    for p in same:
        if p.labels.get("role") == "prefetch" and p.rate >= AS_GOOD * base.rate:
            note = (
                f"prefetch_factor={p.labels.get('prefetch_factor')} measured "
                f"{p.rate / base.rate:.2f}x the samples/s of {base.labels.get('prefetch_factor')}"
            )
            if best is None or p.rate > best[0].rate:
                best = (p, note)
        if p.labels.get("role") == "persistent":
            before = base.get("epoch_start_s")
            after = p.get("epoch_start_s")
            sooner = before is not None and after is not None
            sooner = sooner and before - after >= EPOCH_START_SAVED_S  # type: ignore[operator]
            if sooner or p.rate >= AS_GOOD * base.rate:
                note = f"persistent_workers=True measured {p.rate / base.rate:.2f}x the samples/s"
                if sooner:
                    note += (
                        f" and starts each later epoch in {after:.2f} s instead of "
                        f"{before:.2f} s (its workers are not started again)"
                    )
                if best is None or p.rate >= best[0].rate:
                    best = (p, note)
    return best


def _describe(p: Point) -> str:
    text = f"num_workers={p.workers}"
    if p.workers and int(p.labels.get("prefetch_factor") or 2) != 2:
        text += f", prefetch_factor={p.labels['prefetch_factor']}"
    if p.workers and p.labels.get("persistent_workers"):
        text += ", persistent_workers=True"
    if p.labels.get("pin_memory"):
        text += ", pin_memory=True"
    return text


def _fix(p: Point) -> dict[str, Any]:
    fix: dict[str, Any] = {"num_workers": p.workers}
    if p.workers:
        fix["prefetch_factor"] = int(p.labels.get("prefetch_factor") or 2)
        fix["persistent_workers"] = bool(p.labels.get("persistent_workers"))
    fix["pin_memory"] = bool(p.labels.get("pin_memory"))
    return fix


def _copy_on_read(loader: StageResult, found: list[Point]) -> list[Finding]:
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


def _batch_transfer(loader: StageResult, found: list[Point]) -> list[Finding]:
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
