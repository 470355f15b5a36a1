"""Shared helpers: run the CLI in-process with swapped streams (as httpie's tests do)."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from starvecheck.cli import main
from starvecheck.context import Context

FIXTURES = Path(__file__).parent / "fixtures"
SYSROOTS = FIXTURES / "sysroots"


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        return json.loads(self.stdout)


def run(*args: str, env: dict[str, str] | None = None, width: int = 100) -> Result:
    """Run `starvecheck ARGS` in this process, as a non-terminal with no colour."""
    out, err = io.StringIO(), io.StringIO()
    environ = {
        k: v
        for k, v in os.environ.items()
        if k not in ("STARVECHECK_SYSROOT", "KUBERNETES_SERVICE_HOST")
    }
    environ.update(env or {})
    context = Context(
        stdout=out,
        stderr=err,
        environ=environ,
        stdout_isatty=False,
        width=width,
        now=lambda: "2026-11-21T00:00:00+00:00",
    )
    code = main(list(args), context)
    return Result(int(code), out.getvalue(), err.getvalue())


def sysroot_env(name: str) -> dict[str, str]:
    return {"STARVECHECK_SYSROOT": str(SYSROOTS / name)}


@pytest.fixture
def cli():
    return run
