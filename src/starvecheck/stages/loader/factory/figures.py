"""The figures of one configuration of `loader --factory`, as its record (core/schema/
factory.Measured): its samples/s and batches/s a round, first batch, waits, batch
bytes, CPU and run-queue time per sample, memory, the stage split of its batches'
wait, the samples that came again and the batches each worker delivered. Judging
them is advice/'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from starvecheck.core.metric import Metric
from starvecheck.core.schema.factory import Measured, Role, Settings, Split
from starvecheck.core.schema.figure import Figure
from starvecheck.loading.split import STAGES
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.loader.factory.run import Run
from starvecheck.stages.timing import percentile


def settings_of(config: Config) -> Settings:
    return Settings(
        config.workers,
        config.prefetch_factor or (2 if config.workers else 0),
        config.persistent_workers,
        config.pin_memory,
        config.context,  # the `start` configuration's: another start method
    )


def _many(values: Sequence[float]) -> Figure | None:
    return Figure.repeated(values) if values else None


def measured(role: str, run: Run, current: bool) -> Measured:
    """Every figure of one configuration (`current`: the user's own)."""
    waits = sorted(run.waits_ms)
    wait = {p: Figure.single(round(percentile(waits, p), 4)) for p in (50, 99) if waits}
    start = None
    if run.restarts_s:  # each later epoch's start: judging reads their spread
        start = Figure.repeated([round(x, 4) for x in run.restarts_s])
    elif run.restart_s is not None:
        start = Figure.single(round(run.restart_s, 4))
    out = Measured(
        Role(role),
        current,
        settings_of(run.config),
        samples_per_s=_many(run.samples_per_s),
        batches_per_s=_many(run.batches_per_s),
        first_batch_s=Figure.single(round(run.first_batch_s, 4)),
        wait_p50_ms=wait.get(50),
        wait_p99_ms=wait.get(99),
        batch_bytes=(
            Figure.single(float(statistics.median(run.batch_bytes))) if run.batch_bytes else None
        ),
        epoch_start_s=start,
        copy_ms=_many([x * 1e3 for x in run.copy_s]),
    )
    return _samples(_split(_memory(_cpu(out, run), run), run), run)


def metrics_of(role: str, run: Run, current: bool) -> list[Metric]:
    """Every figure of one configuration, labelled, as the JSON carries them."""
    return list(measured(role, run, current).to_metrics())


def _split(out: Measured, run: Run) -> Measured:
    """Each batch's wait by stage of loading over the windows (stagesplit.py): each
    stage's share of the wait and its busy ms a batch; a batch made alone; each epoch's
    worker start-up."""
    split = run.split
    if split is None or not split.batches:
        return out
    wait = sum(split.exposed)
    parts = tuple(
        Split(
            stage,
            Figure.single(round(exposed / wait, 4) if wait > 0 else 0.0),
            Figure.single(round(busy / split.batches * 1e3, 4)),
        )
        for stage, exposed, busy in zip(STAGES, split.exposed, split.busy, strict=True)
    )
    out = replace(
        out, split=parts, solo_ms=Figure.single(round(split.solo / split.batches * 1e3, 4))
    )
    if split.startups:
        unpickle = [round(u.unpickle_s, 4) for u in split.startups if u.unpickle_s is not None]
        out = replace(
            out,
            startup_s=Figure.repeated([round(u.slowest_s, 4) for u in split.startups]),
            startup_unpickle_s=_many(unpickle),
        )
    return out


def _samples(out: Measured, run: Run) -> Measured:
    """The samples in the windows that came again within their epoch (a share of those
    fingerprinted), and the batches each worker delivered, in worker order."""
    if run.fingerprinted:
        out = replace(
            out,
            repeat_share=Figure.single(round(run.repeats / run.fingerprinted, 4)),
            samples_fingerprinted=Figure.single(run.fingerprinted),
        )
    elif run.unreadable:
        why = "no field of the batches has the batch's leading size, or they are not on the CPU"
        out = replace(out, repeat_share=Figure.missing(why))
    if run.worker_batches and run.config.workers:
        counts = [float(run.worker_batches.get(w, 0)) for w in range(run.config.workers)]
        out = replace(out, worker_batches=Figure.repeated(counts))
    return out


def _cpu(out: Measured, run: Run) -> Measured:
    """Per sample: CPU time, time runnable but waiting for a CPU (run queue), and the
    workers' blocked time (alive, neither on a CPU nor waiting for one: I/O, sleep, a
    full queue); per round, the CPUs other processes kept busy."""
    n = max(run.samples, 1)

    def per_sample(seconds: float | None, why: str) -> Figure:
        return Figure.maybe(None if seconds is None else round(seconds * 1e3 / n, 4), why)

    out = replace(
        out,
        cpu_ms_main=per_sample(run.main_cpu_s, "the process's CPU times could not be read"),
        cpu_ms_workers=per_sample(run.worker_cpu_s, "the workers' CPU times could not be read"),
        runq_ms_main=per_sample(run.main_runq_s, "no schedstat for this process"),
    )
    if run.config.workers:
        out = replace(
            out, runq_ms_workers=per_sample(run.worker_runq_s, "no schedstat for the workers")
        )
    alive, cpu, runq = run.worker_alive_s, run.worker_cpu_s, run.worker_runq_s
    if run.config.workers and alive is not None and cpu is not None and runq is not None:
        blocked = max(0.0, alive - cpu - runq)
        out = replace(out, blocked_ms_workers=Figure.single(round(blocked * 1e3 / n, 4)))
    if run.main_cpu_s is not None and run.main_span_s:
        out = replace(out, cpus_busy_main=Figure.single(round(run.main_cpu_s / run.main_span_s, 3)))
    others = [x for x in run.others_each if x is not None]
    if others and len(others) == len(run.others_each):
        out = replace(out, others_cpus=Figure.repeated([round(x, 3) for x in others]))
    return out


def _memory(out: Measured, run: Run) -> Measured:
    """USS and PSS at the end and USS growth since the first batch: the training
    process's, and every worker's (repeated: one value per worker process)."""
    if run.main_memory is not None:
        start, end = run.main_memory
        growth = [end.uss - start.uss] if start.uss is not None and end.uss is not None else []
        out = replace(
            out,
            uss_main=_many([end.uss] if end.uss else []),
            pss_main=_many([end.pss] if end.pss else []),
            uss_growth_main=_many(growth),
        )
    if run.worker_memory:
        out = replace(
            out,
            uss_worker=_many([e.uss for _, e in run.worker_memory if e.uss is not None]),
            pss_worker=_many([e.pss for _, e in run.worker_memory if e.pss is not None]),
            uss_growth_worker=_many(
                [e.uss - s.uss for s, e in run.worker_memory
                 if e.uss is not None and s.uss is not None]
            ),
        )  # fmt: skip
    return out
