"""`pcie`: host <-> device bandwidth, pinned against pageable, CPU/copy overlap, the
link under load, and the NUMA penalty.

Run order on a CUDA device (stages/copies.py does the copies):
  1. the size sweep: H2D and D2H, pinned and pageable (and D2H into a fresh pageable
     buffer, as `.to("cpu")` does), each timed by the wall clock around
     `torch.cuda.synchronize()` (the JSON's plain names: what a training loop feels,
     since its thread waits for the CPU staging of pageable memory too) and by CUDA
     events (`.events`: the device's part alone);
  2. the reference: the same pinned H2D copy through the CUDA runtime by ctypes;
  3. the overlap experiment, pageable/pinned x blocking/non_blocking;
  4. the link under load: NVML polled while pinned copies run back to back;
  5. with more than one NUMA node: pinned H2D from a thread bound to the GPU's node
     and to another node.
Without a device, `cpu_side` reports what the host says: memory headroom for
pinned buffers, RLIMIT_MEMLOCK, NUMA nodes, each GPU's link and its theoretical peak.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.pcie import (
    Copy,
    Direction,
    Link,
    Memory,
    Mode,
    Overlap,
    PcieFigures,
)
from starvecheck.core.status import Unavailable
from starvecheck.probe.machine import Machine
from starvecheck.stages.base import BaseStage, Refusal, RunContext
from starvecheck.stages.options import PcieOptions
from starvecheck.stages.pcie import bandwidth as bw
from starvecheck.stages.pcie.host import (
    HostFacts,
    Plan,
    cuda_unavailable,
    host_facts,
    matching_gpu,
    size_plan,
)

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload

__all__ = [
    "STAGE",
    "HostFacts",
    "Plan",
    "cpu_side",
    "cuda_unavailable",
    "host_facts",
    "matching_gpu",
    "run",
    "size_plan",
    "stable_names",
]

Progress = Callable[[str, int, int], None]


def _host_parameters(machine: Machine, facts: HostFacts, sp: bw.SizePlan) -> dict[str, Any]:
    return {
        "host_headroom_bytes": facts.room,
        "host_headroom_source": facts.room_source,
        "pinned_budget_bytes": sp.budget_bytes,
        "memlock_bytes": facts.memlock,
        "memlock_unlimited": facts.memlock_unlimited,
        "numa_nodes": len(machine.numa.node_list) or None,
        "sizes_measured": [bw.size_name(s) for s in sp.sizes],
        "sizes_skipped": {bw.size_name(s): why for s, why in sp.skipped},
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "pci_bus_id": g.pci_bus_id,
                "link_idle": [g.pcie.gen_current, g.pcie.width_current],
                "link_max": [g.pcie.gen_max, g.pcie.width_max],
                "theoretical_gbps_max": g.pcie.theoretical_gbps_max,
                "numa_node": g.numa_node,
            }
            for g in machine.gpus
        ],
    }


def promised(sizes: tuple[int, ...], why: str) -> PcieFigures:
    """Every figure the issue promises scripts, for this plan, missing with `why`: the
    copies by direction, memory and size, the overlap ratios, the link under load and
    its efficiency, then the reference ratio."""
    missing = Figure.missing(why)
    return PcieFigures(
        copies=tuple(Copy(d, mem, s, missing) for d in Direction for mem in Memory for s in sizes),
        reference_ratio=missing,
        overlaps=tuple(Overlap(mem, mode, missing) for mem in Memory for mode in Mode),
        link=Link(gen_under_load=missing, width_under_load=missing, efficiency=missing),
        ratio_last=True,
    )


def stable_names(sizes: tuple[int, ...]) -> list[tuple[str, str]]:
    """(name, unit) of every figure the issue promises scripts, for this plan."""
    return [(m.name, m.unit) for m in promised(sizes, "").to_metrics()]


def cpu_side(
    machine: Machine, *, reason: str | None = None, plan: Plan | None = None
) -> StageResult:
    """The report without a CUDA device: host memory for pinned buffers, memlock,
    NUMA, each GPU's link and theoretical peak; every measured figure missing with
    the reason, so scripts find the names they expect."""
    plan = plan or Plan.default(quick=False)
    facts = host_facts(machine)
    sp = size_plan(plan, facts)
    why = f"not measured: {reason}" if reason else "not measured: no CUDA device"
    figures = promised(plan.sizes, why)
    caveats: list[Caveat | str] = [
        Caveat(
            "pcie.no-cuda",
            "no CUDA device: host-side facts only; the GPU table's max GB/s is the "
            "theoretical peak of each link at its maximum generation and width, per "
            "direction",
        )
    ]
    caveats += list(sp.notes)
    if not machine.real:
        caveats.append(
            Caveat(
                "env.fake-sysroot",
                f"facts read from the fake sysroot {machine.sysroot} (STARVECHECK_SYSROOT), "
                "not from this machine",
            )
        )
    params = {"cuda": False, **plan.parameters(), **_host_parameters(machine, facts, sp)}
    return StageResult(
        stage="pcie",
        parameters=params,
        metrics=figures.to_metrics(),
        caveats=tuple(caveats),
    )


def run(
    plan: Plan,
    machine: Machine,
    progress: Progress,
    warn: Callable[[str], None],
) -> StageResult:
    """Measure on the current CUDA device; Unavailable (exit 3) when there is none."""
    reason = cuda_unavailable()
    if reason is not None:
        raise Unavailable(f"pcie needs a CUDA device: {reason}")
    from starvecheck.stages.pcie.measure import Measurement

    facts = host_facts(machine)
    sp = size_plan(plan, facts)
    m = Measurement(plan, machine, facts, sp, progress, warn)
    try:
        m.run()
    except RuntimeError as e:  # a CUDA error that is no one measurement's
        raise Unavailable(f"CUDA failed during the copies: {' '.join(str(e).split())}") from e
    params = {
        "cuda": True,
        **plan.parameters(),
        **_host_parameters(machine, facts, sp),
        **m.parameters,
    }
    return StageResult(
        stage="pcie",
        parameters=params,
        metrics=m.figures().to_metrics(),
        caveats=tuple(list(sp.notes) + m.caveats),
    )


class PcieStage(BaseStage[PcieOptions, Plan]):
    """`pcie` in the registry (stages/base.Stage)."""

    name = "pcie"

    def unavailable(self) -> str | None:
        return cuda_unavailable()

    def plan(self, options: PcieOptions, ctx: RunContext) -> Plan:
        from dataclasses import replace

        plan = Plan.default(options.quick)
        if options.sizes:
            plan = replace(plan, sizes=options.sizes)
        if options.runs:
            plan = replace(plan, runs=options.runs)
        return plan

    def refusal(self, plan: Plan, ctx: RunContext) -> Refusal | None:
        """No CUDA device, or facts from another machine (STARVECHECK_SYSROOT): the
        host-side report, then exit 3."""
        assert ctx.machine is not None
        reason = self.unavailable()
        message = f"pcie needs a CUDA device: {reason}"
        if reason is None and not ctx.machine.real:
            # Binding to a fake machine's NUMA nodes, or judging this GPU by another's
            # link, would mix two machines in one report.
            reason = f"STARVECHECK_SYSROOT={ctx.machine.sysroot} describes another machine"
            message = f"pcie measures this machine's GPU: {reason}; unset it to measure"
        if reason is None:
            return None
        return Refusal(message, cpu_side(ctx.machine, reason=reason, plan=plan))

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        """pcie's sweep plus the size of one of the workload's batches, so the link's
        capacity is the bandwidth measured at the batch's own size (a 256 KiB copy runs
        at about a quarter of the 1 MiB rate on an H100), not the nearest size swept."""
        from dataclasses import replace

        plan = Plan.default(quick)
        batch_bytes = workload.wire_bytes_per_sample * workload.batch_size
        if batch_bytes <= 0 or batch_bytes in plan.sizes:
            return plan
        return replace(plan, sizes=tuple(sorted({*plan.sizes, batch_bytes})))

    def measure(self, plan: Plan, ctx: RunContext) -> StageResult:
        assert ctx.machine is not None
        return run(plan, ctx.machine, ctx.progress, ctx.warn)


STAGE = PcieStage()
