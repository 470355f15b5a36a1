"""`watch(..., prometheus=PORT)`, or STARVECHECK_PROMETHEUS_PORT in the environment: the
loop's figures served for Prometheus to scrape while it runs (docs/fleet.md).

Every rank serves its own figures on PORT + LOCAL_RANK (so the ranks of one node under
torchrun take one port each with no code changed); Prometheus scrapes each and
aggregates, and no rank gathers. The page is prometheus_client's exposition of a
registry of its own (never the process's default one, which the user's code may fill);
the server is loop/httpd.py's, a guest in the training process (two threads, a bounded
number of connections with a timeout each, closed in forked children), bound to
127.0.0.1 unless `prometheus_addr=` or STARVECHECK_PROMETHEUS_ADDR says otherwise
(0.0.0.0 for a scrape from another host or a pod's IP). prometheus_client is imported
only here, when an exporter is asked for.

One server per port and process: a second watch on the same port (a new watch each
epoch) takes it over, and the counters go on from where the last watch left them.

Nothing here raises into the loop (loop/output.never_raising): a port already taken, a
value of the environment variable that is not a port, prometheus_client missing, a
failure while a scrape reads the figures, a pass begun after `close()`: one warning
line on stderr, once each, and the loop goes on. The server stops when the process
exits (atexit) or at `close()`.
"""

from __future__ import annotations

import atexit
import copy
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from starvecheck.core import clocks
from starvecheck.loop.families import Advice, Tally, families
from starvecheck.loop.httpd import Server
from starvecheck.loop.identity import gpu_labels, labels, with_namespace
from starvecheck.loop.output import never_raising

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as PromMetric
    from prometheus_client.registry import Collector
from starvecheck.loop.times import LoopTimes

ENV_PORT = "STARVECHECK_PROMETHEUS_PORT"
ENV_ADDR = "STARVECHECK_PROMETHEUS_ADDR"
DEFAULT_ADDR = "127.0.0.1"
WHAT = "export to Prometheus"
# Judging the figures so far takes milliseconds: the recommendation a scrape exports is
# made again at most this often (loop/live.py).
ADVICE_EVERY_S = 30.0
_SERVING: dict[tuple[str, int], Exporter] = {}  # (addr, port asked) -> its exporter
_LOCK = threading.Lock()


def check_port(port: object, what: str = "prometheus") -> None:
    """Refuse a port that is not one (watch's options check it when the watch is made)."""
    if port is None:
        return
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"{what} must be a TCP port number (0-65535), not {port!r}")


def wanted(
    port: int | None, addr: str | None, environ: Mapping[str, str]
) -> tuple[int, str] | None:
    """(port, address) to serve on, the rank's offset added; None where not asked. A
    value of the environment that is not a port raises ValueError (said as a warning)."""
    if port is None:
        text = environ.get(ENV_PORT, "").strip()
        if not text:
            return None
        if not text.isdigit():
            raise ValueError(f"{ENV_PORT}={text!r} is not a port number")
        port = int(text)
        check_port(port, ENV_PORT)
    local = environ.get("LOCAL_RANK", "0").strip()
    offset = int(local) if local.isdigit() else 0
    if port:  # 0: any free port (exporter.port says which)
        port += offset
        check_port(port, f"the port plus LOCAL_RANK ({offset})")
    return port, addr or environ.get(ENV_ADDR, "").strip() or DEFAULT_ADDR


def start(
    times: LoopTimes, port: int | None, addr: str | None, warned: set[str]
) -> Exporter | None:
    """The exporter a watch feeds, serving; None where none was asked for or it could
    not start (said in one warning line)."""
    with never_raising(warned, WHAT):
        where = wanted(port, addr, os.environ)
        if where is None:
            return None
        with _LOCK:
            exporter = _SERVING.get(where)
            if exporter is None or exporter.closed:
                exporter = Exporter(warned)
                exporter.serve(*where)
                _SERVING[where] = exporter
            exporter.follow(times, warned)
            return exporter
    return None


def serve(collector: Collector, port: int, addr: str, warn: Callable[[str], None]) -> Server:
    """A scrape server for `collector` alone, on a registry of its own (never the
    process's default one): two threads, a bounded number of connections, each with a
    timeout, the page cached and rendered off the connections' thread (loop/httpd.py).
    OSError where the port is taken or the address is not this host's."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return Server(lambda: generate_latest(registry), port, addr, warn)


class Exporter:
    """The server and the collector: a scrape calls `collect()` (its thread)."""

    def __init__(self, warned: set[str]) -> None:
        self.warned = warned
        self.times: LoopTimes | None = None
        self.tally = Tally()
        self.advice = Advice()
        self._advised_at = -1e9
        self._labels: dict[str, str] | None = None
        self._namespace_read = False
        self._lock = threading.Lock()
        self._server: Server | None = None
        self.port: int | None = None  # the port bound
        self.closed = False

    def serve(self, port: int, addr: str) -> None:
        self._server = serve(self, port, addr, self._warn)
        self.port = self._server.server_port
        atexit.register(self.close)

    def _warn(self, message: str) -> None:
        """One warning line for the server's trouble (the first only)."""
        with never_raising(self.warned, WHAT):
            raise RuntimeError(message)

    def follow(self, times: LoopTimes, warned: set[str]) -> None:
        """Count `times` from now on: the last loop's steps not yet counted first."""
        with self._lock:
            if self.times is not None and self.times is not times:
                self.tally.update(self.times)
                self.tally = self.tally.next_loop()
            self.times, self.warned = times, warned

    def new_pass(self, rank: int | None) -> None:
        """A pass begins (the timer's step count is its first step): the labels are read
        at the first, when the process group and the device are set."""
        if self.closed:
            with never_raising(self.warned, WHAT):
                raise RuntimeError(f"the exporter on port {self.port} was closed")
            return
        with self._lock:
            if self.times is not None:
                self.tally.pass_starts.append(len(self.times.waits))
            if self._labels is None:  # the namespace file is read at the first scrape
                self._labels = labels(os.environ, rank=rank, namespace_file=None)
                self._labels |= gpu_labels(os.environ)

    def collect(self) -> Iterator[PromMetric]:
        """The families (prometheus_client's collector interface): nothing before the
        first pass, and nothing, with a warning, where reading them fails. The lock the
        loop takes at a pass's start and a new watch is held only to count the steps
        since the last scrape and copy the totals: reading the namespace file, judging
        the recommendation and making the families are done on the copy, so that a
        scrape however slow never holds the loop back."""
        out: list[Any] = []
        with never_raising(self.warned, WHAT):
            with self._lock:
                if self._labels is None or self.times is None or self.closed:
                    return iter(())
                read_namespace, self._namespace_read = not self._namespace_read, True
                self.tally.update(self.times)
                tally, times, found = copy.deepcopy(self.tally), self.times, self._labels
                now = clocks.monotonic()
                advise = now - self._advised_at >= ADVICE_EVERY_S
                if advise:
                    self._advised_at = now
            if read_namespace:
                found = self._labels = with_namespace(found, os.environ)
            if advise:
                self.advice = self._advise(times)
            out = list(families(tally, found, self.advice))
        return iter(out)

    def _advise(self, times: LoopTimes) -> Advice:
        from starvecheck.loop.live import advice

        try:
            return advice(times)
        except Exception:  # the figures go out without the recommendation
            return Advice(num_workers=times.num_workers)

    def close(self) -> None:
        """Stop serving (idempotent); a later pass of a watch that fed it is warned of."""
        if self.closed:
            return
        self.closed = True
        server, self._server = self._server, None
        if server is not None:
            with never_raising(self.warned, WHAT):
                server.close()
