"""Who a watched loop is, as labels that join its figures with the DCGM exporter's and
the launcher's (docs/fleet.md).

The names are DCGM exporter's where it has one (`Hostname`, `gpu`, `UUID`, `pod`,
`namespace`), so `on (Hostname, gpu)` joins a rank's data wait with its GPU's
`DCGM_FI_DEV_GPU_UTIL`; the launcher's for the rest: `job`, `rank`, `local_rank`, and
Slurm's job and step ids. A label whose value is not known here is left out, never
made up. Everything is read from the environment and the host name, and, for the GPU,
from torch only where the loop already uses CUDA (reading it never initialises it).
"""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Mapping
from pathlib import Path

# The Kubernetes service account's namespace, mounted in every pod that has one.
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
NAMESPACE_BYTES = 253  # a namespace is at most 63; what is read of the file, at most
# The training job's name: ours first, then what the launchers set.
JOB_VARS = ("STARVECHECK_JOB", "SLURM_JOB_NAME", "JOB_NAME", "TORCHELASTIC_RUN_ID")


def job_name(environ: Mapping[str, str], argv0: str) -> str:
    """The job: STARVECHECK_JOB, else the launcher's name for it, else the script's."""
    for name in JOB_VARS:
        value = environ.get(name, "").strip()
        if value and value != "none":  # torchrun's run id when none was given
            return value
    script = os.path.basename(argv0) or "python"
    return script[:-3] if script.endswith(".py") else script


def labels(
    environ: Mapping[str, str],
    *,
    rank: int | None = None,
    hostname: str | None = None,
    argv0: str | None = None,
    namespace_file: Path | None = SA_NAMESPACE,
) -> dict[str, str]:
    """The loop's labels from the environment (a pure function of its arguments and
    one small file, not read where `namespace_file` is None): `rank` is
    torch.distributed's where a group is there, else RANK. Every value valid UTF-8."""
    out = {
        "job": job_name(environ, sys.argv[0] if argv0 is None else argv0),
        "Hostname": hostname or socket.gethostname(),
        "rank": str(rank) if rank is not None else environ.get("RANK", "0"),
        "local_rank": environ.get("LOCAL_RANK", "0"),
    }
    pod = environ.get("POD_NAME") or environ.get("HOSTNAME")
    if "KUBERNETES_SERVICE_HOST" in environ and pod:  # in a pod: its name is the host's
        out["pod"] = pod
        if environ.get("POD_NAMESPACE"):
            out["namespace"] = environ["POD_NAMESPACE"]
    for var, label in (("SLURM_JOB_ID", "slurm_job_id"), ("SLURM_STEP_ID", "slurm_step_id")):
        if environ.get(var):
            out[label] = environ[var]
    found = {k: utf8(v) for k, v in out.items()}
    return found if namespace_file is None else with_namespace(found, environ, namespace_file)


def with_namespace(
    found: dict[str, str], environ: Mapping[str, str], namespace_file: Path | None = None
) -> dict[str, str]:
    """`found` (read with namespace_file=None) with the pod's namespace from its file
    (SA_NAMESPACE unless given), where it is in a pod and the environment did not say:
    the exporter reads it in its own thread, off the loop's path."""
    if "pod" not in found or "namespace" in found or environ.get("POD_NAMESPACE"):
        return found
    ns = _read(namespace_file or SA_NAMESPACE)
    return found | {"namespace": ns} if ns else found


def _read(path: Path) -> str | None:
    """A small file's text, read as a guest: a regular file only (a FIFO, a device or a
    socket there is left alone, never waited on: opened non-blocking), at most
    NAMESPACE_BYTES, bytes that are not UTF-8 replaced, control characters left out (a
    file of zeros, a sparse one, names no namespace). None where there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, NAMESPACE_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    text = "".join(c for c in data.decode("utf-8", "replace") if c.isprintable())
    return text.strip() or None


def utf8(text: str) -> str:
    """`text` as valid UTF-8: the environment's undecodable bytes (Python keeps them as
    surrogates) replaced, so that a page carrying it can be encoded."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def physical_gpu(index: int, visible: str | None) -> str:
    """The GPU's index as the machine (and DCGM) numbers it, from torch's index among
    CUDA_VISIBLE_DEVICES; torch's own where that list is not one of plain indices."""
    if visible:
        ids = [x.strip() for x in visible.split(",")]
        if index < len(ids) and ids[index].isdigit():
            return ids[index]
    return str(index)


def gpu_labels(environ: Mapping[str, str]) -> dict[str, str]:
    """`gpu` and `UUID` of the device the loop runs on, where torch already uses CUDA;
    nothing otherwise (a CPU loop, or CUDA not initialised: reading would initialise)."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return {}
        index = torch.cuda.current_device()
        out = {"gpu": physical_gpu(index, environ.get("CUDA_VISIBLE_DEVICES"))}
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
        if uuid:
            out["UUID"] = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        return out
    except Exception:  # a broken CUDA set-up: the labels it could not read are left out
        return {}
