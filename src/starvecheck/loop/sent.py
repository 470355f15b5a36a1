"""What a rank sent of its figures (loop/times.py's encoding), read back: each part
checked, anything malformed dropped, never raised (another rank's bytes are data)."""

from __future__ import annotations

from array import array
from typing import Any

from starvecheck.core.units import parse_uint

MACHINE_SENT = 600  # the machine's last readings a rank sends (about ten minutes)


def gpu(gpu: Any, headspace: Any) -> dict[str, Any]:
    """A rank's GPU figures and headspace as sent; anything malformed is dropped."""
    out: dict[str, Any] = {}
    try:
        idle, period, unresolved = gpu
        out["gpu_idle"] = array("d", [float(x) for x in idle])
        out["gpu_period"] = array("d", [float(x) for x in period])
        out["gpu_unresolved"] = int(unresolved)
    except (TypeError, ValueError):
        pass
    if isinstance(headspace, list):
        out["headspace"] = [float(x) for x in headspace if isinstance(x, int | float)]
    return out


def machine(value: Any) -> dict[str, list[float]]:
    """A rank's machine readings as sent; anything malformed is dropped."""
    try:
        others, process = ([float(x) for x in v][-MACHINE_SENT:] for v in value)
    except (TypeError, ValueError):
        return {}
    return {"others_cpus": others, "process_cpus": process}


def digests(value: Any) -> dict[int, list[int]]:
    """A rank's digests as sent: pass -> 64-bit integers; anything else is dropped."""
    if not isinstance(value, dict):
        return {}
    out = {}
    for k, v in list(value.items())[:4]:
        if isinstance(v, list) and (n := parse_uint(str(k))) is not None:
            out[n] = [x for x in v[:4096] if isinstance(x, int)]
    return out
