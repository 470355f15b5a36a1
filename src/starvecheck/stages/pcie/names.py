"""pcie's metric names and the labels that go with them: the one place that knows the
naming scheme (`h2d.pinned.256MiB[.fresh][.events]`, `reference.h2d.pinned.256MiB`,
`overlap.pinned.non_blocking[.cpu_ms]`, `link.<figure>`, `numa.<figure>`). Every
metric the stage emits passes through `labelled`, so advice/ and render/ select pcie
figures by labels (quantity, direction, memory, size, clock, source, variant, mode)
and never read a name."""

from __future__ import annotations

from starvecheck.core.metric import LabelValue, Metric
from starvecheck.core.schema.common import GBPS
from starvecheck.core.units import parse_size

DIRECTIONS = ("h2d", "d2h")
MEMORIES = ("pinned", "pageable")
MODES = ("blocking", "non_blocking")


def labels_of(name: str) -> dict[str, LabelValue]:
    parts = name.split(".")
    source = "torch"
    if parts[0] == "reference":
        source, parts = "cudart", parts[1:]
    if parts[0] in DIRECTIONS and len(parts) >= 3 and parts[1] in MEMORIES:
        out: dict[str, LabelValue] = {
            "quantity": GBPS,
            "direction": parts[0],
            "memory": parts[1],
            "size": parse_size(parts[2]) or 0,
            "clock": "events" if parts[-1] == "events" else "wall",
            "source": source,
        }
        if "fresh" in parts[3:]:
            out["variant"] = "fresh"
        return out
    if parts[0] == "overlap" and len(parts) >= 3:
        quantity = "overlap" if len(parts) == 3 else f"overlap_{parts[3]}"
        return {"quantity": quantity, "memory": parts[1], "mode": parts[2]}
    if parts[0] == "link":
        return {"quantity": parts[1], "group": "link"}
    if parts[0] == "numa":
        if parts[1] == "remote_penalty":
            return {"quantity": "remote_penalty", "group": "numa"}
        return {
            "quantity": GBPS,
            "group": "numa",
            "direction": parts[1],
            "memory": parts[2],
            "node": parts[3],
        }
    return {"quantity": name}  # reference_ratio


def labelled(metrics: list[Metric]) -> list[Metric]:
    return [m.labelled(**labels_of(m.name)) for m in metrics]
