"""doctor's words: what its judging reads beside the stages' figures (each rank's node
across ranks is core/schema/nodes.py's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starvecheck.core.model import Finding


@dataclass(frozen=True)
class Context:
    """What doctor's judging reads that is no stage's figure: what the GPU link rests
    on, why each selected stage could not run here ({"pcie": "no CUDA device ..."}),
    and the findings made across ranks under torchrun (doctor.straggler)."""

    gpu_basis: str = ""
    unavailable: Mapping[str, str] = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
