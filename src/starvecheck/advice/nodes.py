"""Many nodes: one row per rank, and the stragglers among them.

In synchronous data-parallel training every step waits for the slowest rank, so one
node whose data pipeline is slow slows the whole job. A rank is a straggler when its
data-pipeline capacity (the lower of storage and loader) is below 80% of the median
across ranks. Pure functions of the ranks' reports (as `Report.to_dict()` gives them).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from starvecheck.model import Finding, Gain, GainKind, Severity

STRAGGLER_SHARE = 0.8
PIPELINE_LINKS = ("storage", "loader")


def data_pipeline(capacities: Mapping[str, float | None]) -> float | None:
    """The lower of the storage and loader capacities that were measured."""
    known = [v for k, v in capacities.items() if k in PIPELINE_LINKS and v is not None]
    return min(known) if known else None


def rows(payloads: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per rank, by rank: host, each link's capacity, the data pipeline."""
    out = []
    for p in sorted(payloads, key=lambda p: p["rank"]):
        chain = p["report"].get("chain", [])
        caps = {x["link"]: x.get("capacity_samples_per_s") for x in chain}
        out.append(
            {
                "rank": p["rank"],
                "host": p.get("host", ""),
                "capacity_samples_per_s": caps,
                "data_pipeline_samples_per_s": data_pipeline(caps),
                "straggler": False,
            }
        )
    return out


def stragglers(
    values: Mapping[int, float | None], share: float = STRAGGLER_SHARE
) -> tuple[float | None, list[int]]:
    """(median of the measured values, ranks below `share` of it)."""
    known = {r: v for r, v in values.items() if v is not None}
    if len(known) < 2:
        return None, []
    median = statistics.median(known.values())
    return median, sorted(r for r, v in known.items() if v < share * median)


def judge(
    payloads: Sequence[Mapping[str, Any]], demand: float | None
) -> tuple[list[dict[str, Any]], list[Finding]]:
    """Rows with stragglers marked, and one doctor.straggler finding per straggler.

    Severity: critical when the straggler cannot feed its own GPU (below demand): in
    synchronous training every rank then waits for it, every step. Warning when it still
    keeps up: nothing is lost today, but it is the first node to starve with a faster
    GPU or model, and a node slower than its twins usually has a fault worth finding.
    """
    table = rows(payloads)
    median, slow = stragglers({r["rank"]: r["data_pipeline_samples_per_s"] for r in table})
    findings = []
    for row in table:
        if row["rank"] not in slow:
            continue
        row["straggler"] = True
        value = row["data_pipeline_samples_per_s"]
        assert median is not None and value is not None
        starving = demand is not None and value < demand
        gain = None
        if starving and demand is not None:
            gain = Gain(
                GainKind.THROUGHPUT,
                round(min(median, demand) / value, 3),
                "the straggler raised to the median node (or the GPU's demand, if lower); "
                "synchronous training runs at the slowest rank's pace",
            )
        where = f"rank {row['rank']}" + (f" on {row['host']}" if row["host"] else "")
        findings.append(
            Finding(
                "doctor.straggler",
                Severity.CRITICAL if starving else Severity.WARNING,
                f"{where.capitalize()} is a straggler: its data pipeline delivers "
                f"{value / median:.0%} of the median node's",
                evidence=(
                    f"data-pipeline capacity (lower of storage and loader) {value:,.0f} "
                    f"samples/s against a median of {median:,.0f} over {len(table)} ranks"
                    + (f"; the GPU consumes {demand:,.0f}" if demand is not None else "")
                    + ". In synchronous data-parallel training every rank waits for the "
                    "slowest at each step."
                ),
                recommendation=(
                    f"Compare {where}'s node with a healthy one: `starvecheck env` there "
                    "(CPU quota and throttling, other jobs on it, NUMA, /dev/shm), its "
                    "storage (`starvecheck io`: a slower disk or a remote mount), and its "
                    "loader settings. Fix the node or leave it out of the job."
                ),
                gain=gain,
                stage="doctor",
            )
        )
    return table, findings


def shared_hosts(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """Caveats for ranks that measured one machine at the same time (torchrun with
    --nproc-per-node above 1): they shared its CPUs and storage while measuring."""
    by_host: dict[str, list[int]] = {}
    for row in table:
        by_host.setdefault(str(row.get("host", "")), []).append(int(row["rank"]))
    return [
        f"ranks {', '.join(map(str, ranks))} measured {host or 'one host'} at the same time, "
        "sharing its CPUs and storage: each figure is what a rank gets beside the others"
        for host, ranks in by_host.items()
        if len(ranks) > 1
    ]
