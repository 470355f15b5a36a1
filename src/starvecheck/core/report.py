"""The report: everything one command found (`Report`: the machine's facts, each
stage's result, the ranked checklist; doctor's chain of `Link`s), written as JSON by
`to_dict()` and read back by `from_dict()`. A stage's result and its findings are
core/model.py's.

The JSON's schema versions, and what each added: docs/json.md ("Schema versions").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from starvecheck.core.jsonvalue import JsonDict, JsonObject
from starvecheck.core.model import Finding, StageResult, restamped
from starvecheck.core.schema.machine import Machine
from starvecheck.core.schema.nodes import Node

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# A stored report's lists, as its schema writes them (read, not checked: `from_dict`).
_Objects = Sequence[JsonObject]


# The links of the chain, upstream first (docs/architecture.md, "The result model"): the pipeline
# links deliver samples/s, the GPU consumes them. Padding is no link: it is part of
# the GPU's step (the gpu link's `parts`).
CHAIN_LINKS = ("storage", "loader", "pcie", "gpu")


@dataclass(frozen=True)
class Link:
    """One link of the chain (storage, loader, padding, pcie, gpu) against one workload:
    the samples per second it can deliver next to what the GPU consumes. `capacity`
    is None only when the link was not measured, and `reason` says why."""

    link: str
    capacity: float | None
    demand: float | None
    basis: str = ""  # what the capacity came from, in a short phrase
    reason: str | None = None  # why capacity is None
    # Where a link is the lower of several limits (loader: reading vs CPU work): each.
    parts: Mapping[str, float | None] = field(default_factory=dict)
    limited_by: str | None = None

    @property
    def ratio(self) -> float | None:
        """Capacity over demand: below 1 the GPU waits for this link."""
        if self.capacity is None or not self.demand:
            return None
        return self.capacity / self.demand

    def to_dict(self) -> JsonDict:
        parts: JsonDict = dict(self.parts)
        return {
            "link": self.link,
            "capacity_samples_per_s": self.capacity,
            "demand_samples_per_s": self.demand,
            "basis": self.basis,
            "reason": self.reason,
            "parts": parts,
            "limited_by": self.limited_by,
        }

    @classmethod
    def from_dict(cls, d: JsonObject) -> Link:
        return cls(
            link=cast(str, d["link"]),
            capacity=cast(float | None, d.get("capacity_samples_per_s")),
            demand=cast(float | None, d.get("demand_samples_per_s")),
            basis=cast(str, d.get("basis", "")),
            reason=cast(str | None, d.get("reason")),
            parts=dict(cast(Mapping[str, float | None], d.get("parts", {}))),
            limited_by=cast(str | None, d.get("limited_by")),
        )


@dataclass(frozen=True)
class Report:
    """Everything one command found: machine facts, stage results, the ranked checklist."""

    command: str
    machine: JsonObject  # JSON-ready facts from probe.machine (Machine.to_dict()); `facts`
    stages: tuple[StageResult, ...] = ()
    checklist: tuple[Finding, ...] = ()  # ranked; see advice.rank
    weakest_link: str | None = None
    verdict: str = ""
    tool_version: str = ""
    created_at: str = ""
    # doctor only (empty elsewhere, and then left out of the JSON):
    workload: JsonObject = field(default_factory=dict)
    chain: tuple[Link, ...] = ()
    weakest_summary: str = ""  # the sentence judging wrote under the chain
    nodes: tuple[Node, ...] = ()  # one per rank under torchrun

    @property
    def findings(self) -> tuple[Finding, ...]:
        return tuple(f for s in self.stages for f in s.findings)

    @property
    def facts(self) -> Machine:
        """The machine facts as their record (core/schema/machine.py), read from
        `machine`, the serialised form, alike for a fresh report and a stored one."""
        return Machine.from_dict(self.machine)

    def to_dict(self) -> JsonDict:
        d: JsonDict = {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "starvecheck", "version": self.tool_version},
            "command": self.command,
            "created_at": self.created_at,
            "machine": dict(self.machine),
            "stages": [s.to_dict() for s in self.stages],
            "checklist": [f.to_dict() for f in self.checklist],
            "weakest_link": self.weakest_link,
            "verdict": self.verdict,
        }
        return d | self._doctor_dict()

    def _doctor_dict(self) -> JsonDict:
        d: JsonDict = {}
        if self.workload:
            d["workload"] = dict(self.workload)
        if self.chain:
            d["chain"] = [link.to_dict() for link in self.chain]
            d["weakest_summary"] = self.weakest_summary
        if self.nodes:
            d["nodes"] = [n.to_dict() for n in self.nodes]
        return d

    @classmethod
    def from_dict(cls, d: JsonObject) -> Report:
        version = d.get("schema_version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"unsupported report schema_version {version!r}")
        # A stored report's shape is its schema's (docs/json.md): read as written.
        stages = tuple(StageResult.from_dict(s) for s in cast(_Objects, d.get("stages", ())))
        own = {s.reported_as: s.stage for s in stages}
        checklist = cast(_Objects, d.get("checklist", ()))
        return cls(
            command=cast(str, d["command"]),
            machine=dict(cast(JsonObject, d.get("machine", {}))),
            stages=stages,
            checklist=tuple(restamped(Finding.from_dict(f), own) for f in checklist),
            weakest_link=cast(str | None, d.get("weakest_link")),
            verdict=cast(str, d.get("verdict", "")),
            tool_version=cast(str, cast(JsonObject, d.get("tool", {})).get("version", "")),
            created_at=cast(str, d.get("created_at", "")),
            workload=dict(cast(JsonObject, d.get("workload", {}))),
            chain=tuple(Link.from_dict(x) for x in cast(_Objects, d.get("chain", ()))),
            weakest_summary=cast(str, d.get("weakest_summary", "")),
            nodes=Node.read_all(d.get("nodes", ())),
        )
