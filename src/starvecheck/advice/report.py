"""A run's report: every stage result judged once, together, then assembled.

The one place a `Report` is built, for every command (cli/) and for
`starvecheck.watch` (loop/timer.py), so a loop timed in Python and a command on the
command line are judged and shaped alike. Judging itself is advice/judge.py; this
only hands it the run and puts the judgement in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from starvecheck.core.jsonvalue import JsonObject
from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.doctor import Context as DoctorContext
from starvecheck.core.schema.nodes import Node
from starvecheck.core.version import __version__

if TYPE_CHECKING:
    from starvecheck.core.context import Context
    from starvecheck.inputs.workload import Workload
    from starvecheck.probe.machine import Machine


def build_report(
    command: str,
    machine: Machine | JsonObject | None,
    stages: list[StageResult],
    c: Context,
    *,
    workload: Workload | None = None,
    doctor: DoctorContext | None = None,
    nodes: Sequence[Node] = (),
) -> Report:
    """Judge every stage result of the run once, together, and assemble the report.
    doctor passes its workload (then judging builds the chain), facts no stage holds
    (`doctor`: the GPU link's basis, why a stage did not run, findings across ranks)
    and, under torchrun, one row per node. `c` gives the clock the report is dated by."""
    from starvecheck.advice.judge import Results, attach, judge
    from starvecheck.probe.machine import Machine

    facts = machine if isinstance(machine, Machine) else None
    results = Results({s.stage: s for s in stages}, facts, workload, doctor or DoctorContext())
    judgement = judge(results)
    return Report(
        command=command,
        machine=machine.to_dict() if isinstance(machine, Machine) else dict(machine or {}),
        stages=tuple(attach(stages, judgement)),
        checklist=judgement.checklist,
        weakest_link=judgement.weakest_link,
        verdict=judgement.verdict,
        tool_version=__version__,
        created_at=c.now(),
        workload=workload.to_dict() if workload is not None else {},
        chain=judgement.chain,
        weakest_summary=judgement.weakest_summary,
        nodes=tuple(nodes),
    )
