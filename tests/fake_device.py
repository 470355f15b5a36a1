"""A device on a simulated clock for the tests of loop/gpuclock.py and watch's device
path: it keeps the `Device` protocol of loop/gpuclock.py, and stays out of the wheel."""

from __future__ import annotations


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
