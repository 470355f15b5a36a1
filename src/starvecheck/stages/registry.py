"""The one list of stages: commands and doctor find a stage here by name.

Modules are imported on first use, so `starvecheck env` and `--help` never load
what `loader` or `pcie` need. Each module exposes `STAGE`, an object that keeps
the `Stage` protocol of stages/base.py. Adding a stage: write its module with a
`STAGE`, name it below, add its rules to advice/ and its tables to render/.
"""

from __future__ import annotations

import importlib
from typing import Any

from starvecheck.stages.base import Stage

MODULES = {
    "env": "starvecheck.stages.env",
    "io": "starvecheck.stages.io",
    "loader": "starvecheck.stages.loader.stage",
    "factory": "starvecheck.stages.loader.factory.stage",
    "starve": "starvecheck.stages.starve.stage",
    "pad": "starvecheck.stages.pad.stage",
    "pcie": "starvecheck.stages.pcie.stage",
    "profile": "starvecheck.stages.profile.stage",
    "trace": "starvecheck.stages.trace.stage",
    "attach": "starvecheck.stages.attach.stage",
}
# The order doctor runs its stages in: cheap ones that can refuse bad input first.
DOCTOR_ORDER = ("pad", "starve", "io", "loader", "pcie")


def get(name: str) -> Stage[Any, Any]:
    """The stage by name. Its options and plan types are erased here (a name picks
    it); each stage's own `plan` is typed, and commands build the options it takes."""
    if name not in MODULES:
        raise KeyError(f"no stage {name!r}")
    return importlib.import_module(MODULES[name]).STAGE  # type: ignore[no-any-return]
