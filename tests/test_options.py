"""Typed stage options: defaults written once, strings parsed in cli/ only, every
command through the one path (cli/common.measure_one).

The records are found in the code, not listed here: every dataclass of
stages/options.py with a `stage`, and doctor's (inputs/workload.Workload). So are the
commands and their options (the Typer app): a new command, record or option is checked
without this file changing.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main

from starvecheck.cli.main import app, register
from starvecheck.core import stages as stages_table
from starvecheck.inputs import workload
from starvecheck.stages import options as opts
from starvecheck.stages import registry
from starvecheck.stages.base import BaseStage, Measured, RunContext
from tests.conftest import run

STAGES = Path(__file__).parent.parent / "src" / "starvecheck" / "stages"


def records() -> list[type]:
    """Every options record: each command's defaults, declared once."""
    found = [v for m in (opts, workload) for v in vars(m).values() if isinstance(v, type)]
    return [
        r
        for r in dict.fromkeys(found)
        if dataclasses.is_dataclass(r) and isinstance(getattr(r, "stage", None), str)
    ]


def stage_records() -> list[type]:
    """The records a stage's plan takes (doctor's workload is no stage's)."""
    return [r for r in records() if stages_table.entry(r.stage).measure is not None]


def records_of(command: str) -> list[type]:
    """The records behind a command: its stage's, and those of stages reported under it
    (`loader --factory`'s, `profile --trace`'s)."""
    return [r for r in records() if stages_table.entry(r.stage).shown_as == command]


def _default(record: type, name: str) -> Any:
    """The field's default as the record declares it now (a class attribute)."""
    return getattr(record, name, dataclasses.MISSING)


def _sized(name: str) -> bool:
    """Sizes are stated as --sample-size reads them (16K), not in bytes."""
    return name.endswith(("_size", "_bytes")) or name == "sizes"


def _text(name: str, value: Any) -> str:
    if _sized(name) and isinstance(value, int):
        return opts.size_text(value)
    if _sized(name) and isinstance(value, tuple):
        return opts.size_list(value)
    return opts.number(value) if isinstance(value, int | float) else str(value)


def stated(record: type, name: str) -> list[str]:
    """What the help must say a field's default is: its value, or, for one that the run
    resolves (None), the table it is resolved from (NAME, or ASSUMED_NAME, in the
    record): by --quick ('5; 3 with --quick'), and for --existing too."""
    value = _default(record, name)
    if value is not None and not isinstance(value, bool):
        return [_text(name, value)] if value != () else []
    table = getattr(record, name.upper(), getattr(record, f"ASSUMED_{name.upper()}", None))
    if not isinstance(table, dict):
        return [] if table is None else [_text(name, table)]
    if all(isinstance(v, dict) for v in table.values()):  # by --existing, then --quick
        return [stated_by_quick(name, table[False]), stated_by_quick(name, table[True])]
    return [stated_by_quick(name, table)]


def stated_by_quick(name: str, table: dict[bool, Any]) -> str:
    return f"{_text(name, table[False])}; {_text(name, table[True])} with --quick"


def _help(command: Any, param: Any) -> str:
    record = param.get_help_record(command.context_class(command, info_name=command.name))
    return " ".join((record[1] if record else "").split())


def mismatches() -> tuple[list[str], int]:
    """Every command's options against their records: the CLI's default is the
    record's, and its help states it as the record declares it. Returns what differs,
    and how many checks were made."""
    register()  # as main does: every command the stage table names
    group = typer.main.get_command(app)
    wrong: list[str] = []
    checked = 0
    for name, command in group.commands.items():
        for param in command.params:
            owners = [r for r in records_of(name) if param.name in r.__dataclass_fields__]
            for record in owners:
                value = _default(record, param.name)
                if value is dataclasses.MISSING:
                    continue
                flag = max(param.opts, key=len)
                cli = param.default
                if value is not None:  # the CLI's own default is the record's
                    checked += 1
                    same = cli == value or (_sized(param.name) and cli == _text(param.name, value))
                    if cli is not None and not same:
                        wrong.append(f"{name} {flag}: default {cli!r}, {record.__name__} {value!r}")
                if value is not None and param.show_default is not False:
                    continue  # Typer states the CLI's default, which is the record's
                for text in stated(record, param.name):
                    checked += 1
                    if not re.search(rf"\[default: {re.escape(text)}[];,]", _help(command, param)):
                        wrong.append(f"{name} {flag}: help does not state [default: {text}]")
    return wrong, checked


def test_every_command_states_its_records_defaults():
    wrong, checked = mismatches()
    assert wrong == []
    assert checked > 40  # every command's options were seen


def test_a_default_changed_in_its_record_alone_shows(monkeypatch: pytest.MonkeyPatch):
    """A default changed in its record where the command still spells out the old one
    is caught: in the help (Typer builds it from the annotations each time, so a help
    text written out is stood in for by the literal attach's help once held), and as
    the CLI's own default (bound when the command was defined)."""
    from starvecheck.cli import attach

    monkeypatch.setattr(attach, "by_quick", lambda table: "10; 5 with --quick")
    monkeypatch.setattr(opts.AttachOptions, "SECONDS", {False: 12.0, True: 5.0})
    monkeypatch.setattr(opts.LoaderOptions, "runs", 4)
    wrong, _ = mismatches()
    assert wrong == [
        "loader --runs: default 3, LoaderOptions 4",
        "attach --duration: help does not state [default: 12; 5 with --quick]",
    ]
    assert "[default: 12; 5 with --quick]" not in run("attach", "--help").stdout


def test_the_help_wording_is_as_before():
    attach = " ".join(run("attach", "--help").stdout.split())
    assert "How long to sample [default: 10; 5 with --quick]." in attach
    assert "(at most 200). [default: 50; 1<=x<=200]" in attach
    pcie = " ".join(run("pcie", "--help").stdout.split())
    assert "[default: 64K,1M,16M,256M,1G; 1M,16M,256M with --quick]" in pcie
    loader = " ".join(run("loader", "--help").stdout.split())
    assert "[default: 32; with --factory, the DataLoader's own]" in loader
    assert "up to twice the effective CPUs, at least 4]" in loader
    assert "[default: 120; 0: no limit]" in loader


def test_every_record_is_found():
    names = {r.__name__ for r in records()}
    assert {"AttachOptions", "EnvOptions", "TraceOptions", "Workload"} <= names
    declared = [
        n.name
        for n in ast.parse((STAGES / "options.py").read_text()).body
        if isinstance(n, ast.ClassDef)
    ]
    assert sorted(declared) == sorted(r.__name__ for r in records() if r is not workload.Workload)
    # Every stage's options are one of them, in the union measure_one takes.
    assert set(opts.StageOptions.__args__) == set(stage_records())


def test_no_stage_parses_command_line_strings():
    importers = []
    for path in STAGES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            if any(
                n == "starvecheck.cli.args" or n.startswith("starvecheck.cli.args.") for n in names
            ):
                importers.append(path.name)
    assert importers == []


@pytest.mark.parametrize("options", stage_records(), ids=lambda o: o.stage)
def test_every_stage_takes_frozen_options_named_for_it(options):
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    stage = registry.get(options.stage)
    assert stage.name == options.stage and isinstance(stage, BaseStage)


def test_defaults_a_run_resolves():
    assert opts.default_workers(1) == (0, 1, 2, 4)
    assert opts.default_workers(8) == (0, 1, 2, 4, 8, 16)
    assert opts.default_threads(None) == (1,) and opts.default_threads(6) == (1, 6)
    assert opts.size_text(16 << 10) == "16K" and opts.size_text(1000) == "1000"


def test_the_optional_abilities_have_defaults():
    class Plain(BaseStage[opts.TraceOptions, str]):
        name = "plain"

        def measure(self, plan, ctx):
            from starvecheck.core.model import StageResult

            return StageResult(stage=plan)

    stage, ctx = Plain(), RunContext()
    assert stage.refusal("plain", ctx) is None
    assert stage.measure_all("plain", ctx) == Measured(stage.measure("plain", ctx))
    workload = object()
    assert stage.measured_workload(workload, stage.measure("plain", ctx)) is workload  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError):
        BaseStage().measure_all(None, ctx)


def test_pcie_plans_once_and_reports_the_host_side_where_it_cannot_measure(monkeypatch):
    stage = registry.get("pcie")
    if stage.unavailable() is None:
        pytest.skip("a CUDA device is here: pcie measures")
    calls = []
    plan = type(stage).plan

    def counted(self, options, ctx):
        calls.append(options)
        return plan(self, options, ctx)

    monkeypatch.setattr(type(stage), "plan", counted)
    r = run("pcie", "--quick", "--json", "-")
    assert r.exit_code == 3 and "pcie needs a CUDA device" in r.stderr
    assert '"stage": "pcie"' in r.stdout
    assert calls == [opts.PcieOptions(quick=True)]


def _bounds(path: Path) -> Iterator[tuple[float, str]]:
    """The numbers a command module writes out as a bound: `min=`, `max=` and the
    arguments of `finite(...)`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        named = isinstance(node.func, ast.Name) and node.func.id == "finite"
        values = [
            *(node.args if named else ()),
            *(k.value for k in node.keywords if k.arg in ("min", "max")),
        ]
        for v in values:
            if isinstance(v, ast.Constant) and isinstance(v.value, int | float):
                yield v.value, f"{path.name}:{v.lineno}"


def test_no_bound_is_written_out_twice(cli: Path = STAGES.parent / "cli"):
    """A bound more than one option checks (a day of seconds, --runs' most) is declared
    once, in stages/options.py or the workload's rules; 0 and 1 are no one's."""
    seen: dict[float, list[str]] = {}
    for path in sorted(cli.glob("*.py")):
        for value, where in _bounds(path):
            if value not in (0, 1):
                seen.setdefault(value, []).append(where)
    assert len(seen) > 5  # the scan sees the bounds
    assert {v: w for v, w in seen.items() if len(w) > 1} == {}
