"""Mode options as data (cli/modes.py): each mode's options declared once, and an
option the user gave that the mode does not take refused in one line, exit 2, whether
or not its value equals the default."""

from __future__ import annotations

import inspect

import pytest

from starvecheck.cli import loader, profile
from starvecheck.cli.common import app
from tests.conftest import run

FACTORY = ("loader", "--factory", "nowhere.py:make")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--no-cold"], "--no-cold does not apply with --factory"),
        (["--cold"], "--cold does not apply with --factory"),
        # Spelled out at its default: still given, still refused.
        (["--sample-size", "16K"], "--sample-size does not apply with --factory"),
        (["--runs", "3"], "--runs (each configuration is read until stable: --budget)"),
        (["--prefetch-factor", "2"], "--prefetch-factor (swept from the DataLoader's own)"),
        (["--no-pin-memory"], "--no-pin-memory (swept where CUDA is present)"),
        (["--existing"], "--existing does not apply with --factory"),
        (["."], "PATH does not apply with --factory"),
    ],
)
def test_factory_refuses_what_shapes_generated_data(extra, named):
    r = run(*FACTORY, *extra)
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and named in lines[0], r.stderr


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--budget", "3"], "--budget applies with --factory only"),
        (["--step-ms", "5"], "--step-ms applies with --factory only"),
        # Its default is a number, so comparing with it let this pass before.
        (["--factory-timeout", "60"], "--factory-timeout applies with --factory only"),
    ],
)
def test_generated_data_refuses_what_only_factory_takes(tmp_path, extra, named):
    r = run("loader", *extra, str(tmp_path))
    assert r.exit_code == 2 and list(tmp_path.iterdir()) == []
    assert len(r.stderr.splitlines()) == 1 and named in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--model-size", "auto"], "drop --model-size"),  # the default, spelled out
        (["--device", "auto"], "drop --device"),
        (["--cold"], "drop --cold"),
        (["somewhere", "--steps", "3"], "drop PATH, --steps (several traces: repeat --trace"),
    ],
)
def test_trace_refuses_every_loop_option_given(tmp_path, extra, named):
    r = run("profile", "--trace", str(tmp_path / "t.json"), *extra)
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and named in r.stderr


def test_every_option_of_a_command_with_modes_belongs_to_a_mode():
    """A new option must be declared in a mode: otherwise every mode refuses it."""
    for command, modes in (
        ("loader", (loader.FACTORY, loader.GENERATED)),
        ("profile", (profile.TRACES, profile.LOOP)),
    ):
        callback = next(
            c.callback for c in app.registered_commands if c.callback.__name__ == command
        )
        names = {n for n in inspect.signature(callback).parameters if n != "ctx"}
        taken = set().union(*(m.takes for m in modes))
        assert names - taken == set(), (command, names - taken)
        # and nothing declared that the command does not have
        assert taken - names == set(), (command, taken - names)
