"""Judging's verdicts on pcie's figures (advice/pcie.complete), as render shows them:
`PcieVerdicts`, carried by `Judged` and serialised as the judgement's `verdicts`
mapping. The judgement's keys are spelled here alone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starvecheck.core.metric import LabelValue
from starvecheck.core.schema.pcie import Memory, Mode, Row

OVERLAP_VERDICT = "overlap_verdict"
LINK_PEAK = "link_peak_gbps"
# The overlap table's rows, in the order render/pcie shows them and the JSON lists them.
OVERLAP_ROWS = tuple((mem, mode) for mem in (Memory.PAGEABLE, Memory.PINNED) for mode in Mode)


@dataclass(frozen=True)
class PcieVerdicts:
    """The verdict of each overlap ratio (PARALLEL, PARTIAL, SEQUENTIAL, UNKNOWN) and
    the theoretical peak of the link as read idle, under load and at its maximum (GB/s
    per direction; None unknown). Serialised as the judgement's `verdicts`, keyed
    `overlap_verdict.<memory>.<mode>` and `link_peak_gbps.<row>`."""

    overlaps: Mapping[tuple[Memory, Mode], str] = field(default_factory=dict)
    peaks: Mapping[Row, float | None] = field(default_factory=dict)

    def verdict(self, memory: Memory, mode: Mode) -> str | None:
        return self.overlaps.get((memory, mode))

    def peak(self, row: Row) -> float | None:
        return self.peaks.get(row)

    def to_verdicts(self) -> dict[str, LabelValue | None]:
        out: dict[str, LabelValue | None] = {
            f"{OVERLAP_VERDICT}.{mem.value}.{mode.value}": v
            for (mem, mode), v in self.overlaps.items()
        }
        return out | {f"{LINK_PEAK}.{row.value}": p for row, p in self.peaks.items()}

    @classmethod
    def from_verdicts(cls, verdicts: Mapping[str, LabelValue | None]) -> PcieVerdicts:
        """What a stored judgement holds; a value of the wrong type is left out."""
        overlaps = {
            (mem, mode): v
            for mem, mode in OVERLAP_ROWS
            if isinstance(v := verdicts.get(f"{OVERLAP_VERDICT}.{mem.value}.{mode.value}"), str)
        }
        peaks: dict[Row, float | None] = {
            row: float(p)
            for row in Row
            if isinstance(p := verdicts.get(f"{LINK_PEAK}.{row.value}"), int | float)
            and not isinstance(p, bool)
        }
        return cls(overlaps, peaks)
