"""HolisticTraceAnalysis's idle time breakdown, by its definitions, so the figures
compare with HTA's `TraceAnalysis.get_idle_time_breakdown()` on the same trace.

HTA (hta/analyzers/breakdown_analysis.py, `_analyze_idle_time_for_stream`, at
facebookresearch/HolisticTraceAnalysis f4d0062) works per CUDA stream over the whole
trace: the stream's GPU events (kernels, memcpys, memsets) in start order; the idle
interval before each is its start less the previous event's end; an interval is

  host wait    when the event's launch (its runtime call, by correlation id) came
               after the previous event ended: the CPU did not enqueue work fast enough;
  kernel wait  otherwise, when the interval is under `consecutive_kernel_delay`
               (30, in the trace's microseconds, by default): the cost of launching
               back-to-back kernels;
  other        otherwise (waiting on an event, a collective, a synchronisation...).

This differs from starvecheck's own split of a step's GPU idle time (the part that
overlaps the loop's data wait): HTA's host wait is any time the GPU waited for the
host to launch, for whatever reason the host was late, data loading only one of them;
and HTA's idle is per stream (a stream idles while another is busy), over the whole
trace rather than the profiled steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# HTA's default `consecutive_kernel_delay`, 30, compared with Kineto's timestamps as they
# are, in microseconds (HTA's docstring says ns; its trace keeps the file's us).
CONSECUTIVE_KERNEL_DELAY_US = 30.0

# A stream's GPU events: (start, end, correlation id or None).
Launch = tuple[float, float, Any]


@dataclass(frozen=True)
class Split:
    """Idle time of a device's streams, summed over them, in microseconds."""

    host_wait: float = 0.0
    kernel_wait: float = 0.0
    other: float = 0.0

    @property
    def total(self) -> float:
        return self.host_wait + self.kernel_wait + self.other

    def ratio(self, part: str) -> float | None:
        """A category's share of the idle time, as HTA's `idle_time_ratio`."""
        total = self.total
        return getattr(self, part) / total if total > 0 else None


def split(
    streams: Mapping[Any, Iterable[Launch]],
    launched_at: Callable[[Any], float | None],
    until: float = math.inf,
    delay: float = CONSECUTIVE_KERNEL_DELAY_US,
) -> Split:
    """HTA's split over every stream of one device. `launched_at(correlation)` is the
    start of the host call that launched an event, None where there is none. As HTA
    (hta/common/trace.py, `_filter_irrelevant_gpu_kernels`), only GPU events a host
    call launched count, and only those launched by `until` (the last step's end:
    HTA's `include_last_profiler_step=True`; by default HTA also drops the last step)."""
    host = kernel = other = 0.0
    for events in streams.values():
        prev_end = None
        for start, end, corr in sorted(events, key=lambda e: e[0]):
            launch = launched_at(corr) if corr is not None else None
            if launch is None or launch > until:
                continue
            if prev_end is not None:
                idle = start - prev_end
                if launch > prev_end:
                    host += idle
                elif idle < delay:
                    kernel += idle
                else:
                    other += idle
            prev_end = end
    return Split(host, kernel, other)
