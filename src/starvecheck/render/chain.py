"""doctor's own parts of a report, as rows: the workload, the chain with its weakest
link, and (under torchrun) one row per node. Plain cells for the terminal and Markdown
renderers, which style them; reads the report only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from starvecheck.core.jsonvalue import JsonObject
from starvecheck.core.report import CHAIN_LINKS as LINKS
from starvecheck.core.report import Link, Report
from starvecheck.core.schema.nodes import Node
from starvecheck.core.units import format_bytes

CHAIN_HEADERS = ("link", "capacity samples/s", "vs demand", "from", "")
WORKLOAD_HEADERS = ("workload", "value", "source")
MARKER = "<- weakest"


def shows(report: Report) -> bool:
    return bool(report.chain or report.workload)


def rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def workload_rows(workload: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(key, value, where it came from); optional inputs only where given."""
    rows = []
    for key, entry in workload.items():
        value, source = entry.get("value"), entry.get("source", "")
        if key == "dataset" and value is None:
            rows.append((key, "pad's embedded Alpaca-like default", source))
            continue
        if value is None or value == []:
            if key == "step_ms":
                rows.append((key, "not known", source))
            continue
        rows.append((key, _show(key, value), source))
    return rows


def _show(key: str, value: Any) -> str:
    if key == "sample_size":
        return f"{format_bytes(value)} per sample on disk"
    if key in ("step_ms", "cpu_ms_per_sample"):
        return f"{value:g} ms" + (" per sample" if key == "cpu_ms_per_sample" else " per step")
    if key == "context":
        return f"{value:,} tokens"
    if key == "token_bytes":
        return f"{value} bytes per token id on the wire"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def demand_line(report: Report) -> str:
    demand = next((x.demand for x in report.chain if x.demand), None)
    if demand is None:
        return "The GPU's demand is not known (no step time)."
    w = report.workload
    batch = cast(JsonObject, w.get("batch_size", {})).get("value")
    step = cast(JsonObject, w.get("step_ms", {}))
    return (
        f"The GPU consumes {rate(demand)} samples/s (batch {batch} every "
        f"{step.get('value'):g} ms, {step.get('source')})."
    )


def chain_rows(chain: Sequence[Link], weakest_name: str | None) -> list[tuple[str, ...]]:
    """One row per link in chain order; the weakest carries the marker."""
    order = {name: i for i, name in enumerate(LINKS)}
    rows: list[tuple[str, ...]] = []
    for link in sorted(chain, key=lambda x: order.get(x.link, len(LINKS))):
        ratio = link.ratio
        name = link.link + (f" ({link.limited_by})" if link.limited_by else "")
        rows.append(
            (
                name,
                rate(link.capacity),
                f"{ratio:,.2f}x" if ratio is not None else "",
                link.basis if link.capacity is not None else (link.reason or ""),
                MARKER if link.link == weakest_name else "",
            )
        )
    return rows


def weakest_line(report: Report) -> str:
    return report.weakest_summary


def node_headers(nodes: Sequence[Node]) -> tuple[str, ...]:
    return ("host", "rank", *LINKS, "data pipeline", "")


def node_rows(nodes: Sequence[Node]) -> list[tuple[str, ...]]:
    return [
        (
            n.host,
            str(n.rank),
            *(rate(n.capacity_samples_per_s.get(link)) for link in LINKS),
            rate(n.data_pipeline_samples_per_s),
            "<- straggler" if n.straggler else "",
        )
        for n in nodes
    ]
