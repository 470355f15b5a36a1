"""attach's GPU reading against a fake NVML: which GPUs are the job's (its PIDs, else
CUDA_VISIBLE_DEVICES, else every GPU, said so), utilization each second, a query
that fails alone, NVML that cannot be opened, and NVML shut when the read ends."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from types import SimpleNamespace

from starvecheck.advice.attach import _gpus
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.probe.nvml import NvmlUnavailable
from starvecheck.stages.attach.gpus import GpuWatch, visible_devices
from starvecheck.stages.attach.stage import _read_gpus


class FakeNvml:
    def __init__(self, procs, rates, fail_rates=()):
        self.procs, self.rates, self.fail_rates = procs, rates, set(fail_rates)
        self.open = False
        self.calls = 0

    def nvmlDeviceGetCount(self):
        return len(self.procs)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:04d}"

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=1) for p in self.procs[h]]

    def nvmlDeviceGetUtilizationRates(self, h):
        if h in self.fail_rates:
            raise RuntimeError("Not Supported")
        self.calls += 1
        return SimpleNamespace(gpu=self.rates[h].pop(0), memory=0)


def opener(fake):
    @contextlib.contextmanager
    def nvml():
        fake.open = True
        try:
            yield fake
        finally:
            fake.open = False

    return nvml


def watch(fake, pids=(100, 101), visible=None, cuda=True):
    return GpuWatch(pids, opener(fake), lambda p: cuda, lambda p: visible)


def test_the_gpu_running_the_jobs_pid_is_read_each_second_and_nvml_shut_after():
    fake = FakeNvml([[7], [101, 9]], [[0, 0], [40.0, 60.0]])
    w = watch(fake)
    assert [g.index for g in w.gpus] == [1] and "PIDs" in w.chosen_by
    assert w.gpus[0].job_pids == [101] and w.gpus[0].other_pids == [9]
    w.tick(), w.tick()
    assert w.gpus[0].utilization == [40.0, 60.0]
    assert fake.open
    w.close()
    assert not fake.open
    caveats: list[Caveat] = []
    gpus = _read_gpus(w, caveats)
    (g,) = gpus
    u = g.utilization
    assert (u.value, u.min, u.max, g.index) == (50.0, 40.0, 60.0, 1)
    assert [c.id for c in caveats] == ["attach.gpu-shared"] and "9" in caveats[0].text
    r = StageResult("attach", {}, tuple(g.metric() for g in gpus))
    assert _gpus(r) == "busy by NVML, median each second (range): GPU 1 50% (40-60%)"


def test_in_a_container_cuda_visible_devices_names_the_gpu_by_index_or_uuid():
    fake = FakeNvml([[5001], [5002], [5003]], [[1], [2], [3]])  # host PIDs only
    w = watch(fake, visible=["GPU-0002"])
    assert [g.index for g in w.gpus] == [2] and "CUDA_VISIBLE_DEVICES" in w.chosen_by
    w = watch(fake, visible=["0", "1"])
    assert [g.index for g in w.gpus] == [0, 1]


def test_where_nothing_tells_every_gpu_is_read_and_the_report_says_so():
    fake = FakeNvml([[5001], [5002]], [[1], [2]])
    w = watch(fake)
    assert [g.index for g in w.gpus] == [0, 1]
    assert w.chosen_by.startswith("every GPU") and "container" in w.chosen_by


def test_a_cpu_job_gets_no_nvml_call_and_no_caveat():
    called = []

    def nvml():
        called.append(1)
        raise AssertionError("NVML opened for a CPU job")

    w = GpuWatch([100], nvml, lambda p: False, lambda p: None)
    assert not called and not w.gpus and not w.missing and "uses no GPU" in (w.reason or "")
    caveats: list[Caveat] = []
    assert _read_gpus(w, caveats) == () and caveats == []


def test_nvml_that_cannot_be_opened_is_one_caveat_and_the_rest_runs():
    @contextlib.contextmanager
    def nvml():
        raise NvmlUnavailable("Driver Not Loaded")
        yield

    w = GpuWatch([100], nvml, lambda p: True, lambda p: None)
    w.tick()
    caveats: list[Caveat] = []
    assert _read_gpus(w, caveats) == ()
    assert [c.id for c in caveats] == ["attach.no-gpu"] and "Driver Not Loaded" in caveats[0].text


def test_a_query_that_fails_alone_leaves_that_gpu_unread():
    fake = FakeNvml([[100], [101]], [[10.0], [20.0]], fail_rates=[0])
    w = watch(fake)
    w.tick()
    assert [g.utilization for g in w.gpus] == [[], [20.0]]
    assert [g.index for g in _read_gpus(w, [])] == [1]


def test_a_failing_device_list_closes_nvml_and_says_why():
    fake = FakeNvml([[100]], [[1]])
    fake.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("GPU is lost"))
    w = watch(fake)
    assert w.missing and "GPU is lost" in (w.reason or "") and not fake.open


def test_cuda_visible_devices_is_read_from_the_process_environment():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-abc, 1", "PATH": "/usr/bin:/bin"}
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.2)
        assert visible_devices(p.pid) == ["GPU-abc", "1"]
    finally:
        p.kill()
        p.wait()
    assert visible_devices(p.pid) is None  # gone
