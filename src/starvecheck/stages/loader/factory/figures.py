"""The figures of one configuration of `loader --factory`, labelled: its samples/s and
batches/s a round, first batch, waits, batch bytes, CPU and run-queue time per sample,
memory, the samples that came again and the batches each worker delivered. Judging
them is advice/'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from starvecheck.core.metric import Metric
from starvecheck.core.schema.common import (
    BATCH_BYTES,
    BATCHES_PER_S,
    EPOCH_START_S,
    FIRST_BATCH_S,
    OTHERS_CPUS,
    SAMPLES_PER_S,
    WORKER_BATCHES,
)
from starvecheck.core.schema.factory import LAYOUT, MAIN, WORKERS
from starvecheck.core.schema.loading import (
    BUSY_MS,
    EXPOSED_SHARE,
    SOLO_MS,
    STARTUP_S,
    STARTUP_UNPICKLE_S,
)
from starvecheck.loading.split import STAGES
from starvecheck.stages.loader.factory.configuration import Run
from starvecheck.stages.loader.factory.loaders import Config
from starvecheck.stages.timing import percentile


def labels_of(role: str, config: Config, current: bool) -> dict[str, Any]:
    labels: dict[str, Any] = {
        "layout": LAYOUT,
        "role": role,
        "current": current,
        "workers": config.workers,
        "prefetch_factor": config.prefetch_factor or (2 if config.workers else 0),
        "persistent_workers": config.persistent_workers,
        "pin_memory": config.pin_memory,
    }
    if config.context is not None:  # the `start` configuration: another start method
        labels["start_method"] = config.context
    return labels


def metrics_of(role: str, run: Run, current: bool) -> list[Metric]:
    """Every figure of one configuration, labelled (`current`: the user's own)."""
    c = run.config
    base = f"own.w{c.workers}" + ("" if role == "workers" else f".{role}")
    lab = labels_of(role, c, current)

    def many(name: str, values: Sequence[float], unit: str, **labels: Any) -> list[Metric]:
        return [Metric.repeated(f"{base}.{name}", values, unit, lab | labels)] if values else []

    def single(name: str, value: float | None, unit: str, **labels: Any) -> list[Metric]:
        return [] if value is None else [Metric.single(f"{base}.{name}", value, unit, lab | labels)]

    out = many("samples_per_s", run.samples_per_s, "samples/s", quantity=SAMPLES_PER_S)
    out += many(BATCHES_PER_S, run.batches_per_s, "batches/s", quantity=BATCHES_PER_S)
    out += single("first_batch_s", round(run.first_batch_s, 4), "s", quantity=FIRST_BATCH_S)
    for p in (50, 99) if run.waits_ms else ():
        wait = round(percentile(sorted(run.waits_ms), p), 4)
        out += single(f"batch_wait_ms.p{p}", wait, "ms", quantity="batch_wait_ms", percentile=p)
    if run.batch_bytes:
        out += single("batch_bytes", float(statistics.median(run.batch_bytes)), "bytes",
                      quantity=BATCH_BYTES)  # fmt: skip
    out += _cpu_metrics(base, lab, run)
    out += _memory_metrics(base, lab, run)
    if run.restarts_s:  # each later epoch's start: judging reads their spread
        starts = [round(x, 4) for x in run.restarts_s]
        out += many("epoch_start_s", starts, "s", quantity=EPOCH_START_S)
    elif run.restart_s is not None:
        out += single("epoch_start_s", round(run.restart_s, 4), "s", quantity=EPOCH_START_S)
    out += many("copy_ms", [x * 1e3 for x in run.copy_s], "ms", quantity="copy_ms")
    out += _split_metrics(base, lab, run)
    return out + _sample_metrics(base, lab, run)


def _split_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    """Each batch's wait by stage of loading over the windows (stagesplit.py): each
    stage's share of the wait and its busy ms a batch; a batch made alone; each epoch's
    worker start-up."""
    split = run.split
    if split is None or not split.batches:
        return []
    out = []
    wait = sum(split.exposed)
    for stage, exposed, busy in zip(STAGES, split.exposed, split.busy, strict=True):
        share = round(exposed / wait, 4) if wait > 0 else 0.0
        q = lab | {"quantity": EXPOSED_SHARE, "load_stage": stage.value}
        out.append(Metric.single(f"{base}.{EXPOSED_SHARE}.{stage}", share, "fraction", q))
        q = lab | {"quantity": BUSY_MS, "load_stage": stage.value}
        ms = round(busy / split.batches * 1e3, 4)
        out.append(Metric.single(f"{base}.{BUSY_MS}.{stage}", ms, "ms", q))
    solo = round(split.solo / split.batches * 1e3, 4)
    out.append(Metric.single(f"{base}.{SOLO_MS}", solo, "ms", lab | {"quantity": SOLO_MS}))
    if split.startups:
        slowest = [round(u.slowest_s, 4) for u in split.startups]
        q = lab | {"quantity": STARTUP_S}
        out.append(Metric.repeated(f"{base}.{STARTUP_S}", slowest, "s", q))
        unpickle = [round(u.unpickle_s, 4) for u in split.startups if u.unpickle_s is not None]
        if unpickle:
            q = lab | {"quantity": STARTUP_UNPICKLE_S}
            out.append(Metric.repeated(f"{base}.{STARTUP_UNPICKLE_S}", unpickle, "s", q))
    return out


def _sample_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    """The samples in the windows that came again within their epoch (a share of those
    fingerprinted), and the batches each worker delivered, in worker order."""
    out = []
    q = lab | {"quantity": "repeat_share"}
    if run.fingerprinted:
        share = round(run.repeats / run.fingerprinted, 4)
        out.append(Metric.single(f"{base}.repeat_share", share, "share", q))
        q = lab | {"quantity": "samples_fingerprinted"}
        out.append(Metric.single(f"{base}.samples_fingerprinted", run.fingerprinted, "samples", q))
    elif run.unreadable:
        why = "no field of the batches has the batch's leading size, or they are not on the CPU"
        out.append(Metric.missing(f"{base}.repeat_share", "share", why, q))
    if run.worker_batches and run.config.workers:
        counts = [float(run.worker_batches.get(w, 0)) for w in range(run.config.workers)]
        q = lab | {"quantity": WORKER_BATCHES}
        out.append(Metric.repeated(f"{base}.worker_batches", counts, "batches", q))
    return out


def _cpu_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    """Per sample: CPU time, time runnable but waiting for a CPU (run queue), and the
    workers' blocked time (alive, neither on a CPU nor waiting for one: I/O, sleep, a
    full queue); per round, the CPUs other processes kept busy."""
    out = []
    n = max(run.samples, 1)
    per_sample = (
        ("cpu_ms_per_sample", "main", run.main_cpu_s, "the process's CPU times could not be read"),
        (
            "cpu_ms_per_sample",
            "workers",
            run.worker_cpu_s,
            "the workers' CPU times could not be read",
        ),
        ("runq_ms_per_sample", "main", run.main_runq_s, "no schedstat for this process"),
        ("runq_ms_per_sample", "workers", run.worker_runq_s, "no schedstat for the workers"),
    )
    for quantity, process, seconds, why in per_sample:
        if quantity == "runq_ms_per_sample" and process == "workers" and not run.config.workers:
            continue
        name = f"{base}.{quantity}.{process}"
        q = lab | {"quantity": quantity, "process": process}
        if seconds is None:
            out.append(Metric.missing(name, "ms", why, q))
        else:
            out.append(Metric.single(name, round(seconds * 1e3 / n, 4), "ms", q))
    alive, cpu, runq = run.worker_alive_s, run.worker_cpu_s, run.worker_runq_s
    if run.config.workers and alive is not None and cpu is not None and runq is not None:
        blocked = max(0.0, alive - cpu - runq)
        q = lab | {"quantity": "blocked_ms_per_sample", "process": WORKERS}
        out.append(
            Metric.single(
                f"{base}.blocked_ms_per_sample.workers", round(blocked * 1e3 / n, 4), "ms", q
            )
        )
    if run.main_cpu_s is not None and run.main_span_s:
        q = lab | {"quantity": "cpus_busy", "process": MAIN}
        busy = round(run.main_cpu_s / run.main_span_s, 3)
        out.append(Metric.single(f"{base}.cpus_busy.main", busy, "CPUs", q))
    others = [x for x in run.others_each if x is not None]
    if others and len(others) == len(run.others_each):
        q = lab | {"quantity": OTHERS_CPUS}
        out.append(Metric.repeated(f"{base}.others_cpus", [round(x, 3) for x in others], "CPUs", q))
    return out


def _memory_metrics(base: str, lab: dict[str, Any], run: Run) -> list[Metric]:
    """USS and PSS at the end and USS growth since the first batch: the training
    process's, and every worker's (repeated: one value per worker process)."""
    per: dict[str, tuple[list[float], list[float], list[float]]] = {}
    if run.main_memory is not None:
        start, end = run.main_memory
        per["main"] = ([end.uss] if end.uss else [], [end.pss] if end.pss else [], [])
        if start.uss is not None and end.uss is not None:
            per["main"][2].append(end.uss - start.uss)
    if run.worker_memory:
        per["worker"] = (
            [e.uss for _, e in run.worker_memory if e.uss is not None],
            [e.pss for _, e in run.worker_memory if e.pss is not None],
            [
                e.uss - s.uss
                for s, e in run.worker_memory
                if e.uss is not None and s.uss is not None
            ],
        )
    out = []
    for process, figures in per.items():
        for quantity, values in zip(
            ("uss_bytes", "pss_bytes", "uss_growth_bytes"), figures, strict=True
        ):
            if values:
                labels = lab | {"quantity": quantity, "process": process}
                out.append(Metric.repeated(f"{base}.{quantity}.{process}", values, "bytes", labels))
    return out
