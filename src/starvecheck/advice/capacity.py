"""The chain's links: each one's capacity in samples/s for one workload.

Pure functions of stage results (metrics selected by their labels) and the workload;
`build` makes the chain for a doctor run, which advice/chain.py judges (the weakest
link, the gains capped per workload). The GPU consumes demand = batch_size / step
time samples per second; every link is stated in the same unit so they compare
directly:

  storage  io's cold samples/s for the workload's layout read as a shuffling loader
           reads it (shard.random or small_files.random), with the most readers
           measured; warm, said so, where io withheld the cold figure
  loader   the lower of: the DataLoader reading the layout at loader's recommended
           num_workers, and the CPU preprocessing rate starve measured (`capacity`
           of the starve result: cpu_ms_per_sample of real work per sample, in
           min(recommended, effective CPUs) workers, the consumer taking no time)
  pcie     pinned host-to-device GB/s at the transfer size nearest one batch (doctor
           measures one batch's own size), over the bytes one sample takes on the
           wire (context token ids)
  gpu      demand itself, batch_size / step time as trained now. Padding is part of
           the step, not a link: pad's real-token share of the strategy trained with
           and of the best one give the rate the same step would reach with less
           padding, demand x e_best / e_current (the gpu link's `parts`:
           `as_trained`, `padding_fixed`; step time taken as proportional to
           positions)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from starvecheck.core.model import StageResult
from starvecheck.core.report import Link
from starvecheck.core.schema.io import IoFigures, Pattern, Place
from starvecheck.core.schema.io import Parameters as IoParameters
from starvecheck.core.schema.loader import LoaderFigures, Recommended, StarveParameters
from starvecheck.core.schema.pad import PadFigures, Strategy
from starvecheck.core.schema.pcie import Direction, Memory, PcieFigures
from starvecheck.core.schema.samples import Cache, Layout, enum_of
from starvecheck.core.stages import FACTORY
from starvecheck.core.strategies import LABELS, STRATEGIES
from starvecheck.core.units import size_name

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

WIRE_GB = 1e9  # pcie reports decimal GB/s, as bandwidths are quoted


def missing(link: str, demand: float | None, reason: str) -> Link:
    return Link(link, None, demand, reason=reason)


def storage(io: StageResult, layout: str, demand: float | None) -> Link:
    """Cold random reads of the layout by the most readers io ran (warm if withheld)."""
    threads = max(io.parameters.read(IoParameters).threads)
    withheld = None
    known = enum_of(Layout, layout)
    for temp in Cache:
        place = None if known is None else Place(known, Pattern.RANDOM, temp, threads)
        reads = None if place is None else io.records(IoFigures).at(place)
        metric = None if reads is None else reads.samples_per_s
        if metric is None:
            continue
        if metric.value is None:
            withheld = metric.reason
            continue
        basis = (
            f"io {layout}.random.{temp}, {threads} reader(s): random order, as a "
            "shuffling loader reads"
        )
        if temp is Cache.WARM:
            basis += (
                "; warm, from the page cache: the cold figure was withheld"
                + (f" ({withheld})" if withheld else "")
                + ", so this is what a second epoch gets, not the storage itself"
            )
        return Link("storage", metric.value, demand, basis)
    return missing("storage", demand, withheld or f"io measured no {layout}.random reads")


def own_capacity(factory: StageResult) -> tuple[float | None, str]:
    """The user's own pipeline (`--factory`): its samples/s at the configuration
    recommended for it."""
    from starvecheck.advice import factory as own

    if factory.delivers is None or factory.delivers.value is None:
        return None, "your pipeline: no configuration measured to recommend"
    return factory.delivers.value, own.basis(factory)


def link_workers(
    factory: StageResult | None, loader: StageResult | None, starve: StageResult | None, layout: str
) -> int | None:
    """The num_workers the loader link's figure is at: the configuration recommended for
    the user's own pipeline; else the larger of loader's count for the layout and
    starve's (the workers must both read and preprocess). None where unknown."""
    if factory is not None:
        from starvecheck.advice import factory as own

        choice = own.choice_of(factory)
        return None if choice is None else choice.chosen.workers
    counts = []
    if loader is not None:
        counts.append(_recommended(loader, layout))
    if starve is not None and starve.delivers is not None:
        counts.append(starve.parameters.read(StarveParameters).capacity_workers)
    known = [k for k in counts if k is not None]
    return max(known) if known and len(known) == len(counts) else None


def _recommended(loader: StageResult, layout: str) -> int | None:
    """loader's recommended num_workers for the layout (judging's), None where none."""
    known = enum_of(Layout, layout)
    figures = loader.figures  # judging's, or a stored schema-2 report's among the metrics
    return None if known is None else Recommended.from_metrics(figures).layouts.get(known)


def read_capacity(loader: StageResult, layout: str) -> tuple[float | None, str]:
    """The DataLoader's samples/s over the layout at its recommended num_workers."""
    k = _recommended(loader, layout)
    known = enum_of(Layout, layout)
    found = None if known is None else loader.records(LoaderFigures).curve(known)
    if k is None or found is None:
        return None, f"loader recommended no num_workers for {layout}"
    temp, curve = found
    value = curve.get(int(k))
    if value is None:
        return None, f"loader has no {layout} figure at {int(k)} workers"
    return value, f"loader {layout} {temp}, {int(k)} worker(s)"


def loader(
    read: tuple[float | None, str],
    cpu: tuple[float | None, str],
    demand: float | None,
    workers: int | None = None,
) -> Link:
    """The lower of reading through the DataLoader and CPU preprocessing, each
    (capacity, what it came from or why it is missing). `workers`: the num_workers the
    link's figure is at. At 0 the training process loads each batch and then runs its
    step: the two take turns, so with the GPU's step the link delivers c * d / (c + d)
    samples/s (c alone, d the GPU's demand), not c."""
    parts = {"reading": read[0], "cpu": cpu[0]}
    known = {k: v for k, v in parts.items() if v is not None}
    if not known:
        return Link("loader", None, demand, reason=f"{read[1]}; {cpu[1]}", parts=parts)
    limited_by = min(known, key=lambda k: (known[k], k != "cpu"))
    basis = "; ".join(
        f"{name} {value:,.0f}/s ({why})" if value is not None else f"{name} not measured ({why})"
        for name, value, why in (("reading", read[0], read[1]), ("cpu", cpu[0], cpu[1]))
    )
    capacity = known[limited_by]
    if workers == 0 and demand:
        alone = capacity
        capacity = alone * demand / (alone + demand)
        parts = {**parts, "alone": alone}
        basis += (
            f"; at num_workers=0 loading and the GPU step take turns: {alone:,.0f}/s alone, "
            f"{capacity:,.0f}/s beside the step"
        )
    return Link("loader", capacity, demand, basis, parts=parts, limited_by=limited_by)


def cpu_capacity(starve: StageResult) -> tuple[float | None, str]:
    if starve.delivers is None or starve.delivers.value is None:
        reason = starve.delivers.reason if starve.delivers else None
        return None, reason or "starve measured no preprocessing capacity"
    params = starve.parameters.read(StarveParameters)
    d, workers = params.sample_cpu_ms, params.capacity_workers
    return starve.delivers.value, f"starve, {d} ms CPU per sample in {workers} worker(s)"


def best_strategy(efficiency: Mapping[str, float]) -> str | None:
    """The strategy with the most real tokens per position; ties go to the simpler one
    (listed first), as pad's advice picks it."""
    names = [s for s in STRATEGIES if s in efficiency]
    return max(names, key=lambda s: (round(efficiency[s], 4), -STRATEGIES.index(s)), default=None)


def padding(pad: StageResult, current: str, demand: float | None) -> tuple[float | None, str]:
    """(the GPU's samples/s with the least-padding strategy, what it rests on); the
    rate is None, with the reason, where pad measured no figure to scale by."""
    by_strategy = pad.records(PadFigures).efficiencies()
    eff = {s: by_strategy[Strategy(s)] for s in STRATEGIES if Strategy(s) in by_strategy}
    best = best_strategy(eff)
    if demand is None:
        return None, "no GPU step time, so no rate to scale"
    if best is None or not eff.get(current):
        return None, f"pad measured no efficiency for {current}"
    e_cur, e_best = eff[current], eff[best]
    basis = (
        f"padding: {LABELS[current]} {e_cur:.1%} real tokens per position, "
        f"{LABELS[best]} {e_best:.1%}"
    )
    return demand * e_best / e_cur, basis


def nearest_size(sizes: Sequence[int], nbytes: float) -> int | None:
    """The size (bytes) nearest `nbytes` on a log scale; the smaller on a tie."""
    valid = [b for b in sizes if b > 0]
    if not valid or nbytes <= 0:
        return None
    return min(valid, key=lambda b: (abs(math.log(b / nbytes)), b))


def pcie(result: StageResult, wire_bytes_per_sample: int, batch: int, demand: float | None) -> Link:
    figures, h2d, pinned = result.records(PcieFigures), Direction.H2D, Memory.PINNED
    rates: dict[int, float] = {}
    for s in figures.sizes(h2d, pinned):  # torch's, by the wall clock
        copy = figures.copy(h2d, pinned, s)
        if copy is not None and copy.wall is not None and copy.wall.value is not None:
            rates[s] = copy.wall.value
    size = nearest_size(list(rates), wire_bytes_per_sample * batch)
    if size is None:
        return missing("pcie", demand, "pcie measured no pinned host-to-device bandwidth")
    gbps = rates[size]
    basis = (
        f"pcie h2d pinned {gbps:,.1f} GB/s at {size_name(size)} (one batch is "
        f"{wire_bytes_per_sample * batch:,} bytes), {wire_bytes_per_sample:,} bytes per sample"
    )
    return Link("pcie", gbps * WIRE_GB / wire_bytes_per_sample, demand, basis)


def gpu(
    demand: float | None, basis: str, padding_fix: tuple[float | None, str] | None = None
) -> Link:
    """The GPU's rate as trained now; with pad's figures, the rate the same step would
    reach with less padding (`parts`)."""
    if demand is None:
        return missing("gpu", None, "no GPU step time")
    parts: dict[str, float | None] = {}
    if padding_fix is not None:
        rate, why = padding_fix
        if rate is not None:
            parts = {"as_trained": demand, "padding_fixed": rate}
            basis += f"; {why}: {rate:,.0f} samples/s with it"
        else:
            basis += f"; padding not judged: {why}"
    return Link("gpu", demand, demand, basis, parts=parts)


def build(results: Results) -> tuple[Link, ...]:
    """The chain for a doctor run: each link from its stage's result, or missing with
    the reason (not selected, no CUDA device, failed part-way)."""
    w = results.workload
    assert w is not None
    demand = w.demand
    why = results.doctor.unavailable
    io, loader_r, factory, starve, pad, pcie_r = (
        results.get(s) for s in ("io", "loader", FACTORY, "starve", "pad", "pcie")
    )
    storage_link = (
        storage(io, w.layout, demand)
        if io is not None
        else missing("storage", demand, f"not measured: {why.get('io', 'io not run')}")
    )
    read = (
        own_capacity(factory)
        if factory is not None
        else read_capacity(loader_r, w.layout)
        if loader_r is not None
        else (None, "loader not selected")
    )
    cpu = cpu_capacity(starve) if starve is not None else (None, "starve not selected")
    if factory is not None:
        cpu = (None, "in your pipeline's own figure")
    padding_fix = (
        padding(pad, w.current, demand)
        if pad is not None
        else (None, f"not measured: {why.get('pad', 'pad not run')}")
    )
    pcie_link = (
        pcie(pcie_r, w.wire_bytes_per_sample, w.batch_size, demand)
        if pcie_r is not None
        else missing("pcie", demand, f"not measured: {why.get('pcie', 'no CUDA device')}")
    )
    gpu_link = gpu(demand, results.doctor.gpu_basis, padding_fix)
    workers = link_workers(factory, loader_r, starve, w.layout)
    return (storage_link, loader(read, cpu, demand, workers), pcie_link, gpu_link)
