"""Whether a cold run was cold: each layout's page-cache residency before its runs
(mincore), and what that means for the figures, for io, loader and profile alike.
A cold figure whose data was still cached is withheld with the reason (docs/architecture.md,
principle 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from starvecheck.core.metric import Caveat, Metric
from starvecheck.core.schema import samples
from starvecheck.core.schema.samples import Residency
from starvecheck.stages.samples.layouts import Layout
from starvecheck.stages.timing import not_cold as not_cold_caveat

# A cold run is cold when at most this share of its data was resident before it.
COLD_MAX_RESIDENT = 0.05
# A warm run is warm when at least this share was resident (less: data > page cache).
WARM_MIN_RESIDENT = 0.95


def record_residency(layout: Layout, errors: list[str]) -> float | None:
    """The layout's resident fraction; why it could not be read goes to `errors`, once."""
    res = layout.residency()
    if res.reason and res.reason not in errors:
        errors.append(res.reason)
    return res.fraction


class CacheRecord(Protocol):
    resident_cold: dict[str, list[float | None]]
    resident_warm: dict[str, list[float | None]]
    residency_errors: list[str]


def judge_cache(
    names: Sequence[str],
    m: CacheRecord,
    fs_kind: str | None,
    *,
    command: str,
    unit: str,
    fix: str,
) -> tuple[list[Residency], list[Caveat], dict[str, str]]:
    """What the residency checks say, for io and loader alike: each layout's
    residency before its cold runs, caveats, and the layouts whose cold figures must
    be withheld (with the reason). `unit` is what one measurement is called ("run",
    "epoch"); `fix` what to do where the cache could not be emptied."""
    metrics: list[Residency] = []
    caveats: list[Caveat] = []
    not_cold: dict[str, str] = {}
    for name in names:
        fractions = m.resident_cold.get(name, [])
        known = [f for f in fractions if f is not None]
        if known:
            metrics.append(Residency.of(samples.Layout(name), known))
            if max(known) > COLD_MAX_RESIDENT:
                not_cold[name] = (
                    f"not cold: {max(known):.0%} of the data was still in the page cache "
                    f"before a cold {unit}"
                )
        elif fractions:
            caveats.append(
                Caveat(
                    "cache.unchecked",
                    f"{name}: could not check that the cache was cold "
                    f"({'; '.join(m.residency_errors) or 'mincore failed'}); "
                    "compare the cold and warm figures before trusting the cold ones",
                )
            )
        warm = [f for f in m.resident_warm.get(name, []) if f is not None]
        if warm and min(warm) < WARM_MIN_RESIDENT:
            caveats.append(
                Caveat(
                    "cache.partly-warm",
                    f"{name}: only {min(warm):.0%} of the data stayed in the page cache "
                    "after a full read, so the warm figures are partly cold (the data is "
                    "larger than the memory the page cache can use)",
                )
            )
    if not_cold and fs_kind == "memory":
        caveats.append(
            not_cold_caveat(
                f"this path is on tmpfs (memory), where data cannot be cold: the cold figures "
                f"of {', '.join(sorted(not_cold))} are withheld; run {command} on the "
                "filesystem the dataset really lives on"
            )
        )
    elif not_cold:
        caveats.append(
            not_cold_caveat(
                f"the page cache could not be emptied for {', '.join(sorted(not_cold))}: the "
                f"cold figures would have been warm ones and are withheld. {fix[0].upper()}"
                f"{fix[1:]}"
            )
        )
    return metrics, caveats, not_cold


def resident_metric(layout: str, fractions: list[float]) -> Metric:
    """`resident_before.<layout>`: the largest fraction of the layout's data found in
    the page cache before a cold run (the figure that decides), every value kept."""
    return Residency.of(samples.Layout(layout), fractions).metric()
