"""Streams, colour, terminal, clock and environment for one run; tests swap any of it.

Modelled on httpie's Environment: the CLI never touches sys.stdout or os.environ
directly, so an in-process test can hand it a StringIO and a dict.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TextIO

from starvecheck.core import clocks

if TYPE_CHECKING:
    from rich.console import Console


def _utc_now() -> str:
    # The real clock (core/clocks.py): a pipeline's frozen datetime does not date it.
    return datetime.fromtimestamp(clocks.time(), timezone.utc).replace(microsecond=0).isoformat()


@dataclass
class Context:
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    stdin: TextIO = field(default_factory=lambda: sys.stdin)
    environ: Mapping[str, str] = field(default_factory=lambda: os.environ)
    stdout_isatty: bool | None = None
    width: int | None = None  # None: the terminal's
    clock: Callable[[], float] = clocks.perf_counter
    now: Callable[[], str] = _utc_now
    debug: bool = False

    def __post_init__(self) -> None:
        if self.stdout_isatty is None:
            self.stdout_isatty = bool(getattr(self.stdout, "isatty", lambda: False)())

    @property
    def color(self) -> bool:
        # https://no-color.org: any non-empty NO_COLOR disables colour.
        return bool(self.stdout_isatty) and not self.environ.get("NO_COLOR")

    def console(self, stream: TextIO | None = None) -> Console:
        from rich.console import Console  # rich costs ~60 ms; only load it to print

        return Console(
            file=stream or self.stdout,
            force_terminal=self.color,
            no_color=not self.color,
            color_system="auto" if self.color else None,
            width=self.width or (None if self.stdout_isatty else 100),
            highlight=False,
            # Facts are data, not markup: "[...]" in a path or ":ab:" in a PCI bus id
            # (0000:ab:00.0) must print as written.
            markup=False,
            emoji=False,
            soft_wrap=False,
        )
