"""Typed stage options: defaults written once, strings parsed in cli/ only, every
command through the one path (cli/common.measure_one)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from starvecheck.stages import options as opts
from starvecheck.stages import registry
from starvecheck.stages.base import BaseStage, Measured, RunContext
from tests.conftest import run

STAGES = Path(__file__).parent.parent / "src" / "starvecheck" / "stages"
OPTIONS = [
    opts.EnvOptions,
    opts.IoOptions,
    opts.LoaderOptions,
    opts.FactoryOptions,
    opts.StarveOptions,
    opts.PadOptions,
    opts.PcieOptions,
    opts.ProfileOptions,
    opts.TraceOptions,
]


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


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: o.stage)
def test_every_stage_takes_frozen_options_named_for_it(options):
    assert dataclasses.is_dataclass(options) and options.__dataclass_params__.frozen
    stage = registry.get(options.stage)
    assert stage.name == options.stage and isinstance(stage, BaseStage)


def test_help_states_the_dataclass_defaults():
    loader = " ".join(run("loader", "--help").stdout.split())  # as words: help wraps
    assert f"[default: {opts.LoaderOptions.runs}]" in loader
    batch = opts.LoaderOptions.BATCH_SIZE
    assert f"[default: {batch}; with --factory, the DataLoader's own]" in loader
    assert "[default: 16K]" in loader
    pcie = " ".join(run("pcie", "--help").stdout.split())
    assert "[default: 64K,1M,16M,256M,1G; 1M,16M,256M with --quick]" in pcie
    assert f"[default: {opts.by_quick(opts.PcieOptions.RUNS)}]" in pcie


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
