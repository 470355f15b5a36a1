"""Which options each mode of a command takes, declared once as data and checked from
what the user gave.

A command with modes (`loader` on generated data or on the user's `--factory`,
`profile`'s own loop or `--trace`) declares each mode's options once; `fence` refuses,
in one line and exit 2, every option the user gave that the mode does not take. "Given"
is click's record of where each value came from (the command line or the environment),
never a comparison with the default: `--sample-size 16K` spelled out with `--factory` is
refused like `--sample-size 1M`, and `--no-cold` like `--cold`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import typer

from starvecheck.core.status import UsageError

# Options every mode of every command takes: where the report goes and when to fail.
OUTPUTS = frozenset({"json_path", "markdown_path", "fail_on", "quick"})
# click's ParameterSource members, by name: Typer vendors click, and its module is private.
_GIVEN = ("COMMANDLINE", "ENVIRONMENT")


@dataclass(frozen=True)
class Mode:
    """A way a command runs: the options it takes (by parameter name; OUTPUTS too), and
    the one line that refuses the others given, from their spellings in the command's
    order."""

    takes: frozenset[str]
    refuse: Callable[[Sequence[str]], str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "takes", frozenset(self.takes) | OUTPUTS)


def spelled(param: Any, value: object) -> str:
    """How the user wrote a parameter (a click Parameter): PATH, --cold, --no-cold."""
    if param.param_type_name == "option":
        if param.is_flag and param.secondary_opts and value is False:
            return str(param.secondary_opts[0])
        return str(max(param.opts, key=len))
    return str(param.metavar or param.name.upper())


def given(ctx: typer.Context) -> list[tuple[str, str]]:
    """(name, spelling) of every parameter the user gave, in the command's order."""
    out = []
    for p in ctx.command.params:
        source = ctx.get_parameter_source(p.name) if p.name else None
        if source is not None and source.name in _GIVEN:
            out.append((p.name, spelled(p, ctx.params.get(p.name))))
    return out


def fence(ctx: typer.Context, mode: Mode) -> None:
    """Refuse (UsageError, exit 2) the options given that `mode` does not take."""
    refused = [s for name, s in given(ctx) if name not in mode.takes]
    if refused:
        raise UsageError(mode.refuse(refused))
