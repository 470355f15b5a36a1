"""Judging, once per report: every stage result of the run in, findings out.

Commands and doctor measure first, then call `judge` once with everything they
measured. Each advice module (`advice/<stage>.py`) exposes `rules(results)`, which
reads the stages it needs from `results` (its own, and any other it wants: io's
measured read speed against env's rotational flag, say) and returns findings; a
module whose stage is not in the run returns nothing. Cross-stage rules live here,
after every module has spoken, so the checklist never contradicts itself.

Before the rules, the modules whose judgement the report carries beside the figures
complete their stage's result (`complete(result)`, named in the stage table): loader's
and starve's recommended num_workers and loader's capacity, pcie's overlap verdicts. The rules, the
chain and the report (through `attach`) all read those completed results.

advice/ imports the model, probe facts and the workload, never stages/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from starvecheck.advice.results import Results
from starvecheck.core import catalogue
from starvecheck.core import stages as stages_table
from starvecheck.core.model import Finding, StageResult
from starvecheck.core.report import Link
from starvecheck.core.schema.steps import Straggler


@dataclass(frozen=True)
class Judgement:
    findings: tuple[Finding, ...]  # every finding, each with its `stage`
    checklist: tuple[Finding, ...]  # ranked, ok findings left out
    verdict: str
    chain: tuple[Link, ...] = ()
    weakest_link: str | None = None
    weakest_summary: str = ""  # the sentence under the chain table
    # The straggler verdict across ranks of watch and of a multi-rank trace, by stage:
    # it lands in that stage's judgement.
    stragglers: Mapping[str, Straggler] = field(default_factory=dict)
    # Each stage's result as judged (`complete`d): what the report carries.
    stages: Mapping[str, StageResult] = field(default_factory=dict)

    def for_stage(self, stage: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.stage == stage)


def complete(results: Results) -> Results:
    """The results with each stage's completed by its module (the stage table's
    `complete`)."""
    stages = {name: _completed(name, r) for name, r in results.stages.items()}
    return replace(results, stages=stages)


def _completed(name: str, r: StageResult) -> StageResult:
    module = stages_table.entry(name).complete
    if module is None:
        return r
    return stages_table.load(module).complete(r)  # type: ignore[no-any-return]


def advise_all(results: Results) -> list[Finding]:
    """Every stage's findings from the advice modules that judge it (its row of the
    stage table, core/stages.py), in the order they are asked; doctor's own are judged
    with the chain."""
    found: list[Finding] = []
    for stage in results.stages:
        for module in stages_table.entry(stage).judge:
            rules = stages_table.load(module).rules
            found += [_stamped(f, stage) for f in rules(results)]
    return found


def judge(results: Results) -> Judgement:
    from starvecheck.advice import rank, stragglers, verdict

    results = complete(results)
    # Findings made outside the stages' rules (doctor's stragglers across ranks).
    findings = [*advise_all(results), *results.doctor.findings]
    chain: tuple[Link, ...] = ()
    weakest, summary = None, ""
    if results.workload is not None:
        from starvecheck.advice import chain as chain_rules

        chain, w, findings = chain_rules.judge(results, findings)
        weakest, summary = w.link, w.message
    findings = reconcile(findings)
    checklist = rank(findings)
    return Judgement(
        tuple(findings),
        checklist,
        verdict(checklist, len(findings)),
        chain,
        weakest,
        summary,
        stragglers.verdicts(results.stages, findings),
        results.stages,
    )


# Cross-stage rules: one judgement per report.

# A flag that a measurement of the same thing replaces: (flag, measurement).
MEASURED_BEATS_FLAGGED = ((catalogue.ENV_ROTATIONAL_STORAGE, catalogue.IO_ROTATIONAL),)


def reconcile(findings: Sequence[Finding]) -> list[Finding]:
    """Findings that contradict each other, resolved: a measurement replaces the flag
    it measured (io's cold reads against env's rotational flag), and each setting gets
    one value per layout (`fix`): the most direct measurement's. A finding that
    recommended another value points at that one instead, and a passed check that
    asserted another value goes."""
    ids = {f.id for f in findings}
    out = [
        f
        for f in findings
        if not any(f.id == flag and measured in ids for flag, measured in MEASURED_BEATS_FLAGGED)
    ]
    return _one_value_per_setting(out)


def _authority(f: Finding, key: str) -> tuple[int, float, int]:
    """Whose value of a setting wins, lowest first: who measured it most directly (the
    stage table's `authority`: the user's own loop; the DataLoader over the data and the
    CPU sweep, one measuring the reads, the other the CPU work, and the workers must do
    both, so the larger count of the two; the storage's readers; env's rule of thumb
    last), then the larger value, then a finding to act on before a passed check."""
    tier = stages_table.entry(f.stage).authority
    v = f.fix[key]
    larger = -float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0
    return (tier, larger, 0 if f.severity.value != "ok" else 1)


def _one_value_per_setting(findings: list[Finding]) -> list[Finding]:
    keys = sorted({k for f in findings for k in f.fix if k != "layout"})
    for key in keys:
        holders = sorted((f for f in findings if key in f.fix), key=lambda f: _authority(f, key))
        winners: list[Finding] = []  # one per layout (None: any layout)
        for f in holders:
            layout = f.fix.get("layout")
            rival = next(
                (w for w in winners if layout is None or w.fix.get("layout") in (None, layout)),
                None,
            )
            if rival is None:
                winners.append(f)
                continue
            if rival.fix[key] == f.fix[key]:
                continue
            i = findings.index(f)
            if f.severity.value == "ok":
                findings.pop(i)  # a passed check may not assert another value
                continue
            scope = f" for {rival.fix['layout']}" if rival.fix.get("layout") else ""
            findings[i] = replace(
                f,
                recommendation=(
                    f"Set {key} as {rival.id} measured on this run: "
                    f"{key}={rival.fix[key]}{scope}. That measurement outranks {f.stage}'s "
                    "own estimate of it."
                ),
                fix={**{k: v for k, v in f.fix.items() if k != key}, key: rival.fix[key]},
            )
    return findings


def attach(results: Sequence[StageResult], judgement: Judgement) -> list[StageResult]:
    """The stage results as judged (completed: see `complete`), with their findings
    filled in from the judgement. A finding whose stage is none of the run's (watch
    reports with profile's findings) joins the run's last result: the one stage of a
    command, doctor's own in doctor. The straggler verdict across ranks joins its
    stage's judgement."""
    stages = {r.stage for r in results}
    homeless = tuple(f for f in judgement.findings if f.stage not in stages)
    out = [
        replace(judgement.stages.get(r.stage, r), findings=judgement.for_stage(r.stage))
        for r in results
    ]
    if homeless and out:
        out[-1] = replace(out[-1], findings=(*out[-1].findings, *homeless))
    return [
        replace(r, judged=replace(r.judged, straggler=judgement.stragglers[r.stage]))
        if r.stage in judgement.stragglers
        else r
        for r in out
    ]


def _stamped(f: Finding, stage: str) -> Finding:
    return f if f.stage else replace(f, stage=stage)
