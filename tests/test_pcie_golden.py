"""pcie's stored reports: every kind of figure the stage writes, read back and shown.

tests/golden/pcie-*.json are reports of the stage run once on the stand-in for CUDA
(tests/fake_cuda.py: host memcpy, so the values mean nothing about PCIe): `full` with
every figure (copies at several sizes, a size skipped, the fresh buffer, the events
clock, the CUDA runtime reference, the overlap experiment, the link idle, under load
and at its maximum, NUMA from two nodes), `no-nvml` without the link's figures, and
`no-gpu` as a CPU-only machine reports (every promised name missing, with the reason).
Each must load and serialise again byte for byte (a stored report stays what it was)
and render exactly as its .txt and .md. The reports are made again only where a file
is deleted and UPDATE_GOLDEN=1 is set; the renderings are rewritten by UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from starvecheck.core.report import Report
from starvecheck.render import json as json_export
from starvecheck.render import markdown
from tests.test_render import check, terminal_text

GOLDEN = Path(__file__).parent / "golden"
NAMES = ("pcie-full", "pcie-no-nvml", "pcie-no-gpu")
UPDATE = bool(os.environ.get("UPDATE_GOLDEN"))
MiB = 1 << 20


def _measured(name: str, monkeypatch: pytest.MonkeyPatch) -> Report:
    """The report the stage gives on the stand-in (only to make a stored file again)."""
    import torch as real_torch

    from starvecheck.advice.report import build_report
    from starvecheck.core.context import Context
    from starvecheck.stages.pcie import cudart
    from starvecheck.stages.pcie import stage as stage
    from tests import fake_cuda
    from tests.test_pcie_fake_cuda import machine_with

    cpus = sorted(os.sched_getaffinity(0))
    machine = machine_with([str(cpus[0]), str(cpus[-1])] if len(cpus) > 1 else None)
    monkeypatch.setitem(sys.modules, "torch", fake_cuda.make(real_torch))
    monkeypatch.setitem(
        sys.modules, "pynvml", None if name == "pcie-no-nvml" else fake_cuda.FakePynvml()
    )
    monkeypatch.setattr(
        cudart,
        "reference_h2d",
        lambda _device, _size, _warmup, runs: ([5.0] * runs, [6.0] * runs, "x"),
    )
    # 16 MiB needs three buffers, past half of the stand-in machine's 48 MiB: skipped.
    plan = stage.Plan((MiB, 4 * MiB, 16 * MiB), runs=3, warmup=1, quick=True, load_s=0.05)
    if name == "pcie-no-gpu":
        reason = "torch 2.13.0+cpu is a CPU-only build (no CUDA)"
        result = stage.cpu_side(machine, reason=reason, plan=plan)
    else:
        result = stage.run(plan, machine, lambda *a: None, lambda m: None)
    report = build_report("pcie", None, [result], Context(environ={}))
    data = report.to_dict()
    data["created_at"] = "2026-11-29T10:00:00+00:00"
    data["stages"][0]["duration_s"] = 0.5
    return Report.from_dict(data)


def stored(name: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Report, str]:
    path = GOLDEN / f"{name}.json"
    if UPDATE and not path.exists():
        path.write_text(json_export.serialize(_measured(name, monkeypatch)))
    text = path.read_text()
    return Report.from_dict(json.loads(text)), text


@pytest.mark.parametrize("name", NAMES)
def test_a_stored_pcie_report_serialises_again_byte_for_byte(name, monkeypatch):
    report, text = stored(name, monkeypatch)
    assert json_export.serialize(report) == text


@pytest.mark.parametrize("name", NAMES)
def test_a_stored_pcie_report_renders_as_its_golden(name, monkeypatch):
    report, _ = stored(name, monkeypatch)
    check(GOLDEN / f"{name}.txt", terminal_text(report))
    check(GOLDEN / f"{name}.md", markdown.serialize(report))


def test_the_stored_reports_hold_every_kind_of_figure(monkeypatch):
    full = stored("pcie-full", monkeypatch)[0].stages[0]
    names = {m.name for m in full.metrics}
    assert {
        "h2d.pinned.1MiB", "h2d.pinned.4MiB.events", "d2h.pageable.4MiB.fresh",
        "h2d.pinned.16MiB", "reference.h2d.pinned.4MiB", "reference.h2d.pinned.4MiB.events",
        "reference_ratio", "overlap.pinned.non_blocking", "overlap.pageable.blocking.both_ms",
        "overlap.pinned.blocking.cpu_ms", "overlap.pinned.blocking.copy_ms",
        "link.gen_idle", "link.width_under_load", "link.gen_max", "link.efficiency",
        "link.theoretical_gbps", "link.theoretical_gbps_max", "link.nvml_rx_gbps",
        "numa.h2d.pinned.local", "numa.h2d.pinned.remote", "numa.remote_penalty",
    } <= names  # fmt: skip
    assert full.metric("h2d.pinned.16MiB").reason.startswith("skipped: ")
    no_nvml = stored("pcie-no-nvml", monkeypatch)[0].stages[0]
    link = [m for m in no_nvml.metrics if m.name.startswith("link.")]
    assert link and all(m.value is None and "NVML" in (m.reason or "") for m in link)
    assert no_nvml.metric("h2d.pinned.1MiB").value
    cpu = stored("pcie-no-gpu", monkeypatch)[0].stages[0]
    assert cpu.metrics and all(m.value is None for m in cpu.metrics)


@pytest.mark.parametrize("name", NAMES)
def test_judging_the_stored_figures_again_gives_the_stored_report(name, monkeypatch):
    """The findings, the checklist and the judgement (overlap verdicts, link peaks) are
    what judging makes of the figures, fresh: the same as stored, byte for byte."""
    from dataclasses import replace

    from starvecheck.advice.report import build_report
    from starvecheck.core.context import Context
    from starvecheck.core.model import Judged

    report, text = stored(name, monkeypatch)
    stage = replace(report.stages[0], findings=(), judged=Judged())
    again = build_report("pcie", report.machine, [stage], Context(environ={}))
    again = replace(again, created_at=report.created_at, tool_version=report.tool_version)
    assert json_export.serialize(again) == text
