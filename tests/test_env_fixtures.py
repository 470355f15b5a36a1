"""`starvecheck env` on the fake machines in tests/fixtures/sysroots: facts and findings.

Each machine is described in its own README.md; these tests pin what env must
report for it, through the real CLI and JSON.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from tests.conftest import SYSROOTS, run, sysroot_env


def env_json(name: str, *args: str, env: dict[str, str] | None = None):
    r = run("env", "--json", "-", *args, env={**sysroot_env(name), **(env or {})})
    assert r.exit_code == 0, r.stderr
    return r.json


def ids(report, severity=None):
    return {
        f["id"]
        for f in report["stages"][0]["findings"]
        if severity is None or f["severity"] == severity
    }


def finding(report, id_):
    return next(f for f in report["stages"][0]["findings"] if f["id"] == id_)


def test_docker_v1_container_with_64mb_shm():
    r = env_json("docker-v1-shm64")
    m = r["machine"]
    assert m["container"] == {
        "runtime": "docker",
        "kubernetes": False,
        "evidence": ["/.dockerenv exists", "/proc/self/cgroup names docker"],
    }
    assert (m["cgroup"]["version"], m["cgroup"]["mode"]) == (1, "hybrid")
    assert m["cpu"]["logical"] == 16 and m["cpu"]["physical"] == 8
    assert m["cpu"]["quota_cpus"] == 4.0 and m["cpu"]["effective_cpus"] == 4
    # The mount root is /docker/<id>: the files are at the mount point itself.
    assert m["cgroup"]["quota_path"] == "/sys/fs/cgroup/cpu,cpuacct"
    assert m["memory"]["limit_bytes"] == 8 * 1024**3
    assert m["shm"]["size_bytes"] == 64 * 1024**2
    assert m["limits"]["memlock_bytes"] == 8 * 1024**2
    assert m["storage"]["fstype"] == "ext4" and m["storage"]["rotational"] is False
    assert m["gpus"] == []
    shm = finding(r, "env.shm-too-small")
    assert shm["severity"] == "critical" and "--shm-size" in shm["recommendation"]
    assert "medium: Memory" in shm["recommendation"] and shm["gain"]["kind"] == "blocker"
    assert r["checklist"][0]["id"] == "env.shm-too-small"
    cpu = finding(r, "env.cpu-oversubscribed")
    assert "num_workers=3" in cpu["recommendation"]
    assert "env.cpu-throttling" in ids(r, "ok")


def test_kubernetes_pod_limited_to_2_of_64_cpus_and_throttled():
    r = env_json("k8s-pod-v2")
    m = r["machine"]
    assert m["container"]["runtime"] == "containerd" and m["container"]["kubernetes"] is True
    assert m["cgroup"]["version"] == 2
    assert m["cpu"]["logical"] == 64 and m["cpu"]["affinity"] == 64
    assert m["cpu"]["quota_cpus"] == 2.0 and m["cpu"]["effective_cpus"] == 2
    # The limit is on the pod's slice, a parent of the container's scope.
    assert m["cgroup"]["quota_path"].endswith(".slice")
    assert "pod" in m["cgroup"]["quota_path"]
    t = m["cgroup"]["throttling"]
    assert (t["nr_periods"], t["nr_throttled"]) == (184210, 40311)
    assert m["memory"]["limit_bytes"] == 16 * 1024**3
    assert m["limits"]["pids_max"] == 4096
    assert m["shm"]["size_bytes"] == 8 * 1024**3
    assert m["numa"]["nodes"] == 2
    assert {"env.cpu-oversubscribed", "env.cpu-throttled"} <= ids(r, "warning")
    assert "21.9%" in finding(r, "env.cpu-throttled")["title"]
    assert "num_workers=1" in finding(r, "env.cpu-oversubscribed")["recommendation"]
    assert "env.shm" in ids(r, "ok")
    # The working directory is /workspace, on gcsfuse.
    assert m["storage"]["path"] == "/workspace" and m["storage"]["kind"] == "fuse"
    assert "env.network-storage" in ids(r, "warning")


def test_kubernetes_pod_data_path_on_nfs():
    m = env_json("k8s-pod-v2", "/data")["machine"]
    assert (m["storage"]["fstype"], m["storage"]["kind"], m["storage"]["network"]) == (
        "nfs4",
        "network",
        True,
    )
    assert m["storage"]["source"] == "10.0.12.7:/export/datasets"


def test_kubernetes_detected_from_the_environment_alone(tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(SYSROOTS / "docker-v1-shm64", copy, symlinks=True)
    r = run(
        "env",
        "--json",
        "-",
        env={"STARVECHECK_SYSROOT": str(copy), "KUBERNETES_SERVICE_HOST": "10.96.0.1"},
    )
    assert r.json["machine"]["container"]["kubernetes"] is True


def test_bare_metal_two_sockets_eight_gpus():
    r = env_json("baremetal-numa-8gpu")
    m = r["machine"]
    assert m["container"]["runtime"] is None and m["container"]["kubernetes"] is False
    assert "container.runtime" in m["not_applicable"]
    assert m["numa"]["nodes"] == 2
    assert m["cpu"]["logical"] == 112 and m["cpu"]["affinity"] == 56
    assert m["cpu"]["quota_cpus"] is None and m["cpu"]["effective_cpus"] == 56
    gpus = m["gpus"]
    # NVSwitches (class 0x0680), the NIC and the BMC's VGA are not GPUs.
    assert len(gpus) == 8
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g["name"] == "NVIDIA H100 80GB HBM3" and g["source"] == "nvml+sysfs" for g in gpus)
    assert [g["pcie"]["width_current"] for g in gpus] == [16] * 6 + [8] + [16]
    assert {(g["pcie"]["gen_current"], g["pcie"]["gen_max"]) for g in gpus} == {(1, 5)}
    assert gpus[6]["pci_bus_id"] == "0000:ba:00.0"
    assert m["gpu_driver"] == {
        "nvml": "ok",
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
    }
    numa = finding(r, "env.numa-remote-gpu")
    assert numa["severity"] == "warning" and "4 of 8 GPUs" in numa["title"]
    assert "GPU 0-3 on node 0" in numa["evidence"]
    assert "--numa-binding=node" in numa["recommendation"]
    width = finding(r, "env.pcie-width-degraded")
    assert "GPU 6 (0000:ba:00.0) x8 of x16" in width["evidence"]
    gen = finding(r, "env.pcie-gen-below-max")
    assert gen["severity"] == "info"
    assert "starvecheck pcie" in gen["evidence"] and "Idle GPUs lower" in gen["evidence"]
    assert "env.nofile-low" in ids(r, "warning")  # soft 1024, hard 524288
    assert "ulimit -n 65536" in finding(r, "env.nofile-low")["recommendation"]
    assert "env.memlock" in ids(r, "ok")  # unlimited
    assert m["storage"]["fstype"] == "xfs" and m["storage"]["rotational"] is False


def test_bare_metal_gpus_from_sysfs_alone_when_nvml_is_missing(tmp_path):
    copy = tmp_path / "m"
    shutil.copytree(SYSROOTS / "baremetal-numa-8gpu", copy, symlinks=True)
    (copy / "starvecheck-fake-nvml.json").unlink()
    r = run("env", "--json", "-", env={"STARVECHECK_SYSROOT": str(copy)})
    m = r.json["machine"]
    gpus = m["gpus"]
    assert len(gpus) == 8 and all(g["source"] == "sysfs" and g["name"] is None for g in gpus)
    assert gpus[6]["pcie"]["width_current"] == 8 and gpus[0]["pcie"]["gen_max"] == 5
    assert [g["numa_node"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert "no starvecheck-fake-nvml.json" in m["unknown"]["gpus[0].name"]
    assert m["gpu_driver"]["driver_version"] is None
    report_ids = {f["id"] for f in r.json["checklist"]}
    assert {"env.pcie-width-degraded", "env.numa-remote-gpu"} <= report_ids


def test_vm_without_numa_or_gpu():
    r = env_json("vm-no-numa-no-gpu")
    m = r["machine"]
    assert m["numa"]["nodes"] is None and "does not exist" in m["unknown"]["numa.nodes"]
    assert m["gpus"] == [] and "gpus" in m["not_applicable"]
    assert m["cpu"]["logical"] == 4 and m["cpu"]["effective_cpus"] == 4
    assert m["cpu"]["quota_cpus"] is None and "cpu.quota_cpus" in m["not_applicable"]
    # /proc/self/limits is missing on this machine: unknown, with the reason.
    assert m["limits"]["nofile"] is None
    assert "/proc/self/limits does not exist" in m["unknown"]["limits.nofile"]
    assert m["storage"]["rotational"] is True
    assert "env.rotational-storage" in ids(r, "warning")
    assert "env.no-gpu" in ids(r, "info")
    assert "env.cpu" in ids(r, "ok")


@pytest.mark.parametrize(
    "name", ["docker-v1-shm64", "k8s-pod-v2", "baremetal-numa-8gpu", "vm-no-numa-no-gpu"]
)
def test_every_fixture_renders_and_flags_itself_as_fake(name):
    r = run("env", env=sysroot_env(name))
    assert r.exit_code == 0
    assert "fake sysroot" in r.stdout and "Checklist" in r.stdout


@pytest.mark.parametrize(
    ("name", "fail_on", "code"),
    [
        ("docker-v1-shm64", "critical", 1),
        ("k8s-pod-v2", "critical", 0),
        ("k8s-pod-v2", "warning", 1),
        ("vm-no-numa-no-gpu", "critical", 0),
    ],
)
def test_fail_on_against_real_findings(name, fail_on, code):
    r = run("env", "--fail-on", fail_on, "--json", "-", env=sysroot_env(name))
    assert r.exit_code == code


def test_path_that_exists_only_on_this_machine_is_refused_for_a_fake_one(tmp_path):
    r = run("env", str(tmp_path), env=sysroot_env("k8s-pod-v2"))
    assert r.exit_code == 2 and "no such file or directory in STARVECHECK_SYSROOT" in r.stderr


def test_one_node_vm_with_a_gpu_has_no_numa_node_to_miss(tmp_path):
    """As on a lent H100 (Firecracker VM): sysfs numa_node is -1 and NVML answers "Not
    Supported". With one NUMA node that is not applicable, not "could not be read"."""
    import json

    copy = tmp_path / "m"
    shutil.copytree(SYSROOTS / "docker-v1-shm64", copy, symlinks=True)
    src = SYSROOTS / "baremetal-numa-8gpu" / "sys/bus/pci/devices/0000:18:00.0"
    dst = copy / "sys/bus/pci/devices/0000:00:06.0"
    shutil.copytree(src, dst)
    (dst / "numa_node").write_text("-1\n")
    snapshot = json.loads((SYSROOTS / "baremetal-numa-8gpu/starvecheck-fake-nvml.json").read_text())
    gpu = dict(snapshot["devices"][0], pci_bus_id="00000000:00:06.0", numa_node=None)
    gpu["errors"] = {"numa_node": "NVML: Not Supported"}
    snapshot["devices"] = [gpu]
    (copy / "starvecheck-fake-nvml.json").write_text(json.dumps(snapshot))
    r = run("env", "--json", "-", env={"STARVECHECK_SYSROOT": str(copy)})
    m = r.json["machine"]
    assert len(m["gpus"]) == 1 and m["gpus"][0]["numa_node"] is None
    assert "gpus[0].numa_node" not in m["unknown"]
    assert m["not_applicable"]["gpus[0].numa_node"].startswith("one NUMA node")
    text = run("env", env={"STARVECHECK_SYSROOT": str(copy)}).stdout
    assert "Unknown (could not be read)" in text  # the fake's free space, still unknown
    assert "numa_node" not in text.split("Unknown (could not be read)")[1]


def test_the_stage_measures_and_the_rules_judge_the_machine():
    """env's stage returns the facts' provenance and no findings; advice/env judges the
    run's machine, only when the env stage is part of the run."""
    from starvecheck.advice.env import rules
    from starvecheck.advice.results import Results
    from starvecheck.stages import registry
    from starvecheck.stages.base import RunContext
    from starvecheck.stages.options import EnvOptions

    environ = sysroot_env("docker-v1-shm64")
    stage = registry.get("env")
    ctx = RunContext(environ=environ)
    plan = stage.plan(EnvOptions(), ctx)
    measured = stage.measure_all(plan, ctx)
    machine, result = measured.machine, measured.result
    again = stage.measure(plan, ctx)
    assert again == replace(result, duration_s=again.duration_s)
    assert (result.stage, result.metrics, result.findings) == ("env", (), ())
    assert result.has_caveat("env.fake-sysroot")
    found = {f.id for f in rules(Results({"env": result}, machine))}
    assert {"env.shm-too-small", "env.cpu-oversubscribed"} <= found
    assert rules(Results({}, machine)) == []  # another command's machine: not judged here
    assert rules(Results({"env": result})) == []  # no facts (a stored trace): nothing to judge


def test_a_missing_path_is_refused_by_the_stages_plan(tmp_path):
    from starvecheck.core.status import UsageError
    from starvecheck.stages import registry
    from starvecheck.stages.base import RunContext
    from starvecheck.stages.options import EnvOptions

    ctx = RunContext(environ=sysroot_env("k8s-pod-v2"))
    with pytest.raises(UsageError, match="no such file or directory in STARVECHECK_SYSROOT="):
        registry.get("env").plan(EnvOptions(path=str(tmp_path)), ctx)


def test_env_json_has_no_metrics_and_its_findings_from_judging():
    r = env_json("k8s-pod-v2")
    assert r["schema_version"] == 3
    (stage,) = r["stages"]
    assert stage["stage"] == "env" and stage["metrics"] == [] and stage["findings"]
    assert all(f["stage"] == "env" for f in stage["findings"])
