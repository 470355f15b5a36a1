"""`starvecheck.watch`'s options, written once: the timer, the public `watch()` and both
trainers' callbacks take them as keywords and build this record, which checks them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TextIO

from starvecheck.loop.barrier import DEFAULT_TIMEOUT_S
from starvecheck.loop.exporter import check_port
from starvecheck.loop.output import check_file


@dataclass(frozen=True)
class WatchOptions:
    """sync: torch.cuda.synchronize() each step; every: print every N steps; file: where
    the report goes (default stderr); show: print at the end; barrier: time a
    dist.barrier() once each batch is in hand; barrier_timeout: seconds before a
    barrier is given up; headspace: steps replayed from memory to measure what faster
    data would buy (starvecheck.watch only); gpu_events: CUDA events on the device
    clock (None: where CUDA is in use); prometheus: serve the figures for Prometheus
    on this port plus LOCAL_RANK (None: STARVECHECK_PROMETHEUS_PORT where set; 0: any
    free port), on prometheus_addr (default 127.0.0.1; loop/exporter.py); stages: split
    each step's wait by stage of loading where the loop iterates a torch DataLoader
    (loading/: its collate_fn and worker_init_fn wrapped while iter() makes the
    workers); False leaves the DataLoader untouched."""

    sync: bool = False
    every: int | None = None
    file: TextIO | None = None
    show: bool = True
    barrier: bool = False
    barrier_timeout: float = DEFAULT_TIMEOUT_S
    headspace: int = 0
    gpu_events: bool | None = None
    prometheus: int | None = None
    prometheus_addr: str | None = None
    stages: bool = True

    def __post_init__(self) -> None:
        every, timeout = self.every, self.barrier_timeout
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"every must be a positive number of steps, not {every!r}")
        if not isinstance(timeout, int | float) or not 0 < timeout < 1e9:
            raise ValueError(
                f"barrier_timeout must be a positive number of seconds, not {timeout!r}"
            )
        object.__setattr__(self, "barrier_timeout", float(timeout))
        check_file(self.file)
        check_port(self.prometheus)
        if not isinstance(self.stages, bool):
            raise TypeError(f"stages must be True or False, not {self.stages!r}")
        if self.prometheus_addr is not None and not isinstance(self.prometheus_addr, str):
            raise TypeError(f"prometheus_addr must be an address, not {self.prometheus_addr!r}")
