"""The terminal report: facts, metrics, caveats, then the ranked checklist and a verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from starvecheck.core.metric import Metric
from starvecheck.core.model import Finding, Severity
from starvecheck.core.report import Report
from starvecheck.core.text import escaped
from starvecheck.render import chain, facts
from starvecheck.render.sections import stage_sections

if TYPE_CHECKING:
    from rich.console import Console

STYLE = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: "cyan",
    Severity.OK: "green",
}


def as_text(report: Report, console: Console) -> str:
    """The report as `render` prints it on `console`, as one string: what a command
    writes to stdout and `watch` to its file. rich pads table cells to the full width;
    the trailing blanks are cut, as they only get in the way of copy-paste and diffs."""
    with console.capture() as captured:
        render(report, console)
    return "\n".join(line.rstrip() for line in captured.get().split("\n"))


def render(report: Report, console: Console) -> None:
    """Print the report on `console`. Every string in it is escaped first (core/text.py):
    a path, a mount point or a name from the user's code never reaches the terminal
    raw, and the tables are laid out at the width of what they show."""
    from rich.table import Table
    from rich.text import Text

    report = escaped(report)
    heading = Text(f"starvecheck {report.command}", style="bold")
    machine = report.facts
    if machine.hostname:
        heading.append(f" · {machine.hostname}")
    if machine.kernel:
        heading.append(f" · Linux {machine.kernel}")
    console.print(heading)
    if chain.shows(report):
        _doctor(report, console)

    for section in facts.sections(report):
        if section.title == facts.MACHINE:
            console.print(_facts(section.rows, console.width))
        elif section.rows:  # the GPUs
            gpus = Table(*section.headers, box=None, header_style="bold", pad_edge=False)
            gpus.columns[1].no_wrap = True
            for row in section.rows:
                gpus.add_row(*row)
            console.print()
            console.print(gpus)
        else:  # the unknown facts
            console.print()
            console.print(Text(section.title or "", style="bold"))
            for note in section.notes:
                console.print(Text(f"  {note}", style="dim"))

    for stage in report.stages:
        sections, rest = stage_sections(stage)
        tables = False
        for section in sections:
            if section.rows:
                console.print()
                title = section.title or stage.reported_as
                table = _table(title, section.headers, section.rows, section.right)
                console.print(_fitting(console, table, title, section.headers, section.rows))
                tables = True
            elif not tables:  # notes without a table above them: name the stage first
                console.print()
                console.print(Text(stage.reported_as, style="bold"))
            for line in section.notes:
                console.print(Text(line, style="dim"))
        if rest:
            console.print()
            title = "" if tables else stage.reported_as
            rows = [_metric_row(m) for m in rest]
            table = _metrics_table(title, tuple(rest))
            console.print(_fitting(console, table, title, METRIC_HEADERS, rows))
        for caveat in stage.said:
            console.print(Text(f"! {stage.reported_as}: {caveat}", style="yellow"))

    console.print()
    console.print(
        Text("Checklist", style="bold underline"),
        Text(" (ranked by expected gain, then severity)", style="dim"),
    )
    if not report.checklist:
        console.print("  nothing to change")
    for i, f in enumerate(report.checklist, 1):
        console.print(_finding_block(i, f, console.width))
    passed = [f for f in report.findings if f.severity is Severity.OK]
    if passed:
        console.print()
        console.print(
            Text("Passed: ", style="bold green") + Text("; ".join(f.title for f in passed))
        )
    console.print()
    worst = report.checklist[0].severity if report.checklist else Severity.OK
    console.print(Text(report.verdict, style=f"bold {STYLE[worst]}"))


def _doctor(report: Report, console: Console) -> None:
    """The workload, then the chain with its weakest link in bold red, then the nodes."""
    from rich.table import Table
    from rich.text import Text

    console.print()
    grid = Table(*chain.WORKLOAD_HEADERS, box=None, header_style="bold", pad_edge=False)
    grid.columns[0].no_wrap = True  # a key is never cut: where it does not fit, stacked
    grid.columns[2].style = "dim"
    workload: list[tuple[str, ...]] = list(chain.workload_rows(report.workload))
    for row in workload:
        grid.add_row(*row)
    console.print(_fitting(console, grid, "", chain.WORKLOAD_HEADERS, workload))
    if report.chain:
        console.print()
        console.print(Text(chain.demand_line(report)))
        table = _table("chain", chain.CHAIN_HEADERS, [], right=range(1, 3))
        table.columns[3].overflow = "fold"
        rows = list(chain.chain_rows(report.chain, report.weakest_link))
        for row in rows:
            style = "bold red" if row[-1] else ("dim" if row[1] == "n/a" else None)
            table.add_row(*row, style=style)
        console.print(_fitting(console, table, "chain", chain.CHAIN_HEADERS, rows))
        console.print(Text(chain.weakest_line(report), style="bold"))
    if report.nodes:
        console.print()
        rows = chain.node_rows(report.nodes)
        headers = chain.node_headers(report.nodes)
        table = _table("nodes", headers, [], right=range(1, len(headers) - 1))
        for row in rows:
            table.add_row(*row, style="bold red" if row[-1] else None)
        console.print(_fitting(console, table, "nodes", headers, rows))
    console.print()


# Below this many columns a label beside its value leaves the value no room (a grid's
# label column is never wrapped, and rich drops a column it cannot fit): each label is
# printed above its value instead, and both wrap.
NARROW = 32


def _facts(rows: list[tuple[str, ...]], width: int) -> Any:
    """The machine's facts: label and value side by side, or stacked where narrow."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if width < NARROW:
        return Group(*(Text(f"{label}\n  {value}") for label, value in rows))
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")  # fold long cgroup paths rather than cut them
    for label, value in rows:
        facts.add_row(label, value)
    return facts


def _finding_block(i: int, f: Finding, width: int = 100) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if width < NARROW:
        lines = [
            Text(f"{i:>2}. ")
            + Text(f.severity.value.upper(), style=STYLE[f.severity])
            + Text(f" {f.title}", style="bold")
            + Text(f" [{f.id}]", style="dim")
        ]
        for label, text in (("evidence", f.evidence), ("change", f.recommendation)):
            if text:
                lines.append(Text(f"  {label}: ", style="dim") + Text(text))
        gain = f.gain.describe() if f.gain else "not estimated"
        lines.append(Text("  gain: ", style="dim") + Text(gain))
        return Group(*lines)
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True, min_width=4)
    grid.add_column(no_wrap=True, min_width=9)
    grid.add_column(overflow="fold")
    head = Text(f.title, style="bold") + Text(f"  [{f.id}]", style="dim")
    grid.add_row(f"{i:>2}.", Text(f.severity.value.upper(), style=STYLE[f.severity]), head)
    if f.evidence:
        grid.add_row("", Text("evidence", style="dim"), f.evidence)
    if f.recommendation:
        grid.add_row("", Text("change", style="dim"), f.recommendation)
    grid.add_row("", Text("gain", style="dim"), f.gain.describe() if f.gain else "not estimated")
    return grid


def _table(
    title: str, headers: tuple[str, ...], rows: Sequence[tuple[str, ...]], right: range
) -> Any:
    """A measurement table: first column never wrapped, numbers right-aligned, rows whose
    figure is n/a dimmed (their reason is printed below the table)."""
    from rich.table import Table

    table = Table(
        *headers,
        title=title,
        title_justify="left",
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    table.columns[0].no_wrap = True
    for column in table.columns[1:]:
        column.overflow = "fold"  # a figure too wide for its cell wraps; it is never cut
    for i in right:
        table.columns[i].justify = "right"
    for row in rows:
        table.add_row(*row, style="dim" if "n/a" in row else None)
    return table


def _fitting(
    console: Any, table: Any, title: str, headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]
) -> Any:
    """The table, or where even its narrowest layout (each column as wide as its longest
    word) is wider than the terminal, its rows stacked: rich would otherwise cut words
    into pieces across lines, or drop whole columns."""
    unbounded = console.options.update(max_width=1 << 16)  # else measured to the width
    if console.width < NARROW or console.measure(table, options=unbounded).minimum > console.width:
        return _stacked(title, headers, rows)
    return table


def _stacked(title: str, headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> Any:
    """A table on a narrow terminal: each row's first cell, then each other cell under
    it with its header, every line wrapped (nothing cut, no column dropped)."""
    from rich.console import Group
    from rich.text import Text

    lines = [Text(title, style="italic")] if title else []
    for row in rows:
        lines.append(Text(row[0], style="bold"))
        cells = zip(headers[1:], row[1:], strict=False)
        lines += [Text(f"  {h}: {cell}" if h else f"  {cell}") for h, cell in cells if cell]
    return Group(*lines)


METRIC_HEADERS = ("metric", "value", "unit", "min … max", "σ", "n")


def _metric_row(m: Metric) -> tuple[str, ...]:
    if m.value is None:
        return (m.name, "n/a", m.unit, m.reason or "", "", "")
    if m.values:
        spread = f"{m.min:.4g} … {m.max:.4g}"
        return (m.name, f"{m.value:.4g}", m.unit, spread, f"{m.stdev:.3g}", str(m.n))
    return (m.name, f"{m.value:.4g}", m.unit, "", "", "")


def _metrics_table(stage: str, metrics: tuple[Metric, ...]) -> Any:
    from rich.table import Table

    table = Table(
        *METRIC_HEADERS,
        title=stage or None,
        title_justify="left",
        box=None,
        header_style="bold",
        pad_edge=False,
    )
    for m in metrics:
        table.add_row(*_metric_row(m))
    return table
