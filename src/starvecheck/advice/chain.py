"""The chain: each link's capacity in samples/s for one workload, and the weakest link.

Pure functions of stage results (metrics selected by their labels) and the workload;
`judge` is the entry point advice.judge calls for a doctor run. The GPU consumes
demand = batch_size / step time samples per second; every link is stated in the
same unit so they compare directly:

  storage  io's cold samples/s for the workload's layout read as a shuffling loader
           reads it (shard.random or small_files.random), with the most readers
           measured; warm, said so, where io withheld the cold figure
  loader   the lower of: the DataLoader reading the layout at loader's recommended
           num_workers, and the CPU preprocessing rate starve measured (`capacity`
           of the starve result: cpu_ms_per_sample of real work per sample, in
           min(recommended, effective CPUs) workers, the consumer taking no time)
  padding  demand x e_current / e_best, pad's real-token share of the strategy
           trained with and of the best one: demand / capacity is the speed-up pad
           reports for switching
  pcie     pinned host-to-device GB/s at the transfer size nearest one batch (doctor
           measures one batch's own size), over the bytes one sample takes on the
           wire (context token ids)
  gpu      demand itself: the GPU is a link too, and the weakest when it is fed

The weakest link is the lowest capacity among the measured links; on a tie the GPU
(a pipeline that exactly keeps up is feeding it), then the link further upstream.
Fixing it helps until the next limit: min(demand, next lowest capacity) / its capacity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from starvecheck.figures import loader_curve
from starvecheck.model import CHAIN_LINKS, Finding, Gain, GainKind, Link, Severity, StageResult

if TYPE_CHECKING:
    from starvecheck.advice.judge import Results
from starvecheck.strategies import LABELS, STRATEGIES
from starvecheck.units import size_name

LINKS = CHAIN_LINKS
# Below this speed-up a fix is not worth a checklist line.
WORTH = 1.05
CRITICAL_SPEEDUP = 2.0
WIRE_GB = 1e9  # pcie reports decimal GB/s, as bandwidths are quoted
SAME = 0.01  # gains within 1% of the headroom are the same figure, rounded


def missing(link: str, demand: float | None, reason: str) -> Link:
    return Link(link, None, demand, reason=reason)


def storage(io: StageResult, layout: str, demand: float | None) -> Link:
    """Cold random reads of the layout by the most readers io ran (warm if withheld)."""
    threads = max(io.parameters.get("threads") or [1])
    withheld = None
    for temp in ("cold", "warm"):
        metric = io.one(
            quantity="samples_per_s", layout=layout, pattern="random", cache=temp, threads=threads
        )
        if metric is None:
            continue
        if metric.value is None:
            withheld = metric.reason
            continue
        basis = (
            f"io {layout}.random.{temp}, {threads} reader(s): random order, as a "
            "shuffling loader reads"
        )
        if temp == "warm":
            basis += (
                "; warm, from the page cache: the cold figure was withheld"
                + (f" ({withheld})" if withheld else "")
                + ", so this is what a second epoch gets, not the storage itself"
            )
        return Link("storage", metric.value, demand, basis)
    return missing("storage", demand, withheld or f"io measured no {layout}.random reads")


def read_capacity(loader: StageResult, layout: str) -> tuple[float | None, str]:
    """The DataLoader's samples/s over the layout at its recommended num_workers."""
    k = loader.value(quantity="recommended_num_workers", layout=layout)
    found = loader_curve(loader, layout)
    if k is None or found is None:
        return None, f"loader recommended no num_workers for {layout}"
    temp, curve = found
    value = curve.get(int(k))
    if value is None:
        return None, f"loader has no {layout} figure at {int(k)} workers"
    return value, f"loader {layout} {temp}, {int(k)} worker(s)"


def loader(
    read: tuple[float | None, str], cpu: tuple[float | None, str], demand: float | None
) -> Link:
    """The lower of reading through the DataLoader and CPU preprocessing, each
    (capacity, what it came from or why it is missing)."""
    parts = {"reading": read[0], "cpu": cpu[0]}
    known = {k: v for k, v in parts.items() if v is not None}
    if not known:
        return Link("loader", None, demand, reason=f"{read[1]}; {cpu[1]}", parts=parts)
    limited_by = min(known, key=lambda k: (known[k], k != "cpu"))
    basis = "; ".join(
        f"{name} {value:,.0f}/s ({why})" if value is not None else f"{name} not measured ({why})"
        for name, value, why in (("reading", read[0], read[1]), ("cpu", cpu[0], cpu[1]))
    )
    return Link("loader", known[limited_by], demand, basis, parts=parts, limited_by=limited_by)


def cpu_capacity(starve: StageResult) -> tuple[float | None, str]:
    if starve.capacity is None or starve.capacity.value is None:
        reason = starve.capacity.reason if starve.capacity else None
        return None, reason or "starve measured no preprocessing capacity"
    d = starve.parameters.get("sample_cpu_ms")
    workers = starve.parameters.get("capacity_workers")
    return starve.capacity.value, f"starve, {d} ms CPU per sample in {workers} worker(s)"


def best_strategy(efficiency: Mapping[str, float]) -> str | None:
    """The strategy with the most real tokens per position; ties go to the simpler one
    (listed first), as pad's advice picks it."""
    names = [s for s in STRATEGIES if s in efficiency]
    return max(names, key=lambda s: (round(efficiency[s], 4), -STRATEGIES.index(s)), default=None)


def padding(pad: StageResult, current: str, demand: float | None) -> Link:
    eff = {
        s: v for s in STRATEGIES if (v := pad.value(quantity="efficiency", strategy=s)) is not None
    }
    best = best_strategy(eff)
    if demand is None:
        return missing("padding", None, "no GPU step time, so no demand to scale")
    if best is None or not eff.get(current):
        return missing("padding", demand, f"pad measured no efficiency for {current}")
    e_cur, e_best = eff[current], eff[best]
    basis = (
        f"pad: {LABELS[current]} {e_cur:.1%} real tokens per position, {LABELS[best]} {e_best:.1%}"
    )
    return Link("padding", demand * e_cur / e_best, demand, basis)


def nearest_size(sizes: Sequence[int], nbytes: float) -> int | None:
    """The size (bytes) nearest `nbytes` on a log scale; the smaller on a tie."""
    valid = [b for b in sizes if b > 0]
    if not valid or nbytes <= 0:
        return None
    return min(valid, key=lambda b: (abs(math.log(b / nbytes)), b))


def pcie(result: StageResult, wire_bytes_per_sample: int, batch: int, demand: float | None) -> Link:
    rates = {
        int(m.labels["size"]): m.value
        for m in result.select(
            quantity="gbps", direction="h2d", memory="pinned", clock="wall", source="torch"
        )
        if m.value is not None and "variant" not in m.labels
    }
    size = nearest_size(list(rates), wire_bytes_per_sample * batch)
    if size is None:
        return missing("pcie", demand, "pcie measured no pinned host-to-device bandwidth")
    gbps = rates[size]
    basis = (
        f"pcie h2d pinned {gbps:,.1f} GB/s at {size_name(size)} (one batch is "
        f"{wire_bytes_per_sample * batch:,} bytes), {wire_bytes_per_sample:,} bytes per sample"
    )
    return Link("pcie", gbps * WIRE_GB / wire_bytes_per_sample, demand, basis)


def gpu(demand: float | None, basis: str) -> Link:
    if demand is None:
        return missing("gpu", None, "no GPU step time")
    return Link("gpu", demand, demand, basis)


@dataclass(frozen=True)
class Weakest:
    link: str | None  # None: too few links measured to name one
    capacity: float | None = None
    demand: float | None = None
    speedup: float | None = None  # how much faster training runs with it fixed
    next_link: str | None = None  # the limit after it (gpu: demand)
    next_capacity: float | None = None
    headroom: float | None = None  # gpu weakest: lowest other capacity / demand
    message: str = ""


def weakest(chain: Sequence[Link]) -> Weakest:
    measured = [x for x in chain if x.capacity is not None]
    if not any(x.link != "gpu" for x in measured):
        return Weakest(None, message="Weakest link: too few links measured to name one.")
    order = {name: i for i, name in enumerate(LINKS)}
    # The GPU first on a tie, then upstream first (chain order).
    ranked = sorted(
        measured,
        key=lambda x: (x.capacity, x.link != "gpu", order.get(x.link, len(LINKS))),
    )
    low, others = ranked[0], ranked[1:]
    assert low.capacity is not None
    demand = low.demand
    if low.link == "gpu":
        nxt = others[0] if others else None
        headroom = nxt.capacity / low.capacity if nxt and nxt.capacity and low.capacity else None
        text = "Weakest link: gpu: the input pipeline keeps up, the GPU step is the limit"
        if nxt is not None and headroom is not None:
            text += f" (next: {nxt.link} at {headroom:,.1f}x what the GPU consumes)"
        return Weakest(
            "gpu",
            low.capacity,
            demand,
            1.0,
            nxt.link if nxt else None,
            nxt.capacity if nxt else None,
            headroom,
            text + ".",
        )
    # Fixing this link helps until the next limit: the next lowest link, or the GPU.
    nxt = next((x for x in others if x.link != "gpu"), None)
    limit, limit_name = demand, "the GPU's demand"
    if nxt is not None and nxt.capacity is not None and (limit is None or nxt.capacity < limit):
        limit, limit_name = nxt.capacity, nxt.link
    speedup = limit / low.capacity if limit is not None and low.capacity > 0 else None
    text = f"Weakest link: {low.link}"
    if speedup is not None:
        text += (
            f": fixing it would make training up to {speedup:,.1f}x faster "
            f"(until {limit_name} at {limit:,.0f} samples/s)"
        )
    return Weakest(low.link, low.capacity, demand, speedup, limit_name, limit, None, text + ".")


# What to do about each link, pointing at the stage findings that say exactly how.
_FIX = {
    "storage": "Read from faster storage or a better layout: see the io findings "
    "(shards instead of one file per sample, more concurrent readers, a local copy).",
    "loader": "Feed the GPU faster from the host: see the loader and starve findings "
    "(num_workers, cheaper preprocessing, a shard layout).",
    "padding": "Batch with less padding: see pad.waste for the one-line change.",
    "pcie": "Copy batches faster to the GPU: pinned memory (pin_memory=True), "
    "non_blocking copies, fewer bytes per sample (int32 token ids).",
}


def advise(chain: Sequence[Link], w: Weakest) -> tuple[Finding, ...]:
    """doctor.weakest-link when a data link starves the GPU enough to matter."""
    if w.link is None or w.link == "gpu" or w.speedup is None or w.speedup < WORTH:
        return ()
    by_name = {x.link: x for x in chain}
    link = by_name[w.link]
    evidence = ", ".join(
        f"{x.link} {x.capacity:,.0f}" if x.capacity is not None else f"{x.link} n/a" for x in chain
    )
    return (
        Finding(
            "doctor.weakest-link",
            Severity.CRITICAL if w.speedup >= CRITICAL_SPEEDUP else Severity.WARNING,
            f"The GPU waits for {w.link}: {link.capacity:,.0f} samples/s against the "
            f"{link.demand:,.0f} it consumes",
            evidence=f"Capacity in samples/s: {evidence}. {w.link}: {link.basis}.",
            recommendation=_FIX.get(w.link, ""),
            gain=Gain(
                GainKind.THROUGHPUT,
                round(w.speedup, 3),
                f"{w.link} raised to the next limit ({w.next_link})",
            ),
            stage="doctor",
        ),
    )


# The link each stage's findings are about; env's and doctor's own are about none.
STAGE_LINK = {
    "io": "storage",
    "loader": "loader",
    "starve": "loader",
    "pad": "padding",
    "pcie": "pcie",
}


def headroom(chain: Sequence[Link], name: str) -> float | None:
    """How much faster training runs if link `name` were made infinitely fast: up to
    the GPU's demand or the next lowest link, never below 1. None: not measured."""
    by_name = {x.link: x for x in chain}
    link = by_name.get(name)
    if link is None or link.capacity is None or not link.demand or link.capacity <= 0:
        return None
    others = [x.capacity for x in chain if x.link not in (name, "gpu") and x.capacity is not None]
    return max(1.0, min([link.demand, *others]) / link.capacity)


def reweigh(findings: Sequence[Finding], chain: Sequence[Link]) -> list[Finding]:
    """Stage findings with their throughput gain capped at what it buys this workload.

    A stage's gain is the speed-up of its own link (a shard reads 15x faster than small
    files); training only gets it where that link is what holds the GPU back, and only
    up to the next limit. Doctor ranks its checklist by the capped gain, and says so.
    A finding whose fix would not speed this workload up at all is kept, as info: true
    of the link, but not what to spend time on (nor what should fail a CI job)."""
    out = []
    for f in findings:
        name = STAGE_LINK.get(f.stage)
        g = f.gain
        room = headroom(chain, name) if name else None
        if g is None or g.kind is not GainKind.THROUGHPUT or g.value is None or room is None:
            out.append(f)
            continue
        if g.value <= room * (1 + SAME):
            out.append(f)
            continue
        basis = (
            f"{g.basis}; {g.value:.2f}x for {name} itself, but training would run at most "
            f"{room:.2f}x faster: "
            + (
                f"{name} already delivers more than the GPU consumes"
                if room <= 1.0
                else "then the next link limits it"
            )
        )
        severity = f.severity
        if room <= 1.0 + SAME and severity.rank > Severity.INFO.rank:
            severity = Severity.INFO
            basis += f" (info here, {f.severity.value} for {name} alone)"
        gain = Gain(GainKind.THROUGHPUT, round(room, 3), basis)
        out.append(replace(f, severity=severity, gain=gain))
    return out


def build(results: Results) -> tuple[Link, ...]:
    """The chain for a doctor run: each link from its stage's result, or missing with
    the reason (not selected, no CUDA device, failed part-way)."""
    w = results.workload
    assert w is not None
    demand = w.demand
    why = results.extra.get("unavailable", {})
    io, loader_r, starve, pad, pcie_r = (
        results.get(s) for s in ("io", "loader", "starve", "pad", "pcie")
    )
    storage_link = (
        storage(io, w.layout, demand)
        if io is not None
        else missing("storage", demand, f"not measured: {why.get('io', 'io not run')}")
    )
    read = (
        read_capacity(loader_r, w.layout) if loader_r is not None else (None, "loader not selected")
    )
    cpu = cpu_capacity(starve) if starve is not None else (None, "starve not selected")
    padding_link = (
        padding(pad, w.current, demand)
        if pad is not None
        else missing("padding", demand, f"not measured: {why.get('pad', 'pad not run')}")
    )
    pcie_link = (
        pcie(pcie_r, w.wire_bytes_per_sample, w.batch_size, demand)
        if pcie_r is not None
        else missing("pcie", demand, f"not measured: {why.get('pcie', 'no CUDA device')}")
    )
    gpu_link = gpu(demand, results.extra.get("gpu_basis", ""))
    return (storage_link, loader(read, cpu, demand), padding_link, pcie_link, gpu_link)


def judge(
    results: Results, findings: Sequence[Finding]
) -> tuple[tuple[Link, ...], Weakest, list[Finding]]:
    """doctor's judgement over every stage's findings: the chain, its weakest link,
    each finding's gain weighed by what it buys this workload, and doctor's own."""
    links = build(results)
    w = weakest(links)
    return links, w, [*reweigh(findings, links), *advise(links, w)]
