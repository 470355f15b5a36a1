"""The one list of stages: commands and doctor find a stage here by name.

Modules are imported on first use, so `starvecheck env` and `--help` never load
what `loader` or `pcie` need. Each module exposes `STAGE`, an object that keeps
the `Stage` protocol of stages/base.py. Adding a stage: write its module with a
`STAGE`, its rules in advice/ and its tables in render/, and one row in the stage
table (core/stages.py).
"""

from __future__ import annotations

from typing import Any

from starvecheck.core import stages as stages_table
from starvecheck.stages.base import Stage


def get(name: str) -> Stage[Any, Any]:
    """The stage by name. Its options and plan types are erased here (a name picks
    it); each stage's own `plan` is typed, and commands build the options it takes."""
    measure = stages_table.entry(name).measure
    if measure is None:
        raise KeyError(f"no stage {name!r}")
    return stages_table.load(measure).STAGE  # type: ignore[no-any-return]
