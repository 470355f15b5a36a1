"""Python stacks of a running job, sampled without stopping it (`attach`).

py-spy (`record --nonblocking`) reads the target's memory from outside
(process_vm_readv), at a bounded rate, and never pauses it: a blocking sampler stops
every thread for each sample, which has slowed a torch process with 150+ threads 5-15x
(py-spy issue 872). Non-blocking reads can catch a stack mid-change: py-spy drops such
samples (its `Errors`), and the counts say how many were kept. `--idle` keeps threads
that are not on a CPU: a main thread blocked on the DataLoader's queue is the answer.
`--subprocesses` follows the DataLoader workers; `--threads` names each thread.

py-spy writes speedscope's JSON: a table of frames, and for each thread
(`Process 123 Thread 456 "MainThread"`; without --subprocesses, `Thread 456 "..."`) its
samples in the order they were taken, each a list of indices into the table, root
first. The order is what a share's interval needs: samples of one long wait are not
independent draws (core/intervals.effective_samples). It is parsed here, bounded
(bytes, profiles, samples, frames): it comes from another program. py-spy's raw output,
one line per distinct stack with its count, no order,

    process 123:"python train.py";thread (123): MainThread;<module> (train.py:9);... 41

is still read where that is what the file holds.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import secrets
import shutil
import signal
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from starvecheck.core import clocks
from starvecheck.stages.attach.spyout import MAX_LINES, Stacks, parse_raw, parse_speedscope
from starvecheck.stages.options import AttachOptions

# The output's parsers and record: importable from here, where callers have found them.
__all__ = ["Recorder", "Stacks", "parse_raw", "parse_speedscope"]

if TYPE_CHECKING:
    from starvecheck.scratch.directory import Scratch

RATE_CEILING = AttachOptions.RATE_CEILING  # never more, whatever is asked
MAX_BYTES = 64 << 20
END_GRACE_S = 15.0  # past its duration, for py-spy to write its samples and end
STOP_S = 5.0  # once asked to end (SIGINT), before its process group is killed
REAP_S = 2.0  # once killed, to be reaped


class NotAllowed(Exception):
    """py-spy may not read the process (ptrace refused): what is missing, in words."""


def py_spy() -> str | None:
    """py-spy beside this Python (the `attach` extra installs it), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


class Recorder:
    """One py-spy sampling one process (with `subprocesses`, its children too) for
    `seconds` at `rate` a second (capped at RATE_CEILING), never pausing it, in the
    background: `done()`, `stop()`, `stacks()`.

    py-spy dies with attach: it is started in a process group of its own (a Ctrl-C at
    the terminal reaches attach, which stops it), with a parent-death signal (SIGKILL to
    attach ends it at once, where it would otherwise sample the job to the end of
    --duration), and its whole group is killed on every way out: `stop()` (SIGINT, then
    SIGKILL after STOP_S), and whenever py-spy is found ended, before it is reaped (so
    that a child it left, holding its output open, goes too, and its group's id cannot
    have been reused). No wait on it is unbounded: it is polled, never waited for, and
    once killed, reaped within REAP_S or left to the kernel. Its files (the samples,
    what it printed) live in `scratch`, a marked directory that attach removes and
    `starvecheck clean` can prove and remove after a SIGKILL; each at most MAX_BYTES
    (RLIMIT_FSIZE: a py-spy printing for ever is ended by the kernel, SIGXFSZ)."""

    def __init__(
        self,
        pid: int,
        seconds: float,
        rate: int,
        binary: str,
        scratch: Scratch,
        subprocesses: bool = False,
    ) -> None:
        self.pid = pid
        self.rate = max(1, min(int(rate), RATE_CEILING))
        self.seconds = max(1, round(seconds))
        self.subprocesses = subprocesses
        self.cpu_s: float | None = None  # py-spy's CPU seconds, once it has ended
        self._scratch = scratch
        name = f"spy-{pid}-{secrets.token_hex(3)}"
        self.out, self._stdout, self._stderr = (f"{name}.{x}" for x in ("json", "out", "err"))
        os.close(scratch.new_file(self.out))  # recorded before py-spy writes it
        cmd = [binary, "record", "--pid", str(pid), "--nonblocking", "--idle", "--threads",
               "--full-filenames", *(["--subprocesses"] if subprocesses else []),
               "--rate", str(self.rate), "--duration", str(self.seconds),
               "--format", "speedscope",
               "--output", os.path.join(scratch.path, self.out)]  # fmt: skip
        env = {**os.environ, "RUST_BACKTRACE": "0"}
        env.pop("RUST_LOG", None)
        out = scratch.new_file(self._stdout)
        err = scratch.new_file(self._stderr)
        parent = os.getpid()
        try:
            self.started = clocks.monotonic()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,
                preexec_fn=lambda: _die_with(parent),
            )
        finally:
            os.close(out)
            os.close(err)
        self.ended: float | None = None
        self.killed = False  # it did not end when asked: its group was killed

    def done(self) -> bool:
        return self._reap()

    def cpu_now(self) -> float | None:
        """py-spy's CPU seconds so far (/proc while it runs; exact once it has ended)."""
        if self.cpu_s is not None:
            return self.cpu_s
        from starvecheck.stages.attach.budget import cpu_seconds

        return cpu_seconds(self.proc.pid)

    @property
    def ran_s(self) -> float:
        return (self.ended or clocks.monotonic()) - self.started

    def stop(self) -> None:
        """End py-spy and its group: SIGINT first (it writes what it sampled), SIGKILL
        after STOP_S. Safe to call again, and from `finally` on any way out."""
        stop_all([self])

    def interrupt(self) -> None:
        """Ask py-spy to end (SIGINT: it writes what it sampled); `stop()` waits for it."""
        if not self._reap():
            self._signal(signal.SIGINT)

    def kill(self) -> None:
        """End py-spy's group at once (a restart at another rate drops its samples; a
        py-spy that did not end when asked), and reap it within REAP_S."""
        if self._reap():
            return
        self.killed = True
        self._signal(signal.SIGKILL)
        deadline = clocks.monotonic() + REAP_S
        while not self._reap() and clocks.monotonic() < deadline:
            clocks.sleep(0.01)

    def _signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def _reap(self) -> bool:
        """Whether py-spy has ended, never waiting. Found ended, its group is killed
        first (what it left running in it), while its id is still held by it (a
        zombie), then it is reaped here (os.wait4) to keep its CPU time."""
        if self.proc.returncode is not None:
            return True
        try:
            ended = os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if ended is None:
                return False
            self._signal(signal.SIGKILL)
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere
            self.proc.returncode = -1
            self.ended = clocks.monotonic()
            return True
        if pid == 0:  # cannot be: it was seen ended
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.ended = clocks.monotonic()
        return True

    def printed(self) -> str:
        """What py-spy printed (its progress: samples, errors, how far behind)."""
        return _read_bounded(self._scratch, self._stdout)

    def stacks(self) -> Stacks:
        """The samples, once py-spy has ended. NotAllowed where ptrace was refused;
        RuntimeError, with py-spy's `Error:` line in words, for anything else."""
        self.stop()
        err = _read_bounded(self._scratch, self._stderr)
        text = _read_bounded(self._scratch, self.out)
        if self.proc.returncode != 0 or not text:
            if _refused(err):
                raise NotAllowed(_why(err))
            if self.killed:
                raise RuntimeError(f"py-spy did not end within {STOP_S:.0f} s of being asked to")
            if self.proc.returncode != 0:
                raise RuntimeError(error_line(err, self.proc.returncode))
        stacks = parse_speedscope(text, None if self.subprocesses else self.pid)
        progress = parse_progress(self.printed())
        stacks.errors = progress.errors or 0
        return stacks


def stop_all(recorders: list[Recorder]) -> None:
    """Every py-spy asked to end at once (SIGINT), waited for together for at most
    STOP_S, then every group still there killed, on any way out (a signal in the wait
    included: the kills run with signals held)."""
    from starvecheck.core.signals import signals_held

    try:
        for r in recorders:
            r.interrupt()
        deadline = clocks.monotonic() + STOP_S
        while not all(r.done() for r in recorders) and clocks.monotonic() < deadline:
            clocks.sleep(0.02)
    finally:
        with signals_held():
            for r in recorders:
                r.kill()


def _die_with(parent: int) -> None:
    """In py-spy's process, before exec: the kernel sends it SIGKILL when attach goes
    (PR_SET_PDEATHSIG, Linux); where attach went already, it leaves at once. Each file
    it writes is bounded (RLIMIT_FSIZE): past MAX_BYTES the kernel ends it (SIGXFSZ)."""
    from starvecheck.stages.dataloader.workers import PR_SET_PDEATHSIG, prctl

    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_BYTES, MAX_BYTES))
    if os.getppid() != parent:
        os._exit(1)


def _read_bounded(scratch: Scratch, name: str) -> str:
    """A file py-spy wrote in the scratch directory, at most MAX_BYTES; "" where none,
    or where what is there now is not a regular file (a FIFO put in its place would
    block the read for ever: opened non-blocking, and not read)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=scratch.dir_fd())
    except (OSError, KeyError):
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        return f.read(MAX_BYTES).decode(errors="replace")


@dataclass(frozen=True)
class Progress:
    """What py-spy printed about its sampling: samples kept and errors (dropped), and
    how far behind its rate it fell (it says so once it is more than a second late)."""

    samples: int | None = None
    errors: int | None = None
    behind_s: float | None = None  # the most it was behind; None where never said


_BEHIND = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(ns|us|\u00b5s|ms|s|m|h)\s+behind in sampling")
_COUNTS = re.compile(r"Samples:\s*([0-9]{1,15})\s+Errors:\s*([0-9]{1,15})")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_progress(text: str) -> Progress:
    """py-spy's printed progress (pure; lines that do not match are skipped):

    py-spy> 110.52s behind in sampling, results may be inaccurate. Try reducing ...
    py-spy> Wrote raw flamegraph data to 'raw.txt'. Samples: 396 Errors: 2
    """
    behind: float | None = None
    samples = errors = None
    for line in text[:MAX_BYTES].splitlines()[:MAX_LINES]:
        if (m := _BEHIND.search(line)) is not None:
            value = float(m.group(1)) * _UNIT_S[m.group(2)]
            behind = value if behind is None else max(behind, value)
        if (c := _COUNTS.search(line)) is not None:
            samples, errors = int(c.group(1)), int(c.group(2))
    return Progress(samples, errors, behind)


def error_line(err: str, status: int | None = None) -> str:
    """What py-spy said failed, in one line of words: its `Error:` line (with the first
    `Reason:`), never a line of a Rust backtrace (`7: main`, `at src/...`); where the
    kernel ended it for writing past its bound, that, whatever it printed."""
    if status == -signal.SIGXFSZ:
        return _exited(status)
    lines = [x.strip() for x in err[:MAX_BYTES].splitlines()[:MAX_LINES] if x.strip()]
    said = next((x for x in lines if x.startswith("Error:")), None)
    if said is not None:
        reason = next((x for x in lines if x.startswith("Reason:")), None)
        text = said[len("Error:") :].strip()
        if reason is not None:
            text += f" ({reason[len('Reason:') :].strip()})"
        return _printable(text)[:300] or _exited(status)
    words = [x for x in lines if not _RUST_FRAME.match(x)]
    return _printable(words[0])[:300] if words else _exited(status)


_RUST_FRAME = re.compile(r"^(\d+:\s|at\s|stack backtrace:|note: |thread '.*' panicked)")


def _exited(status: int | None) -> str:
    if status == -signal.SIGXFSZ:
        return f"py-spy wrote more than {MAX_BYTES >> 20} MiB of output and was ended"
    if status is not None and status < 0:
        try:
            return f"py-spy was ended by {signal.Signals(-status).name}"
        except ValueError:
            return f"py-spy was ended by signal {-status}"
    return "py-spy failed with no message" + (f" (exit status {status})" if status else "")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _refused(err: str) -> bool:
    low = err.lower()
    return "permission denied" in low or "operation not permitted" in low or "ptrace" in low


def _why(err: str) -> str:
    """py-spy's own words for the refusal (its line naming the permission); what is
    missing and how to grant it is stage.py's caveat (probe/process.ptrace_missing)."""
    for line in err.splitlines():
        if _refused(line):
            return _clean(line)
    return _last(err)


def _last(err: str) -> str:
    """The line of py-spy's stderr that says what went wrong: its `Error:` line, else
    its first line that is not its banner or a Rust backtrace frame (`7: main`,
    `at src/main.rs:3`), which say nothing to a user."""
    lines = [_clean(x) for x in err.splitlines() if x.strip()]
    for line in lines:
        if line.lower().startswith("error"):
            return line
    for line in lines:
        if not _BACKTRACE.match(line) and not line.startswith("py-spy>"):
            return line
    return "py-spy failed with no message"


_BACKTRACE = re.compile(r"^(\d+:|at |stack backtrace|note: |thread '|py-spy: \d+:)")


def _clean(line: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in line.strip())[:300]
