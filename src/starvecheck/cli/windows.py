"""`starvecheck attach PID --every SECONDS [--prometheus PORT]`: a window read every
SECONDS until the job ends (or Ctrl-C), each said in one line on stderr and, with
--prometheus, added to the metric families served there (loop/windows.py); the last
window's report is the command's output, as one `attach` gives it.

A sidecar's loop: it runs beside a training container for as long as the job does
(docs/fleet.md). The job ending between windows ends it with the last report; a job
gone before the first window is attach's usual one line and exit status.
"""

from __future__ import annotations

import contextlib
from typing import Any

from starvecheck.advice.report import build_report
from starvecheck.cli.common import Outputs, emit, measure_one
from starvecheck.core import clocks
from starvecheck.core.context import Context
from starvecheck.core.report import Report
from starvecheck.core.schema.attach import Main, share_of
from starvecheck.core.schema.attachfigures import AttachFigures
from starvecheck.core.status import StarvecheckError, Unavailable, UsageError
from starvecheck.probe.life import Life, read_life
from starvecheck.probe.process import shorten
from starvecheck.stages.options import AttachOptions


def check(every: float | None, port: int | None, seconds: float) -> None:
    """--prometheus serves windows: it needs --every; a window fits in its period."""
    if port is not None and every is None:
        raise UsageError("--prometheus needs --every SECONDS: it serves a window every SECONDS")
    if every is not None and seconds > every:
        raise UsageError(f"--duration {seconds:g} is longer than --every {every:g}")


def windows(
    options: AttachOptions,
    c: Context,
    out: Outputs,
    machine: Any,
    every: float,
    port: int | None,
    addr: str,
) -> int:
    """Windows until the job ends; the last one's report emitted."""
    collector = _serving(c, port, addr) if port is not None else None
    job = read_life(options.pid)  # read before the first window: the job
    report: Report | None = None
    n = 0
    while True:
        began = clocks.monotonic()
        try:
            result = measure_one(options, c, out, machine).result
        except StarvecheckError:
            if report is None:  # nothing read yet: attach's own line and status
                raise
            _moved(c, options.pid, job, read_life(options.pid), n)
            break  # the job ended between windows (or exec'd into what attach cannot read)
        now = read_life(options.pid)
        why = _moved(c, options.pid, job, now, n)
        if why is not None:  # the window read another process: never reported as the job
            if report is None:
                raise Unavailable(
                    f"attach: PID {options.pid} is no longer the process attach began with: "
                    f"{why}; nothing of it was reported"
                )
            break
        report = build_report("attach", machine, [result], c)
        n += 1
        if collector is not None:
            collector.add(report)
        _say(c, f"starvecheck: attach window {n}: {_line(report)}")
        if now is None or now.ended:
            break  # the job ended during the window
        clocks.sleep(max(0.0, every - (clocks.monotonic() - began)))
    return emit(report, out, c)


def _moved(c: Context, pid: int, job: Life | None, now: Life | None, n: int) -> str | None:
    """Why the process under `pid` is not the job attach began with (its PID reused, or
    an exec), said in one line once windows were reported; None where it is the job."""
    why = _replaced(job, now) if job is not None and now is not None and not now.ended else None
    if why is not None and n:
        _say(
            c,
            f"starvecheck: attach: PID {pid} is no longer the job attach watched: {why}; "
            f"the watch ends with window {n}, the last of the job",
        )
    return why


def _replaced(job: Life, now: Life) -> str | None:
    """probe/life's verdict on `now` against `job`, in words."""
    how = job.replaced_by(now)
    if how == "PID reused":
        if job.pidns is not None and now.pidns is not None and job.pidns != now.pidns:
            return "another process has its PID now (in another PID namespace)"
        return "another process has its PID now (its start time is not the job's)"
    if how == "exec'd" and job.exe != now.exe:
        return f"it runs another program now ({shorten([now.exe or ''])}: it called exec)"
    if how is not None:  # the same binary again, or another command line
        return "it called exec (a new program image under the same PID)"
    return None


def _serving(c: Context, port: int, addr: str) -> Any:
    from starvecheck.loop.exporter import serve
    from starvecheck.loop.windows import Windows

    collector = Windows(c.environ)
    warned: set[str] = set()

    def warn(message: str) -> None:  # the first of the server's troubles, one line
        if not warned:
            warned.add(message)
            _say(c, f"starvecheck: warning: {message}")

    try:
        server = serve(collector, port, addr, warn)
    except OSError as e:
        raise UsageError(f"--prometheus {port}: cannot serve on {addr}:{port} ({e})") from None
    _say(
        c, f"starvecheck: serving Prometheus metrics on http://{addr}:{server.server_port}/metrics"
    )
    return collector


def _line(report: Report) -> str:
    """Each rank's sampled data-wait share in this window, in a few words."""
    stage = report.stages[0]
    parts = []
    figures = stage.records(AttachFigures)
    for r in stage.parameters.get("ranks") or []:
        pid = r.get("pid")
        d = share_of(figures.rank(pid).main, Main.DATA) if isinstance(pid, int) else None
        share = d.value if d is not None else None
        who = f"rank {r['rank']}" if r.get("rank") is not None else f"PID {r.get('pid')}"
        said = f"waits for data {share:.0%}" if share is not None else "not read"
        parts.append(f"{who} {said}")
    return "; ".join(parts) or "no rank read"


def _say(c: Context, line: str) -> None:
    """A line on stderr; dropped where it cannot be written (stderr closed, its reader
    gone): the report is written all the same."""
    with contextlib.suppress(OSError, ValueError):
        c.stderr.write(line + "\n")
        c.stderr.flush()
