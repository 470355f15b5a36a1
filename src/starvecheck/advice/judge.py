"""Judging, once per report: every stage result of the run in, findings out.

Commands and doctor measure first, then call `judge` once with everything they
measured. Each advice module (`advice/<stage>.py`) exposes `rules(results)`, which
reads the stages it needs from `results` (its own, and any other it wants: io's
measured read speed against env's rotational flag, say) and returns findings; a
module whose stage is not in the run returns nothing. Cross-stage rules live here,
after every module has spoken, so the checklist never contradicts itself.

advice/ imports the model, probe facts and the workload, never stages/.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from starvecheck.model import Finding, Link, StageResult

if TYPE_CHECKING:
    from starvecheck.probe.machine import Machine
    from starvecheck.workload import Workload

# The advice modules that judge each stage, in the order their findings are gathered.
MODULES: dict[str, tuple[str, ...]] = {
    "env": ("starvecheck.advice.env",),
    "io": ("starvecheck.advice.io",),
    "loader": ("starvecheck.advice.loader",),
    "starve": ("starvecheck.advice.starve",),
    "pad": ("starvecheck.advice.pad",),
    "pcie": ("starvecheck.advice.pcie",),
    # profile's loop, and a trace of another run (`profile --trace`), which reports
    # under the same stage: each module judges the kind it knows.
    "profile": ("starvecheck.advice.profile", "starvecheck.advice.trace"),
    "watch": ("starvecheck.advice.trace",),  # a user's own loop, timed by starvecheck.watch
}


@dataclass(frozen=True)
class Results:
    """Everything one run measured, as judging sees it."""

    stages: Mapping[str, StageResult]
    machine: Machine | None = None  # this machine's facts (None for a trace of another run)
    workload: Workload | None = None  # doctor's; None for a single command
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. doctor's GPU basis

    def get(self, stage: str) -> StageResult | None:
        return self.stages.get(stage)

    def __contains__(self, stage: str) -> bool:
        return stage in self.stages


@dataclass(frozen=True)
class Judgement:
    findings: tuple[Finding, ...]  # every finding, each with its `stage`
    checklist: tuple[Finding, ...]  # ranked, ok findings left out
    verdict: str
    chain: tuple[Link, ...] = ()
    weakest_link: str | None = None
    weakest_summary: str = ""  # the sentence under the chain table

    def for_stage(self, stage: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.stage == stage)


def advise_all(results: Results) -> list[Finding]:
    found: list[Finding] = []
    for stage in results.stages:
        for module in MODULES.get(stage, ()):  # doctor's own is judged with the chain
            rules = importlib.import_module(module).rules
            found += [_stamped(f, stage) for f in rules(results)]
    return found


def judge(results: Results) -> Judgement:
    from starvecheck.advice import rank, verdict

    # Findings made outside the stages' rules (doctor's stragglers across ranks).
    findings = [*advise_all(results), *results.extra.get("findings", ())]
    chain: tuple[Link, ...] = ()
    weakest, summary = None, ""
    if results.workload is not None:
        from starvecheck.advice import chain as chain_rules

        chain, w, findings = chain_rules.judge(results, findings)
        weakest, summary = w.link, w.message
    checklist = rank(findings)
    return Judgement(
        tuple(findings), checklist, verdict(checklist, len(findings)), chain, weakest, summary
    )


def attach(results: Sequence[StageResult], judgement: Judgement) -> list[StageResult]:
    """The stage results with their findings filled in from the judgement. A finding
    whose stage is none of the run's (watch reports with profile's findings) joins the
    run's last result: the one stage of a command, doctor's own in doctor."""
    stages = {r.stage for r in results}
    homeless = tuple(f for f in judgement.findings if f.stage not in stages)
    out = [replace(r, findings=judgement.for_stage(r.stage)) for r in results]
    if homeless and out:
        out[-1] = replace(out[-1], findings=(*out[-1].findings, *homeless))
    return out


def _stamped(f: Finding, stage: str) -> Finding:
    return f if f.stage else replace(f, stage=stage)
