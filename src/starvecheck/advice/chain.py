"""The chain judged: its weakest link, what fixing it buys, and the gains of every
stage's findings capped at what they buy this workload.

Pure functions of the links (advice/capacity.py: each link's capacity in samples/s,
`build`) and of the findings; `judge` is the entry point advice.judge calls for a
doctor run.

Throughput now is the lowest of the pipeline links and the GPU. The weakest link is
the lowest pipeline link below the GPU's rate (on a tie the GPU: a pipeline that
exactly keeps up is feeding it; then the link further upstream); fixing it buys
min(next pipeline limit, GPU rate) / its capacity. Otherwise the GPU is the limit,
and less padding (when wasteful) is its first fix: it buys min(pipeline limit, the
GPU's rate with less padding) / the GPU's rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from starvecheck.advice.capacity import build
from starvecheck.core import catalogue
from starvecheck.core import stages as stages_table
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.core.report import CHAIN_LINKS, Link

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

LINKS = CHAIN_LINKS
# Below this speed-up a fix is not worth a checklist line.
WORTH = 1.05
CRITICAL_SPEEDUP = 2.0
SAME = 0.01  # gains within 1% of the headroom are the same figure, rounded


def _pipeline(chain: Sequence[Link]) -> list[Link]:
    return [x for x in chain if x.link != "gpu" and x.capacity is not None]


@dataclass(frozen=True)
class Weakest:
    link: str | None  # None: too few links measured to name one
    capacity: float | None = None
    demand: float | None = None
    speedup: float | None = None  # how much faster training runs with it fixed
    next_link: str | None = None  # the limit after it (gpu: demand)
    headroom: float | None = None  # gpu weakest: lowest other capacity / demand
    message: str = ""


def weakest(chain: Sequence[Link]) -> Weakest:
    demand: float | None  # the GPU's rate, where its link was measured
    speedup: float | None  # training's, with the weakest link fixed
    pipeline = _pipeline(chain)
    gpu_link = next((x for x in chain if x.link == "gpu" and x.capacity is not None), None)
    if not pipeline:
        fixed = gpu_link.parts.get("padding_fixed") if gpu_link is not None else None
        if gpu_link is None or fixed is None or gpu_link.capacity is None:
            return Weakest(None, message="Weakest link: too few links measured to name one.")
        # Only the GPU is known: its step is all there is to judge.
        demand = gpu_link.capacity
        speedup = max(1.0, fixed / demand)
        text = "Weakest link: gpu (no pipeline link measured)"
        if speedup > 1 + SAME:
            text += (
                f": less padding would make the step up to {speedup:,.1f}x faster; whether "
                "training gets it depends on the pipeline, not measured here"
            )
        return Weakest("gpu", demand, demand, speedup, None, None, text + ".")
    order = {name: i for i, name in enumerate(LINKS)}
    ranked = sorted(pipeline, key=lambda x: (x.capacity, order.get(x.link, len(LINKS))))
    low, others = ranked[0], ranked[1:]
    assert low.capacity is not None
    demand = gpu_link.capacity if gpu_link is not None else None
    # Within 1% of the demand keeps up: a loader that takes turns with the step at
    # num_workers=0 is always a hair below it (advice/capacity.loader).
    if demand is not None and gpu_link is not None and low.capacity >= demand * (1 - SAME):
        return _gpu_weakest(gpu_link, low)
    # A pipeline link starves the GPU: fixing it helps until the next pipeline limit
    # or the GPU's rate, whichever is lower.
    nxt = others[0] if others else None
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
    return Weakest(low.link, low.capacity, demand, speedup, limit_name, None, text + ".")


def _gpu_weakest(gpu_link: Link, low: Link) -> Weakest:
    """The pipeline keeps up: the GPU step is the limit; less padding, where pad says
    the step computes padding, is what would make it faster, up to the pipeline."""
    demand = gpu_link.capacity
    assert demand is not None and low.capacity is not None
    headroom = low.capacity / demand
    text = "Weakest link: gpu: the input pipeline keeps up, the GPU step is the limit"
    fixed = gpu_link.parts.get("padding_fixed")
    if fixed is not None and fixed > demand * (1 + SAME):
        limit = min(low.capacity, fixed)
        speedup = limit / demand
        until = f"{low.link} at {low.capacity:,.0f}" if low.capacity < fixed else "all padding"
        text += (
            f"; less padding would make training up to {speedup:,.1f}x faster "
            f"(until {until}" + (" samples/s" if low.capacity < fixed else " removed") + ")"
        )
        return Weakest("gpu", demand, demand, speedup, low.link, headroom, text + ".")
    text += f" (next: {low.link} at {headroom:,.1f}x what the GPU consumes)"
    return Weakest("gpu", demand, demand, 1.0, low.link, headroom, text + ".")


# What to do about each link, pointing at the stage findings that say exactly how.
_FIX = {
    "storage": "Read from faster storage or a better layout: see the io findings "
    "(shards instead of one file per sample, more concurrent readers, a local copy).",
    "loader": "Feed the GPU faster from the host: see the loader and starve findings "
    "(num_workers, cheaper preprocessing, a shard layout).",
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
            catalogue.DOCTOR_WEAKEST_LINK,
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


def headroom(chain: Sequence[Link], name: str) -> float | None:
    """How much faster training runs if link `name` were made infinitely fast: up to
    the GPU's demand or the next lowest link, never below 1. None: not measured."""
    by_name = {x.link: x for x in chain}
    link = by_name.get(name)
    if link is None or link.capacity is None or not link.demand or link.capacity <= 0:
        return None
    others = [x.capacity for x in chain if x.link not in (name, "gpu") and x.capacity is not None]
    return max(1.0, min([link.demand, *others]) / link.capacity)


def padding_room(chain: Sequence[Link], gain: float) -> tuple[float, str] | None:
    """What less padding (a `gain`-fold faster step) buys training, and why: nothing
    while a pipeline link starves the GPU (the step is not the limit), else up to the
    lowest pipeline link. None: the GPU's rate is not known."""
    gpu_link = next((x for x in chain if x.link == "gpu"), None)
    if gpu_link is None or gpu_link.capacity is None:
        return None
    demand = gpu_link.capacity
    pipeline = _pipeline(chain)
    low = min(pipeline, key=lambda x: x.capacity or 0.0) if pipeline else None
    if low is not None and low.capacity is not None and low.capacity < demand * (1 - SAME):
        return 1.0, (
            f"the GPU waits for {low.link} ({low.capacity:,.0f} samples/s against the "
            f"{demand:,.0f} it consumes), so a faster step buys nothing until {low.link} "
            "is fixed"
        )
    if low is not None and low.capacity is not None and low.capacity < demand * gain:
        return max(1.0, low.capacity / demand), f"then {low.link} limits it"
    return gain, ""


def reweigh(findings: Sequence[Finding], chain: Sequence[Link]) -> list[Finding]:
    """Stage findings with their throughput gain capped at what it buys this workload.

    A stage's gain is the speed-up of its own link (a shard reads 15x faster than small
    files); training only gets it where that link is what holds the GPU back, and only
    up to the next limit. Padding is part of the GPU's step: less of it buys something
    only once the pipeline keeps up. Doctor ranks its checklist by the capped gain, and
    says so. A finding whose fix would not speed this workload up at all is kept, as
    info: true of the link, but not what to spend time on (nor what should fail CI)."""
    out = []
    for f in findings:
        g = f.gain
        if g is None or g.kind is not GainKind.THROUGHPUT or g.value is None:
            out.append(f)
            continue
        if f.stage == "pad":
            name = "the GPU step"
            found = padding_room(chain, g.value)
            if found is None:
                out.append(f)
                continue
            room, why = found
        else:
            name = stages_table.entry(f.stage).link or ""
            room_or_none = headroom(chain, name) if name else None
            if room_or_none is None:
                out.append(f)
                continue
            room = room_or_none
            why = (
                f"{name} already delivers more than the GPU consumes"
                if room <= 1.0
                else "then the next link limits it"
            )
        if g.value <= room * (1 + SAME):
            out.append(f)
            continue
        basis = (
            f"{g.basis}; {g.value:.2f}x for {name} itself, but training would run at most "
            f"{room:.2f}x faster: {why}"
        )
        severity = f.severity
        if room <= 1.0 + SAME and severity.rank > Severity.INFO.rank:
            severity = Severity.INFO
            basis += f" (info here, {f.severity.value} for {name} alone)"
        gain = Gain(GainKind.THROUGHPUT, round(room, 3), basis)
        out.append(replace(f, severity=severity, gain=gain))
    return out


# The workload inputs the chain's figures rest on, and what an unset one is.
CHAIN_INPUTS = ("batch_size", "step_ms", "cpu_ms_per_sample", "sample_size", "context")


def assumptions(results: Results) -> list[str]:
    """The inputs this doctor run assumed rather than was given or measured, in words."""
    w = results.workload
    assert w is not None
    out = []
    for key in CHAIN_INPUTS:
        source = w.source(key)
        if source in ("default", "assumed"):
            value = getattr(w, key)
            shown = f"{value:g}" if isinstance(value, float) else f"{value:,}"
            out.append(f"{key} {shown} ({source})")
    if "pad" in results and not w.dataset:
        out.append("the dataset (pad's embedded Alpaca-like lengths, not yours)")
    return out


# Findings judged against the workload: their weight comes from the chain.
# The stages whose findings the chain weighs: those about a link (the stage table's
# `link`), padding and doctor's own.
_WEIGHED = frozenset(e.name for e in stages_table.TABLE if e.link) | {"pad", "doctor"}


def hedged(findings: Sequence[Finding], assumed: Sequence[str]) -> list[Finding]:
    """A finding the chain weighed on assumed inputs is at most a warning, and says so
    in its title and evidence (an assumed step time can make any link look slow)."""
    if not assumed:
        return list(findings)
    note = (
        "Rests on assumed inputs: " + "; ".join(assumed) + ". Give yours (options or "
        "--workload FILE.toml) to judge your job."
    )
    out = []
    for f in findings:
        if f.stage not in _WEIGHED or f.severity is not Severity.CRITICAL:
            out.append(f)
            continue
        evidence = f"{f.evidence} {note}".strip()
        title = f"{f.title} (on assumed inputs)"
        out.append(replace(f, severity=Severity.WARNING, title=title, evidence=evidence))
    return out


def judge(
    results: Results, findings: Sequence[Finding]
) -> tuple[tuple[Link, ...], Weakest, list[Finding]]:
    """doctor's judgement over every stage's findings: the chain, its weakest link,
    each finding's gain weighed by what it buys this workload, and doctor's own; any
    that rests on assumed inputs at most a warning."""
    links = build(results)
    w = weakest(links)
    weighed = [*reweigh(findings, links), *advise(links, w)]
    return links, w, hedged(weighed, assumptions(results))
