"""Judging attach's split of a rank's wait for data by stage of loading (measured by
stages/attach/waitsplit.py; the stages are core/schema/loading.py's): the stage with the
largest exposed share, named with its fix (`attach.load-stage`) only where the evidence
decides it, its interval's low end above every other stage's high end, and only where
the wait itself is worth a finding (input-bound). What each fix is:

  read       the dataset's fetch off a CPU: more workers (a read waits, so they may
             outnumber the CPUs) or threads inside the dataset for its I/O
  transform  on a CPU: more workers up to the CPUs free for them (the worker model,
             attach.loader-bound), or cheaper transforms
  collate    the same, or a cheaper collate_fn
  handover   more workers do not shorten it: fewer bytes a batch, or fewer workers
  startup    workers started every pass: persistent_workers=True, a dataset that
             pickles small, the fork start method
  pin        pinning in one thread of the training process: fewer bytes a batch

A worker count's gain is attach.loader-bound's (the worker model): the read, transform
and collate findings give none of their own. For the others the gain is the stage's
part of the loop's time, at most (nothing predicts how much of it a fix removes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from starvecheck.advice.loadstages import MEANING
from starvecheck.core import catalogue
from starvecheck.core.intervals import percent
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.core.schema.attach import WaitPart
from starvecheck.core.schema.loading import LoadStage

SAID_SHARE = 0.02  # a stage under this share of the wait is left out of the sentence


@dataclass(frozen=True)
class Part:
    """A stage's share of a rank's wait, its 95% interval, and whether the workers'
    samples over the window stood for part of it (the split's assumption)."""

    share: float
    low: float
    high: float
    from_workers: bool

    def text(self) -> str:
        mark = "*" if self.from_workers else ""
        return f"{self.share:.0%}{mark} ({percent(self.low, self.high)})"


def read(wait: Sequence[WaitPart]) -> dict[LoadStage, Part]:
    """A rank's split (its record's `wait`), by stage; {} where its wait was not split."""
    out: dict[LoadStage, Part] = {}
    for p in wait:
        low, high = p.interval.low, p.interval.high
        if p.value is None:
            continue
        if low is None or high is None:
            low, high = 0.0, 1.0  # a report without intervals decides nothing
        out[p.stage] = Part(p.value, float(low), float(high), p.from_workers is True)
    return out


def decided(split: dict[LoadStage, Part]) -> LoadStage | None:
    """The stage with the largest share where its interval lies above every other
    stage's (the samples tell it apart); None where they do not."""
    if not split:
        return None
    top = max(split, key=lambda s: split[s].share)
    rest = [p.high for s, p in split.items() if s is not top]
    return top if split[top].share > 0 and all(split[top].low > h for h in rest) else None


def sentence(split: dict[LoadStage, Part]) -> str:
    """`; by stage (of its samples waiting for data): read 94%* (85-97%), handover 5%
    (3-10%)`, largest first; those under SAID_SHARE left out; '' where not split."""
    parts = [
        f"{s.value} {p.text()}"
        for s, p in sorted(split.items(), key=lambda x: -x[1].share)
        if p.share >= SAID_SHARE
    ]
    if not parts:
        return ""
    said = "; by stage (of its samples waiting for data): " + ", ".join(parts)
    if any(p.from_workers for p in split.values()):
        said += " (* in part from what the workers did over the window, not at the same moments)"
    return said


FIXES = {
    LoadStage.READ: (
        "More DataLoader workers overlap more reads: a read waits off a CPU, so workers may "
        "outnumber the CPUs (attach.loader-bound gives the count the worker model predicts); "
        "or threads inside the dataset for its I/O (a thread pool that fetches ahead, the "
        "storage client's own concurrency)."
    ),
    LoadStage.TRANSFORM: (
        "More DataLoader workers, up to the CPUs free for them (attach.loader-bound gives the "
        "count the worker model predicts); or cheaper transforms: decode at the size you "
        "train at, augment on the GPU."
    ),
    LoadStage.COLLATE: (
        "More DataLoader workers, up to the CPUs free for them (attach.loader-bound); or a "
        "cheaper collate_fn: pad or stack in the dataset, numpy arrays rather than lists of "
        "Python objects, no per-sample Python in collate_fn."
    ),
    LoadStage.HANDOVER: (
        "More workers do not shorten it. Send fewer bytes a batch (uint8 images converted "
        "to float and normalised on the device, int32 token ids, no copies of shared "
        "tensors), or fewer workers; `starvecheck loader --factory FILE.py:FUNC` measures "
        "num_workers=0, which hands nothing over, against your count."
    ),
    LoadStage.STARTUP: (
        "Keep the workers between passes: `DataLoader(..., persistent_workers=True)`. A "
        "dataset that pickles small (open files and load arrays in the worker, not in "
        "__init__) shortens every start under spawn and forkserver, which send each worker "
        "the whole dataset; so does the fork start method, where the job can use it."
    ),
    LoadStage.PIN: (
        "Pinning runs in one thread of the training process: fewer bytes a batch (uint8 "
        "images, converted on the device), or `pin_memory=False` where the copy need not "
        "overlap the step."
    ),
    LoadStage.COPY: "Copy fewer bytes a batch, with `non_blocking=True` from pinned memory.",
}
FIX_SETTINGS: dict[LoadStage, dict[str, bool]] = {LoadStage.STARTUP: {"persistent_workers": True}}
WORKERS_REACH = (LoadStage.READ, LoadStage.TRANSFORM, LoadStage.COLLATE)


def finding(
    parts: Sequence[WaitPart], who: str, wait: float, severity: Severity | None
) -> Finding | None:
    """`attach.load-stage` for a rank (its wait's split, `who` in words, its wait's
    share and the verdict on it): where the wait is input-bound and the split decides
    its largest stage."""
    if severity not in (Severity.WARNING, Severity.CRITICAL):
        return None
    split = read(parts)
    top = decided(split)
    if top is None:
        return None
    part = split[top]
    title = (
        f"{who}: most of its wait for data is {top.value} ({part.share:.0%} of it, "
        f"{percent(part.low, part.high)}): {MEANING[top]}"
    )
    evidence = f"{who}: waits for data {wait:.0%} of its samples{sentence(split)}"
    if part.from_workers:
        evidence += (
            f". The loop waited on its workers; {top.value} is the workers' share of their "
            "busy samples over the window (their samples are not lined up with the loop's)"
        )
    if top in WORKERS_REACH:
        gain = Gain(GainKind.STEP_SHARE, None, "a worker count's gain: attach.loader-bound's")
    else:
        gain = Gain(
            GainKind.STEP_SHARE,
            round(part.share * wait, 4),
            f"the {top.value} stage's part of the loop's time ({part.share:.0%} of a "
            f"{wait:.0%} wait), were it free; at most",
        )
    return Finding(
        catalogue.ATTACH_LOAD_STAGE,
        Severity.WARNING,
        title,
        evidence,
        FIXES[top],
        gain,
        fix=dict(FIX_SETTINGS.get(top, {})),
    )
