"""Judging a `pcie` run: is the link as fast as the hardware allows, and is the CPU
free while batches cross it?

Reads metrics by their labels (direction, memory, size, clock, source, mode, ...),
so a stored report is judged as a fresh one and a renamed figure is judged the same.
A finding needs its figures measured: with a metric missing (no GPU, no NVML) the
finding is not made at all.

Thresholds:
  link below max       generation or width under load below what GPU and slot support
  low efficiency       measured H2D under load below 60% of the negotiated link's
                       theoretical peak (healthy links reach 75-90%: an H100 on PCIe 5.0
                       x16, 52-57 of 63 GB/s)
  pageable D2H         pageable D2H at the largest size below half of pinned D2H
  overlap              PARALLEL at a ratio of 0.8 or more, SEQUENTIAL at 0.2 or less
  NUMA                 a thread on another node loses 20% or more of pinned H2D
  reference            torch's pinned H2D more than 10% below the CUDA runtime's
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starvecheck.core import catalogue
from starvecheck.core.criteria import PARALLEL_AT, SEQUENTIAL_AT, overlap_verdict
from starvecheck.core.metric import Labels
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.schema.common import CLOCK_WALL, GBPS, SOURCE_CUDART, SOURCE_TORCH
from starvecheck.core.schema.pcie import Parameters
from starvecheck.core.units import size_name
from starvecheck.probe.gpu import theoretical_gbps as link_peak

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

verdict = overlap_verdict

LOW_EFFICIENCY = 0.6
PAGEABLE_D2H_COLLAPSE = 0.5
NUMA_PENALTY = 0.2
REFERENCE_GAP = 0.9
# What a healthy link delivers of its theoretical peak, for the gain estimate.
HEALTHY_EFFICIENCY = 0.8


def key(labels: Labels) -> str:
    """A figure's key in the table below, made from its labels (`h2d.pinned.256MiB`,
    `overlap.pinned.blocking.both_ms`, `link.efficiency`, ...)."""
    q = str(labels.get("quantity", ""))
    group = labels.get("group")
    if group == "link":
        return f"link.{q}"
    if group == "numa":
        if q == "remote_penalty":
            return "numa.remote_penalty"
        return f"numa.{labels['direction']}.{labels['memory']}.{labels['node']}"
    if q == "gbps":
        prefix = "reference." if labels.get("source") == SOURCE_CUDART else ""
        base = f"{prefix}{labels['direction']}.{labels['memory']}.{size_name(int(labels['size']))}"
        base += ".fresh" if labels.get("variant") == "fresh" else ""
        return base + (".events" if labels.get("clock") == "events" else "")
    if q.startswith("overlap"):
        part = q[len("overlap") :].lstrip("_")
        return f"overlap.{labels['memory']}.{labels['mode']}" + (f".{part}" if part else "")
    return q


def _values(result: StageResult) -> dict[str, float]:
    return {key(m.labels): m.value for m in result.metrics if m.value is not None}


def _sizes(result: StageResult, direction: str, memory: str) -> list[int]:
    """Sizes with a wall-clock torch figure for this direction and memory."""
    return [
        int(m.labels["size"])
        for m in result.select(
            quantity=GBPS, direction=direction, memory=memory, clock=CLOCK_WALL, source=SOURCE_TORCH
        )
        if m.value is not None and "variant" not in m.labels and "group" not in m.labels
    ]


def rules(results: Results) -> list[Finding]:
    r = results.get("pcie")
    return [] if r is None else list(advise(r))


# The overlap table's rows and the link table's, as render/pcie shows them.
OVERLAP_ROWS = tuple(
    (mem, mode) for mem in ("pageable", "pinned") for mode in ("blocking", "non_blocking")
)
LINK_ROWS = {
    "idle": ("link.gen_idle", "link.width_idle"),
    "under_load": ("link.gen_under_load", "link.width_under_load"),
    "max": ("link.gen_max", "link.width_max"),
}


def complete(result: StageResult) -> StageResult:
    """The result as the report carries it: with what its tables show beside the
    figures (`judged.verdicts`): the verdict of each overlap ratio
    (`overlap_verdict.<memory>.<mode>`, UNKNOWN where not measured) and the
    theoretical peak of the link as read idle, under load and at its maximum
    (`link_peak_gbps.<row>`, GB/s per direction, probe.gpu's table; None unknown)."""
    v = _values(result)
    judged: dict[str, Any] = {
        f"overlap_verdict.{mem}.{mode}": verdict(v.get(f"overlap.{mem}.{mode}"))
        for mem, mode in OVERLAP_ROWS
    }
    for row, (gen, width) in LINK_ROWS.items():
        g, w = v.get(gen), v.get(width)
        judged[f"link_peak_gbps.{row}"] = link_peak(int(g) if g else None, int(w) if w else None)
    return replace(result, judged=Judged(verdicts=judged))


def advise(result: StageResult) -> tuple[Finding, ...]:
    v, params = _values(result), result.parameters.read(Parameters)
    found = [
        link_below_max(v),
        low_efficiency(v),
        pageable_d2h(v, result),
        overlap(v),
        numa_penalty(v, params),
        reference_gap(v, params),
    ]
    return tuple(f for f in found if f is not None)


def link_below_max(v: Mapping[str, float]) -> Finding | None:
    keys = ("link.gen_under_load", "link.width_under_load", "link.gen_max", "link.width_max")
    if not all(k in v for k in keys):
        return None
    gen, width, gen_max, width_max = (int(v[k]) for k in keys)
    now = f"gen{gen} x{width}"
    best = f"gen{gen_max} x{width_max}"
    if gen >= gen_max and width >= width_max:
        return Finding(
            catalogue.PCIE_LINK_BELOW_MAX,
            Severity.OK,
            f"under load the link runs at its maximum ({now})",
            stage="pcie",
        )
    peak_now, peak_max = link_peak(gen, width), link_peak(gen_max, width_max)
    gain = (
        Gain(GainKind.THROUGHPUT, round(peak_max / peak_now, 2), "theoretical peaks of the links")
        if peak_now and peak_max
        else None
    )
    return Finding(
        catalogue.PCIE_LINK_BELOW_MAX,
        Severity.WARNING,
        f"under load the PCIe link runs at {now}, below its maximum {best}",
        evidence=f"NVML read gen{gen} x{width} while pinned copies ran back to back; GPU and "
        f"slot support {best}"
        + (f" ({peak_now:.1f} against {peak_max:.1f} GB/s per direction)" if gain else ""),
        recommendation="Reseat the card, or move it to a slot wired for the full width; check "
        "the BIOS PCIe link speed setting (Auto or the highest generation), risers and "
        "retimers; `nvidia-smi -q -d PCIE` while a job runs should show the maximum.",
        gain=gain,
        stage="pcie",
    )


def low_efficiency(v: Mapping[str, float]) -> Finding | None:
    if "link.efficiency" not in v or "link.theoretical_gbps" not in v:
        return None
    eff, peak = v["link.efficiency"], v["link.theoretical_gbps"]
    measured = v.get("link.h2d_under_load", eff * peak)
    if eff >= LOW_EFFICIENCY:
        return Finding(
            catalogue.PCIE_LOW_EFFICIENCY,
            Severity.OK,
            f"pinned H2D reaches {eff:.0%} of the link's theoretical peak",
            stage="pcie",
        )
    return Finding(
        catalogue.PCIE_LOW_EFFICIENCY,
        Severity.WARNING,
        f"pinned host-to-device copies reach only {eff:.0%} of the link's theoretical peak",
        evidence=f"{measured:.1f} GB/s measured under load against {peak:.1f} GB/s for the "
        f"negotiated link; healthy links reach 75-90%",
        recommendation="Check the IOMMU (boot with iommu=pt, or intel_iommu=off where policy "
        "allows), PCIe ACS on the switch above the GPU (it routes peer traffic through the "
        "root complex), and NUMA placement: run the copying process on the GPU's node "
        "(`numactl --cpunodebind=N --membind=N`).",
        gain=Gain(
            GainKind.THROUGHPUT,
            round(HEALTHY_EFFICIENCY / eff, 2) if eff > 0 else None,
            f"to {HEALTHY_EFFICIENCY:.0%} of the theoretical peak, what healthy links reach",
        ),
        stage="pcie",
    )


def _largest(result: StageResult, direction: str) -> str | None:
    """The largest size measured both pinned and pageable, as its name (`1GiB`)."""
    both = set(_sizes(result, direction, "pinned")) & set(_sizes(result, direction, "pageable"))
    return size_name(max(both)) if both else None


def pageable_d2h(v: Mapping[str, float], result: StageResult) -> Finding | None:
    size = _largest(result, "d2h")
    if size is None:
        return None
    pinned = v[f"d2h.pinned.{size}"]
    fresh = v.get(f"d2h.pageable.{size}.fresh")
    pageable = min(v[f"d2h.pageable.{size}"], fresh if fresh is not None else float("inf"))
    share = pageable / pinned if pinned > 0 else 1.0
    if share >= PAGEABLE_D2H_COLLAPSE:
        return Finding(
            catalogue.PCIE_PAGEABLE_D2H,
            Severity.OK,
            f"pageable device-to-host copies keep {share:.0%} of pinned speed at {size}",
            stage="pcie",
        )
    return Finding(
        catalogue.PCIE_PAGEABLE_D2H,
        Severity.WARNING,
        f"device-to-host copies into pageable memory collapse to {pageable:.1f} GB/s at {size}",
        evidence=f"{size}: pinned {pinned:.1f} GB/s, pageable {v[f'd2h.pageable.{size}']:.1f} "
        "GB/s"
        + (f", into a fresh buffer as .to('cpu') does {fresh:.1f} GB/s" if fresh else "")
        + f" ({share:.0%} of pinned)",
        recommendation="Copy checkpoints, activations and optimizer state offloaded to the host "
        "into pinned buffers allocated once: `buf = torch.empty(shape, dtype=..., "
        "pin_memory=True)` then `buf.copy_(t, non_blocking=True)` and one synchronize, instead "
        "of `t.cpu()` per tensor.",
        gain=Gain(
            GainKind.THROUGHPUT,
            round(pinned / pageable, 2) if pageable > 0 else None,
            "D2H copies, pinned over pageable, measured here",
        ),
        stage="pcie",
    )


def overlap(v: Mapping[str, float]) -> Finding | None:
    keys = {
        (mem, mode): f"overlap.{mem}.{mode}"
        for mem in ("pinned", "pageable")
        for mode in ("blocking", "non_blocking")
    }
    if keys[("pinned", "non_blocking")] not in v:
        return None
    ratios = {k: v.get(name) for k, name in keys.items()}
    best = ratios[("pinned", "non_blocking")]
    table = ", ".join(
        f"{mem} {mode} {verdict(r)}" + (f" {r:.0%}" if r is not None else "")
        for (mem, mode), r in ratios.items()
    )
    line = (
        "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True), with "
        "nothing that synchronizes (.item(), .cpu(), print of a tensor) before the step "
        "needs the batch"
    )
    others = [r for k, r in ratios.items() if k != ("pinned", "non_blocking")]
    if (
        best is not None
        and best >= PARALLEL_AT
        and all(r is not None and r >= PARALLEL_AT for r in others)
    ):
        return Finding(
            catalogue.PCIE_OVERLAP,
            Severity.OK,
            "every combination overlaps CPU work with the copy",
            evidence=table,
            stage="pcie",
        )
    if best is not None and best >= PARALLEL_AT:
        known = all(r is not None for r in others)
        return Finding(
            catalogue.PCIE_OVERLAP,
            Severity.WARNING if known else Severity.INFO,
            (
                "only pinned memory with non_blocking=True"
                if known
                else "pinned memory with non_blocking=True"
            )
            + " lets the CPU work while a batch crosses the bus",
            evidence=table,
            recommendation=f"Use {line}; a pageable or blocking copy holds the Python thread "
            "for the whole transfer.",
            gain=_overlap_gain(v),
            stage="pcie",
        )
    if best is not None and best > SEQUENTIAL_AT:
        sev, title = (
            Severity.WARNING,
            "even pinned non_blocking copies overlap CPU work only partly",
        )
    else:
        sev, title = Severity.WARNING, "no combination overlaps CPU work with the copy"
    return Finding(
        catalogue.PCIE_OVERLAP,
        sev,
        title,
        evidence=table,
        recommendation=f"Use {line}. If pinned non_blocking still waits, the CPU side is the "
        "limit: another thread holding the GIL, or CPUs shared with DataLoader workers "
        "(`starvecheck env`: effective CPUs, throttling).",
        gain=_overlap_gain(v),
        stage="pcie",
    )


def _overlap_gain(v: Mapping[str, float]) -> Gain | None:
    slow = v.get("overlap.pageable.blocking.both_ms")
    fast = v.get("overlap.pinned.non_blocking.both_ms")
    if slow is None or fast is None or slow <= 0 or fast >= slow:
        return None
    return Gain(
        GainKind.STEP_SHARE,
        round((slow - fast) / slow, 4),
        "copy plus CPU work, pageable blocking against pinned non_blocking, measured here",
    )


def numa_penalty(v: Mapping[str, float], params: Parameters) -> Finding | None:
    if "numa.remote_penalty" not in v:
        return None
    penalty = v["numa.remote_penalty"]
    local, remote = params.numa_local_node, params.numa_remote_node
    if penalty < NUMA_PENALTY:
        return Finding(
            catalogue.PCIE_NUMA_REMOTE,
            Severity.OK,
            f"a copying thread on NUMA node {remote} loses {penalty:.0%} against node {local}",
            stage="pcie",
        )
    lg, rg = v.get("numa.h2d.pinned.local"), v.get("numa.h2d.pinned.remote")
    return Finding(
        catalogue.PCIE_NUMA_REMOTE,
        Severity.WARNING,
        f"copies from NUMA node {remote} lose {penalty:.0%} of the bandwidth of node {local}, "
        "the GPU's",
        evidence=f"pinned H2D with the thread and its buffer on node {local}: "
        f"{lg:.1f} GB/s; on node {remote}: {rg:.1f} GB/s"
        if lg is not None and rg is not None
        else f"penalty {penalty:.0%}",
        recommendation=f"Run each GPU's process on the GPU's node: `numactl --cpunodebind={local} "
        f"--membind={local} python train.py` (one process per GPU), or set the DataLoader "
        "workers' affinity to that node's CPUs (`os.sched_setaffinity` in worker_init_fn).",
        gain=Gain(
            GainKind.THROUGHPUT,
            round(lg / rg, 2) if lg and rg else None,
            "pinned H2D, local node over remote, measured here",
        ),
        stage="pcie",
    )


def reference_gap(v: Mapping[str, float], params: Parameters) -> Finding | None:
    if "reference_ratio" not in v:
        return None
    ratio = v["reference_ratio"]
    size = params.reference_size or "256MiB"
    if ratio >= REFERENCE_GAP:
        return Finding(
            catalogue.PCIE_REFERENCE,
            Severity.OK,
            f"torch's pinned H2D at {size} runs at {ratio:.0%} of the CUDA runtime's",
            stage="pcie",
        )
    return Finding(
        catalogue.PCIE_REFERENCE,
        Severity.INFO,
        f"torch's pinned H2D at {size} runs at {ratio:.0%} of a plain cudaMemcpy",
        evidence=f"reference_ratio {ratio:.2f} (medians of the wall clock, same size, same "
        "device, same run)",
        recommendation="Nothing to change in your code; rerun to see whether it holds. A "
        "steady gap points at torch's copy path (its pinned-memory allocator, a device "
        "synchronize) rather than at the link.",
        stage="pcie",
    )
