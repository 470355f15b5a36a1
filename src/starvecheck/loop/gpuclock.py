"""The GPU's idle time waiting for data, on the device's own clock, without
synchronizing.

Two events a step on the stream the loop queues its work on:

  arrive_i  recorded when batch i is in the loop's hands (before the step queues its
            work): it completes on the device when everything queued before it has
            run, or at once where the device was already idle;
  done_i    recorded when the loop asks for the next batch (the step's work queued):
            it completes when that work has run.

So on the device's clock the gap from done_{i-1} to arrive_i is how long the GPU sat
idle with nothing to run while the host fetched batch i: 0 where the previous step's
kernels outlasted the fetch (the event completes the moment they end), the fetch's
excess where they did not. done_{i-1} to done_i is the step's whole period on the
device; idle over period is the GPU's data-wait share.

Events are read lazily with a non-blocking `query()`: a step's gaps are resolved once
its `done` event has completed, oldest first, at most a few per step; nothing ever
waits for the device. Steps whose events have not completed when the figures are read
are counted as unresolved, and a queue of PENDING_MAX unresolved steps (a stream that
stalls, or a device far behind) drops its oldest, counted, so memory stays bounded.

The device is behind a seam (`Device`): `CudaDevice` records torch.cuda events on the
current stream; tests drive a fake device (tests/fake_device.py) on a simulated clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from starvecheck.core.schema.figure import Figure
from starvecheck.core.schema.steps import Step as Quantity
from starvecheck.core.schema.steps import StepFigure

PENDING_MAX = 256
RESOLVE_PER_CALL = 4


class Device(Protocol):
    def record(self) -> Any: ...  # an event recorded on the stream now

    def done(self, event: Any) -> bool: ...  # completed on the device (never blocks)

    def elapsed_ms(self, a: Any, b: Any) -> float: ...  # device time from a to b


class CudaDevice:
    """torch.cuda events with timing on the current stream."""

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def record(self) -> Any:
        e = self._torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def done(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b))


@dataclass
class Step:
    arrive: Any
    done: Any = None


_GAP = object()  # a break in the chain of steps: a pass's start, a headspace replay


@dataclass
class DeviceIdle:
    """Each resolved step's idle gap and device period (ms), in order (appended to the
    sequences given: LoopTimes' arrays); how many steps were dropped unresolved."""

    device: Device
    idle_ms: MutableSequence[float] = field(default_factory=list)
    period_ms: MutableSequence[float] = field(default_factory=list)
    dropped: int = 0
    _pending: deque[Step] = field(default_factory=deque)
    _last_done: Any = None  # the last resolved step's `done`: the next one's start

    def arrived(self) -> None:
        """Batch in hand: the step's first event."""
        self._pending.append(Step(self.device.record()))
        if len(self._pending) > PENDING_MAX:
            if self._pending.popleft().arrive is not _GAP:
                self.dropped += 1
            self._last_done = None  # the chain is broken: the next step has no start

    def asked(self) -> None:
        """The step's work is queued and the loop asks for the next batch."""
        if self._pending and self._pending[-1].done is None:
            self._pending[-1].done = self.device.record()
        self.resolve(RESOLVE_PER_CALL)

    def new_pass(self) -> None:
        """What comes next is not a step after the last one (a pass's first batch, the
        steps after a headspace replay): no idle gap is read across it."""
        self._pending.append(Step(_GAP, _GAP))

    def resolve(self, most: int = PENDING_MAX * 2) -> None:
        """Read the oldest steps whose `done` has completed, never waiting."""
        for _ in range(most):
            if not self._pending:
                return
            step = self._pending[0]
            if step.arrive is _GAP:
                self._pending.popleft()
                self._last_done = None
                continue
            if step.done is None or not self.device.done(step.done):
                return
            self._pending.popleft()
            if self._last_done is not None:
                idle = self.device.elapsed_ms(self._last_done, step.arrive)
                self.idle_ms.append(max(0.0, idle))
                self.period_ms.append(max(0.0, self.device.elapsed_ms(self._last_done, step.done)))
            self._last_done = step.done

    @property
    def unresolved(self) -> int:
        return self.dropped + sum(1 for s in self._pending if s.arrive is not _GAP)

    def share(self) -> float | None:
        """The GPU's idle time over its steps' periods, resolved steps only."""
        total = sum(self.period_ms)
        return sum(self.idle_ms) / total if total > 0 else None


class NoDevice:
    """No events: what the loop calls where the GPU's clock is not read."""

    def arrived(self) -> None:
        pass

    def asked(self) -> None:
        pass

    def new_pass(self) -> None:
        pass


def figures(
    idle_ms: Sequence[float], period_ms: Sequence[float], unresolved: int
) -> list[StepFigure]:
    """The GPU's figures from its events: its idle time waiting for data a step (ms),
    its share of the device's step periods, the device's step period, and the steps
    whose events had not completed when read. Nothing where no step was resolved."""
    if not period_ms:
        return []
    total = sum(period_ms)
    share = sum(idle_ms) / total if total > 0 else 0.0
    out = [
        StepFigure(Quantity.GPU_DATA_WAIT_MS, Figure.repeated(idle_ms), "ms"),
        StepFigure(Quantity.GPU_STEP_MS, Figure.repeated(period_ms), "ms"),
        StepFigure(Quantity.GPU_IDLE_DATA_WAIT_SHARE, Figure.single(share), "fraction"),
    ]
    if unresolved:
        out.append(StepFigure(Quantity.GPU_UNRESOLVED_STEPS, Figure.single(unresolved), "steps"))
    return out
