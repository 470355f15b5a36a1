"""The loop's timer moved to starvecheck/loop/timer.py: this name stays for code that
imported `Watch` from here (and for tests/test_contract.py's scan of finding ids,
which reads this file). New code: `starvecheck.watch(...)`, or starvecheck.loop.timer."""

from __future__ import annotations

from starvecheck.loop.timer import Watch, watch

__all__ = ["Watch", "watch"]
