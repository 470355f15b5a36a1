"""The measuring half of `pcie` on a CUDA device: each step appends its metrics, or
the same names missing with the reason, so one failed step never hides the others.
Called only by stages/pcie.run once a device is known to be there."""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Metric
from starvecheck.core.signals import importing
from starvecheck.stages.pcie import bandwidth as bw
from starvecheck.stages.pcie import copies
from starvecheck.stages.pcie.bandwidth import size_name
from starvecheck.stages.timing import stability_warnings

if TYPE_CHECKING:
    from starvecheck.probe.machine import Machine
    from starvecheck.stages.pcie.host import HostFacts, Plan


def metric_name(key: str, size: str) -> str:
    """ "h2d.pinned", "1MiB" -> "h2d.pinned.1MiB"; "d2h.pageable.fresh" ->
    "d2h.pageable.1MiB.fresh" (the size before the variant, as the JSON names it)."""
    direction, memory, *variant = key.split(".")
    return ".".join([direction, memory, size, *variant])


class Measurement:
    """One run's steps in order; `metrics`, `caveats` and `parameters` fill as they go."""

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
        self.metrics: list[Metric] = []
        self.caveats: list[str] = []
        self.parameters: dict[str, Any] = {}
        self.steps = len(sizes.sizes) + 4 + 1 + 1 + (2 if len(facts.nodes) > 1 else 0)
        self.done = 0
        self.unstable: list[str] = []

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
            for d in ("h2d", "d2h"):
                for mem in ("pinned", "pageable"):
                    self.metrics.append(
                        Metric.missing(f"{d}.{mem}.{size_name(size)}", "GB/s", f"skipped: {why}")
                    )
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
            for key in ("h2d.pinned", "h2d.pageable", "d2h.pinned", "d2h.pageable"):
                t = timings.get(key)
                full = f"{key}.{name}"
                if t is None:
                    reason = pinned_error or "not measured"
                    self.metrics.append(Metric.missing(full, "GB/s", reason))
                    continue
                self.metrics.append(Metric.repeated(full, t.wall_gbps, "GB/s"))
                self.metrics.append(Metric.repeated(f"{full}.events", t.event_gbps, "GB/s"))
            for key, t in timings.items():
                if t.wall_gbps and stability_warnings(t.wall_gbps):
                    spread = statistics.stdev(t.wall_gbps) / statistics.median(t.wall_gbps)
                    self.unstable.append(f"{metric_name(key, name)} {spread:.0%}")
            fresh = timings.get("d2h.pageable.fresh")
            if fresh is not None:
                self.metrics.append(
                    Metric.repeated(
                        metric_name("d2h.pageable.fresh", name), fresh.wall_gbps, "GB/s"
                    )
                )

    # 2. the CUDA runtime reference
    def reference(self, size: int | None) -> None:
        from starvecheck.stages.pcie import cudart

        self._step("CUDA runtime reference")
        if size is None:
            self.metrics.append(Metric.missing("reference_ratio", "ratio", "no size measured"))
            return
        name = size_name(size)
        index = self.device.index or 0
        try:
            wall, events, path = cudart.reference_h2d(index, size, self.plan.warmup, self.plan.runs)
        except cudart.CudartUnavailable as e:
            for suffix in ("", ".events"):
                self.metrics.append(
                    Metric.missing(f"reference.h2d.pinned.{name}{suffix}", "GB/s", str(e))
                )
            self.metrics.append(Metric.missing("reference_ratio", "ratio", str(e)))
            return
        self.parameters["cudart"] = path
        ref = Metric.repeated(f"reference.h2d.pinned.{name}", wall, "GB/s")
        self.metrics += [
            ref,
            Metric.repeated(f"reference.h2d.pinned.{name}.events", events, "GB/s"),
        ]
        ours = next((m for m in self.metrics if m.name == f"h2d.pinned.{name}"), None)
        if ours is None or ours.value is None or not ref.value:
            why = ours.reason if ours is not None and ours.reason else "no pinned H2D figure"
            self.metrics.append(Metric.missing("reference_ratio", "ratio", why))
        else:
            self.metrics.append(Metric.single("reference_ratio", ours.value / ref.value, "ratio"))

    # 3. CPU work against the copy
    def overlap(self, size: int | None) -> None:
        if size is not None:
            self.parameters["overlap_size"] = size_name(size)
        for mem in ("pageable", "pinned"):
            for mode in ("blocking", "non_blocking"):
                key = f"overlap.{mem}.{mode}"
                self._step(f"overlap, {mem}, {mode}")
                if size is None:
                    why = "host memory too short for 1 MiB buffers"
                    self.metrics.append(Metric.missing(key, "fraction", why))
                    continue
                try:
                    med, cpu_s, copy_s, both_s = copies.overlap(
                        self.torch,
                        size,
                        self.device,
                        mem == "pinned",
                        mode == "non_blocking",
                        self.plan.warmup,
                        self.plan.runs,
                    )
                except copies.Failed as e:
                    self.metrics.append(Metric.missing(key, "fraction", str(e)))
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
                if ratio is None:
                    self.metrics.append(
                        Metric.missing(
                            key,
                            "fraction",
                            "the copy and the CPU work differ too much in length to tell",
                        )
                    )
                else:
                    self.metrics.append(Metric.single(key, round(ratio, 4), "fraction"))
                for part, values in (("cpu_ms", cpu_s), ("copy_ms", copy_s), ("both_ms", both_s)):
                    self.metrics.append(
                        Metric.repeated(f"{key}.{part}", [v * 1e3 for v in values], "ms")
                    )

    # 4. the link under load
    def link(self, size: int | None, props: Any) -> None:

        self._step("the link under load")
        names = (
            ("link.gen_under_load", "gen"),
            ("link.width_under_load", "lanes"),
            ("link.efficiency", "fraction"),
        )

        def missing(why: str) -> None:
            for name, unit in names:
                self.metrics.append(Metric.missing(name, unit, why))

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
        self._single("link.gen_under_load", load.gen, "gen", why)
        self._single("link.width_under_load", load.width, "lanes", why)
        self._single("link.gen_max", gen_max, "gen", "NVML did not report it")
        self._single("link.width_max", width_max, "lanes", "NVML did not report it")
        peak = bw.link_peak(load.gen, load.width)
        self._single("link.theoretical_gbps", peak, "GB/s", "link under load unknown")
        self._single(
            "link.theoretical_gbps_max", bw.link_peak(gen_max, width_max), "GB/s", "max unknown"
        )
        self.metrics.append(Metric.single("link.h2d_under_load", measured, "GB/s"))
        self._single(
            "link.efficiency", bw.efficiency(measured, peak), "fraction", "link under load unknown"
        )
        self._single("link.nvml_rx_gbps", load.rx_gbps, "GB/s", why)
        self._single("link.nvml_tx_gbps", load.tx_gbps, "GB/s", why)

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
            self._single("link.gen_idle", gpu.pcie.gen_current, "gen")
            self._single("link.width_idle", gpu.pcie.width_current, "lanes")
        watch = LinkWatch(pynvml, handle)
        try:
            measured = copies.under_load(self.torch, size, self.device, self.plan.load_s, watch)
        except copies.Failed as e:
            missing(str(e))
            return None
        return watch.result(), gen_max, width_max, measured

    def _single(self, name: str, value: float | None, unit: str, why: str = "unknown") -> None:
        if value is None:
            self.metrics.append(Metric.missing(name, unit, why))
        else:
            self.metrics.append(Metric.single(name, value, unit))

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
            for where in ("local", "remote"):
                self.metrics.append(
                    Metric.missing(
                        f"numa.h2d.pinned.{where}", "GB/s", "the GPU's NUMA node is unknown"
                    )
                )
            return
        remote = bw.other_node(nodes, local)
        self.parameters["numa_local_node"] = local
        self.parameters["numa_remote_node"] = remote
        results: dict[str, Metric] = {}
        for where, node in (("local", local), ("remote", remote)):
            self._step(f"pinned H2D from NUMA node {node}")
            name = f"numa.h2d.pinned.{where}"
            if size is None or node is None:
                results[where] = Metric.missing(name, "GB/s", "nothing to measure")
                continue
            try:
                values = copies.numa_h2d(
                    self.torch, size, self.device, nodes[node], self.plan.warmup, self.plan.runs
                )
                results[where] = Metric.repeated(name, values, "GB/s")
            except copies.Failed as e:
                results[where] = Metric.missing(name, "GB/s", str(e))
        self.metrics += list(results.values())
        penalty = bw.remote_penalty(results["local"].value, results["remote"].value)
        self._single("numa.remote_penalty", penalty, "fraction", "a figure is missing")
