"""`pcie` end to end on a stand-in for CUDA (tests/fake_cuda.py): every step runs,
every promised name is reported, and each way a step can fail becomes a missing
figure with its reason. The copies are host memcpy here, so no value is checked
beyond being a positive number: this tests the orchestration, not PCIe."""

from __future__ import annotations

import dataclasses
import os
import sys

import pytest

from starvecheck.probe.machine import GpuInfo, Numa, NumaNodeInfo, Pcie, collect
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.pcie import cudart
from starvecheck.stages.pcie import stage as stage
from tests import fake_cuda
from tests.conftest import run

MiB = 1 << 20


@pytest.fixture
def fake(monkeypatch):
    import torch as real_torch

    fake_torch = fake_cuda.make(real_torch)
    nvml = fake_cuda.FakePynvml()
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return fake_torch, nvml


def by_name(result):
    return {m.name: m for m in result.metrics}


def machine_with(numa_cpus: list[str] | None = None):
    m = collect(SysRoot.from_environ({}))
    gpu = GpuInfo(
        index=0,
        name="Fake GPU",
        pci_bus_id="0000:18:00.0",
        memory_total_bytes=None,
        pcie=Pcie(1, 4, 16, 16, 4.0, 31.5),
        numa_node=0,
        cpu_affinity=None,
        utilization_pct=None,
        source="nvml",
    )
    # 48 MiB left: a budget of 24 MiB, so the overlap, link and NUMA copies shrink
    # from 256 MiB to 8 MiB (three buffers each) and the tests stay quick.
    memory = dataclasses.replace(m.memory, available_bytes=48 * MiB, limit_bytes=None)
    m = dataclasses.replace(m, gpus=[gpu], memory=memory)
    if numa_cpus:
        nodes = [NumaNodeInfo(i, cpus, None) for i, cpus in enumerate(numa_cpus)]
        m = dataclasses.replace(m, numa=Numa(len(nodes), nodes))
    return m


def quick_plan(*sizes):
    return stage.Plan(tuple(sizes), runs=3, warmup=1, quick=True, load_s=0.05)


def test_every_step_reports_its_names(fake, monkeypatch):
    monkeypatch.setattr(
        cudart,
        "reference_h2d",
        lambda device, size, warmup, runs: ([5.0] * runs, [6.0] * runs, "x"),
    )
    seen = []
    result = stage.run(
        quick_plan(MiB, 4 * MiB), machine_with(), lambda *a: seen.append(a), lambda m: None
    )
    m = by_name(result)
    for d in ("h2d", "d2h"):
        for mem in ("pinned", "pageable"):
            for size in ("1MiB", "4MiB"):
                figure = m[f"{d}.{mem}.{size}"]
                assert figure.value > 0 and figure.n == 3
                assert m[f"{d}.{mem}.{size}.events"].n == 3
    assert m["d2h.pageable.4MiB.fresh"].value > 0
    for mem in ("pinned", "pageable"):
        for mode in ("blocking", "non_blocking"):
            ratio = m[f"overlap.{mem}.{mode}"]
            assert ratio.value is not None or ratio.reason
            assert m[f"overlap.{mem}.{mode}.both_ms"].n == 3
    assert m["reference.h2d.pinned.4MiB"].value == 5.0
    assert m["reference_ratio"].value == pytest.approx(m["h2d.pinned.4MiB"].value / 5.0)
    # the fake link reports gen1 on its first sample, gen4 x16 afterwards
    assert m["link.gen_under_load"].value == 4 and m["link.width_under_load"].value == 16
    assert m["link.gen_idle"].value == 1 and m["link.gen_max"].value == 4
    assert m["link.theoretical_gbps"].value == pytest.approx(31.5)
    assert m["link.efficiency"].value == pytest.approx(m["link.h2d_under_load"].value / 31.5)
    assert m["link.nvml_rx_gbps"].value == pytest.approx(2_000_000 * 1024 / 1e9)
    p = result.parameters
    assert p["cuda"] is True and p["reference_size"] == "4MiB" and p["pci_bus_id"]
    assert p["overlap_size"] == "8MiB" and p["load_size"] == "8MiB"
    assert p["link_gens_seen"] == [1, 4]
    assert seen[-1][1] == seen[-1][2]  # the progress bar ends full
    assert sys.modules["pynvml"].initialised == 0  # NVML shut down again
    assert any("one NUMA node" in c or "NUMA topology unknown" in c for c in result.caveats)


def test_a_pinned_allocation_that_fails_is_a_reason_not_a_crash(monkeypatch):
    import torch as real_torch

    monkeypatch.setitem(sys.modules, "torch", fake_cuda.make(real_torch, pinned_fails_above=MiB))
    monkeypatch.setitem(sys.modules, "pynvml", fake_cuda.FakePynvml())
    monkeypatch.setattr(
        cudart,
        "reference_h2d",
        lambda *a: (_ for _ in ()).throw(cudart.CudartUnavailable("no lib")),
    )
    m = by_name(stage.run(quick_plan(MiB, 4 * MiB), machine_with(), lambda *a: None, print))
    assert m["h2d.pinned.1MiB"].value > 0
    big = m["h2d.pinned.4MiB"]
    assert big.value is None and "pinned allocation of 4194304 bytes failed" in big.reason
    assert "\n" not in big.reason
    assert m["h2d.pageable.4MiB"].value > 0  # the pageable figures are still there
    assert m["reference_ratio"].value is None and m["reference_ratio"].reason == "no lib"
    # the overlap and the link use the largest size, whose pinned buffer failed
    assert m["overlap.pinned.blocking"].value is None
    assert m["overlap.pageable.blocking"].value is not None or m["overlap.pageable.blocking"].reason
    assert m["link.gen_under_load"].value is None and "pinned" in m["link.gen_under_load"].reason


def test_no_nvml_leaves_the_link_missing_with_the_reason(fake, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails
    monkeypatch.setattr(cudart, "reference_h2d", lambda *a: ([1.0], [1.0], "x"))
    m = by_name(stage.run(quick_plan(MiB), machine_with(), lambda *a: None, print))
    for name in ("link.gen_under_load", "link.width_under_load", "link.efficiency"):
        assert m[name].value is None and m[name].reason.startswith("NVML unavailable")
    assert m["h2d.pinned.1MiB"].value > 0


def test_numa_binds_to_each_node_and_restores_the_affinity(fake, monkeypatch):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to play two NUMA nodes")
    monkeypatch.setattr(cudart, "reference_h2d", lambda *a: ([1.0], [1.0], "x"))
    before = os.sched_getaffinity(0)
    result = stage.run(
        quick_plan(MiB), machine_with([str(cpus[0]), str(cpus[1])]), lambda *a: None, print
    )
    assert os.sched_getaffinity(0) == before
    m = by_name(result)
    assert m["numa.h2d.pinned.local"].n == 3 and m["numa.h2d.pinned.remote"].n == 3
    assert 0 <= m["numa.remote_penalty"].value <= 1
    assert result.parameters["numa_local_node"] == 0
    assert result.parameters["numa_remote_node"] == 1


def test_numa_with_a_cpu_this_process_may_not_use_is_a_reason(fake, monkeypatch):
    monkeypatch.setattr(cudart, "reference_h2d", lambda *a: ([1.0], [1.0], "x"))
    allowed = sorted(os.sched_getaffinity(0))
    outside = str(max(allowed) + 4096)  # no such CPU: sched_setaffinity refuses it
    result = stage.run(
        quick_plan(MiB), machine_with([str(allowed[0]), outside]), lambda *a: None, print
    )
    m = by_name(result)
    assert m["numa.h2d.pinned.local"].value > 0
    assert m["numa.h2d.pinned.remote"].value is None
    assert m["numa.h2d.pinned.remote"].reason.startswith("cannot bind to CPUs")
    assert m["numa.remote_penalty"].value is None


@pytest.mark.slow
def test_the_command_on_the_stand_in_exits_0_with_a_json_report(fake, monkeypatch):
    monkeypatch.setattr(cudart, "reference_h2d", lambda *a: ([1.0], [1.0], "x"))
    r = run("pcie", "--sizes", "1M,2M", "--runs", "3", "--json", "-")
    assert r.exit_code == 0, r.stderr
    st = r.json["stages"][0]
    names = {m["name"] for m in st["metrics"]}
    assert {"h2d.pinned.2MiB", "overlap.pinned.non_blocking", "link.efficiency"} <= names
    assert st["parameters"]["sizes"] == ["1MiB", "2MiB"]
    text = run("pcie", "--sizes", "1M", "--runs", "3").stdout
    assert "size sweep" in text and "overlap" in text and "under load" in text


def test_a_fake_sysroot_is_reported_not_measured(fake):
    from tests.conftest import sysroot_env

    r = run("pcie", "--quick", "--json", "-", env=sysroot_env("baremetal-numa-8gpu"))
    assert r.exit_code == 3
    (line,) = r.stderr.splitlines()
    assert "pcie measures this machine's GPU: STARVECHECK_SYSROOT=" in line
    assert r.json["stages"][0]["parameters"]["cuda"] is False
    assert sys.modules["torch"].calls["pinned"] == 0  # nothing was measured


def test_metric_names_put_the_size_before_the_variant():
    from starvecheck.core.schema.pcie import Clock, Copy, Direction, Memory, Source

    assert Copy(Direction.H2D, Memory.PINNED, MiB).name() == "h2d.pinned.1MiB"
    fresh = Copy(Direction.D2H, Memory.PAGEABLE, 256 * MiB, fresh=True)
    assert fresh.name() == "d2h.pageable.256MiB.fresh"
    ref = Copy(Direction.H2D, Memory.PINNED, MiB, source=Source.CUDART)
    assert ref.name(Clock.EVENTS) == "reference.h2d.pinned.1MiB.events"
