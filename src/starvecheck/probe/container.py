"""Container runtime and orchestrator, from marker files, cgroup paths and the environment."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from starvecheck.probe.fact import Fact
from starvecheck.probe.sysroot import SysRoot

SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"

# cgroup path fragments each runtime leaves (seen in /proc/self/cgroup without a
# cgroup namespace): order matters, the more specific first.
CGROUP_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"cri-containerd-|/containerd/|containerd\.service", "containerd"),
    (r"crio-|/crio/", "cri-o"),
    (r"libpod-|/libpod/|/machine\.slice/libpod", "podman"),
    (r"docker-[0-9a-f]{12,}\.scope|/docker/[0-9a-f]{12,}", "docker"),
    (r"/lxc/|/lxc\.payload", "lxc"),
)


@dataclass(frozen=True)
class ContainerFacts:
    runtime: Fact[str]  # docker, podman, containerd, cri-o, lxc; absent on bare metal
    kubernetes: bool
    evidence: tuple[str, ...]


def detect_runtime_from_cgroup(text: str) -> str | None:
    for pattern, runtime in CGROUP_PATTERNS:
        if re.search(pattern, text):
            return runtime
    return None


def probe_container(root: SysRoot, environ: Mapping[str, str]) -> ContainerFacts:
    evidence: list[str] = []
    runtime: str | None = None
    if root.exists("/.dockerenv"):
        runtime = "docker"
        evidence.append("/.dockerenv exists")
    if root.exists("/run/.containerenv"):
        runtime = "podman"
        evidence.append("/run/.containerenv exists")
    cgroup = root.read("/proc/self/cgroup")
    from_cgroup = detect_runtime_from_cgroup(cgroup.value or "") if cgroup.known else None
    if from_cgroup:
        evidence.append(f"/proc/self/cgroup names {from_cgroup}")
        # Kubernetes on containerd still runs images built for Docker; the cgroup
        # path names the runtime that actually started us, so it wins over the marker.
        runtime = from_cgroup if runtime in (None, "docker") else runtime
    env_runtime = environ.get("container")  # podman and systemd-nspawn set $container
    if runtime is None and env_runtime:
        runtime = env_runtime
        evidence.append(f"$container={env_runtime}")
    kubernetes = False
    if environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes = True
        evidence.append("$KUBERNETES_SERVICE_HOST is set")
    if root.exists(SERVICE_ACCOUNT):
        kubernetes = True
        evidence.append(f"{SERVICE_ACCOUNT} exists")
    if runtime is None and kubernetes:
        runtime = "unknown container runtime"
    fact = (
        Fact.of(runtime)
        if runtime
        else Fact.absent(
            "no container markers (/.dockerenv, /run/.containerenv, runtime cgroup paths): "
            "bare metal or a VM, or a container with a private cgroup namespace"
        )
    )
    return ContainerFacts(fact, kubernetes, tuple(evidence))
