"""doctor under torchrun: every rank measures its own node, rank 0 reports them all.

(Its counterpart for a training job's own loop is loop/ranks.py; both are judged by
advice/stragglers.py: nodes here, ranks of one job there.)

torchrun sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; each rank runs its
stages in its own scratch directories (each made fresh with a random name), then the
ranks meet in a gloo process group and gather their reports on rank 0.

STARVECHECK_SLOW_RANKS (a testing hook, read here only): `RANKS:MS`, e.g. `1:20` or
`1,3:5`, makes every loader sample on those ranks take MS milliseconds longer, so the
straggler check can be tested with ranks on one machine.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from starvecheck.core.model import Finding
from starvecheck.core.report import Report
from starvecheck.core.schema.nodes import Node
from starvecheck.core.signals import importing
from starvecheck.core.status import Unavailable, UsageError
from starvecheck.core.units import parse_uint

SLOW_ENV = "STARVECHECK_SLOW_RANKS"
# Ranks meet only once each has measured its node: a slow node may take minutes more.
TIMEOUT_S = 1800


@dataclass(frozen=True)
class Rank:
    rank: int
    world: int


def from_environ(environ: Mapping[str, str]) -> Rank | None:
    """This process's rank under torchrun, or None when started on its own."""
    rank, world = environ.get("RANK"), environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    r, w = parse_uint(rank), parse_uint(world)  # ASCII digits only: not " 1", "٣", "+1"
    if r is None or w is None or not r < w:
        raise UsageError(f"RANK={rank!r}, WORLD_SIZE={world!r}: expected 0 <= RANK < WORLD_SIZE")
    return Rank(r, w)


def slow_ms(environ: Mapping[str, str], rank: int) -> float:
    """The testing hook: extra milliseconds per loader sample on this rank."""
    text = environ.get(SLOW_ENV, "")
    if not text:
        return 0.0
    ranks_text, sep, ms_text = text.partition(":")
    read = [parse_uint(r.strip()) for r in ranks_text.split(",")]
    ranks = {r for r in read if r is not None}
    try:
        ms = float(ms_text) if ms_text.isascii() else -1.0
    except ValueError:
        ms = -1.0
    if not sep or not read or None in read or not 0 < ms <= 10_000:
        raise UsageError(
            f"{SLOW_ENV}={text!r}: expected RANKS:MS, e.g. 1:20 (ranks 1 add 20 ms per sample)"
        )
    return ms if rank in ranks else 0.0


def gather(report: Report, rank: Rank, environ: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """Every rank's report on rank 0 (None on the others), through gloo."""
    with importing("torch"):
        import torch.distributed as dist

    payload = {
        "rank": rank.rank,
        "host": report.machine.get("hostname") or socket.gethostname(),
        "report": report.to_dict(),
    }
    gathered: list[Any] | None = [None] * rank.world if rank.rank == 0 else None
    try:
        dist.init_process_group(
            "gloo", rank=rank.rank, world_size=rank.world, timeout=timedelta(seconds=TIMEOUT_S)
        )
        dist.gather_object(payload, gathered, dst=0)
    except (RuntimeError, ValueError, OSError) as e:
        addr, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
        where = f"MASTER_ADDR={addr}, MASTER_PORT={port}"
        raise Unavailable(
            f"gathering the ranks' reports failed (gloo, {where}): {' '.join(str(e).split())}"
        ) from e
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return gathered


def judge(
    gathered: list[dict[str, Any]], demand: float | None
) -> tuple[list[Node], list[Finding], list[str]]:
    """Rows per rank, straggler findings, and caveats."""
    from starvecheck.advice import stragglers

    table, findings = stragglers.among_nodes(gathered, demand)
    return table, findings, stragglers.shared_hosts(table)
