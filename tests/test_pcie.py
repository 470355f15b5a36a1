"""`starvecheck pcie`: the arithmetic, the NVML poller against a fake, the CUDA runtime
finder, the findings on both sides of each threshold, the renderers, and the refusal
without a CUDA device end to end. The measurement itself is in the `gpu` tests at
the end, which run only where torch sees a CUDA device."""

from __future__ import annotations

import json
import sys
import threading
import types
from dataclasses import replace

import pytest

from starvecheck.advice import pcie as advice
from starvecheck.core.criteria import overlap_verdict
from starvecheck.core.metric import Metric
from starvecheck.core.model import Judged, Severity, StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.pcie_schema1 import schema1_labelled as labelled
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.core.units import parse_size
from starvecheck.probe.machine import collect
from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.pcie import bandwidth as bw
from starvecheck.stages.pcie import cudart, linkwatch
from starvecheck.stages.pcie import stage as stage
from tests.conftest import SYSROOTS, run, sysroot_env


def advise_pcie(metrics, params):
    """pcie's judgement of these figures (labelled as the stage labels them)."""
    ms = tuple(labelled(list(metrics)))
    return advice.advise(StageResult("pcie", params, ms))


MiB, GiB = 1 << 20, 1 << 30


def no_cuda() -> str:
    reason = stage.cuda_unavailable()
    if reason is None:
        pytest.skip("a CUDA device is here: the refusal path cannot be seen")
    return reason


# --- arithmetic -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "name"),
    [
        (64 << 10, "64KiB"),
        (MiB, "1MiB"),
        (16 * MiB, "16MiB"),
        (256 * MiB, "256MiB"),
        (GiB, "1GiB"),
        (1536 << 10, "1536KiB"),
        (3 * GiB // 2, "1536MiB"),
        (5000, "5000B"),
    ],
)
def test_size_names_are_the_json_names_and_round_trip(size, name):
    assert bw.size_name(size) == name
    assert parse_size(name) == size


def test_gbps_is_decimal_gigabytes_per_second():
    assert bw.gbps(10**9, 1.0) == 1.0
    assert bw.gbps(256 * MiB, 0.02) == pytest.approx(13.4217728)
    with pytest.raises(ValueError):
        bw.gbps(1, 0.0)


def test_large_sizes_get_fewer_runs_and_one_warmup():
    assert bw.runs_for(256 * MiB, 10, 3) == (3, 10)
    assert bw.runs_for(GiB, 10, 3) == (1, 5)
    assert bw.runs_for(GiB, 4, 3) == (1, 3)


@pytest.mark.parametrize(
    ("cpu", "copy", "both", "ratio", "verdict"),
    [
        (5e-3, 5e-3, 5e-3, 1.0, "PARALLEL"),  # the copy hides entirely
        (5e-3, 5e-3, 10e-3, 0.0, "SEQUENTIAL"),  # one after the other
        (5e-3, 5e-3, 7.5e-3, 0.5, "PARTIAL"),
        (5e-3, 20e-3, 21e-3, 0.8, "PARALLEL"),  # (25 - 21) / (25 - 20)
        (5e-3, 20e-3, 24e-3, 0.2, "SEQUENTIAL"),
        (5e-3, 5e-3, 12e-3, 0.0, "SEQUENTIAL"),  # slower than sequential: clamped
        (5e-3, 5e-3, 4e-3, 1.0, "PARALLEL"),  # faster than ideal: clamped
    ],
)
def test_overlap_ratio_against_hand_computed_cases(cpu, copy, both, ratio, verdict):
    o = bw.Overlap(cpu, copy, both)
    assert o.sequential_s == pytest.approx(cpu + copy)
    assert o.parallel_s == max(cpu, copy)
    assert o.ratio == pytest.approx(ratio)
    assert overlap_verdict(o.ratio) == verdict


def test_overlap_is_unknown_when_one_side_is_too_short_to_tell():
    assert bw.Overlap(5e-3, 0.4e-3, 5.2e-3).ratio is None
    assert bw.Overlap(5e-3, 0.6e-3, 5.0e-3).ratio == pytest.approx(1.0)
    assert overlap_verdict(None) == "UNKNOWN"


@pytest.mark.parametrize(
    ("ratio", "verdict"),
    [
        (0.8, "PARALLEL"),
        (0.79, "PARTIAL"),
        (0.21, "PARTIAL"),
        (0.2, "SEQUENTIAL"),
        (0, "SEQUENTIAL"),
    ],
)
def test_verdict_thresholds(ratio, verdict):
    assert overlap_verdict(ratio) == verdict


class FakeClock:
    """Work of n iterations costs overhead + n * per_item seconds of fake time."""

    def __init__(self, per_item: float, overhead: float = 0.0) -> None:
        self.now, self.per_item, self.overhead, self.calls = 0.0, per_item, overhead, []

    def clock(self) -> float:
        return self.now

    def work(self, n: int) -> None:
        self.calls.append(n)
        self.now += self.overhead + n * self.per_item


def test_calibration_scales_the_count_to_the_target():
    fake = FakeClock(per_item=1e-6)
    n = bw.calibrate(5e-3, work=fake.work, clock=fake.clock, start=1000)
    assert n == 5000
    assert fake.calls == [1000, 5000]


def test_calibration_converges_with_a_fixed_overhead():
    fake = FakeClock(per_item=2e-7, overhead=1e-3)
    n = bw.calibrate(5e-3, work=fake.work, clock=fake.clock, start=10)
    assert abs(1e-3 + n * 2e-7 - 5e-3) <= 0.1 * 5e-3


def test_calibration_grows_at_most_a_hundredfold_from_an_untimeable_run():
    fake = FakeClock(per_item=0.0)
    bw.calibrate(5e-3, work=fake.work, clock=fake.clock, start=10, tries=3)
    assert fake.calls == [10, 1000, 100_000]
    with pytest.raises(ValueError):
        bw.calibrate(0, work=fake.work, clock=fake.clock)


def test_spin_is_real_work_that_returns():
    assert isinstance(bw.spin(1000), int)


@pytest.mark.parametrize(
    ("gen", "width", "peak"),
    [
        (1, 16, 4.0),
        (2, 16, 8.0),
        (3, 16, 15.76),  # 8 GT/s x 128/130: the 15.75, to two decimals
        (4, 16, 31.5),
        (5, 16, 63.01),
        (4, 8, 15.75),
        (5, 4, 15.75),
        (6, 16, 121.01),  # FLIT mode: 242 of every 256 bytes carry data
        (None, 16, None),
        (4, None, None),
        (9, 16, None),
    ],
)
def test_theoretical_peak_per_generation_and_width(gen, width, peak):
    got = bw.link_peak(gen, width)
    assert got == (pytest.approx(peak, abs=0.02) if peak is not None else None)


def test_efficiency():
    assert bw.efficiency(25.2, 31.5) == pytest.approx(0.8)
    assert bw.efficiency(None, 31.5) is None
    assert bw.efficiency(10.0, None) is None


def test_headroom_is_the_lesser_of_available_and_the_cgroup_room():
    assert bw.headroom(10 * GiB, None, None) == (10 * GiB, "MemAvailable")
    assert bw.headroom(10 * GiB, 8 * GiB, 6 * GiB) == (
        2 * GiB,
        "the cgroup memory limit minus its usage",
    )
    assert bw.headroom(10 * GiB, 8 * GiB, 9 * GiB)[0] == 0
    assert bw.headroom(None, None, None)[0] is None


def test_sizes_that_do_not_fit_half_the_headroom_are_skipped_and_said_so():
    sizes = bw.DEFAULT_SIZES
    fits = bw.plan_sizes(sizes, 8 * GiB, "MemAvailable", None, True)
    assert fits.sizes == sizes and fits.skipped == () and fits.budget_bytes == 4 * GiB
    tight = bw.plan_sizes(sizes, 4 * GiB, "the cgroup memory limit minus its usage", None, True)
    assert tight.sizes == sizes[:-1]  # 1 GiB needs 3 GiB, the budget is 2 GiB
    ((size, why),) = tight.skipped
    assert size == GiB and "3 GiB" in why and "cgroup" in why
    # 768 MiB exactly: 256 MiB needs 3 x 256 MiB, half of 1.5 GiB
    edge = bw.plan_sizes(sizes, 1536 * MiB, "MemAvailable", None, True)
    assert 256 * MiB in edge.sizes and GiB not in edge.sizes
    unknown = bw.plan_sizes(sizes, None, "nothing readable", None, True)
    assert unknown.sizes == sizes and "unknown" in unknown.notes[0]


def test_memlock_below_a_size_is_a_note_not_a_skip():
    low = bw.plan_sizes(bw.DEFAULT_SIZES, 64 * GiB, "MemAvailable", 8 * MiB, False)
    assert low.sizes == bw.DEFAULT_SIZES
    assert any("RLIMIT_MEMLOCK is 8 MiB" in n and "1GiB" in n for n in low.notes)
    unlimited = bw.plan_sizes(bw.DEFAULT_SIZES, 64 * GiB, "MemAvailable", None, True)
    assert unlimited.notes == ()
    big = bw.plan_sizes(bw.DEFAULT_SIZES, 64 * GiB, "MemAvailable", 2 * GiB, False)
    assert big.notes == ()


def test_reference_size():
    assert bw.reference_size(bw.DEFAULT_SIZES) == 256 * MiB
    assert bw.reference_size((MiB, 16 * MiB, GiB)) == 16 * MiB
    assert bw.reference_size((GiB, 2 * GiB)) == GiB
    assert bw.reference_size(()) is None


def test_the_overlap_size_halves_until_its_buffers_fit():
    assert bw.overlap_size(None) == 256 * MiB
    assert bw.overlap_size(3 * 256 * MiB) == 256 * MiB
    assert bw.overlap_size(3 * 256 * MiB - 1) == 128 * MiB
    assert bw.overlap_size(3 * MiB) == MiB
    assert bw.overlap_size(3 * MiB - 1) is None


def test_other_node_and_penalty():
    nodes = {0: frozenset({0, 1}), 1: frozenset({2, 3}), 2: frozenset()}
    assert bw.other_node(nodes, 0) == 1
    assert bw.other_node(nodes, 1) == 0  # node 2 has no CPUs to bind to
    assert bw.other_node({0: frozenset({0})}, 0) is None
    assert bw.remote_penalty(20.0, 5.0) == pytest.approx(0.75)
    assert bw.remote_penalty(20.0, 25.0) == 0.0
    assert bw.remote_penalty(None, 5.0) is None


# --- the NVML poller, against a fake ---------------------------------------------


class NVMLError(Exception):
    pass


class FakeNvml:
    """Scripted answers, the last one repeated; a name in `broken` raises NVMLError."""

    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVMLError = NVMLError

    def __init__(self, gens, widths, tx, rx, broken=(), uuids=()):
        self.script = {"gen": list(gens), "width": list(widths), "tx": list(tx), "rx": list(rx)}
        self.broken, self.uuids = set(broken), set(uuids)
        self.calls: dict[str, int] = {}
        self.enough = threading.Event()

    def _next(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls.get("gen", 0) >= 3:
            self.enough.set()
        if name in self.broken:
            raise NVMLError("Not Supported")
        seq = self.script[name]
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._next("gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._next("width")

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return self._next("tx" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "rx")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        raise NVMLError("Not Supported")

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.uuids:
            raise NVMLError("Not Found")
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("index", i)

    def nvmlDeviceGetPciInfo(self, h):
        return types.SimpleNamespace(busId=b"00000000:18:00.0")


def test_samples_read_gen_width_and_throughput_and_summarize():
    nv = FakeNvml(gens=[1, 5, 5], widths=[16], tx=[100, 200, 300], rx=[10_000_000, 20_000_000])
    watch = linkwatch.LinkWatch(nv, "h")
    for _ in range(3):
        watch.sample_once()
    r = watch.result()
    assert r.samples == 3
    assert (r.gen, r.width) == (5, 16)  # the idle gen1 sample does not count as under load
    assert r.gens_seen == (1, 5) and r.widths_seen == (16,)
    assert r.rx_gbps == pytest.approx(20_000_000 * 1024 / 1e9)  # median of 10M, 20M, 20M KB/s
    assert r.tx_gbps == pytest.approx(200 * 1024 / 1e9)
    assert r.errors == {}


def test_a_failing_query_is_recorded_once_and_not_asked_again():
    nv = FakeNvml(gens=[4], widths=[16], tx=[1], rx=[1], broken={"tx", "rx"})
    watch = linkwatch.LinkWatch(nv, "h")
    for _ in range(4):
        watch.sample_once()
    assert nv.calls == {"gen": 4, "width": 4, "tx": 1, "rx": 1}
    r = watch.result()
    assert r.gen == 4 and r.rx_gbps is None and r.tx_gbps is None
    assert set(r.errors) == {"tx", "rx"} and "Not Supported" in r.errors["tx"]


def test_the_watch_samples_in_a_thread_until_the_block_ends():
    nv = FakeNvml(gens=[1, 4], widths=[8, 16], tx=[0], rx=[5])
    with linkwatch.LinkWatch(nv, "h", interval_s=0.001, throughput=False) as watch:
        assert nv.enough.wait(timeout=10)  # the thread has sampled at least 3 times
    assert not watch._thread.is_alive()
    count = len(watch.samples)
    assert count >= 3 and "tx" not in nv.calls
    assert watch.result().gen == 4 and watch.result().width == 16
    assert len(watch.samples) == count  # nothing is sampled after the block


def test_the_watch_stops_by_itself_when_every_query_fails():
    nv = FakeNvml(gens=[4], widths=[16], tx=[1], rx=[1], broken={"gen", "width", "tx", "rx"})
    with linkwatch.LinkWatch(nv, "h", interval_s=0.001) as watch:
        watch._thread.join(timeout=10)
        assert not watch._thread.is_alive()
    r = watch.result()
    assert r.samples == 1 and r.gen is None and len(r.errors) == 4


def test_summary_of_no_samples():
    r = linkwatch.summarize([])
    assert r.samples == 0 and r.gen is None and r.rx_gbps is None


def test_the_device_is_found_by_uuid_then_by_index():
    nv = FakeNvml([4], [16], [0], [0], uuids={"GPU-abc"})
    assert linkwatch.open_device(nv, "abc", 3) == ("uuid", "GPU-abc")
    assert linkwatch.open_device(nv, "GPU-abc", None) == ("uuid", "GPU-abc")
    assert linkwatch.open_device(nv, "zzz", 3) == ("index", 3)
    assert linkwatch.open_device(nv, None, 0) == ("index", 0)
    with pytest.raises(NVMLError):
        linkwatch.open_device(nv, "zzz", None)
    with pytest.raises(LookupError):
        linkwatch.open_device(nv, None, None)
    assert linkwatch.max_link(nv, "h") == (5, None)
    assert linkwatch.bus_id(nv, "h") == "00000000:18:00.0"


# --- the CUDA runtime reference: finding the library ------------------------------


def test_libcudart_candidates_prefer_the_wheel_then_torch_then_the_loader(tmp_path):
    wheel = tmp_path / "site" / "nvidia" / "cuda_runtime" / "lib"
    wheel.mkdir(parents=True)
    (wheel / "libcudart.so.12").write_bytes(b"")
    torch_lib = tmp_path / "site" / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    (torch_lib / "libcudart-9335f6a2.so.11.0").write_bytes(b"")
    found = cudart.candidates([str(tmp_path / "site")], find_library=lambda name: "libcudart.so")
    assert found == [
        str(wheel / "libcudart.so.12"),
        str(torch_lib / "libcudart-9335f6a2.so.11.0"),
        "libcudart.so",
    ]
    assert cudart.candidates([str(tmp_path / "nothing")], find_library=lambda name: None) == []


def test_libcudart_torch_already_loaded_comes_first_and_cu13_wheels_are_found(tmp_path):
    cu13 = tmp_path / "site" / "nvidia" / "cu13" / "lib"
    cu13.mkdir(parents=True)
    (cu13 / "libcudart.so.13").write_bytes(b"")
    maps = (
        "7f00-7f01 r-xp 00000000 fd:01 123 /venv/nvidia/cu13/lib/libcudart.so.13\n"
        "7f01-7f02 r--p 00001000 fd:01 123 /venv/nvidia/cu13/lib/libcudart.so.13\n"
        "7f02-7f03 rw-p 00000000 00:00 0 \n"
        "7f03-7f04 r-xp 00000000 fd:01 456 /usr/lib/libcudnn.so.9\n"
    )
    found = cudart.candidates([str(tmp_path / "site")], find_library=lambda name: None, maps=maps)
    assert found == ["/venv/nvidia/cu13/lib/libcudart.so.13", str(cu13 / "libcudart.so.13")]
    assert cudart.loaded("garbage\n\n  \n") == []


def test_libcudart_that_cannot_be_loaded_is_a_reason_not_a_crash(tmp_path):
    with pytest.raises(cudart.CudartUnavailable, match="libcudart not found"):
        cudart.load([])
    bogus = tmp_path / "libcudart.so.12"
    bogus.write_bytes(b"not an ELF file")
    with pytest.raises(cudart.CudartUnavailable, match="could not be loaded") as e:
        cudart.load([str(bogus)])
    assert str(bogus) in str(e.value)


# --- findings, each threshold from both sides -------------------------------------


def metrics(**values) -> list[Metric]:
    return [Metric.single(k.replace("__", "."), v, "") for k, v in values.items()]


def only(found, fid):
    (f,) = [f for f in found if f.id == fid]
    return f


def link(gen, width, gen_max=5, width_max=16):
    return [
        Metric.single("link.gen_under_load", gen, "gen"),
        Metric.single("link.width_under_load", width, "lanes"),
        Metric.single("link.gen_max", gen_max, "gen"),
        Metric.single("link.width_max", width_max, "lanes"),
    ]


def test_link_below_max_under_load():
    f = only(advise_pcie(link(4, 16), {}), "pcie.link-below-max")
    assert f.severity is Severity.WARNING and "gen4 x16" in f.title and "gen5 x16" in f.title
    assert f.gain.value == pytest.approx(2.0)  # 63.0 / 31.5
    narrow = only(advise_pcie(link(5, 8), {}), "pcie.link-below-max")
    assert narrow.severity is Severity.WARNING and "x8" in narrow.title
    assert only(advise_pcie(link(5, 16), {}), "pcie.link-below-max").severity is Severity.OK
    assert not [f for f in advise_pcie(link(5, 16)[:2], {}) if f.id == "pcie.link-below-max"]


def eff(value, peak=63.01):
    return [
        Metric.single("link.efficiency", value, "fraction"),
        Metric.single("link.theoretical_gbps", peak, "GB/s"),
        Metric.single("link.h2d_under_load", value * peak, "GB/s"),
    ]


def test_efficiency_below_sixty_percent():
    low = only(advise_pcie(eff(0.59), {}), "pcie.low-efficiency")
    assert low.severity is Severity.WARNING and "59%" in low.title
    assert "iommu" in low.recommendation.lower() and "numactl" in low.recommendation
    assert low.gain.value == pytest.approx(round(0.8 / 0.59, 2))
    assert only(advise_pcie(eff(0.6), {}), "pcie.low-efficiency").severity is Severity.OK


def sweep(d2h_pinned, d2h_pageable, fresh=None, size="256MiB"):
    out = [
        Metric.single(f"d2h.pinned.{size}", d2h_pinned, "GB/s"),
        Metric.single(f"d2h.pageable.{size}", d2h_pageable, "GB/s"),
        # a smaller size that would collapse, to check the largest one is judged
        Metric.single("d2h.pinned.1MiB", 10.0, "GB/s"),
        Metric.single("d2h.pageable.1MiB", 1.0, "GB/s"),
    ]
    if fresh is not None:
        out.append(Metric.single(f"d2h.pageable.{size}.fresh", fresh, "GB/s"))
    return out


def test_pageable_d2h_collapse_at_the_largest_size():
    bad = only(advise_pcie(sweep(12.0, 5.9), {}), "pcie.pageable-d2h")
    assert bad.severity is Severity.WARNING and "256MiB" in bad.title
    assert "pin_memory=True" in bad.recommendation
    assert only(advise_pcie(sweep(12.0, 6.0), {}), "pcie.pageable-d2h").severity is Severity.OK
    fresh = only(advise_pcie(sweep(12.0, 11.0, fresh=2.0), {}), "pcie.pageable-d2h")
    assert fresh.severity is Severity.WARNING and fresh.gain.value == pytest.approx(6.0)


def ratios(pageable_b, pageable_nb, pinned_b, pinned_nb):
    values = {
        "pageable.blocking": pageable_b,
        "pageable.non_blocking": pageable_nb,
        "pinned.blocking": pinned_b,
        "pinned.non_blocking": pinned_nb,
    }
    out = [Metric.single(f"overlap.{k}", v, "fraction") for k, v in values.items()]
    out += [
        Metric.single("overlap.pageable.blocking.both_ms", 10.0, "ms"),
        Metric.single("overlap.pinned.non_blocking.both_ms", 6.0, "ms"),
    ]
    return out


def test_overlap_only_with_pinned_non_blocking_names_the_dataloader_line():
    f = only(advise_pcie(ratios(0.0, 0.05, 0.1, 0.95), {}), "pcie.overlap")
    assert f.severity is Severity.WARNING and f.title.startswith("only pinned")
    assert "pin_memory=True" in f.recommendation and "non_blocking=True" in f.recommendation
    assert "pinned non_blocking PARALLEL 95%" in f.evidence
    assert f.gain.value == pytest.approx(0.4)  # (10 - 6) / 10
    partly = only(advise_pcie(ratios(0, 0, 0, 0.79), {}), "pcie.overlap")
    assert "partly" in partly.title
    none = only(advise_pcie(ratios(0, 0, 0, 0.2), {}), "pcie.overlap")
    assert none.title.startswith("no combination")
    unknown = [m for m in ratios(0, 0, 0, 0.9) if m.name != "overlap.pinned.blocking"]
    partial_view = only(advise_pcie(unknown, {}), "pcie.overlap")
    assert partial_view.severity is Severity.INFO and not partial_view.title.startswith("only")
    every = only(advise_pcie(ratios(0.8, 0.8, 0.8, 0.8), {}), "pcie.overlap")
    assert every.severity is Severity.OK


def test_numa_penalty_from_twenty_percent():
    def numa(local, remote):
        return [
            Metric.single("numa.h2d.pinned.local", local, "GB/s"),
            Metric.single("numa.h2d.pinned.remote", remote, "GB/s"),
            Metric.single("numa.remote_penalty", bw.remote_penalty(local, remote), "fraction"),
        ]

    params = {"numa_local_node": 0, "numa_remote_node": 1}
    bad = only(advise_pcie(numa(50.0, 40.0), params), "pcie.numa-remote")
    assert bad.severity is Severity.WARNING and "--cpunodebind=0" in bad.recommendation
    assert bad.gain.value == pytest.approx(1.25)
    ok = only(advise_pcie(numa(50.0, 40.5), params), "pcie.numa-remote")
    assert ok.severity is Severity.OK


def test_reference_gap_from_ten_percent():
    low = only(advise_pcie(metrics(reference_ratio=0.89), {}), "pcie.reference")
    assert low.severity is Severity.INFO
    assert only(advise_pcie(metrics(reference_ratio=0.9), {}), "pcie.reference").severity is (
        Severity.OK
    )


def test_missing_figures_make_no_findings():
    missing = [Metric.missing(n, u, "no CUDA") for n, u in stage.stable_names(bw.QUICK_SIZES)]
    assert advise_pcie(missing, {}) == ()


# --- the stage without a device -------------------------------------------------


def fake_torch(monkeypatch, cuda="12.4", count=1, init_error=None):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.13.0+test"
    torch.version = types.SimpleNamespace(cuda=cuda, hip=None)

    def init():
        if init_error:
            raise RuntimeError(init_error)

    torch.cuda = types.SimpleNamespace(device_count=lambda: count, init=init)
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_cuda_unavailable_says_why(monkeypatch):
    fake_torch(monkeypatch, cuda=None)
    assert stage.cuda_unavailable() == "torch 2.13.0+test is a CPU-only build (no CUDA)"
    fake_torch(monkeypatch, count=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert stage.cuda_unavailable() == (
        "no CUDA device is visible to torch 2.13.0+test (device_count() is 0; "
        "CUDA_VISIBLE_DEVICES='')"
    )
    fake_torch(monkeypatch, init_error="Found no NVIDIA driver\n on your system.")
    assert stage.cuda_unavailable() == (
        "CUDA initialisation failed: Found no NVIDIA driver on your system."
    )
    fake_torch(monkeypatch)
    assert stage.cuda_unavailable() is None
    monkeypatch.setitem(sys.modules, "torch", None)
    assert stage.cuda_unavailable().startswith("torch is not installed")


def test_run_without_a_device_raises_unavailable_with_the_reason():
    reason = no_cuda()
    machine = collect(SysRoot.from_environ({}))
    with pytest.raises(Unavailable, match="pcie needs a CUDA device") as e:
        stage.run(stage.Plan.default(True), machine, lambda *a: None, lambda m: None)
    assert reason in str(e.value)


def test_plans():
    quick, full = stage.Plan.default(True), stage.Plan.default(False)
    assert quick.sizes == (MiB, 16 * MiB, 256 * MiB) and quick.quick and quick.runs < full.runs
    assert full.sizes == (64 << 10, MiB, 16 * MiB, 256 * MiB, GiB) and not full.quick
    assert quick.parameters()["sizes"] == ["1MiB", "16MiB", "256MiB"]


def test_cpu_side_on_the_eight_gpu_server_reports_links_numa_and_memory():
    machine = collect(SysRoot(SYSROOTS / "baremetal-numa-8gpu"))
    r = stage.cpu_side(machine, reason="no device here")
    p = r.parameters
    assert r.stage == "pcie" and p["cuda"] is False
    assert p["numa_nodes"] == 2 and p["memlock_unlimited"] is True
    assert len(p["gpus"]) == 8
    assert p["gpus"][0]["theoretical_gbps_max"] == pytest.approx(63.0, abs=0.02)
    assert p["gpus"][0]["link_max"] == [5, 16] and p["gpus"][0]["numa_node"] == 0
    gpu6 = next(g for g in p["gpus"] if g["pci_bus_id"] == "0000:ba:00.0")
    assert gpu6["link_idle"] == [1, 8]
    assert p["sizes_skipped"] == {} and p["host_headroom_source"] == "MemAvailable"
    names = {m.name for m in r.metrics}
    assert {"h2d.pinned.256MiB", "d2h.pageable.1GiB", "overlap.pinned.non_blocking"} <= names
    assert {"link.gen_under_load", "link.width_under_load", "link.efficiency"} <= names
    assert "reference_ratio" in names
    assert all(m.value is None and m.reason == "not measured: no device here" for m in r.metrics)
    assert any("fake sysroot" in c for c in r.caveats)
    assert r.findings == ()


def test_cpu_side_on_a_machine_without_gpus_and_a_small_cgroup():
    machine = collect(SysRoot(SYSROOTS / "docker-v1-shm64"))
    r = stage.cpu_side(machine, reason="x")
    assert r.parameters["gpus"] == []
    room = r.parameters["host_headroom_bytes"]
    skipped = r.parameters["sizes_skipped"]
    assert all(3 * parse_size(s) > room // 2 for s in skipped)
    assert all(3 * parse_size(s) <= room // 2 for s in r.parameters["sizes_measured"])


# --- the command line ---------------------------------------------------------------


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("starvecheck: error: ")
    return lines[0]


def test_no_cuda_is_one_line_and_exit_3_after_the_host_report():
    reason = no_cuda()
    r = run("pcie")
    assert r.exit_code == 3
    line = one_error_line(r.stderr)
    assert line == f"starvecheck: error: pcie needs a CUDA device: {reason}"
    assert "host memory for pinned buffers" in r.stdout and "Checklist" in r.stdout
    assert f"not measured: {reason}" in r.stdout
    assert "Traceback" not in r.stdout + r.stderr


def test_no_cuda_json_is_still_valid_and_carries_every_stable_name():
    reason = no_cuda()
    r = run("pcie", "--quick", "--json", "-")
    assert r.exit_code == 3
    one_error_line(r.stderr)
    d = r.json
    assert d["command"] == "pcie"
    (st,) = d["stages"]
    by_name = {m["name"]: m for m in st["metrics"]}
    for name in ("h2d.pinned.1MiB", "h2d.pageable.256MiB", "d2h.pinned.16MiB"):
        assert by_name[name]["value"] is None and reason in by_name[name]["reason"]
    assert "h2d.pinned.1GiB" not in by_name  # --quick sizes
    assert st["parameters"]["cuda"] is False


def test_no_cuda_markdown_and_files(tmp_path):
    no_cuda()
    r = run("pcie", "--markdown", "-")
    assert r.exit_code == 3 and r.stdout.startswith("## starvecheck pcie")
    out = tmp_path / "r.json"
    r = run("pcie", "--json", str(out))
    assert r.exit_code == 3 and json.loads(out.read_text())["command"] == "pcie"


def test_fake_server_json_has_the_theoretical_peaks():
    no_cuda()
    r = run("pcie", "--json", "-", env=sysroot_env("baremetal-numa-8gpu"))
    assert r.exit_code == 3
    d = r.json
    assert d["machine"]["gpus"][0]["pcie"]["theoretical_gbps_max"] == pytest.approx(63.0, 0.01)
    assert d["stages"][0]["parameters"]["numa_nodes"] == 2
    text = run("pcie", env=sysroot_env("baremetal-numa-8gpu")).stdout
    assert "NUMA: 2 nodes" in text and "gen1 x8" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "fast"], "--sizes 'fast': expected sizes such as"),
        (["--sizes", "1M,,4M"], "expected sizes such as"),
        (["--sizes", "1K"], "from 4KiB to 16GiB"),
        (["--sizes", "64G"], "from 4KiB to 16GiB"),
        (["--runs", "1"], "--runs"),
        (["--json", "-", "--markdown", "-"], "cannot both write to stdout"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv, message):
    r = run("pcie", *argv)
    assert r.exit_code == 2
    assert message in one_error_line(r.stderr)


def test_sizes_parser():
    from starvecheck.cli import args

    assert args.copy_sizes("256M,64K,1M,1M") == (64 << 10, MiB, 256 * MiB)
    assert args.copy_sizes(" 1GiB ") == (GiB,)
    with pytest.raises(UsageError):
        args.copy_sizes("")


# --- rendering ----------------------------------------------------------------------


def synthetic_result() -> StageResult:
    """Hand-made figures (round numbers, not measured) to check the tables' shape."""
    ms = [
        Metric.repeated("h2d.pinned.256MiB", [10.0, 11.0, 12.0], "GB/s"),
        Metric.repeated("h2d.pinned.256MiB.events", [12.5], "GB/s"),
        Metric.repeated("h2d.pageable.256MiB", [5.0, 6.0, 7.0], "GB/s"),
        Metric.repeated("h2d.pageable.256MiB.events", [9.0], "GB/s"),
        Metric.repeated("d2h.pinned.256MiB", [11.0], "GB/s"),
        Metric.missing("d2h.pageable.256MiB", "GB/s", "pinned allocation failed"),
        Metric.repeated("d2h.pageable.256MiB.fresh", [2.0], "GB/s"),
        Metric.repeated("reference.h2d.pinned.256MiB", [12.0], "GB/s"),
        Metric.single("reference_ratio", 11.0 / 12.0, "ratio"),
        Metric.single("overlap.pinned.non_blocking", 0.9, "fraction"),
        Metric.repeated("overlap.pinned.non_blocking.cpu_ms", [5.0], "ms"),
        Metric.repeated("overlap.pinned.non_blocking.copy_ms", [20.0], "ms"),
        Metric.repeated("overlap.pinned.non_blocking.both_ms", [20.5], "ms"),
        Metric.single("overlap.pageable.blocking", 0.0, "fraction"),
        Metric.single("link.gen_idle", 1, "gen"),
        Metric.single("link.width_idle", 16, "lanes"),
        Metric.single("link.gen_under_load", 4, "gen"),
        Metric.single("link.width_under_load", 16, "lanes"),
        Metric.single("link.gen_max", 4, "gen"),
        Metric.single("link.width_max", 16, "lanes"),
        Metric.single("link.theoretical_gbps", 31.5, "GB/s"),
        Metric.single("link.h2d_under_load", 12.6, "GB/s"),
        Metric.single("link.efficiency", 0.4, "fraction"),
        Metric.single("duration_note", 1.0, "s"),
    ]
    params = {"reference_size": "256MiB", "cuda": True, "host_headroom_source": "MemAvailable"}
    # As the report carries it: judged (the overlap verdicts, the link peaks) with findings.
    result = advice.complete(StageResult("pcie", params, tuple(labelled(ms))))
    return replace(result, findings=advise_pcie(ms, params))


def render_text(result: StageResult) -> str:
    from rich.console import Console

    from starvecheck.render.terminal import render

    report = Report("pcie", {}, (result,), tuple(f for f in result.findings if f.severity.rank))
    console = Console(width=140, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    render(report, console)
    return console.export_text()


def test_terminal_tables():
    text = render_text(synthetic_result())
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("H2D") and "pinned" in line)
    assert row.split()[:7] == ["H2D", "pinned", "256MiB", "11.00", "10.00", "…", "12.00"]
    assert "pageable, fresh buffer" in text and "pinned, CUDA runtime" in text
    assert "d2h.pageable.256MiB: pinned allocation failed" in text
    ov = next(line for line in lines if line.startswith("pinned") and "non_blocking" in line)
    assert ov.split()[2:] == ["20.00", "5.00", "25.00", "20.50", "90%", "PARALLEL"]
    under = next(line for line in lines if line.startswith("under load"))
    assert under.split()[2:] == ["4", "16", "31.5", "12.60", "40%"]
    assert "reference_ratio: 0.92" in text
    assert "duration_note" in text  # a metric no table claims still shows
    assert "pcie.low-efficiency" in text


def test_markdown_tables():
    from starvecheck.render.markdown import serialize

    result = synthetic_result()
    md = serialize(Report("pcie", {}, (result,), ()))
    assert "**size sweep**" in md and "**overlap**" in md and "**link**" in md
    assert "| H2D | pinned | 256MiB | 11.00 | 10.00 … 12.00 | 12.50 | 3 |" in md


def test_report_round_trips_through_json():
    result = synthetic_result()
    report = Report("pcie", {}, (result,), ())
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    # The verdicts and peaks are judging's: in the JSON's judgement (schema 3), so the
    # report read back shows the same tables, and judged again, the same still.
    assert again.stages[0].judged.verdicts == result.judged.verdicts != {}
    assert render_text(again.stages[0]) == render_text(result)
    assert render_text(advice.complete(again.stages[0])) == render_text(result)
    unjudged = render_text(replace(again.stages[0], judged=Judged()))
    ov = next(
        line for line in unjudged.splitlines() if line.startswith("pinned") and "non_bl" in line
    )
    assert ov.split()[-2:] == ["90%", "-"]  # no verdict read: none shown


# --- on a real GPU ------------------------------------------------------------------


@pytest.mark.gpu
def test_quick_json_on_a_cuda_device_reports_everything():
    r = run("pcie", "--quick", "--json", "-")
    assert r.exit_code == 0, r.stderr
    (st,) = r.json["stages"]
    by_name = {m["name"]: m for m in st["metrics"]}
    for d in ("h2d", "d2h"):
        for mem in ("pinned", "pageable"):
            for size in ("1MiB", "16MiB", "256MiB"):
                m = by_name[f"{d}.{mem}.{size}"]
                assert m["value"] is not None and m["value"] > 0, m
                assert m["n"] >= 3 and m["min"] <= m["median"] <= m["max"]
                assert by_name[f"{d}.{mem}.{size}.events"]["value"] > 0
    for mem in ("pinned", "pageable"):
        for mode in ("blocking", "non_blocking"):
            m = by_name[f"overlap.{mem}.{mode}"]
            assert m["value"] is None or 0 <= m["value"] <= 1
            assert by_name[f"overlap.{mem}.{mode}.both_ms"]["value"] > 0
    for name in ("link.gen_under_load", "link.width_under_load", "link.efficiency"):
        m = by_name[name]
        assert m["value"] is not None or m["reason"], m
    ratio = by_name["reference_ratio"]
    assert ratio["value"] is not None or ratio["reason"]
    if ratio["value"] is not None:
        assert 0.5 < ratio["value"] < 2.0  # the same copy, two callers
    # Every figure has a value; only NUMA may be missing, where there is one node.
    nulls = [m["name"] for m in st["metrics"] if m["value"] is None]
    one_node = (st["parameters"]["numa_nodes"] or 1) <= 1
    assert all(n.startswith("numa.") for n in nulls) if one_node else not nulls, nulls
    # The link reads its maximum generation under load (idle links train down).
    assert by_name["link.gen_under_load"]["value"] == by_name["link.gen_max"]["value"]


@pytest.mark.gpu
def test_pinned_h2d_is_within_ten_percent_of_the_cuda_runtime():
    r = run("pcie", "--sizes", "256M", "--json", "-")
    assert r.exit_code == 0, r.stderr
    by_name = {m["name"]: m for m in r.json["stages"][0]["metrics"]}
    ratio = by_name["reference_ratio"]
    if ratio["value"] is None:
        pytest.skip(f"no CUDA runtime reference: {ratio['reason']}")
    assert 0.9 <= ratio["value"] <= 1.1


def test_tables_and_findings_select_by_labels_not_names():
    """Renamed but labelled the same, every figure lands in the same table and finding."""
    r = synthetic_result()
    renamed = replace(r, metrics=tuple(replace(m, name=f"m{i}") for i, m in enumerate(r.metrics)))
    renamed = advice.complete(replace(renamed, judged={}))
    assert [f.to_dict() for f in advice.advise(renamed)] == [f.to_dict() for f in advice.advise(r)]
    text = render_text(renamed)
    ov = next(line for line in text.splitlines() if line.startswith("pinned") and "non_bl" in line)
    assert ov.split()[-2:] == ["90%", "PARALLEL"] and "reference_ratio: 0.92" in text
