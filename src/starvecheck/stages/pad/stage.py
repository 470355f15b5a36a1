"""`pad`: the padding tax of a dataset under every common batching strategy.

Token lengths come from a dataset tokenized here (--dataset, --tokenizer), a file of
lengths (--lengths), or the embedded Alpaca-like default. Lengths past --context are
cut to it, as training would; then each strategy of `packing` lays the samples out
and its cost is counted: real tokens per computed position (efficiency), padding,
positions per batch, batches per epoch, and attention work against the ideal.

Strategies that shuffle (dynamic padding, length grouping, padding-free) are laid
out over several shuffles, so their figures carry a median and a spread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from starvecheck.core import clocks
from starvecheck.core.metric import Caveat
from starvecheck.core.model import StageResult
from starvecheck.core.schema.figure import Figure, value_of
from starvecheck.core.schema.pad import Cost, Lengths, PadFigures, Strategy
from starvecheck.core.status import UsageError
from starvecheck.core.strategies import SHARES_ROWS, SHUFFLED, STRATEGIES
from starvecheck.inputs.dataset import CHARS_PER_TOKEN, read_samples
from starvecheck.inputs.embedded import ALPACA_RANGE, ALPACA_SAMPLES, alpaca_like
from starvecheck.inputs.lengths import read_lengths
from starvecheck.inputs.records import RECORD_CHARS, detect_format
from starvecheck.inputs.tokenizers import load_tokenizer, token_lengths
from starvecheck.stages.base import BaseStage, Measured, RunContext
from starvecheck.stages.options import PadOptions
from starvecheck.stages.pad import packing
from starvecheck.stages.pad.packing import Figures, Layout

if TYPE_CHECKING:
    from starvecheck.inputs.workload import Workload

Progress = Callable[[str, int, int | None], None]
SHUFFLES = 5
SHUFFLE_BUDGET = 2_000_000  # lengths laid out per shuffled strategy, over all shuffles


def _no_progress(what: str, done: int, total: int | None) -> None:
    pass


@dataclass(frozen=True)
class Plan:
    context: int = PadOptions.context
    batch_size: int = PadOptions.batch_size
    current: str = PadOptions.current
    seed: int = PadOptions.seed
    limit: int | None = None
    dataset: str | None = None
    fmt: str | None = None  # None: from the file name
    fields: tuple[str, ...] = ()
    tokenizer: str | None = None
    lengths: str | None = None  # a file of lengths, or "-" for stdin
    stdin: IO[str] | None = field(default=None, compare=False, repr=False)  # for "-"

    @property
    def source(self) -> str:
        return "dataset" if self.dataset else ("lengths" if self.lengths else "default")

    def shuffles(self, n: int) -> int:
        """Shuffles per shuffled strategy: 5, fewer on big data (where they agree anyway)."""
        return max(1, min(SHUFFLES, SHUFFLE_BUDGET // max(1, n)))

    def parameters(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dataset": self.dataset,
            "format": self.fmt,
            "fields": list(self.fields),
            "tokenizer": self.tokenizer,
            "lengths": self.lengths,
            "context": self.context,
            "batch_size": self.batch_size,
            "current": self.current,
            "seed": self.seed,
            "limit": self.limit,
        }


@dataclass
class Input:
    lengths: np.ndarray  # as read: before dropping empty samples and cutting to context
    caveats: list[Caveat] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def load(plan: Plan, progress: Progress = _no_progress, stdin: IO[str] | None = None) -> Input:
    if plan.lengths is not None:
        lengths = read_lengths(plan.lengths, stdin, plan.limit)
        if lengths.size == 0:
            raise UsageError(f"--lengths {plan.lengths}: no lengths (one count per line)")
        return Input(lengths)
    if plan.dataset is None:
        n = plan.limit or ALPACA_SAMPLES
        lo, hi = ALPACA_RANGE
        return Input(
            alpaca_like(n, plan.seed),
            [
                Caveat(
                    "pad.default-lengths",
                    f"no --dataset or --lengths: {n:,} synthetic lengths from the embedded "
                    f"Alpaca-like distribution (log-normal cut to {lo}-{hi} tokens, median 83, "
                    "mean 95); measure your own data with --dataset or --lengths",
                )
            ],
        )
    fmt = plan.fmt or detect_format(plan.dataset)
    progress("reading", 0, plan.limit)
    max_chars = plan.context * CHARS_PER_TOKEN
    samples = read_samples(plan.dataset, fmt, plan.fields, plan.limit, max_chars)
    caveats: list[Caveat] = []
    if samples.cut:
        kept = min(max_chars, RECORD_CHARS)
        caveats.append(
            Caveat(
                "pad.long-samples-cut",
                f"{samples.cut:,} sample{'s' if samples.cut != 1 else ''} over {kept:,} "
                f"characters ({CHARS_PER_TOKEN} "
                f"per token of the {plan.context:,}-token context) were cut to that before "
                "tokenizing, so memory stays bounded: their token counts are of the part "
                "kept, lower bounds (as are length.max, length.mean and truncated_tokens)",
            )
        )
    details: dict[str, Any] = {"format": fmt, "fields": list(samples.fields)}
    for name, n in samples.missing.items():
        caveats.append(
            Caveat(
                "pad.missing-field",
                f"field {name!r} is missing from {n:,} of {samples.records:,} records "
                "(taken as empty)",
            )
        )
    tokenizer = None
    if plan.tokenizer:
        tokenizer = load_tokenizer(plan.tokenizer)
        if not getattr(tokenizer, "is_fast", True):
            caveats.append(
                Caveat(
                    "pad.slow-tokenizer",
                    f"{plan.tokenizer} is a slow (Python) tokenizer: the lengths are right, "
                    "but tokenizing took long; a tokenizer.json gives the fast one",
                )
            )
    elif not samples.pretokenized:
        raise UsageError(
            f"--dataset {plan.dataset}: field {', '.join(samples.fields) or 'text'} holds "
            "text; name the tokenizer you train with: --tokenizer DIR_OR_CACHED_NAME"
        )
    elif plan.tokenizer is None:
        details["pretokenized"] = True
    lengths = token_lengths(samples.items, tokenizer, progress)
    return Input(lengths, caveats, details)


def _figure(values: list[float]) -> Figure:
    """A figure, repeated when it was laid out per shuffle."""
    return Figure.repeated(values) if len(values) > 1 else Figure.single(values[0])


def _cost(name: str, figs: list[Figures], ideal: float) -> Cost:
    """A strategy's cost, each figure over the shuffles it was laid out in."""

    def vs_ideal(attention: float) -> float:
        return attention / ideal if ideal else 1.0

    unmasked = (
        _figure([vs_ideal(f.attention_unmasked or 0.0) for f in figs])
        if figs[0].attention_unmasked is not None
        else None
    )
    return Cost(
        Strategy(name),
        efficiency=_figure([f.efficiency for f in figs]),
        padding_positions=_figure([f.padding for f in figs]),
        positions_per_batch=_figure([f.positions_per_batch for f in figs]),
        max_positions_per_batch=_figure([f.max_batch_positions for f in figs]),
        batches=_figure([f.batches for f in figs]),
        attention_cost=_figure([f.attention for f in figs]),
        attention_vs_ideal=_figure([vs_ideal(f.attention) for f in figs]),
        attention_unmasked_vs_ideal=unmasked,
    )


def _lengths(raw: np.ndarray, cut: np.ndarray, context: int, empty: int) -> Lengths:
    s = np.sort(raw[raw > 0])
    return Lengths(
        samples=Figure.single(int(cut.size)),
        tokens=Figure.single(int(cut.sum())),
        mean=Figure.single(float(s.mean())),
        median=Figure.single(float(np.median(s))),
        p90=Figure.single(float(np.percentile(s, 90))),
        p99=Figure.single(float(np.percentile(s, 99))),
        min=Figure.single(int(s[0])),
        max=Figure.single(int(s[-1])),
        truncated_samples=Figure.single(int((s > context).sum())),
        truncated_tokens=Figure.single(int((s - np.minimum(s, context)).sum())),
        empty_samples=Figure.single(empty) if empty else None,
    )


@dataclass(frozen=True)
class Run:
    result: StageResult
    lengths: np.ndarray  # as laid out: empty samples dropped, cut to the context
    layouts: dict[str, Layout]  # the first shuffle's, for pictures


def run(plan: Plan, progress: Progress = _no_progress, stdin: IO[str] | None = None) -> Run:
    stdin = stdin if stdin is not None else plan.stdin
    if plan.current not in STRATEGIES:
        raise UsageError(f"--current {plan.current}: one of {', '.join(STRATEGIES)}")
    data = load(plan, progress, stdin)
    raw = data.lengths
    empty = int((raw == 0).sum())
    if empty == raw.size:
        raise UsageError("every sample has 0 tokens: nothing to batch")
    lengths = np.minimum(raw[raw > 0], plan.context)
    caveats = list(data.caveats)
    if empty:
        caveats.append(
            Caveat(
                "pad.empty-samples",
                f"{empty:,} samples with 0 tokens left out (nothing to train on)",
            )
        )

    ideal = float((lengths.astype(np.float64) ** 2).sum())
    costs: list[Cost] = []
    shuffles = plan.shuffles(int(lengths.size))
    layouts: dict[str, Layout] = {}
    laid_out = clocks.perf_counter()
    for i, name in enumerate(STRATEGIES):
        seeds = [plan.seed + k for k in range(shuffles if name in SHUFFLED else 1)]
        figs = []
        for seed in seeds:
            lay = packing.layout(name, lengths, plan.context, plan.batch_size, seed)
            layouts.setdefault(name, lay)
            figs.append(packing.figures(lay, lengths))
        costs.append(_cost(name, figs, ideal))
        progress("laying out batches", i + 1, len(STRATEGIES))
    layout_s = clocks.perf_counter() - laid_out
    lengths_fed = _lengths(raw, lengths, plan.context, empty)
    figures = PadFigures(lengths_fed, Figure.single(ideal), tuple(costs))

    unmasked = [
        f"{c.strategy} {_x(value_of(c.attention_unmasked_vs_ideal))}"
        for c in figures.costs
        if c.strategy in SHARES_ROWS
    ]
    caveats.append(
        Caveat(
            "pad.shared-rows",
            "padding_free and the packing strategies put several samples in one sequence: "
            "without a per-document attention mask (FlashAttention varlen through position_ids "
            "or cu_seqlens) samples attend to each other, and attention costs "
            f"{', '.join(unmasked)} the ideal instead of 1x",
        )
    )
    if shuffles < SHUFFLES:
        caveats.append(
            Caveat(
                "pad.few-shuffles",
                f"shuffled strategies laid out over {shuffles} shuffle(s), not {SHUFFLES}: "
                f"{lengths.size:,} samples vary little from one shuffle to the next",
            )
        )
    params = {
        **plan.parameters(),
        **data.details,
        "shuffles": shuffles,
        "layout_s": round(layout_s, 3),
    }
    result = StageResult(
        stage="pad",
        parameters=params,
        metrics=figures.to_metrics(),
        caveats=tuple(caveats),
    )
    return Run(result, lengths, layouts)


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}x"


class PadStage(BaseStage[PadOptions, Plan]):
    """`pad` in the registry (stages/base.Stage)."""

    name = "pad"

    def plan(self, options: PadOptions, ctx: RunContext) -> Plan:
        """`options` as the command parsed them (`fields` split and checked)."""
        dataset, lengths = options.dataset, options.lengths
        if dataset is not None and lengths is not None:
            raise UsageError("--dataset and --lengths: choose one source of lengths")
        if dataset is None:
            for option, given in (
                ("--tokenizer", options.tokenizer),
                ("--field", options.fields),
                ("--format", options.format),
            ):
                if given:
                    raise UsageError(f"{option} applies to --dataset")
        if lengths == "" or dataset == "":
            raise UsageError(f"{'--lengths' if lengths == '' else '--dataset'} needs a path")
        quick = options.quick and (dataset or lengths)
        return Plan(
            context=options.context,
            batch_size=options.batch_size,
            current=options.current,
            seed=options.seed,
            limit=options.limit or (PadOptions.QUICK_LIMIT if quick else None),
            dataset=dataset,
            fmt=options.format,
            fields=options.fields,
            tokenizer=options.tokenizer,
            lengths=lengths,
            stdin=options.stdin,
        )

    def doctor_plan(self, workload: Workload, quick: bool, ctx: RunContext) -> Plan:
        w = workload
        return Plan(
            context=w.context,
            batch_size=w.batch_size,
            current=w.current,
            limit=PadOptions.QUICK_LIMIT if quick and w.dataset else None,
            dataset=w.dataset,
            fields=w.field,
            tokenizer=w.tokenizer if w.dataset else None,
        )

    def measure_all(self, plan: Plan, ctx: RunContext) -> Measured:
        """The result and the layouts behind it (pad --plot draws a batch of each)."""
        out = run(plan, ctx.progress)
        return Measured(out.result, pad_run=out)


STAGE = PadStage()
