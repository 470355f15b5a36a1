"""Judging a `pad` run: how much of each step the current batching spends on
padding, the strategy that wastes least, and the one-line change to get there.

Reads the run's figures as their record (core/schema/pad.PadFigures,
`StageResult.records`), by field, so a stored report is judged as a fresh one. The
gain is a ratio of efficiencies: the same real tokens in fewer computed positions,
with step time taken as proportional to positions (true of the linear layers, which
dominate; attention is reported on its own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starvecheck.core import catalogue
from starvecheck.core.model import Finding, Gain, GainKind, Severity
from starvecheck.core.schema.figure import value_of
from starvecheck.core.schema.pad import Lengths, PadFigures, Parameters
from starvecheck.core.strategies import LABELS, SHARES_ROWS, STRATEGIES

if TYPE_CHECKING:
    from starvecheck.advice.results import Results

CRITICAL_GAIN = 2.0
WARNING_GAIN = 1.25
INFO_GAIN = 1.05
CUT_WARNING = 0.01  # share of all tokens cut by the context


def change(strategy: str, context: int) -> str:
    """The one-line change that trains with `strategy`, in Hugging Face / PyTorch terms."""
    return {
        "pad_to_context": f'tokenize with `padding="max_length", max_length={context}`',
        "dynamic": "tokenize with `padding=False` and batch with "
        "`DataCollatorWithPadding(tokenizer)`",
        "dynamic_mult8": "`DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)`",
        "dynamic_mult64": "`DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64)`",
        "length_grouped": "`TrainingArguments(group_by_length=True)` with "
        "`DataCollatorWithPadding(tokenizer)` (plain PyTorch: a batch sampler that sorts "
        "mega-batches of 50 batches by length)",
        "padding_free": "`DataCollatorWithFlattening()` and "
        '`from_pretrained(..., attn_implementation="flash_attention_2")` (TRL: '
        "`SFTConfig(padding_free=True)`)",
        "greedy_pack": f"concatenate samples in order into rows of {context} tokens, a new "
        "row when the next does not fit, with `position_ids` restarting at each sample",
        "ffd_pack": f'TRL `SFTConfig(packing=True, packing_strategy="bfd", '
        f"max_length={context})` (best-fit decreasing packs as tightly as first-fit)",
        "bfd_pack": f'TRL `SFTConfig(packing=True, packing_strategy="bfd", max_length={context})`',
    }[strategy]


def rules(results: Results) -> list[Finding]:
    m = results.get("pad")
    if m is None:
        return []
    figures = m.records(PadFigures)
    eff: dict[str, float] = dict(figures.efficiencies().items())
    if not eff:
        return []
    params = m.parameters.read(Parameters)
    findings = [_waste(figures, eff, params), _truncated(figures.lengths, params)]
    return [f for f in findings if f is not None]


def _best(eff: Mapping[str, float], among: Sequence[str]) -> str | None:
    names = [s for s in STRATEGIES if s in among and s in eff]
    # Ties go to the first listed: the simpler strategy.
    return max(names, key=lambda s: (round(eff[s], 4), -STRATEGIES.index(s)), default=None)


@dataclass(frozen=True)
class Waste:
    """What pad measured of the padding trained with today: the detection behind
    `pad.waste`, apart from the words it is said in."""

    current: str  # the strategy trained with today
    best: str  # the most real tokens per computed position
    padded_best: str | None  # the best that keeps samples in rows of their own
    gain: float  # best's real tokens per position over current's
    severity: Severity
    embedded: bool  # judged on pad's embedded lengths, not the user's


def waste(eff: Mapping[str, float], params: Parameters) -> Waste | None:
    current = params.current or "dynamic"
    if current not in eff or eff[current] <= 0:
        return None
    best = _best(eff, STRATEGIES)
    assert best is not None
    gain = eff[best] / eff[current]
    padded_best = _best(eff, [s for s in STRATEGIES if s not in SHARES_ROWS])
    severity = (
        Severity.OK
        if gain < INFO_GAIN
        else Severity.CRITICAL
        if gain >= CRITICAL_GAIN
        else Severity.WARNING
        if gain >= WARNING_GAIN
        else Severity.INFO
    )
    embedded = params.lengths_source == "default"
    if embedded and severity is not Severity.OK:
        # Judged on lengths the user never gave: a hint, never a verdict on their job.
        severity = min(severity, Severity.WARNING, key=lambda x: x.rank)
    return Waste(current, best, padded_best, gain, severity, embedded)


def _waste_evidence(
    w: Waste, figures: PadFigures, eff: Mapping[str, float], params: Parameters
) -> str:
    current, best = w.current, w.best
    mean, p90 = value_of(figures.lengths.mean), value_of(figures.lengths.p90)
    cost = figures.cost(current)
    padding = value_of(cost.padding_positions) if cost is not None else None
    others = ", ".join(
        f"{s} {eff[s]:.1%}" for s in STRATEGIES if s in eff and s not in (current, best)
    )
    return (
        f"{current}: {eff[current]:.1%} of computed positions are real tokens"
        + (f" ({padding:,.0f} padding positions per epoch)" if padding is not None else "")
        + f"; {best}: {eff[best]:.1%}; {others}."
        + (
            f" Samples: mean {mean:,.0f} tokens, p90 {p90:,.0f}; context {params.context:,}, "
            f"batch {params.batch_size}."
            if mean is not None and p90 is not None
            else ""
        )
    )


def _waste_change(w: Waste, figures: PadFigures, eff: Mapping[str, float], context: int) -> str:
    """How to switch to the best strategy, and the padded one where the best needs
    attention that keeps samples apart."""
    best, current, padded_best = w.best, w.current, w.padded_best
    recommendation = f"Switch to {LABELS[best]}: {change(best, context)}."
    if best in SHARES_ROWS:
        cost = figures.cost(best)
        unmasked = value_of(cost.attention_unmasked_vs_ideal) if cost is not None else None
        recommendation += (
            " It needs attention that keeps samples apart (FlashAttention 2/3 with "
            "position_ids): without it samples attend to each other"
            + (f" and attention costs {unmasked:,.1f}x the ideal." if unmasked else ".")
        )
        if padded_best is not None and padded_best != current:
            alt = eff[padded_best] / eff[current]
            if alt >= INFO_GAIN:
                recommendation += (
                    f" If your model cannot: {LABELS[padded_best]}, {change(padded_best, context)}"
                    f" ({eff[padded_best]:.1%} real, {alt:.2f}x)."
                )
    return recommendation


def _waste(figures: PadFigures, eff: Mapping[str, float], params: Parameters) -> Finding | None:
    w = waste(eff, params)
    if w is None:
        return None
    current, best = w.current, w.best
    evidence = _waste_evidence(w, figures, eff, params)
    basis = (
        f"real tokens per computed position, {best} over {current}; step time taken as "
        "proportional to positions"
    )
    gain = Gain(GainKind.THROUGHPUT, round(w.gain, 3), basis)
    if w.severity is Severity.OK:
        return Finding(
            catalogue.PAD_WASTE,
            Severity.OK,
            f"{LABELS[current].capitalize()} wastes little: {eff[current]:.0%} of positions "
            "are real tokens",
            evidence=evidence,
            gain=gain,
            stage="pad",
        )
    title = (
        f"{LABELS[current].capitalize()} spends {1 - eff[current]:.0%} of each step on "
        f"padding; {LABELS[best]} would do {w.gain:.2f}x the real work"
    )
    if w.embedded:
        title += " (on the embedded Alpaca-like lengths, not your data)"
        evidence += (
            " Lengths: pad's embedded Alpaca-like default, not your dataset; measure yours "
            "with --dataset FILE --tokenizer DIR, or --lengths FILE."
        )
    return Finding(
        catalogue.PAD_WASTE,
        w.severity,
        title,
        evidence=evidence,
        recommendation=_waste_change(w, figures, eff, params.context),
        gain=gain,
        stage="pad",
        fix={"strategy": best},
    )


def _truncated(lengths: Lengths, params: Parameters) -> Finding | None:
    n, cut = value_of(lengths.truncated_samples), value_of(lengths.truncated_tokens)
    samples, tokens = value_of(lengths.samples), value_of(lengths.tokens)
    if not n or cut is None or not samples or tokens is None:
        return None
    context = params.context
    share = cut / (tokens + cut)
    longest, p99 = value_of(lengths.max), value_of(lengths.p99)
    if p99 is not None and p99 > context:
        change = (
            f"Raise max_length to cover most of them (p99 is {p99:,.0f} tokens), or split "
            f"long documents into {context:,}-token pieces before batching (TRL "
            '`packing_strategy="wrapped"` splits; "bfd" cuts)'
        )
    else:
        change = (
            f"Keep max_length: fewer than 1% of samples pass it. To lose nothing, split "
            f"those into {context:,}-token pieces before batching (TRL "
            '`packing_strategy="wrapped"` splits; "bfd" cuts)'
        )
    return Finding(
        catalogue.PAD_TRUNCATED,
        Severity.WARNING if share >= CUT_WARNING else Severity.INFO,
        f"{n:,.0f} samples ({_share(n / samples)}) are longer than the context of "
        f"{context:,} tokens",
        evidence=(
            f"{cut:,.0f} tokens ({_share(share)} of all) would be cut; longest "
            f"{longest:,.0f} tokens, p99 {p99:,.0f}. Every strategy above counts them cut "
            f"to {context:,}."
        ),
        recommendation=change,
        stage="pad",
    )


def _share(x: float) -> str:
    return "<0.1%" if 0 < x < 0.001 else f"{x:.1%}"
