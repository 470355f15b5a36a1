"""The GPU's idle time from events on a fake device clock: a data-bound loop, kernels
that outlast the next fetch (the host waits, the GPU does not), a stalled stream (no
blocking, unresolved counted, memory bounded), and a new pass."""

from __future__ import annotations

import pytest

from starvecheck.loop.gpuclock import PENDING_MAX, DeviceIdle
from tests.fake_device import FakeDevice


def run(
    device: FakeDevice,
    idle: DeviceIdle,
    steps: int,
    fetch_ms: float,
    kernels_ms: float,
    queue_ms: float = 1.0,
) -> None:
    """A loop: wait `fetch_ms` for a batch, queue `kernels_ms` of GPU work taking
    `queue_ms` on the host, ask for the next batch."""
    for _ in range(steps):
        device.now += fetch_ms
        idle.arrived()
        device.launch(kernels_ms)
        device.now += queue_ms
        idle.asked()


def test_a_data_bound_loop_the_gpu_idles_the_fetch_less_its_work():
    d = FakeDevice()
    idle = DeviceIdle(d)
    run(d, idle, 20, fetch_ms=20.0, kernels_ms=5.0)
    d.now += 100
    idle.resolve()
    # each period: 21 ms of host time; the GPU runs 5 of it and idles 16
    assert idle.idle_ms == pytest.approx([16.0] * 19)
    assert idle.period_ms == pytest.approx([21.0] * 19)
    assert idle.share() == pytest.approx(16 / 21)
    assert idle.unresolved == 0


def test_kernels_that_outlast_the_next_fetch_leave_the_gpu_no_idle_time():
    d = FakeDevice()
    idle = DeviceIdle(d)
    # the host waits 10 ms for every batch, yet the GPU is still busy with 30 ms of work
    run(d, idle, 20, fetch_ms=10.0, kernels_ms=30.0)
    d.now += 1000
    idle.resolve()
    assert idle.share() == pytest.approx(0.0)
    assert idle.period_ms[-1] == pytest.approx(30.0)  # the device's own step time


def test_partly_overlapped_fetch_counts_only_its_excess():
    d = FakeDevice()
    idle = DeviceIdle(d)
    run(d, idle, 10, fetch_ms=25.0, kernels_ms=20.0, queue_ms=0.0)
    d.now += 1000
    idle.resolve()
    assert idle.idle_ms == pytest.approx([5.0] * 9)
    assert idle.share() == pytest.approx(5 / 25)


def test_resolving_never_waits_and_reads_only_completed_steps():
    d = FakeDevice()
    idle = DeviceIdle(d)
    run(d, idle, 5, fetch_ms=1.0, kernels_ms=100.0)
    # the host is at 10 ms; the device has 500 ms of work queued: nothing is done
    assert idle.idle_ms == [] and idle.unresolved == 5
    d.now += 250
    idle.resolve()
    assert len(idle.period_ms) == 1 and idle.unresolved == 3  # steps 1-2 done, 1 has no start


def test_a_stalled_stream_never_blocks_and_stays_bounded():
    d = FakeDevice()
    idle = DeviceIdle(d)
    run(d, idle, 10, fetch_ms=20.0, kernels_ms=5.0)
    d.now += 10
    idle.resolve()
    resolved = len(idle.idle_ms)
    d.stall()
    run(d, idle, PENDING_MAX * 3, fetch_ms=1.0, kernels_ms=5.0)
    assert len(idle.idle_ms) == resolved  # nothing after the stall is invented
    assert idle.unresolved == PENDING_MAX * 3
    assert len(idle._pending) <= PENDING_MAX and idle.dropped == PENDING_MAX * 2


def test_a_new_pass_does_not_count_the_gap_before_its_first_batch():
    d = FakeDevice()
    idle = DeviceIdle(d)
    run(d, idle, 5, fetch_ms=20.0, kernels_ms=20.0, queue_ms=0.0)
    d.now += 100
    idle.new_pass()
    d.now += 5000  # workers starting for the next epoch
    run(d, idle, 5, fetch_ms=20.0, kernels_ms=20.0, queue_ms=0.0)
    d.now += 100
    idle.resolve()
    assert max(idle.idle_ms) == pytest.approx(0.0) and len(idle.idle_ms) == 8
