"""The measuring half of `pcie` on a CUDA device: each step fills its part of the
figures (core/schema/pcie.py's records), or the same figures missing with the reason,
so one failed step never hides the others. Called only by stages/pcie.run once a
device is known to be there."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.pcie import (
    Copy,
    Direction,
    Link,
    Memory,
    Mode,
    Numa,
    Overlap,
    PcieFigures,
    Source,
)
from starvecheck.core.signals import importing
from starvecheck.stages.pcie import bandwidth as bw
from starvecheck.stages.pcie import copies
from starvecheck.stages.pcie.bandwidth import size_name
from starvecheck.stages.timing import stability_warnings

if TYPE_CHECKING:
    from starvecheck.probe.machine import Machine
    from starvecheck.stages.pcie.host import HostFacts, Plan


# copies.sweep_size's keys: each copy of the sweep, and the D2H copy into a fresh buffer.
SWEPT = (
    ("h2d.pinned", Direction.H2D, Memory.PINNED),
    ("h2d.pageable", Direction.H2D, Memory.PAGEABLE),
    ("d2h.pinned", Direction.D2H, Memory.PINNED),
    ("d2h.pageable", Direction.D2H, Memory.PAGEABLE),
)
FRESH_KEY = "d2h.pageable.fresh"


class Measurement:
    """One run's steps in order; the figures (`figures()`), `caveats` and `parameters`
    fill as they go."""

    def __init__(
        self,
        plan: Plan,
        machine: Machine,
        facts: HostFacts,
        sizes: bw.SizePlan,
        progress: Callable[[str, int, int], None],
        warn: Callable[[str], None],
    ) -> None:
        self.plan, self.machine, self.facts, self.sp = plan, machine, facts, sizes
        self.progress, self.warn = progress, warn
        self.copies: list[Copy] = []
        self.ratio: Figure | None = None
        self.overlaps: list[Overlap] = []
        self.link_figures: dict[str, Figure] = {}  # by core/schema/pcie.Link's fields
        self.numa_figures: dict[str, Figure] = {}  # by core/schema/pcie.Numa's fields
        self.caveats: list[str] = []
        self.parameters: dict[str, Any] = {}
        self.steps = len(sizes.sizes) + 4 + 1 + 1 + (2 if len(facts.nodes) > 1 else 0)
        self.done = 0
        self.unstable: list[str] = []

    def figures(self) -> PcieFigures:
        """What the steps measured, as the report carries it."""
        return PcieFigures(
            tuple(self.copies),
            self.ratio,
            tuple(self.overlaps),
            Link(**self.link_figures),
            Numa(**self.numa_figures),
        )

    def _step(self, what: str) -> None:
        self.progress(what, self.done, self.steps)
        self.done += 1

    def run(self) -> None:
        with importing("torch"):
            import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        props = torch.cuda.get_device_properties(self.device)
        self.parameters.update(
            device=str(self.device),
            device_name=props.name,
            torch=torch.__version__,
            torch_cuda=torch.version.cuda,
        )
        self.sweep()
        if self.unstable:
            self.caveats.append(
                "runs vary by 10% or more of the median (stdev/median), or hold outliers: "
                + ", ".join(self.unstable)
                + "; other work on this GPU or CPU, or a link changing speed: close it and "
                "add --runs"
            )
        ref = bw.reference_size(self.sp.sizes)
        self.parameters["reference_size"] = size_name(ref) if ref else None
        self.reference(ref)
        big = bw.overlap_size(self.sp.budget_bytes)
        self.overlap(big)
        self.link(max([*self.sp.sizes, big]) if big else None, props)
        self.numa(big)
        self.progress("done", self.steps, self.steps)

    # 1. the size sweep
    def sweep(self) -> None:
        for size, why in self.sp.skipped:
            for _, d, mem in SWEPT:
                self.copies.append(Copy(d, mem, size, Figure.missing(f"skipped: {why}")))
        for size in self.sp.sizes:
            name = size_name(size)
            self._step(f"copies of {name}")
            warmup, runs = bw.runs_for(size, self.plan.runs, self.plan.warmup)
            try:
                timings, pinned_error = copies.sweep_size(
                    self.torch, size, self.device, warmup, runs
                )
            except copies.Failed as e:
                timings, pinned_error = {}, str(e)
                self.caveats.append(f"{name}: {e}")
            kinds = {key: Copy(d, mem, size) for key, d, mem in SWEPT}
            kinds[FRESH_KEY] = Copy(Direction.D2H, Memory.PAGEABLE, size, fresh=True)
            for key, _, _ in SWEPT:
                t = timings.get(key)
                if t is None:
                    gone = Figure.missing(pinned_error or "not measured")
                    self.copies.append(replace(kinds[key], wall=gone))
                    continue
                wall, events = Figure.repeated(t.wall_gbps), Figure.repeated(t.event_gbps)
                self.copies.append(replace(kinds[key], wall=wall, events=events))
            for key, t in timings.items():
                if t.wall_gbps and stability_warnings(t.wall_gbps):
                    spread = statistics.stdev(t.wall_gbps) / statistics.median(t.wall_gbps)
                    self.unstable.append(f"{kinds[key].name()} {spread:.0%}")
            fresh = timings.get(FRESH_KEY)
            if fresh is not None:
                self.copies.append(replace(kinds[FRESH_KEY], wall=Figure.repeated(fresh.wall_gbps)))

    # 2. the CUDA runtime reference
    def reference(self, size: int | None) -> None:
        from starvecheck.stages.pcie import cudart

        self._step("CUDA runtime reference")
        if size is None:
            self.ratio = Figure.missing("no size measured")
            return
        index = self.device.index or 0
        made = Copy(Direction.H2D, Memory.PINNED, size, source=Source.CUDART)
        try:
            wall, events, path = cudart.reference_h2d(index, size, self.plan.warmup, self.plan.runs)
        except cudart.CudartUnavailable as e:
            self.copies.append(
                replace(made, wall=Figure.missing(str(e)), events=Figure.missing(str(e)))
            )
            self.ratio = Figure.missing(str(e))
            return
        self.parameters["cudart"] = path
        ref = Figure.repeated(wall)
        self.copies.append(replace(made, wall=ref, events=Figure.repeated(events)))
        copy = PcieFigures(tuple(self.copies)).copy(Direction.H2D, Memory.PINNED, size)
        ours = copy.wall if copy is not None else None
        if ours is None or ours.value is None or not ref.value:
            why = ours.reason if ours is not None and ours.reason else "no pinned H2D figure"
            self.ratio = Figure.missing(why)
        else:
            self.ratio = Figure.single(ours.value / ref.value)

    # 3. CPU work against the copy
    def overlap(self, size: int | None) -> None:
        if size is not None:
            self.parameters["overlap_size"] = size_name(size)
        for mem in (Memory.PAGEABLE, Memory.PINNED):
            for mode in (Mode.BLOCKING, Mode.NON_BLOCKING):
                self._step(f"overlap, {mem}, {mode}")
                if size is None:
                    why = "host memory too short for 1 MiB buffers"
                    self.overlaps.append(Overlap(mem, mode, Figure.missing(why)))
                    continue
                try:
                    med, cpu_s, copy_s, both_s = copies.overlap(
                        self.torch,
                        size,
                        self.device,
                        mem is Memory.PINNED,
                        mode is Mode.NON_BLOCKING,
                        self.plan.warmup,
                        self.plan.runs,
                    )
                except copies.Failed as e:
                    self.overlaps.append(Overlap(mem, mode, Figure.missing(str(e))))
                    continue
                # The median of each round's own ratio: the rounds interleave the copy,
                # the CPU work and both, so a round's three figures share its conditions.
                rounds = [
                    r
                    for r in (
                        bw.Overlap(c, p, t).ratio
                        for c, p, t in zip(cpu_s, copy_s, both_s, strict=True)
                    )
                    if r is not None
                ]
                ratio = statistics.median(rounds) if rounds else med.ratio
                why = "the copy and the CPU work differ too much in length to tell"
                ms = [Figure.repeated([v * 1e3 for v in s]) for s in (cpu_s, copy_s, both_s)]
                figure = Figure.maybe(None if ratio is None else round(ratio, 4), why)
                self.overlaps.append(Overlap(mem, mode, figure, *ms))

    # 4. the link under load
    def link(self, size: int | None, props: Any) -> None:

        self._step("the link under load")

        def missing(why: str) -> None:
            for name in ("gen_under_load", "width_under_load", "efficiency"):
                self.link_figures[name] = Figure.missing(why)

        if size is None:
            missing("host memory too short for 1 MiB buffers")
            return
        self.parameters["load_size"] = size_name(size)
        from starvecheck.probe import nvml

        try:
            with nvml.session() as pynvml:
                found = self._load(pynvml, size, props, missing)
        except nvml.NvmlUnavailable as e:
            missing(f"NVML unavailable: {e}")
            return
        if found is None:
            return
        load, gen_max, width_max, measured = found
        self.parameters["link_samples"] = load.samples
        self.parameters["link_gens_seen"] = list(load.gens_seen)
        self.parameters["link_widths_seen"] = list(load.widths_seen)
        if load.errors:
            self.parameters["link_errors"] = load.errors
        why = "; ".join(f"{k}: {v}" for k, v in load.errors.items()) or "no sample"
        peak = bw.link_peak(load.gen, load.width)
        self.link_figures |= {
            "gen_under_load": Figure.maybe(load.gen, why),
            "width_under_load": Figure.maybe(load.width, why),
            "gen_max": Figure.maybe(gen_max, "NVML did not report it"),
            "width_max": Figure.maybe(width_max, "NVML did not report it"),
            "theoretical_gbps": Figure.maybe(peak, "link under load unknown"),
            "theoretical_gbps_max": Figure.maybe(bw.link_peak(gen_max, width_max), "max unknown"),
            "h2d_under_load": Figure.single(measured),
            "efficiency": Figure.maybe(bw.efficiency(measured, peak), "link under load unknown"),
            "nvml_rx_gbps": Figure.maybe(load.rx_gbps, why),
            "nvml_tx_gbps": Figure.maybe(load.tx_gbps, why),
        }

    def _load(
        self, pynvml: Any, size: int, props: Any, missing: Callable[[str], None]
    ) -> tuple[Any, int | None, int | None, float] | None:
        """Pinned copies back to back while NVML samples the link; None (and the
        figures missing with the reason) when the GPU or the copies fail."""
        from starvecheck.stages.pcie.host import matching_gpu
        from starvecheck.stages.pcie.linkwatch import LinkWatch, bus_id, max_link, open_device

        nvml_index = None
        get_index = getattr(self.torch.cuda, "_get_nvml_device_index", None)
        with contextlib.suppress(Exception):
            nvml_index = get_index(self.device) if get_index else self.device.index
        try:
            handle = open_device(pynvml, str(getattr(props, "uuid", "") or ""), nvml_index)
        except Exception as e:
            missing(f"NVML could not find this GPU: {e}")
            return None
        bus = bus_id(pynvml, handle)
        gpu = matching_gpu(self.machine, bus)
        self.parameters["pci_bus_id"] = bus
        self.parameters["gpu_numa_node"] = gpu.numa_node if gpu else None
        gen_max, width_max = max_link(pynvml, handle)
        if gpu is not None:
            self.link_figures["gen_idle"] = Figure.maybe(gpu.pcie.gen_current, "unknown")
            self.link_figures["width_idle"] = Figure.maybe(gpu.pcie.width_current, "unknown")
        watch = LinkWatch(pynvml, handle)
        try:
            measured = copies.under_load(self.torch, size, self.device, self.plan.load_s, watch)
        except copies.Failed as e:
            missing(str(e))
            return None
        return watch.result(), gen_max, width_max, measured

    # 5. NUMA
    def numa(self, size: int | None) -> None:
        nodes = self.facts.nodes
        if len(nodes) < 2:
            self.caveats.append(
                "one NUMA node with CPUs: no remote node to compare"
                if nodes
                else "NUMA topology unknown: no remote node to compare"
            )
            return
        local = self.parameters.get("gpu_numa_node")
        if local is None and len(self.machine.gpus) == 1:
            # NVML could not name the GPU; with one GPU on the machine it is that one.
            local = self.machine.gpus[0].numa_node
            self.parameters["gpu_numa_node"] = local
        if local is None or local not in nodes:
            unknown = Figure.missing("the GPU's NUMA node is unknown")
            self.numa_figures |= {"local": unknown, "remote": unknown}
            return
        remote = bw.other_node(nodes, local)
        self.parameters["numa_local_node"] = local
        self.parameters["numa_remote_node"] = remote
        results: dict[str, Figure] = {}
        for where, node in (("local", local), ("remote", remote)):
            self._step(f"pinned H2D from NUMA node {node}")
            if size is None or node is None:
                results[where] = Figure.missing("nothing to measure")
                continue
            try:
                values = copies.numa_h2d(
                    self.torch, size, self.device, nodes[node], self.plan.warmup, self.plan.runs
                )
                results[where] = Figure.repeated(values)
            except copies.Failed as e:
                results[where] = Figure.missing(str(e))
        penalty = bw.remote_penalty(results["local"].value, results["remote"].value)
        results["remote_penalty"] = Figure.maybe(penalty, "a figure is missing")
        self.numa_figures |= results
