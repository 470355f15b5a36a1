"""pcie's schema-1 names (names without labels) mapped to the labels its records write:
for reports stored before labels and for tests that build figures by name."""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import LabelValue, Metric
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.pcie import (
    FRESH,
    GROUP_LINK,
    GROUP_NUMA,
    OVERLAP,
    REFERENCE_RATIO,
    Clock,
    Copy,
    Direction,
    Link,
    Memory,
    Mode,
    Numa,
    Overlap,
    PcieFigures,
    Source,
)
from starvecheck.core.units import parse_size


def schema1_labels(name: str) -> dict[str, LabelValue]:
    """The labels of a schema-1 metric name (reports stored before labels, and tests
    that build figures by name, tests/fixtures/labels/pcie.py): the figure it names,
    written as `to_metrics` writes it; {"quantity": name} where it names none."""
    parts = name.split(".")
    cudart = parts[0] == "reference"
    parts, one = parts[1:] if cudart else parts, Figure(None)
    try:
        if parts[0] in set(Direction) and parts[1] in set(Memory):
            wall, timed = (None, one) if parts[-1] == Clock.EVENTS.value else (one, None)
            kind = Direction(parts[0]), Memory(parts[1]), parse_size(parts[2]) or 0
            source = Source.CUDART if cudart else Source.TORCH
            made = PcieFigures(copies=(Copy(*kind, wall, timed, source, FRESH in parts[3:]),))
        elif parts[0] == OVERLAP:
            part = {(parts[3:] or ["ratio"])[0]: one}
            made = PcieFigures(overlaps=(Overlap(Memory(parts[1]), Mode(parts[2]), **part),))
        elif parts[0] == GROUP_LINK:
            made = PcieFigures(link=Link(**{parts[1]: one}))
        elif parts[0] == GROUP_NUMA:
            made = PcieFigures(numa=Numa(**{parts[-1]: one}))
        else:
            made = PcieFigures(reference_ratio=one if name == REFERENCE_RATIO else None)
    except (TypeError, ValueError, IndexError):  # no figure of pcie's has this name
        made = PcieFigures()
    metrics = made.to_metrics()
    return dict(metrics[0].labels) if metrics else {"quantity": name}


def schema1_labelled(metrics: Sequence[Metric]) -> list[Metric]:
    """Metrics named as schema 1 named them, with the labels the stage writes."""
    return [m.labelled(**schema1_labels(m.name)) for m in metrics]
