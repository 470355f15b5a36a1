"""Judging a `pcie` run: is the link as fast as the hardware allows, and is the CPU
free while batches cross it?

Reads the figures as their record (core/schema/pcie.PcieFigures, through
`StageResult.records`): a stored report is judged as a fresh one, and a renamed figure
the same. A finding needs its figures measured: with a figure missing (no GPU, no
NVML) the finding is not made at all.

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

from dataclasses import replace
from typing import TYPE_CHECKING

from starvecheck.core import catalogue
from starvecheck.core.criteria import PARALLEL_AT, SEQUENTIAL_AT, overlap_verdict
from starvecheck.core.model import Finding, Gain, GainKind, Judged, Severity, StageResult
from starvecheck.core.schema.figure import value_of
from starvecheck.core.schema.pcie import (
    Direction,
    Link,
    Memory,
    Mode,
    Numa,
    Parameters,
    PcieFigures,
    Row,
)
from starvecheck.core.schema.pcie_verdicts import OVERLAP_ROWS, PcieVerdicts
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


def _whole(x: float | None) -> int | None:
    return int(x) if x else None


def rules(results: Results) -> list[Finding]:
    r = results.get("pcie")
    return [] if r is None else list(advise(r))


def complete(result: StageResult) -> StageResult:
    """The result as the report carries it: with what its tables show beside the
    figures (`judged`, a PcieVerdicts): the verdict of each overlap ratio (UNKNOWN
    where not measured) and the theoretical peak of the link as read idle, under load
    and at its maximum (GB/s per direction, probe.gpu's table; None unknown)."""
    f = result.records(PcieFigures)
    overlaps = {
        (mem, mode): verdict(value_of(f.overlap(mem, mode).ratio)) for mem, mode in OVERLAP_ROWS
    }
    peaks: dict[Row, float | None] = {}
    for row in Row:
        gen, width = f.link.row(row)
        peaks[row] = link_peak(_whole(value_of(gen)), _whole(value_of(width)))
    return replace(result, judged=Judged.of(PcieVerdicts(overlaps, peaks)))


def advise(result: StageResult) -> tuple[Finding, ...]:
    f, params = result.records(PcieFigures), result.parameters.read(Parameters)
    found = [
        link_below_max(f.link),
        low_efficiency(f.link),
        pageable_d2h(f),
        overlap(f),
        numa_penalty(f.numa, params),
        reference_gap(value_of(f.reference_ratio), params),
    ]
    return tuple(x for x in found if x is not None)


def link_below_max(link: Link) -> Finding | None:
    read = [value_of(x) for x in (*link.row(Row.UNDER_LOAD), *link.row(Row.MAX))]
    if any(x is None for x in read):
        return None
    gen, width, gen_max, width_max = (int(x or 0) for x in read)
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


def low_efficiency(link: Link) -> Finding | None:
    eff, peak = value_of(link.efficiency), value_of(link.theoretical_gbps)
    if eff is None or peak is None:
        return None
    under_load = value_of(link.h2d_under_load)
    measured = eff * peak if under_load is None else under_load
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


def _wall(f: PcieFigures, memory: Memory, size: int, fresh: bool = False) -> float | None:
    """torch's D2H copy of this memory and size by the wall clock (GB/s)."""
    copy = f.copy(Direction.D2H, memory, size, fresh)
    return None if copy is None else value_of(copy.wall)


def pageable_d2h(f: PcieFigures) -> Finding | None:
    """At the largest size measured both pinned and pageable."""
    both = set(f.sizes(Direction.D2H, Memory.PINNED)) & set(f.sizes(Direction.D2H, Memory.PAGEABLE))
    if not both:
        return None
    largest = max(both)
    size = size_name(largest)
    pinned = _wall(f, Memory.PINNED, largest) or 0.0
    plain = _wall(f, Memory.PAGEABLE, largest) or 0.0
    fresh = _wall(f, Memory.PAGEABLE, largest, fresh=True)
    pageable = min(plain, fresh if fresh is not None else float("inf"))
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
        evidence=f"{size}: pinned {pinned:.1f} GB/s, pageable {plain:.1f} GB/s"
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


def overlap(f: PcieFigures) -> Finding | None:
    ratios = {(mem, mode): value_of(f.overlap(mem, mode).ratio) for mem in Memory for mode in Mode}
    best = ratios[(Memory.PINNED, Mode.NON_BLOCKING)]
    if best is None:
        return None
    table = ", ".join(
        f"{mem} {mode} {verdict(r)}" + (f" {r:.0%}" if r is not None else "")
        for (mem, mode), r in ratios.items()
    )
    line = (
        "DataLoader(..., pin_memory=True) and batch.to(device, non_blocking=True), with "
        "nothing that synchronizes (.item(), .cpu(), print of a tensor) before the step "
        "needs the batch"
    )
    others = [r for k, r in ratios.items() if k != (Memory.PINNED, Mode.NON_BLOCKING)]
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
            gain=_overlap_gain(f),
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
        gain=_overlap_gain(f),
        stage="pcie",
    )


def _overlap_gain(f: PcieFigures) -> Gain | None:
    slow = value_of(f.overlap(Memory.PAGEABLE, Mode.BLOCKING).both_ms)
    fast = value_of(f.overlap(Memory.PINNED, Mode.NON_BLOCKING).both_ms)
    if slow is None or fast is None or slow <= 0 or fast >= slow:
        return None
    return Gain(
        GainKind.STEP_SHARE,
        round((slow - fast) / slow, 4),
        "copy plus CPU work, pageable blocking against pinned non_blocking, measured here",
    )


def numa_penalty(numa: Numa, params: Parameters) -> Finding | None:
    penalty = value_of(numa.remote_penalty)
    if penalty is None:
        return None
    local, remote = params.numa_local_node, params.numa_remote_node
    if penalty < NUMA_PENALTY:
        return Finding(
            catalogue.PCIE_NUMA_REMOTE,
            Severity.OK,
            f"a copying thread on NUMA node {remote} loses {penalty:.0%} against node {local}",
            stage="pcie",
        )
    lg, rg = value_of(numa.local), value_of(numa.remote)
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


def reference_gap(ratio: float | None, params: Parameters) -> Finding | None:
    if ratio is None:
        return None
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
