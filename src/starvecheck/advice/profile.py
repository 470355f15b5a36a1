"""Judging a `profile` run: how much of each training step waits for data, in which
layout and at which num_workers, and what to change.

Reads the loop's figures as their record (core/schema/steps.ProfileFigures), read
from the metrics alike for a fresh result and a stored report. Thresholds as
HolisticTraceAnalysis and the PyTorch profiler guides use them: data wait above 5%
of the step is input-bound, above 20% highly input-bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from starvecheck.advice.workers import Cpus, IdleShares, recommend_workers
from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.core.schema.steps import Layout, Parameters, Phase, ProfileFigures

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

INPUT_BOUND = 0.05
HIGHLY_INPUT_BOUND = 0.20
LAYOUT_GAP = 0.05
H2D_SHARE = 0.10  # copies over a tenth of the step are worth overlapping
MIN_STEPS = 10  # fewer measured steps are a glimpse: no warning or critical from them


def few_steps(n: int, sev: Severity, counted: str = "measured") -> tuple[Severity, str]:
    """At most info, and why, with fewer than MIN_STEPS steps: a trace of a step or
    two is a glimpse, not a verdict."""
    if sev in (Severity.WARNING, Severity.CRITICAL) and 0 < n < MIN_STEPS:
        return Severity.INFO, f"; only {n} step(s) {counted}: {MIN_STEPS} or more for a verdict"
    return sev, ""


def rules(results: Results) -> list[Finding]:
    """profile's loop: its figures per layout and num_workers (a trace of another run
    is the `trace` stage's, judged by advice/trace)."""
    r = results.get("profile")
    if r is None:
        return []
    figures = r.records(ProfileFigures)
    s = figures.shares()
    if not s:
        return []
    cpus = Cpus(float(r.parameters.cpus))
    findings = [
        _best(s),
        _workers(s, cpus),
        _layout(s),
        _tokenize(s),
        _h2d(figures, r.parameters.read(Parameters)),
    ]
    return [f for f in findings if f is not None]


def severity(share: float) -> Severity:
    if share > HIGHLY_INPUT_BOUND:
        return Severity.CRITICAL
    return Severity.WARNING if share > INPUT_BOUND else Severity.OK


def _line(workers: int) -> str:
    return (
        f"`DataLoader(dataset, batch_size=..., num_workers={workers}, pin_memory=True, "
        f"persistent_workers={workers > 0}, prefetch_factor={2 if workers else None})`"
    )


Shares = Mapping[tuple[Layout, int], float]  # data-wait share by (layout, num_workers)


def _tokenize(s: Shares) -> Finding | None:
    """Raw text tokenized in the loader against the same number of pre-tokenized
    samples in shards, at the most workers both were measured with."""
    text = {w: v for (lay, w), v in s.items() if lay is Layout.TEXT}
    shards = {w: v for (lay, w), v in s.items() if lay is Layout.MDS}
    common = sorted(set(text) & set(shards))
    if not common:
        return None
    w = max(common)
    gap = text[w] - shards[w]
    if gap < LAYOUT_GAP:
        return None
    return Finding(
        catalogue.PROFILE_TOKENIZE,
        severity(text[w]),
        f"Tokenizing in the loader waits {gap:.0%} of the step longer than pre-tokenized shards",
        evidence=f"num_workers={w}: data wait {text[w]:.1%} tokenizing raw text per sample, "
        f"{shards[w]:.1%} reading token ids from MDS shards",
        recommendation="Tokenize once, before training: `dataset.map(tokenize, batched=True, "
        "num_proc=N)` and save the token ids (`save_to_disk`, or MDS with "
        "`streaming.MDSWriter`); or tokenize in more DataLoader workers "
        "(`starvecheck starve --tokenizer` sizes them).",
        gain=Gain(GainKind.STEP_SHARE, round(gap, 4), "data-wait share, raw text against shards"),
        stage="profile",
    )


def _h2d(figures: ProfileFigures, params: Parameters) -> Finding | None:
    """Copies the loop waits for: the loop times H2D_TRANSFER to its end (synchronised on
    CUDA), which is what a loop pays when the copy does not overlap compute."""
    worst = None
    for sc in figures.scenarios:
        copy, step = sc.phase(Phase.H2D_TRANSFER), sc.step_ms
        if copy is None or not copy.values:
            continue
        if step is None or not step.values or sum(step.values) <= 0:
            continue
        share = sum(copy.values) / sum(step.values)
        if worst is None or share > worst[0]:
            worst = (share, f"{sc.layout} with num_workers={sc.workers}")
    if worst is None or worst[0] <= H2D_SHARE:
        return None
    share, where = worst
    pinned = params.device == "cuda"  # the loop pins its batches on CUDA
    return Finding(
        catalogue.PROFILE_H2D,
        Severity.WARNING,
        f"Host-to-device copies take {share:.0%} of each step, not overlapped with compute",
        evidence=f"{where}: H2D_TRANSFER is {share:.1%} of the "
        "summed step time" + (" (pinned batches, timed to the copy's end)" if pinned else ""),
        recommendation="Overlap the copy with compute: `DataLoader(..., pin_memory=True)`, "
        "`batch.to(device, non_blocking=True)`, and copy the next batch on a side "
        "`torch.cuda.Stream()` while this one trains (a prefetcher); send less (int32 token "
        "ids, uint8 images normalised on the GPU). `starvecheck pcie` measures the link.",
        gain=Gain(GainKind.STEP_SHARE, round(share, 4), "copy time in the step; at most"),
        stage="profile",
    )


def _best(s: Shares) -> Finding:
    (layout, w), share = min(s.items(), key=lambda kv: kv[1])
    sev = severity(share)
    where = f"{layout} with num_workers={w}"
    if sev is Severity.OK:
        return Finding(
            catalogue.PROFILE_DATA_BOUND,
            Severity.OK,
            catalogue.PROFILE_DATA_BOUND.title("fed", share=share, where=f" ({where})"),
            stage="profile",
        )
    kind = "highly input-bound" if sev is Severity.CRITICAL else "input-bound"
    return Finding(
        catalogue.PROFILE_DATA_BOUND,
        sev,
        catalogue.PROFILE_DATA_BOUND.title(
            "bound",
            whose="Even the best configuration is",
            kind=kind,
            share=share,
            each="each step",
            more="",
        ),
        evidence=f"best measured: {where}; every configuration: "
        + ", ".join(f"{lay} w{n} {v:.0%}" for (lay, n), v in sorted(s.items())),
        recommendation="More workers do not close the gap here: find the slow link with "
        "`starvecheck starve` (CPU preprocessing per sample), `starvecheck io` (storage, "
        "cold cache) and `starvecheck loader` (layouts and workers).",
        gain=Gain(GainKind.STEP_SHARE, round(share, 4), "data wait of the best configuration"),
        stage="profile",
    )


def _workers(s: Shares, cpus: Cpus) -> Finding | None:
    """The data-wait share by num_workers, through the one worker rule: the fewest
    workers within 2 points of the least wait, at or below the effective CPUs."""
    worst = None
    for layout in sorted({lay for lay, _ in s}):
        counts = {w: v for (lay, w), v in s.items() if lay == layout}
        if len(counts) < 2:
            continue
        low = min(counts)
        advice = recommend_workers(IdleShares(counts), cpus)
        if advice is None or advice.workers == low:
            continue
        best_w = advice.workers
        gap = counts[low] - counts[best_w]
        if gap >= INPUT_BOUND and (worst is None or gap > worst[0]):
            worst = (gap, layout, low, best_w, counts[low], counts[best_w])
    if worst is None:
        return None
    gap, layout, low, best_w, share_low, share_best = worst
    return Finding(
        catalogue.PROFILE_WORKERS,
        severity(share_low),
        f"num_workers={low} leaves {share_low:.0%} of each step waiting for data; "
        f"{best_w} workers bring it to {share_best:.0%}",
        evidence=f"{layout}: data wait {share_low:.1%} of the step at num_workers={low}, "
        f"{share_best:.1%} at {best_w}",
        recommendation=f"Load in worker processes: {_line(best_w)}.",
        gain=Gain(GainKind.STEP_SHARE, round(gap, 4), "data-wait share recovered, measured here"),
        stage="profile",
    )


def _layout(s: Shares) -> Finding | None:
    files = {w: v for (lay, w), v in s.items() if lay is Layout.SMALL_FILES}
    shards = {w: v for (lay, w), v in s.items() if lay is Layout.MDS}
    common = sorted(set(files) & set(shards))
    if not common:
        return None
    w = max(common)
    gap = files[w] - shards[w]
    if gap < LAYOUT_GAP:
        return None
    return Finding(
        catalogue.PROFILE_SMALL_FILES,
        severity(files[w]),
        f"One file per sample waits {gap:.0%} of the step longer than MDS shards",
        evidence=f"num_workers={w}: data wait {files[w]:.1%} with one file per sample, "
        f"{shards[w]:.1%} with MDS shards",
        recommendation="Store samples in shards: `streaming.MDSWriter` then "
        "`StreamingDataset(local=..., shuffle=True)`, or WebDataset tar shards.",
        gain=Gain(GainKind.STEP_SHARE, round(gap, 4), "data-wait share, files against shards"),
        stage="profile",
    )
