"""The real NVML source, driven through a fake `pynvml` module; and the sysfs merge."""

from __future__ import annotations

import sys
import types

import pytest

from starvecheck.probe.gpu import probe_gpus
from starvecheck.probe.nvml import (
    FakeNvmlSource,
    NvmlGpu,
    NvmlSnapshot,
    NvmlUnavailable,
    PynvmlSource,
)
from starvecheck.probe.sysroot import SysRoot


class NVMLError(Exception):
    def __init__(self, value, text=""):
        super().__init__(text or f"NVML error {value}")
        self.value = value


def fake_pynvml(*, init_error=None, gpus=2, unsupported=()):
    """A stand-in for nvidia-ml-py: two H100s; calls in `unsupported` raise NOT_SUPPORTED."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_ERROR_LIBRARY_NOT_FOUND = 12
    calls = []

    def call(name, value):
        def fn(*args):
            calls.append(name)
            if name in unsupported:
                raise NVMLError(3, "Not Supported")
            return value(*args) if callable(value) else value

        return fn

    def init():
        if init_error:
            raise init_error

    m.nvmlInit = init
    m.nvmlShutdown = lambda: calls.append("shutdown")
    m.nvmlSystemGetDriverVersion = call("driver", b"550.54.15")
    m.nvmlSystemGetCudaDriverVersion = call("cuda", 12040)
    m.nvmlDeviceGetCount = call("count", gpus)
    m.nvmlDeviceGetHandleByIndex = call("handle", lambda i: i)
    m.nvmlDeviceGetName = call("name", b"NVIDIA H100 80GB HBM3")
    m.nvmlDeviceGetUUID = call("uuid", "GPU-1")
    m.nvmlDeviceGetPciInfo = call(
        "pci", lambda h: types.SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())
    )
    m.nvmlDeviceGetMemoryInfo = call("memory", types.SimpleNamespace(total=85520809984))
    m.nvmlDeviceGetUtilizationRates = call("util", types.SimpleNamespace(gpu=7))
    m.nvmlDeviceGetCurrPcieLinkGeneration = call("gen", 1)
    m.nvmlDeviceGetMaxPcieLinkGeneration = call("genmax", 5)
    m.nvmlDeviceGetCurrPcieLinkWidth = call("width", 16)
    m.nvmlDeviceGetMaxPcieLinkWidth = call("widthmax", 16)
    m.nvmlDeviceGetCpuAffinity = call("affinity", lambda h, n: [0xFFFF] + [0] * (n - 1))
    m.nvmlDeviceGetNumaNodeId = call("numa", 0)
    m.calls = calls
    return m


@pytest.fixture
def with_pynvml(monkeypatch):
    def install(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module

    return install


def test_pynvml_source_reads_every_field(with_pynvml):
    nv = with_pynvml(fake_pynvml())
    snap = PynvmlSource(logical_cpus=112).read()
    assert snap.driver_version == "550.54.15" and snap.cuda_driver_version == 12040
    assert len(snap.devices) == 2
    d = snap.devices[1]
    assert (d.name, d.pci_bus_id, d.pcie_gen_current, d.pcie_gen_max) == (
        "NVIDIA H100 80GB HBM3",
        "00000000:19:00.0",
        1,
        5,
    )
    assert d.cpu_affinity == "0-15" and d.errors == {}
    assert nv.calls[-1] == "shutdown"


def test_pynvml_field_not_supported_keeps_the_rest(with_pynvml):
    with_pynvml(fake_pynvml(unsupported=("genmax", "numa")))
    d = PynvmlSource().read().devices[0]
    assert d.pcie_gen_max is None and d.numa_node is None
    assert d.name == "NVIDIA H100 80GB HBM3"
    assert set(d.errors) == {"pcie.gen_max", "numa_node"}
    assert "Not Supported" in d.errors["pcie.gen_max"]


def test_pynvml_library_missing_is_unavailable_with_reason(with_pynvml):
    with_pynvml(fake_pynvml(init_error=NVMLError(12, "NVML Shared Library Not Found")))
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver"):
        PynvmlSource().read()


def test_pynvml_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(NvmlUnavailable, match="not installed"):
        PynvmlSource().read()


def _pci(
    root, bdf, *, vendor="0x10de", cls="0x030200", speed="16.0 GT/s PCIe", width="16", numa="1"
):
    d = root / "sys/bus/pci/devices" / bdf
    d.mkdir(parents=True)
    for name, value in (
        ("vendor", vendor),
        ("class", cls),
        ("current_link_speed", speed),
        ("max_link_speed", "16.0 GT/s PCIe"),
        ("current_link_width", width),
        ("max_link_width", "16"),
        ("numa_node", numa),
        ("local_cpulist", "8-15"),
    ):
        (d / name).write_text(value + "\n")


def test_merge_nvml_with_sysfs_by_bus_id(tmp_path):
    _pci(tmp_path, "0000:18:00.0", numa="1")
    _pci(tmp_path, "0000:3b:00.0", width="8")  # NVIDIA hardware NVML does not list
    _pci(tmp_path, "0000:05:00.0", cls="0x068000")  # an NVSwitch: not a GPU
    _pci(tmp_path, "0000:02:00.0", vendor="0x1a03", cls="0x030000")  # a BMC's VGA
    nvml = FakeNvmlSource(
        NvmlSnapshot(
            "550",
            12040,
            (
                NvmlGpu(
                    0,
                    name="NVIDIA L40S",
                    pci_bus_id="00000000:18:00.0",
                    pcie_gen_current=None,
                    errors={"pcie.gen_current": "NVML: Not Supported"},
                ),
            ),
        )
    )
    facts = probe_gpus(SysRoot(tmp_path), nvml)
    assert [g.pci_bus_id for g in facts.gpus] == ["0000:18:00.0", "0000:3b:00.0"]
    first, second = facts.gpus
    # NVML could not say the generation; sysfs could, so it is known and not "unknown".
    assert first.gen_current == 4 and "pcie.gen_current" not in first.unknown
    assert first.numa_node == 1 and first.source == "nvml+sysfs"
    assert second.source == "sysfs" and second.index == 1 and second.width_current == 8
    assert facts.cuda_driver_version.value == "12.4"


def test_sysfs_only_when_nvml_unavailable(tmp_path):
    _pci(tmp_path, "0000:18:00.0", numa="-1")
    facts = probe_gpus(SysRoot(tmp_path), FakeNvmlSource(None, "driver not loaded"))
    (g,) = facts.gpus
    assert g.name is None and g.numa_node is None and g.gen_max == 4
    assert "driver not loaded" in g.unknown["name"]
    assert facts.nvml.reason == "driver not loaded"


def test_a_crashing_nvml_source_does_not_take_env_down(tmp_path):
    class Broken:
        def read(self):
            raise RuntimeError("segfault-ish")

    facts = probe_gpus(SysRoot(tmp_path), Broken())
    assert facts.gpus == [] and "RuntimeError" in facts.nvml.reason
