"""Markdown export, for a CI job's step summary ($GITHUB_STEP_SUMMARY and the like)."""

from __future__ import annotations

from collections.abc import Sequence

from starvecheck.core.metric import Metric
from starvecheck.core.model import Finding, Severity
from starvecheck.core.report import Report
from starvecheck.core.text import escaped
from starvecheck.render import chain, facts
from starvecheck.render.sections import stage_sections

ICON = {Severity.CRITICAL: "🔴", Severity.WARNING: "🟠", Severity.INFO: "🔵", Severity.OK: "✅"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip() or " "


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _metric(m: Metric) -> tuple[str, ...]:
    if m.value is None:
        return (m.name, "n/a", m.unit, m.reason or "")
    spread = f"{m.min:.4g} … {m.max:.4g}, σ {m.stdev:.3g}, n={m.n}" if m.values else ""
    return (m.name, f"{m.value:.4g}", m.unit, spread)


def _finding(i: int, f: Finding) -> tuple[str, ...]:
    return (
        str(i),
        f"{ICON[f.severity]} {f.severity.value}",
        f"`{f.id}` {f.title}",
        f.evidence,
        f.recommendation,
        f.gain.describe() if f.gain else "not estimated",
    )


def _doctor(report: Report) -> list[str]:
    """The workload, the chain (weakest link in bold, marked), the nodes."""
    out = [
        "### Workload",
        "",
        *_table(chain.WORKLOAD_HEADERS, chain.workload_rows(report.workload)),
    ]
    if report.chain:
        rows = [
            tuple(f"**{c}**" if row[-1] and c else c for c in row)
            for row in chain.chain_rows(report.chain, report.weakest_link)
        ]
        out += [
            "",
            "### Chain",
            "",
            chain.demand_line(report),
            "",
            *_table(chain.CHAIN_HEADERS, rows),
        ]
        out += ["", f"**{chain.weakest_line(report)}**"]
    if report.nodes:
        headers = chain.node_headers(report.nodes)
        out += ["", "### Nodes", "", *_table(headers, chain.node_rows(report.nodes))]
    return [*out, ""]


def serialize(report: Report) -> str:
    """The report as Markdown, every string in it escaped first (core/text.py): control
    characters from a path or a name would reach the terminal that shows the file.
    Newlines stay: a table cell turns them into blanks, the rest of the page into a
    line break."""
    report = escaped(report, keep="\n")
    out = [f"## starvecheck {report.command}", "", f"**Verdict:** {report.verdict}", ""]
    if chain.shows(report):
        out += _doctor(report)
    machine = facts.sections(report)
    if machine and machine[0].rows:
        out += ["### Machine", ""]
        out += _table(("", ""), [(f"**{k}**", v) for k, v in machine[0].rows])
        out.append("")
        for gpus in (s for s in machine if s.title == facts.GPUS):
            out += [f"### {gpus.title}", "", *_table(gpus.headers, gpus.rows), ""]
    for stage in report.stages:
        sections, rest = stage_sections(stage)
        if stage.figures:
            out += [f"### {stage.reported_as}", ""]
        for section in sections:
            if section.rows:
                if section.title:
                    out += [f"**{section.title}**", ""]
                out += [*_table(section.headers, section.rows), ""]
            if section.notes:
                out += [*(f"_{n}_" for n in section.notes), ""]
        if rest:
            out += _table(("metric", "value", "unit", "spread"), [_metric(m) for m in rest])
            out.append("")
        for caveat in stage.said:
            out.append(f"> ⚠️ {stage.reported_as}: {caveat}")
        if stage.said:
            out.append("")
    out += ["### Checklist", ""]
    if report.checklist:
        out += _table(
            ("#", "severity", "finding", "evidence", "change", "expected gain"),
            [_finding(i, f) for i, f in enumerate(report.checklist, 1)],
        )
    else:
        out.append("Nothing to change.")
    passed = [f for f in report.findings if f.severity is Severity.OK]
    if passed:
        out += ["", "**Passed:** " + "; ".join(f"`{f.id}` {f.title}" for f in passed)]
    return "\n".join(out) + "\n"
