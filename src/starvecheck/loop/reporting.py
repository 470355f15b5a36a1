"""What the Watch (loop/timer.py) found: this loop's figures as a stage's result (on
rank 0 under torch.distributed, every rank's), judged as a command's report is
(starvecheck.advice.report), rendered as the terminal shows it, and printed where the
watch was told to (`file=`, else stderr); what handing its batches from a worker would
cost, measured once per batch size where the worker model needs it; what making its
batches at num_workers=0 would cost, measured once per dataset and batch size where the
hand-over holds its step back (loading/alone.py)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.loading import HANDOVER_BYTES, LoadStage
from starvecheck.loop.handover import Handover, worth_measuring
from starvecheck.loop.handover import measure as measure_handover
from starvecheck.loop.times import LoopTimes

if TYPE_CHECKING:
    from starvecheck.loading.alone import Alone
    from starvecheck.loading.tap import Tap
    from starvecheck.loop.ranks import Gathered, Peers


class Reporting:
    """Mixed into Watch: what it needs of it is declared here."""

    times: LoopTimes
    file: TextIO | None
    gathered: Gathered | None
    _handover: dict[int, Handover | None]
    _alone: dict[tuple[int, int], Alone]
    _taps: list[Tap | None] | None

    if TYPE_CHECKING:  # Watch's own

        def _distributed(self) -> Peers | None: ...
        def _read_gpu(self) -> None: ...

    def measured(self) -> StageResult:
        """This loop's figures, not yet judged; on rank 0 under torch.distributed,
        every rank's."""
        peers = self._distributed()
        if peers is not None and peers.rank == 0:
            from starvecheck.loop.ranks import combine

            if self.gathered is None:
                self.gathered = peers.post(self.times, final=True)
            assert self.gathered is not None
            return combine(self.times, peers.rank, self.gathered)
        self._read_gpu()
        if peers is None:
            self._measure_handover()
            self._measure_alone()
        params = self.times.parameters()
        if peers is not None:
            params |= {"rank": peers.rank, "world_size": peers.world}
        return StageResult(
            stage="watch",
            parameters=params,
            metrics=tuple(self.times.metrics()),
            caveats=tuple(self.times.caveats()),
        )

    def _measure_handover(self) -> None:
        """What handing this loop's batches from a worker would cost, measured once per
        batch size where the loop loads in its own process, waits for data and its
        batches are large: the worker model needs it (advice/workers). With workers the
        loop's own figures hold it (its CPU receiving each batch): one figure for it."""
        t = self.times
        size = t.batch_bytes
        if t.num_workers:  # with workers the hand-over is in the loop's own figures
            return
        if size is None or not worth_measuring(size, t.waits, t.computes):
            return
        if size not in self._handover:
            self._handover[size] = measure_handover(size)
        t.handover = self._handover[size]

    def _measure_alone(self) -> None:
        """Where the hand-over holds this loop's step back (its largest exposed share,
        batches of HANDOVER_BYTES or more, a loop that waits for data), its batches made
        at num_workers=0 in a fresh process (loading/alone.py), once per dataset and
        batch size: the figure num_workers=0's prediction needs, which the workers'
        own timings cannot give. Not under torch.distributed: every rank would start
        one at once."""
        t = self.times
        tap = self._taps[0] if self._taps else None
        size = t.batch_bytes
        if tap is None or not t.num_workers or size is None or size < HANDOVER_BYTES:
            return
        if not worth_measuring(size, t.waits, t.computes):
            return
        if t.figures()[1].top is not LoadStage.HANDOVER:
            return
        key = (id(getattr(tap.loader, "dataset", None)), size)
        if key not in self._alone:
            from starvecheck.loading.alone import measure as measure_alone

            torch: Any = sys.modules["torch"]  # worth_measuring: loaded
            threads = int(torch.get_num_threads())
            collate = tap.own_collate()
            self._alone[key] = measure_alone(tap.loader, collate, threads=threads, batch_bytes=size)
        t.split.alone = self._alone[key]

    def report(self) -> Report:
        """The loop's result, judged once as a command's is, with the ranked checklist:
        the report the CLI would build (starvecheck.advice.report.build_report)."""
        from starvecheck.advice.report import build_report
        from starvecheck.core.context import Context

        return build_report("watch", None, [self.measured()], Context(stdout_isatty=False))

    def result(self) -> StageResult:
        """The measured figures, judged: the findings are what advice.judge makes of
        them, as for any command's report."""
        return self.report().stages[0]

    def summary(self, color: bool = False, width: int | None = 100) -> str:
        """The report as the terminal shows it (the trailing blanks rich pads with cut)."""
        from starvecheck.core.context import Context
        from starvecheck.render.terminal import as_text

        c = Context(stdout_isatty=color, width=width, environ=os.environ)
        return as_text(self.report(), c.console())

    def _print(self) -> None:
        stream = self.file or sys.stderr
        isatty = bool(getattr(stream, "isatty", lambda: False)())
        stream.write(self.summary(color=isatty, width=None if isatty else 100))
        stream.flush()
