"""Where a step's time goes, for a trace read by `profile --trace` and for `watch`.

Both report figures of one kind each, labelled with their quantity alone (`step_ms`,
`data_wait_share`, `gpu_idle_share`, ...; phases add their `phase`); a person reads
them as one breakdown of the step: each figure in ms per step where it was timed per
step, and as a share of the step.
"""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import StageResult
from starvecheck.core.schema.steps import HTA_PARTS, Step, StepFigure, Straggler
from starvecheck.core.schema.steps import Parameters as StepParameters
from starvecheck.core.units import parse_uint
from starvecheck.render.section import Section, taken

# The milliseconds are means, as the shares are sums over the same steps: the rows add up.
HEADERS = ("per step", "ms (mean ± σ)", "share of step")
# (quantity, label, indented under the row above); the order people read a step in.
_SHARES = (
    (Step.DATA_WAIT_SHARE, "data wait", False),
    (Step.GPU_IDLE_SHARE, "GPU idle", False),
    (Step.GPU_IDLE_DATA_WAIT_SHARE, "while the loop waits for data", True),
    (Step.GPU_IDLE_HOST_WAIT_SHARE, "while the loop waits for data", True),  # before 0.2
    (Step.GPU_IDLE_OTHER_SHARE, "other (launches, syncs, host code)", True),
    (Step.COLLECTIVE_SHARE, "in collectives (NCCL, gloo)", False),
    (Step.MEMCPY_SHARE, "GPU copies (memcpy)", False),
    (Step.MEMCPY_H2D_SHARE, "host to device", True),
    (Step.MEMCPY_H2D_PAGEABLE_SHARE, "from pageable memory", True),
    (Step.MEMCPY_PAGEABLE_SHARE, "from pageable memory", True),  # before 0.2
    (Step.MEMCPY_D2H_SHARE, "device to host", True),
    (Step.MEMCPY_D2D_SHARE, "device to device", True),
)
_MS = {Step.DATA_WAIT_SHARE: Step.DATA_WAIT_MS}
_FIRST = (
    (Step.FIRST_STEP_MS, "first step (left out)"),
    (Step.FIRST_WAIT_MS, "  ↳ its data wait"),
)
# A figure and the metric it was read from (what the table hands on by identity).
Read = tuple[StepFigure, Metric]
ByQuantity = dict[Step, Metric]


def _read(metrics: Sequence[Metric]) -> list[Read]:
    """Each metric that is a step breakdown's figure, as its record."""
    return [(f, m) for m in metrics if (f := StepFigure.of(m)) is not None]


def _ms(m: Metric | None) -> str:
    if m is None or m.value is None:
        return ""
    v = sum(m.values) / len(m.values) if m.values else m.value
    digits = 1 if v < 1000 else 0
    text = f"{v:,.{digits}f}"
    return text + (f" ± {m.stdev:,.{digits}f}" if m.n > 1 and m.stdev is not None else "")


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.1%}"


def split(
    stage: StageResult, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, every other metric, notes) of `metrics`, those of `stage` the tables
    before this one left; no rows unless they are a step breakdown of `profile --trace`
    or `watch` (a `step_ms` beside a `data_wait_share`, each labelled with its quantity
    alone: profile's loop labels its own with a layout and num_workers)."""
    if stage.stage not in ("trace", "watch"):
        return [], list(metrics), []
    read = _read(metrics)
    by_quantity: ByQuantity = {
        f.quantity: m for f, m in read if (f.phase, f.rank, f.device) == (None, None, None)
    }
    step = by_quantity.get(Step.STEP_MS)
    if step is None or Step.DATA_WAIT_SHARE not in by_quantity:
        return [], list(metrics), []
    used = {id(x) for x in (step, by_quantity.get(Step.STEPS)) if x is not None}
    rows = [_step_row(step, by_quantity.get(Step.STEPS))]
    notes = _whose(stage)
    rows += _share_rows(by_quantity, used, notes)
    total = sum(step.values) if step.values else 0.0
    rows += _loop_rows(by_quantity, step, total, used)
    rows += _phase_rows(read, step, total, used)
    notes += _hta_note(by_quantity, used)
    rows += _first_rows(by_quantity, used)
    return rows, [m for m in metrics if id(m) not in used], notes


# The helpers below each add to `used` the ids of the metrics their rows (or notes)
# show, so that `split` hands on the others.


def _step_row(step: Metric, steps: Metric | None) -> tuple[str, ...]:
    """The step itself, the whole: how many steps its mean is over."""
    label = "step"
    if steps is not None and steps.value is not None and step.n and steps.value != step.n:
        label = f"step ({step.n} of {int(steps.value)} measured)"
    elif step.n:
        label = f"step ({step.n} measured)"
    return (label, _ms(step), "100.0%")


def _whose(stage: StageResult) -> list[str]:
    """Notes on whose figures these are: the headline rank's, one GPU's of several."""
    notes = []
    params = stage.parameters.read(StepParameters)
    headline = params.headline_rank
    if headline:
        notes.append(
            f"{headline}'s steps: of {len(params.ranks)} ranks, the one that "
            "waits most for data (or idles most); every rank's figures below"
        )
    device = params.gpu_device
    if params.gpu_devices > 1 and device is not None:
        notes.append(f"GPU figures are GPU {device}'s, the idlest of the rank's GPUs")
    return notes


def _share_rows(by_quantity: ByQuantity, used: set[int], notes: list[str]) -> list[tuple[str, ...]]:
    """A row per share of the step (_SHARES), with its ms where timed; a share not
    measured says why in `notes`, once."""
    rows: list[tuple[str, ...]] = []
    for name, text, nested in _SHARES:
        m = by_quantity.get(name)
        if m is None:
            continue
        used.add(id(m))
        ms = by_quantity.get(_MS[name]) if name in _MS else None
        if ms is not None:
            used.add(id(ms))
        label = f"  ↳ {text}" if nested else text
        if name is Step.COLLECTIVE_SHARE and not m.value:
            continue  # no collectives in the trace: no row
        if m.value is None:
            rows.append((label, "", "n/a"))
            note = f"n/a: {m.reason or 'not measured'}"
            if note not in notes:
                notes.append(note)
            continue
        rows.append((label, _ms(ms), f"{m.value:.1%}"))
        if name is Step.DATA_WAIT_SHARE:
            rows += _wait_cpu_rows(by_quantity, used)
    return rows


def _wait_cpu_rows(by_quantity: ByQuantity, used: set[int]) -> list[tuple[str, ...]]:
    """watch: the loop's own thread's CPU time while it waited (num_workers=0: the
    process making the batch): CPU work, against I/O or sleep."""
    cpu = by_quantity.get(Step.DATA_WAIT_CPU_MS)
    if cpu is None or cpu.value is None:
        return []
    used.add(id(cpu))
    rows: list[tuple[str, ...]] = [("  ↳ CPU time of the loop's thread", _ms(cpu), "")]
    runq = by_quantity.get(Step.DATA_WAIT_RUNQUEUE_MS)
    if runq is not None and runq.value is not None:
        used.add(id(runq))  # it was ready to run, and waited for a CPU
        rows.append(("  ↳ waiting for a CPU", _ms(runq), ""))
    return rows


def _loop_rows(
    by_quantity: ByQuantity, step: Metric, total: float, used: set[int]
) -> list[tuple[str, ...]]:
    """watch: the loop's own step after its batch came (compute), and with
    barrier=True its wait for the other ranks; each a share of the steps' `total`."""
    rows: list[tuple[str, ...]] = []
    compute = by_quantity.get(Step.COMPUTE_MS)
    if compute is not None and compute.value is not None:
        used.add(id(compute))
        share = sum(compute.values) / total if total and compute.n == step.n else None
        rows.append(
            ("compute (the loop's step)", _ms(compute), "" if share is None else f"{share:.1%}")
        )
        compute_cpu = by_quantity.get(Step.COMPUTE_CPU_MS)
        if compute_cpu is not None and compute_cpu.value is not None:
            used.add(id(compute_cpu))
            rows.append(("  ↳ CPU time of the loop's thread", _ms(compute_cpu), ""))
    barrier = by_quantity.get(Step.RANK_WAIT_MS)
    if barrier is not None and barrier.value is not None:
        used.add(id(barrier))
        share = sum(barrier.values) / total if total and barrier.n == step.n else None
        rows.append(("waiting for the other ranks", _ms(barrier), _share(share)))
    return rows


def _phase_rows(
    read: Sequence[Read], step: Metric, total: float, used: set[int]
) -> list[tuple[str, ...]]:
    """A row per phase timed (`phase_ms` labelled with its `phase`)."""
    rows: list[tuple[str, ...]] = []
    for f, m in read:
        if f.phase is None or f.rank is not None or f.device is not None or m.value is None:
            continue
        used.add(id(m))
        share = sum(m.values) / total if total and m.n == step.n else None
        rows.append((f"phase {f.phase.value}", _ms(m), _share(share)))
    return rows


def _hta_note(by_quantity: ByQuantity, used: set[int]) -> list[str]:
    """HolisticTraceAnalysis's idle split, as a note, where all three parts are known."""
    hta = [by_quantity.get(p) for p in HTA_PARTS]
    used.update(id(x) for x in hta if x is not None)  # missing: the GPU row says why
    if not all(x is not None and x.value is not None for x in hta):
        return []
    host, kernel, other = (x.value for x in hta)  # type: ignore[union-attr]
    return [
        f"HolisticTraceAnalysis's idle split (per stream, whole trace): host wait {host:.0%}, "
        f"kernel wait {kernel:.0%}, other {other:.0%} of the streams' idle time"
    ]


def _first_rows(by_quantity: ByQuantity, used: set[int]) -> list[tuple[str, ...]]:
    """The first step, left out of the figures above, and its data wait."""
    rows: list[tuple[str, ...]] = []
    for name, text in _FIRST:
        first = by_quantity.get(name)
        if first is not None and first.value is not None:
            used.add(id(first))
            rows.append((text, _ms(first), ""))
    return rows


RANK_HEADERS = (
    "rank",
    "steps",
    "step ms (mean)",
    "data wait",
    "GPU idle",
    "in collectives",
    "H2D copies",
    "slowest in",
)


def ranks(
    stage: StageResult, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, every other metric, notes): one row per rank of a multi-rank trace
    (figures labelled `rank`), one per GPU where a rank drives several (`device`)."""
    if stage.stage != "trace":
        return [], list(metrics), []
    mine = [(f, m) for f, m in _read(metrics) if f.rank is not None or f.device is not None]
    if not mine:
        return [], list(metrics), []
    by: dict[str, ByQuantity] = {}
    devices: dict[str, dict[str, Metric]] = {}
    for fig, m in mine:
        rank = fig.rank or ""
        if fig.device is not None:
            devices.setdefault(rank, {})[fig.device] = m
        elif fig.phase is None:
            by.setdefault(rank, {})[fig.quantity] = m
    verdict = stage.judged.straggler or Straggler()
    turns, compared = verdict.slowest_in, verdict.steps_compared
    rows: list[tuple[str, ...]] = []

    def share(x: Metric | None) -> str:
        return "" if x is None else _share(x.value)

    for rank in sorted(set(by) | set(devices), key=_natural):
        f = by.get(rank, {})
        if f:
            steps = f.get(Step.STEPS)
            step = f.get(Step.STEP_MS)
            rows.append(
                (
                    rank,
                    "" if steps is None or steps.value is None else f"{steps.value:.0f}",
                    _ms(step).split(" ±")[0] if step is not None else "",
                    *(share(f.get(q)) for q in _RANK_SHARES),
                    f"{turns.get(rank, 0)} of {compared}" if compared else "",
                )
            )
        for dev, m in sorted(devices.get(rank, {}).items(), key=lambda kv: _natural(kv[0])):
            label = f"  ↳ GPU {dev}" if rank else f"GPU {dev}"
            rows.append((label, "", "", "", _share(m.value), "", "", ""))
    notes = []
    if compared:
        notes.append(
            "slowest in: steps where the rank had the most work (the step less its time in "
            "collectives), over the steps every rank has"
        )
    taken = {id(m) for _, m in mine}
    return rows, [m for m in metrics if id(m) not in taken], notes


LOOP_RANK_HEADERS = (
    "rank",
    "steps",
    "step ms",
    "data wait ms",
    "compute ms",
    "waits for others ms",
    "data wait",
    "first step ms",
    "slowest in",
)


_LOOP_RANK_MS = (Step.STEP_MS, Step.DATA_WAIT_MS, Step.COMPUTE_MS, Step.RANK_WAIT_MS)
_RANK_SHARES = (
    Step.DATA_WAIT_SHARE,
    Step.GPU_IDLE_SHARE,
    Step.COLLECTIVE_SHARE,
    Step.MEMCPY_H2D_SHARE,
)


def loop_ranks(
    stage: StageResult, metrics: Sequence[Metric]
) -> tuple[list[tuple[str, ...]], list[Metric], list[str]]:
    """(rows, every other metric, notes): `watch` under torch.distributed, one row per
    rank (figures labelled `rank`): its step, data wait, compute, time waiting for the
    others, first step, and in how many steps it had the most work."""
    if stage.stage != "watch":
        return [], list(metrics), []
    mine = [(f, m) for f, m in _read(metrics) if f.rank is not None]
    if not mine:
        return [], list(metrics), []
    by: dict[str, ByQuantity] = {}
    for fig, m in mine:
        if fig.rank is not None:
            by.setdefault(fig.rank, {})[fig.quantity] = m
    verdict = stage.judged.straggler or Straggler()
    turns, compared = verdict.slowest_in, verdict.steps_compared
    rows: list[tuple[str, ...]] = []
    for rank in sorted(by, key=_natural):
        f = by[rank]
        steps = f.get(Step.STEPS)
        first = f.get(Step.FIRST_STEP_MS)
        rows.append(
            (
                rank,
                "" if steps is None or steps.value is None else f"{steps.value:.0f}",
                *(_ms(f.get(q)).split(" ±")[0] for q in _LOOP_RANK_MS),
                _share(f[Step.DATA_WAIT_SHARE].value) if Step.DATA_WAIT_SHARE in f else "",
                "" if first is None or first.value is None else f"{first.value:,.0f}",
                f"{turns.get(rank, 0)} of {compared}" if compared else "",
            )
        )
    how = stage.parameters.read(StepParameters).rank_wait_source
    notes = [
        "means per step, the first step left out; waits for others: "
        + (
            "timed at a barrier once each batch is in hand (barrier=True)"
            if how == "barrier"
            else "estimated, the rank's compute above the fastest rank's in the same step"
        )
    ]
    if compared:
        notes.append(
            "slowest in: steps where the rank had the most work (its step less its wait for "
            "the others), over the steps every rank has"
        )
    taken = {id(m) for _, m in mine}
    return rows, [m for m in metrics if id(m) not in taken], notes


def _natural(text: str) -> tuple[str, int]:
    head, _, tail = text.rpartition(" ")
    number = parse_uint(tail)
    return (head, number) if number is not None else (text, -1)


def sections(stage: StageResult, metrics: Sequence[Metric]) -> tuple[list[Section], list[Metric]]:
    """The steps' phases, then every rank's (a multi-rank trace's, or watch's ranks)."""
    out: list[Section] = []
    before = list(metrics)
    rows, rest, notes = split(stage, before)
    if rows:
        right = range(1, len(HEADERS))
        out.append(Section(HEADERS, rows, notes, right, metrics=taken(before, rest)))
    for pick, headers, last in (
        (ranks, RANK_HEADERS, len(RANK_HEADERS)),
        (loop_ranks, LOOP_RANK_HEADERS, len(LOOP_RANK_HEADERS) - 1),
    ):
        before = rest
        rows, rest, notes = pick(stage, before)
        if rows:
            shown = taken(before, rest)
            out.append(Section(headers, rows, notes, range(1, last), "every rank", shown))
    return out, list(rest)
