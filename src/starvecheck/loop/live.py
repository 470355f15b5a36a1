"""The live recommendation a scrape exports: this rank's figures so far, judged as
watch's report judges them (advice.report.build_report), reduced to the gauges of
loop/families.Advice: num_workers now and recommended, the predicted speed-up with its
interval over blocks of steps (advice.stepworkers.prediction_interval), the weakest
link, all from the last WINDOW steps. Judging takes milliseconds, so the exporter
does it at most every loop/exporter.ADVICE_EVERY_S seconds, on a copy of the steps
completed (the loop appends meanwhile).
"""

from __future__ import annotations

import dataclasses

from starvecheck.loop.families import Advice
from starvecheck.loop.times import ARRAYS, LoopTimes

# The steps judged: the last this many (a rank's window, loop/ranks.WINDOW), so judging
# stays a few milliseconds however long the job has run, and says what holds now.
WINDOW = 4096

# The data-wait share from which watch's judgement calls a loop input-bound
# (advice/profile.INPUT_BOUND): the weakest link is then the data's.
DATA = "data loading"
STEP = "training step"


def snapshot(t: LoopTimes, window: int = WINDOW) -> LoopTimes:
    """The last `window` steps completed, apart from the arrays the loop goes on
    appending to (`offset` counts those before, as a rank's last steps are sent)."""
    n = len(t.computes)
    start = max(0, n - window)
    arrays = {name: getattr(t, name)[start : min(n, len(getattr(t, name)))] for name in ARRAYS}
    lists = {
        name: list(getattr(t, name))
        for name in ("worker_cpu", "worker_runq", "notes", "others_cpus", "process_cpus")
    }
    gpu = {"gpu_idle": t.gpu_idle[:], "gpu_period": t.gpu_period[:]}
    offset = t.offset + start
    return dataclasses.replace(t, **arrays, **lists, **gpu, digests=dict(t.digests), offset=offset)


def advice(t: LoopTimes) -> Advice:
    """The live recommendation from the loop's figures so far."""
    from starvecheck.advice.profile import INPUT_BOUND
    from starvecheck.advice.report import build_report
    from starvecheck.advice.stepworkers import prediction_interval
    from starvecheck.core.context import Context
    from starvecheck.core.metric import value
    from starvecheck.core.model import GainKind, StageResult
    from starvecheck.core.schema.common import DATA_WAIT_SHARE
    from starvecheck.core.schema.steps import Parameters as StepParameters
    from starvecheck.core.schema.steps import StepFigures

    snap = snapshot(t)
    if len(snap.computes) < 2:
        return Advice(num_workers=snap.num_workers)
    result = StageResult(
        stage="watch",
        parameters=snap.parameters(),
        metrics=tuple(snap.metrics()),
        caveats=tuple(snap.caveats()),
    )
    report = build_report("watch", None, [result], Context(stdout_isatty=False))
    stage = report.stages[0]
    recommended = speedup = low = high = None
    for f in stage.findings:
        n = f.fix.get("num_workers")
        if isinstance(n, int) and not isinstance(n, bool):
            recommended = n
            if f.gain is not None and f.gain.kind is GainKind.THROUGHPUT:
                speedup = f.gain.value
            break
    if speedup is not None:
        figures = stage.records(StepFigures).headline()
        interval = prediction_interval(figures, stage.parameters.read(StepParameters))
        if interval is not None:
            low, high = interval.low, interval.high
    share = value(stage.metrics, quantity=DATA_WAIT_SHARE)
    link = report.weakest_link
    if link is None and share is not None:
        link = DATA if share >= INPUT_BOUND else STEP
    return Advice(snap.num_workers, recommended, speedup, low, high, link)
