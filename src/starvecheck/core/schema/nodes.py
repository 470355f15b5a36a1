"""doctor across ranks: each rank's node as the report's `nodes` lists it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starvecheck.core.schema.record import Record


@dataclass(frozen=True)
class Node(Record):
    """A rank's node under doctor across ranks: its host, each link's capacity, its
    data pipeline (the lower of storage and loader), and whether it is a straggler."""

    rank: int
    host: str = ""
    capacity_samples_per_s: Mapping[str, float | None] = field(default_factory=dict)
    data_pipeline_samples_per_s: float | None = None
    straggler: bool = False
