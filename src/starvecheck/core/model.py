"""The result model: what stages return and what renderers read (a stage's result
and its findings; the report that holds them is core/report.py's).

Results are frozen once made; their figures (`Metric`, with labels, and `Caveat`) are
core/metric.py's. Every class has `to_dict()` and `from_dict()` so a report written as
JSON loads back into the same objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import cast

from starvecheck.core import stages as stages_table
from starvecheck.core.jsonvalue import JsonDict, JsonObject
from starvecheck.core.judged import Judged
from starvecheck.core.metric import Caveat, LabelValue, Metric, caveat, one, select, value
from starvecheck.core.parameters import Parameters
from starvecheck.core.schema.common import JUDGED
from starvecheck.core.schema.record import F, FromMetrics
from starvecheck.core.schema.steps import Straggler

# A stored report's lists, as its schema writes them (read, not checked: `from_dict`).
_Objects = Sequence[JsonObject]
_Texts = Sequence[str]


class Severity(str, Enum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
    OK = "ok"

    @property
    def rank(self) -> int:
        """Higher is worse; used for --fail-on and for ordering."""
        return {"ok": 0, "info": 1, "warning": 2, "critical": 3}[self.value]


class GainKind(str, Enum):
    # The job cannot run well at all until this is fixed (workers killed by a bus
    # error, training on the CPU): ranked above any measured gain.
    BLOCKER = "blocker"
    # Throughput would be multiplied by `value` (1.4 = 40% more samples/s).
    THROUGHPUT = "throughput"
    # A share of step time (0..1) that would be recovered.
    STEP_SHARE = "step_share"


@dataclass(frozen=True)
class Gain:
    kind: GainKind
    value: float | None = None
    basis: str = ""  # how the figure was estimated, in words

    @property
    def score(self) -> float:
        """Comparable size of the gain: the share of time saved (0..1), blockers above all."""
        if self.kind is GainKind.BLOCKER:
            return float("inf")
        if self.value is None:
            return 0.0
        if self.kind is GainKind.THROUGHPUT:
            return 1.0 - 1.0 / self.value if self.value > 0 else 0.0
        return self.value

    def describe(self) -> str:
        if self.kind is GainKind.BLOCKER:
            text = "blocker: fix before anything else"
        elif self.value is None:
            text = "not estimated"
        elif self.kind is GainKind.THROUGHPUT:
            text = f"{self.value:.2f}x throughput"
        else:
            text = f"{self.value:.0%} of step time recovered"
        return f"{text} ({self.basis})" if self.basis else text

    @property
    def speedup(self) -> float | None:
        """The training step's predicted throughput multiplier: the value itself for a
        throughput gain; 1 / (1 - share) for a share of step time recovered (the same
        step, that share shorter). None where the gain is not estimated."""
        if self.kind is GainKind.BLOCKER or self.value is None:
            return None
        if self.kind is GainKind.THROUGHPUT:
            return self.value
        return 1.0 / (1.0 - self.value) if 0 <= self.value < 1 else None

    def to_dict(self) -> JsonDict:
        s = self.speedup
        return {
            "kind": self.kind.value,
            "value": self.value,
            "basis": self.basis,
            "speedup": None if s is None else round(s, 3),
        }

    @classmethod
    def from_dict(cls, d: JsonObject) -> Gain:
        value, basis = cast(float | None, d.get("value")), cast(str, d.get("basis", ""))
        return cls(GainKind(d["kind"]), value, basis)


# Stages that report under another stage's name: a command's modes, which the JSON has
# named after the command since schema 1 (`loader --factory` under loader, `profile
# --trace` under profile). In the code a result's `stage` is always its own stage's
# name; the JSON and the screen show `reported_as(stage)`, and reading a report back
# tells the modes apart by what only they record (`_own_stage`).
def reported_as(stage: str) -> str:
    """The name the JSON and the screen give a stage's results and findings."""
    return stages_table.entry(stage).shown_as


def _own_stage(reported: str, parameters: Mapping[str, object]) -> str:
    """A result's own stage from its JSON: `loader --factory` records its spec
    (`factory`), `profile --trace` its files (`trace`); every other stage reports under
    its own name."""
    for own, name in stages_table.reported_as().items():
        if reported == name and own in parameters:
            return own
    return reported


@dataclass(frozen=True)
class Finding:
    """One thing to know or change, with the numbers that show it."""

    id: str  # stable: catalogue.ENV_SHM_TOO_SMALL; people grep and gate on it
    severity: Severity
    title: str
    evidence: str = ""
    recommendation: str = ""
    gain: Gain | None = None
    stage: str = ""
    # The change recommended, as data where it is a setting ({"num_workers": 2}).
    fix: Mapping[str, LabelValue] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # A kind of the catalogue (core/catalogue.py) is detected in the severities it
        # lists; judging may lower one (a gain inside the noise, an assumed input),
        # never raise it above them.
        allowed = getattr(self.id, "severities", None)
        if allowed and self.severity.rank > max(s.rank for s in allowed):
            raise ValueError(f"{self.id} is never {self.severity.value} (core/catalogue.py)")

    def to_dict(self) -> JsonDict:
        d: JsonDict = {
            "id": self.id,
            "severity": self.severity.value,
            "title": self.title,
            "evidence": self.evidence,
            "recommendation": self.recommendation,
            "gain": self.gain.to_dict() if self.gain else None,
            "stage": reported_as(self.stage),
        }
        return d | ({"fix": dict(self.fix)} if self.fix else {})

    @classmethod
    def from_dict(cls, d: JsonObject) -> Finding:
        return cls(
            id=cast(str, d["id"]),
            severity=Severity(d["severity"]),
            title=cast(str, d["title"]),
            evidence=cast(str, d.get("evidence", "")),
            recommendation=cast(str, d.get("recommendation", "")),
            gain=Gain.from_dict(cast(JsonObject, d["gain"])) if d.get("gain") else None,
            stage=cast(str, d.get("stage", "")),
            fix=dict(cast(Mapping[str, LabelValue], d.get("fix") or {})),
        )


@dataclass(frozen=True)
class StageResult:
    """What one stage measured, and (`judged`) what judging read off it. Stages leave
    `findings` empty: judging (advice.judge) runs once over every result of the run and
    fills them in."""

    stage: str
    # What it measured with, as the JSON writes it, typed where another layer reads it
    # (core/parameters.py); any mapping given becomes one.
    parameters: Parameters = field(default_factory=Parameters)
    metrics: tuple[Metric, ...] = ()  # measured: judging never adds to them
    findings: tuple[Finding, ...] = ()
    caveats: tuple[Caveat, ...] = ()
    # Samples per second this link delivers for the workload, where the stage measured
    # it (io's existing files, starve); judging's, at the count it recommends, is
    # `judged.capacity` (`delivers` reads either).
    capacity: Metric | None = None
    duration_s: float | None = None
    judged: Judged = field(default_factory=Judged, compare=False, repr=False)
    # Each record `records` read, by its type: read once (a result never changes).
    _records: dict[type, FromMetrics] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        # Plain sentences are accepted and become caveats of their own kind.
        object.__setattr__(self, "caveats", tuple(caveat(c) for c in self.caveats))
        if not isinstance(self.parameters, Parameters):
            object.__setattr__(self, "parameters", Parameters(self.parameters))

    def records(self, kind: type[F]) -> F:
        """The measured figures as the stage's record (`records(PcieFigures)`), read
        from `metrics`, the serialised form, alike for a fresh result and a stored one."""
        if kind not in self._records:
            self._records[kind] = kind.from_metrics(self.metrics)
        return cast(F, self._records[kind])

    @property
    def figures(self) -> tuple[Metric, ...]:
        """Every figure the report shows: the measured ones, then judging's."""
        return (*self.metrics, *self.judged.figures)

    @property
    def said(self) -> tuple[Caveat, ...]:
        """Every caveat the report shows: the stage's, then judging's."""
        return (*self.caveats, *(c for c in self.judged.caveats if c not in self.caveats))

    @property
    def delivers(self) -> Metric | None:
        """The capacity the report states: judging's where it made one, else measured."""
        return self.judged.capacity or self.capacity

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.figures if m.name == name), None)

    def select(self, **want: LabelValue) -> list[Metric]:
        return select(self.figures, **want)

    def one(self, **want: LabelValue) -> Metric | None:
        return one(self.figures, **want)

    def value(self, **want: LabelValue) -> float | None:
        return value(self.figures, **want)

    def has_caveat(self, caveat_id: str) -> bool:
        return any(c.id == caveat_id for c in self.said)

    @property
    def reported_as(self) -> str:
        """The name the JSON and the screen give this result (core/stages.py)."""
        return reported_as(self.stage)

    def to_dict(self) -> JsonDict:
        """The stage as schema 3 writes it: `judgement` is judging's, and (kept for
        scripts written against schema 2) its figures, caveats, capacity and straggler
        verdict are in `metrics`, `caveats`, `capacity` and `parameters` too."""
        parameters = cast(JsonDict, dict(self.parameters))  # what the JSON writes
        if self.judged.straggler is not None:
            parameters["straggler"] = self.judged.straggler.to_dict()
        d: JsonDict = {
            "stage": self.reported_as,
            "parameters": parameters,
            "metrics": [m.to_dict() for m in self.figures],
            "findings": [f.to_dict() for f in self.findings],
            "caveats": [c.text for c in self.said],
            "capacity": self.delivers.to_dict() if self.delivers else None,
            "duration_s": self.duration_s,
        }
        if self.judged:
            d["judgement"] = self.judged.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: JsonObject) -> StageResult:
        # A stored report's shape is its schema's (docs/json.md): read as written.
        parameters = dict(cast(JsonObject, d.get("parameters", {})))
        stage = _own_stage(cast(str, d["stage"]), parameters)
        metrics = tuple(Metric.from_dict(m) for m in cast(_Objects, d.get("metrics", ())))
        caveats = tuple(caveat(c) for c in cast(_Texts, d.get("caveats", ())))
        capacity = Metric.from_dict(cast(JsonObject, d["capacity"])) if d.get("capacity") else None
        judged = Judged()
        if isinstance(section := d.get("judgement"), Mapping):  # schema 3
            names = set(cast(_Texts, section.get("figures", ())))
            said = {caveat(c) for c in cast(_Texts, section.get("caveats", ()))}
            judged = Judged(
                tuple(m for m in metrics if m.name in names),
                Metric.from_dict(cast(JsonObject, section["capacity"]))
                if section.get("capacity")
                else None,
                tuple(c for c in caveats if c in said),
                dict(cast(Mapping[str, LabelValue | None], section.get("verdicts", {}))),
            )
            metrics = tuple(m for m in metrics if m.name not in names)
            caveats = tuple(c for c in caveats if c not in said)
            capacity = None if judged.capacity is not None else capacity
        else:  # schema 2: judging's figures among the measured; judging makes them again
            metrics = tuple(m for m in metrics if m.labels.get("quantity") not in JUDGED)
        straggler = Straggler.from_dict(parameters.pop("straggler", None))
        findings = cast(_Objects, d.get("findings", ()))
        own = {cast(str, d["stage"]): stage}
        return cls(
            stage=stage,
            parameters=Parameters(parameters),
            metrics=metrics,
            findings=tuple(restamped(Finding.from_dict(f), own) for f in findings),
            caveats=caveats,
            capacity=capacity,
            duration_s=cast(float | None, d.get("duration_s")),
            judged=replace(judged, straggler=straggler),
        )


def restamped(f: Finding, own: Mapping[str, str]) -> Finding:
    """A finding read from JSON, with the own name of the stage it reports under."""
    stage = own.get(f.stage, f.stage)
    return f if stage == f.stage else replace(f, stage=stage)


def at_or_above(findings: Sequence[Finding], threshold: Severity) -> list[Finding]:
    return [f for f in findings if f.severity.rank >= threshold.rank]
