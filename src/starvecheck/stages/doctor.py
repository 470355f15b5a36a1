"""`doctor`: every stage against one workload, then the chain and its weakest link.

Runs the stages through their own Plan/run APIs, with plans built from the workload
(its batch size, sample size, CPU cost per sample, step time, layout and batching),
and returns their results untouched: doctor adds the chain and its own findings,
never a second opinion of a stage's figures.

--quick sizes fit the whole run in under a minute on two CPU cores: each stage's own
--quick sizes, and fewer points where a stage sweeps (loader: the workload's layout
only, warm, num_workers up to the CPUs; starve: one worker count) because doctor only
needs each link's capacity at the recommended setting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from starvecheck import args
from starvecheck.advice import chain
from starvecheck.model import Finding, Link, Report, StageResult
from starvecheck.status import Unavailable, UsageError
from starvecheck.workload import ASSUMED_STEP_MS, Workload

if TYPE_CHECKING:  # the stages import numpy or torch where they need them
    from starvecheck.stages import io as io_stage
    from starvecheck.stages import loader as loader_stage
    from starvecheck.stages import pad as pad_stage
    from starvecheck.stages import starve as starve_stage

Progress = Callable[[str, int, int], None]
Warn = Callable[[str], None]
STAGES = ("io", "loader", "starve", "pad", "pcie")

STARVE_STEPS = {True: 4, False: 20}
CAPACITY_RUNS = 3


def select(only: str | None, skip: str | None) -> tuple[str, ...]:
    """--only/--skip -> the stages to run, in chain order (env always runs)."""

    def names(option: str, text: str) -> set[str]:
        got = {n.strip() for n in text.split(",")}
        bad = sorted(n for n in got if n not in STAGES)
        if bad or not got:
            raise UsageError(
                f"{option} {text!r}: unknown stage {', '.join(bad) or '(none)'}; "
                f"choose from {', '.join(STAGES)}"
            )
        return got

    if only is not None and skip is not None:
        raise UsageError("--only and --skip: choose one")
    chosen = set(STAGES)
    if only is not None:
        chosen = names("--only", only)
    if skip is not None:
        chosen -= names("--skip", skip)
    return tuple(s for s in STAGES if s in chosen)


@dataclass(frozen=True)
class Plans:
    """Each selected stage's plan (None: not run)."""

    io: io_stage.Plan | None = None
    loader: loader_stage.Plan | None = None
    starve: starve_stage.Plan | None = None
    pad: pad_stage.Plan | None = None


def plans(
    w: Workload, stages: Sequence[str], quick: bool, eff: int, delay_ms: float = 0.0
) -> Plans:
    """Plans from the workload; step_ms must be known (measured or assumed) first."""
    from starvecheck.stages import io as io_stage
    from starvecheck.stages import loader as loader_stage
    from starvecheck.stages import pad as pad_stage
    from starvecheck.stages import starve as starve_stage

    assert w.step_ms is not None
    io = loader = starve = pad = None
    if "io" in stages:
        n, runs = io_stage.SIZES[quick]["generated"]
        io = io_stage.Plan(
            samples=n,
            sample_size=w.sample_size,
            runs=runs,
            threads=args.thread_counts(None, eff),
        )
    if "loader" in stages:
        n, runs = loader_stage.SIZES[quick]["generated"]
        workers = args.default_workers(eff)
        loader = loader_stage.Plan(
            samples=n,
            sample_size=w.sample_size,
            workers=tuple(x for x in workers if x <= eff) if quick else workers,
            runs=runs,
            batch_size=w.batch_size,
            # The storage link is io's cold read; with --quick the loader link is the
            # DataLoader itself, warm.
            cold=not quick,
            effective_cpus=eff,
            layouts=(w.layout,),
            sample_delay_ms=delay_ms,
        )
    if "starve" in stages:
        starve = starve_stage.Plan(
            sample_ms=w.cpu_ms_per_sample,
            batch_size=w.batch_size,
            step_ms=w.step_ms,
            workers=(eff,) if quick else tuple(x for x in args.default_workers(eff) if x <= eff),
            steps=STARVE_STEPS[quick],
            effective_cpus=eff,
            tokenizer=w.tokenizer,
            capacity_runs=CAPACITY_RUNS,
        )
    if "pad" in stages:
        pad = pad_stage.Plan(
            context=w.context,
            batch_size=w.batch_size,
            current=w.current,
            limit=pad_stage.QUICK_LIMIT if quick and w.dataset else None,
            dataset=w.dataset,
            fields=w.field,
            tokenizer=w.tokenizer if w.dataset else None,
        )
    return Plans(io, loader, starve, pad)


def space_problems(path: str, p: Plans) -> None:
    """Refuse before anything is written when io's or loader's data would not fit."""
    from starvecheck.stages import io as io_stage
    from starvecheck.stages import sources

    if p.io is not None and (
        problem := io_stage.space_problem(path, p.io.samples, p.io.sample_size)
    ):
        raise UsageError(problem)
    if p.loader is not None:
        need = sources.space_needed(p.loader.samples, p.loader.sample_size)
        if problem := io_stage.space_problem(path, p.loader.samples, p.loader.sample_size, need):
            raise UsageError(problem)


def resolve_step(w: Workload, quick: bool, progress: Progress) -> tuple[Workload, str, str | None]:
    """(workload with step_ms, what the GPU link's figure is, a caveat or None)."""
    if w.step_ms is not None:
        return w, f"step_ms {w.step_ms:g} ({w.source('step_ms')})", None
    if cuda_present():
        from starvecheck.stages import gpustep

        progress("measuring the GPU step", 0, 1)
        m = gpustep.measure(w.batch_size, w.context, quick)
        progress("measuring the GPU step", 1, 1)
        w = w.set("step_ms", round(m.scaled_ms, 3), "measured")
        return w, f"step_ms {w.step_ms:g} measured", f"step_ms measured: {m.description}"
    w = w.set("step_ms", ASSUMED_STEP_MS, "assumed")
    return (
        w,
        f"step_ms {ASSUMED_STEP_MS:g} assumed (no CUDA device)",
        f"step_ms {ASSUMED_STEP_MS:g} is an assumed figure, not measured: there is no CUDA "
        "device here to time a training step on. It stands for a ~1B-parameter model at "
        "batch 16 x 2,048 tokens on one data-centre GPU; give --step-ms with your own "
        "step time (from your training logs) to judge the pipeline against your GPU",
    )


def cuda_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pcie_plan(pcie: Any, w: Workload, quick: bool) -> Any:
    """pcie's sweep plus the size of one of this workload's batches, so the link's
    capacity is the bandwidth measured at the batch's own size (a 256 KiB copy runs at
    about half the 1 MiB rate on an H100), not the nearest size of the sweep."""
    plan = pcie.Plan.default(quick)
    batch_bytes = w.wire_bytes_per_sample * w.batch_size
    if batch_bytes <= 0 or batch_bytes in plan.sizes:
        return plan
    return replace(plan, sizes=tuple(sorted({*plan.sizes, batch_bytes})))


def pcie_module() -> tuple[Any | None, str]:
    """The pcie stage, or why it cannot run here (it needs a CUDA device)."""
    from starvecheck.stages import pcie

    why = pcie.cuda_unavailable()
    if why is not None:
        return None, why or "no CUDA device"
    return pcie, ""


@dataclass(frozen=True)
class Outcome:
    workload: Workload
    results: tuple[StageResult, ...]  # the stages' own, in chain order, then doctor's
    chain: tuple[Link, ...]
    weakest: chain.Weakest


def run(
    path: str,
    w: Workload,
    stages: Sequence[str],
    quick: bool,
    machine: Any,
    progress: Progress,
    warn: Warn,
    delay_ms: float = 0.0,
) -> Outcome:
    from starvecheck.scratch import signals_raise

    start = time.perf_counter()
    eff = max(1, machine.cpu.effective_cpus or 1)
    storage = machine.to_dict()["storage"]
    caveats: list[str] = []
    with signals_raise():
        w, gpu_basis, step_caveat = resolve_step(w, quick, progress)
    if step_caveat:
        caveats.append(step_caveat)
    p = plans(w, stages, quick, eff, delay_ms)
    space_problems(path, p)
    results: dict[str, StageResult] = {}
    # pad and starve first: a dataset or tokenizer that cannot be read is one line
    # before minutes of measuring, not after.
    if p.pad is not None:
        from starvecheck.stages import pad as pad_stage

        results["pad"] = pad_stage.run(p.pad, progress).result
    if p.starve is not None:
        from starvecheck.stages import starve as starve_stage

        results["starve"] = starve_stage.run(p.starve, progress)
        if w.tokenizer:
            d = results["starve"].parameters["sample_cpu_ms"]
            w = w.set("cpu_ms_per_sample", d, "measured")
    if p.io is not None:
        from starvecheck.stages import io as io_stage

        results["io"] = io_stage.run(
            path, p.io, existing=False, storage=storage, progress=progress, warn=warn
        )
    if p.loader is not None:
        from starvecheck.stages import loader as loader_stage

        results["loader"] = loader_stage.run(
            path, p.loader, existing=False, storage=storage, progress=progress, warn=warn
        )
    pcie_reason = "pcie not selected (--only/--skip)"
    if "pcie" in stages:
        pcie, pcie_reason = pcie_module()
        if pcie is not None:
            try:
                results["pcie"] = pcie.run(pcie_plan(pcie, w, quick), machine, progress, warn)
            except Unavailable as e:  # CUDA failing mid-way: the link says why, the rest stands
                pcie_reason = str(e)
    links = build_chain(w, results, gpu_basis, pcie_reason)
    weakest = chain.weakest(links)
    if delay_ms:
        caveats.append(
            f"STARVECHECK_SLOW_RANKS: every loader sample took {delay_ms:g} ms longer on "
            "purpose (a testing hook), so this node's loader figures are slowed"
        )
    own = StageResult(
        stage="doctor",
        parameters={"stages": list(stages), "quick": quick},
        findings=chain.advise(links, weakest),
        caveats=tuple(caveats),
        duration_s=round(time.perf_counter() - start, 3),
    )
    ordered = (*(results[s] for s in STAGES if s in results), own)
    return Outcome(w, ordered, links, weakest)


def build_chain(
    w: Workload, results: dict[str, StageResult], gpu_basis: str, pcie_reason: str
) -> tuple[Link, ...]:
    demand = w.demand
    skipped = "not measured: {} not selected (--only/--skip)"
    storage = (
        chain.storage(results["io"], w.layout, demand)
        if "io" in results
        else chain.missing("storage", demand, skipped.format("io"))
    )
    read = (
        chain.read_capacity(results["loader"], w.layout)
        if "loader" in results
        else (None, "loader not selected")
    )
    cpu = (
        chain.cpu_capacity(results["starve"])
        if "starve" in results
        else (None, "starve not selected")
    )
    loader = chain.loader(read, cpu, demand)
    padding = (
        chain.padding(results["pad"], w.current, demand)
        if "pad" in results
        else chain.missing("padding", demand, skipped.format("pad"))
    )
    pcie = (
        chain.pcie(results["pcie"], w.wire_bytes_per_sample, w.batch_size, demand)
        if "pcie" in results
        else chain.missing("pcie", demand, f"not measured: {pcie_reason}")
    )
    gpu = chain.gpu(demand, gpu_basis)
    return (storage, loader, padding, pcie, gpu)


def finish(report: Report, outcome: Outcome, nodes: Sequence[Mapping[str, Any]] = ()) -> Report:
    """The report with doctor's own parts: the workload, the chain, the weakest link,
    and every stage's findings weighed by what each fix buys this workload
    (chain.reweigh), so the checklist, the verdict and --fail-on agree."""
    from starvecheck.advice import rank, verdict

    stages = tuple(
        replace(s, findings=tuple(chain.reweigh(s.findings, outcome.chain))) for s in report.stages
    )
    report = replace(report, stages=stages)
    checklist = rank(report.findings)
    return replace(
        report,
        checklist=checklist,
        verdict=verdict(checklist, len(report.findings)),
        workload=outcome.workload.to_dict(),
        chain=outcome.chain,
        weakest_link=outcome.weakest.link,
        nodes=tuple(nodes),
    )


def add_findings(
    results: Sequence[StageResult], more: Sequence[Finding], caveats: Sequence[str] = ()
) -> list[StageResult]:
    """Findings doctor makes after the stages ran (stragglers) join its own result."""
    return [
        replace(r, findings=(*r.findings, *more), caveats=(*r.caveats, *caveats))
        if r.stage == "doctor"
        else r
        for r in results
    ]
