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
current stream; tests drive `FakeDevice`, whose work runs on a simulated clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

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


@dataclass
class DeviceIdle:
    """Each resolved step's idle gap and device period (ms), in order; how many steps
    were left unresolved (dropped when too many were pending, or still pending)."""

    device: Device
    idle_ms: list[float] = field(default_factory=list)
    period_ms: list[float] = field(default_factory=list)
    dropped: int = 0
    _pending: deque[Step] = field(default_factory=deque)
    _last_done: Any = None  # the previous step's `done`, once resolved or recorded

    def arrived(self) -> None:
        """Batch in hand: the step's first event."""
        self._pending.append(Step(self.device.record()))
        if len(self._pending) > PENDING_MAX:
            self._pending.popleft()
            self.dropped += 1
            self._last_done = None  # the chain is broken: the next step has no start

    def asked(self) -> None:
        """The step's work is queued and the loop asks for the next batch."""
        if self._pending and self._pending[-1].done is None:
            self._pending[-1].done = self.device.record()
        self.resolve(RESOLVE_PER_CALL)

    def resolve(self, most: int = PENDING_MAX) -> None:
        """Read the oldest steps whose `done` has completed, never waiting."""
        for _ in range(most):
            if not self._pending:
                return
            step = self._pending[0]
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
        return self.dropped + len(self._pending)

    def share(self) -> float | None:
        """The GPU's idle time over its steps' periods, resolved steps only."""
        total = sum(self.period_ms)
        return sum(self.idle_ms) / total if total > 0 else None

    def new_pass(self) -> None:
        """A new pass: the gap before its first batch (workers starting) is not a step's."""
        self.resolve()
        self._pending.clear()
        self._last_done = None


class FakeDevice:
    """A device on a simulated clock, for tests: `launch(ms)` queues work behind what is
    queued; an event completes when the work queued before it has run; `stall()` makes
    queued work never finish. The host's time is `now`, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_until = 0.0
        self.stalled = False

    def launch(self, ms: float) -> None:
        self.busy_until = max(self.busy_until, self.now) + ms

    def stall(self) -> None:
        self.stalled = True
        self.busy_until = float("inf")

    def record(self) -> float:
        return max(self.busy_until, self.now)

    def done(self, event: float) -> bool:
        return event <= self.now

    def elapsed_ms(self, a: float, b: float) -> float:
        return b - a
