"""What judging read off one stage's figures (`Judged`), apart from the result model
(core/model.py) that carries it as `StageResult.judged`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from starvecheck.core.jsonvalue import JsonDict
from starvecheck.core.metric import Caveat, LabelValue, Metric
from starvecheck.core.schema.factory_choice import Choice
from starvecheck.core.schema.record import FromVerdicts, V
from starvecheck.core.schema.steps import Straggler


@dataclass(frozen=True)
class Judged:
    """What judging read off one stage's figures, once per report (the stage table's
    `complete`, advice/): the figures it derives (a recommended num_workers, each
    configuration's ratio to the current one), the capacity at the count it
    recommends, caveats on reading the figures, the verdicts a table shows beside them
    (pcie's overlap verdicts and link peaks), the straggler verdict across ranks, and
    loader --factory's choice. Measured results are never written by judging: this is
    where its verdict lands, and the JSON carries it as the stage's `judgement`."""

    figures: tuple[Metric, ...] = ()
    capacity: Metric | None = None
    caveats: tuple[Caveat, ...] = ()
    # The verdicts as the JSON writes them; a stage's typed record of them: `read`.
    verdicts: Mapping[str, LabelValue | None] = field(default_factory=dict)
    straggler: Straggler | None = None
    choice: Choice | None = None  # loader --factory's: judging's own, not in the JSON
    _read: dict[type, FromVerdicts] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def of(cls, verdicts: FromVerdicts) -> Judged:
        """Judging's verdicts given as their record, serialised in `verdicts`."""
        made = cls(verdicts=verdicts.to_verdicts())
        made._read[type(verdicts)] = verdicts
        return made

    def read(self, kind: type[V]) -> V:
        """The verdicts as their stage's record (`read(PcieVerdicts)`), alike for a
        fresh judgement and a stored one."""
        if kind not in self._read:
            self._read[kind] = kind.from_verdicts(self.verdicts)
        return cast(V, self._read[kind])

    def to_dict(self) -> JsonDict:
        return {
            "figures": [m.name for m in self.figures],
            "capacity": self.capacity.to_dict() if self.capacity else None,
            "caveats": [c.text for c in self.caveats],
            "verdicts": dict(self.verdicts),
        }

    def __bool__(self) -> bool:
        return bool(self.figures or self.capacity or self.caveats or self.verdicts)
