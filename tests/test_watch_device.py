"""watch on the GPU's own clock, with a fake device (CI has no GPU): the idle time the
GPU spends waiting for data, beside the host's wait, for a data-bound loop and for one
whose kernels outlast the next fetch; headspace on a real CPU loop; the pin_memory A/B
skipped with its reason where there is no CUDA."""

from __future__ import annotations

import time

import pytest

from starvecheck.core.metric import value
from starvecheck.loop.timer import Watch
from tests.fake_device import FakeDevice


def fake_loop(fetch_ms: float, kernels_ms: float, steps: int = 40, **kw):
    """A loop whose loader takes `fetch_ms` of host time a batch and whose step queues
    `kernels_ms` of GPU work in 1 ms of host time, on one simulated clock."""
    device = FakeDevice()

    def loader():
        for i in range(steps):
            device.now += fetch_ms
            yield i

    w = Watch(loader(), show=False, clock=lambda: device.now / 1e3, device=device, **kw)
    for _ in w:
        device.launch(kernels_ms)
        device.now += 1.0
    device.now += 10_000  # the device catches up; read without waiting
    return w.measured().metrics


def test_a_data_bound_loop_idles_the_gpu_for_the_fetch_less_its_work():
    m = fake_loop(fetch_ms=20.0, kernels_ms=5.0)
    # host: 20 ms of each 21 ms step waits; the GPU runs 5 of it and idles 16
    assert value(m, quantity="data_wait_share") == pytest.approx(20 / 21, rel=1e-6)
    assert value(m, quantity="gpu_idle_data_wait_share") == pytest.approx(16 / 21, rel=1e-6)
    assert value(m, quantity="gpu_step_ms") == pytest.approx(21.0)


def test_kernels_that_outlast_the_fetch_show_host_wait_but_no_gpu_idle():
    m = fake_loop(fetch_ms=10.0, kernels_ms=30.0)
    assert value(m, quantity="data_wait_share") > 0.8  # the host waits for every batch
    assert value(m, quantity="gpu_idle_data_wait_share") == pytest.approx(0.0)
    assert value(m, quantity="gpu_step_ms") == pytest.approx(30.0)


def test_a_stalled_stream_never_blocks_the_loop_and_is_said():
    device = FakeDevice()
    w = Watch(range(20), show=False, clock=lambda: device.now / 1e3, device=device)
    started = time.perf_counter()
    for i in w:
        if i == 5:
            device.stall()
        device.launch(5.0)
        device.now += 20.0
    assert time.perf_counter() - started < 5.0
    m = w.measured().metrics
    assert value(m, quantity="gpu_unresolved_steps") >= 14


def test_the_data_bound_finding_puts_the_gpus_clock_beside_the_hosts():
    device = FakeDevice()

    def loader():
        for i in range(40):
            device.now += 20.0
            yield i

    w = Watch(loader(), show=False, clock=lambda: device.now / 1e3, device=device)
    for _ in w:
        device.launch(5.0)
        device.now += 1.0
    device.now += 10_000
    f = next(f for f in w.result().findings if f.id == "profile.data-bound")
    assert "On the GPU's own clock" in f.evidence and "76.2%" in f.evidence


def test_gpu_events_asked_for_without_cuda_is_one_note():
    w = Watch(range(5), show=False, gpu_events=True)
    list(w)
    assert any(c.id == "watch.events-without-cuda" for c in w.measured().caveats)
    assert value(w.measured().metrics, quantity="gpu_step_ms") is None


def _step(x, reps: int) -> float:
    """A CPU step with real work: matrix products."""
    import torch

    y = x
    for _ in range(reps):
        y = torch.tanh(y @ x)
    return float(y[0, 0])


@pytest.fixture
def one_thread():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a step whose time a second thread's luck does not move
    yield
    torch.set_num_threads(before)


@pytest.mark.accuracy
def test_headspace_on_a_cpu_loop_measures_the_step_without_the_loader(one_thread):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = torch.randn(192, 192) / 14

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 30

        def __getitem__(self, i):
            time.sleep(0.03)  # a loader slower than the step
            return torch.zeros(4)

    one = []
    for _ in range(5):
        t0 = time.perf_counter()
        _step(x, 1)
        one.append(time.perf_counter() - t0)
    reps = max(1, round(0.010 / sorted(one)[2]))  # a step of about 10 ms here

    def alone(n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            _step(x, reps)
            out.append(time.perf_counter() - t0)
        return out

    loader = torch.utils.data.DataLoader(Slow(), batch_size=1)
    w = Watch(loader, show=False, headspace=20)
    before = alone(20)
    seen = 0
    for _ in w:
        _step(x, reps)
        seen += 1
    after = alone(20)
    assert seen == 30 + 20  # the loop was handed 20 batches again
    m = w.measured().metrics
    assert value(m, quantity="steps") == 30  # the replayed steps are not the loop's
    floor = value(m, quantity="headspace_step_ms") / 1e3
    without = sorted(before + after)[len(before)]  # the median of both
    assert abs(floor / without - 1) <= 0.10, (floor, without)
    step = value(m, quantity="step_ms") / 1e3
    assert step > floor + 0.02  # the loop's own step waits ~30 ms for data
    f = next(f for f in w.result().findings if f.id == "profile.data-bound")
    assert "headspace" in f.evidence and "gains" in f.evidence
    # the worker change's predicted gain stands where it is under the measured ceiling
    assert "measured: the step with no data wait (headspace)" in f.gain.basis
    assert f.gain.value <= float(f.evidence.split("gains ")[1].split("x")[0])


@pytest.mark.parametrize("bad", [-1, True, 2.5, 10**6])
def test_headspace_must_be_a_number_of_steps(bad):
    with pytest.raises(ValueError, match="headspace"):
        Watch(range(3), headspace=bad)


def test_a_trainers_hooks_record_the_same_events():
    device = FakeDevice()
    w = Watch((), show=False, clock=lambda: device.now / 1e3, device=device)
    w.begin_pass()
    for _ in range(30):
        device.now += 20.0  # the trainer fetches its batch
        w.begin_step()
        device.launch(5.0)
        device.now += 1.0
        w.end_step()
    device.now += 10_000
    w.end_pass()
    m = w.measured().metrics
    assert value(m, quantity="gpu_idle_data_wait_share") == pytest.approx(16 / 21, rel=1e-6)
