"""Python stacks of a running job, sampled without stopping it (`attach`).

py-spy (`record --nonblocking`) reads the target's memory from outside
(process_vm_readv), at a bounded rate, and never pauses it: a blocking sampler stops
every thread for each sample, which has slowed a torch process with 150+ threads 5-15x
(py-spy issue 872). Non-blocking reads can catch a stack mid-change: py-spy drops such
samples (its `Errors`), and the counts say how many were kept. `--idle` keeps threads
that are not on a CPU: a main thread blocked on the DataLoader's queue is the answer.
`--subprocesses` follows the DataLoader workers; `--threads` names each thread.

The raw output, one line per distinct stack with its count:

    process 123:"python train.py";thread (123): MainThread;<module> (train.py:9);... 41

is parsed here, bounded (lines, frames, bytes): it comes from another program.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from starvecheck.stages.attach.classify import Frame, parse_frame

RATE_DEFAULT = 50  # samples a second: the default (under 1% of a step, docs/performance.md)
RATE_CEILING = 200  # never more, whatever is asked
MAX_LINES = 200_000
MAX_FRAMES = 512
MAX_BYTES = 64 << 20


@dataclass
class Stacks:
    """Samples by (process, thread): each distinct stack with its count."""

    by_thread: dict[tuple[int, int], list[tuple[list[Frame], int]]] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)
    samples: int = 0  # what py-spy kept
    errors: int = 0  # samples py-spy dropped (a stack caught mid-change)

    def count(self, key: tuple[int, int]) -> int:
        return sum(n for _, n in self.by_thread.get(key, ()))


def parse_raw(text: str) -> Stacks:
    """py-spy's raw output, as above; lines that do not parse are skipped."""
    out = Stacks()
    for line in text.splitlines()[:MAX_LINES]:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";", MAX_FRAMES + 8)
        # --subprocesses: a child's line names its parents first, itself last.
        at = 0
        while at < min(len(parts), 8) and parts[at].startswith("process "):
            at += 1
        if at == 0 or at >= len(parts) or not parts[at].startswith("thread ("):
            continue
        pid_text, _, command = parts[at - 1][len("process ") :].partition(":")
        tid_text, _, name = parts[at][len("thread (") :].partition(")")
        if not pid_text.isdigit() or not tid_text.isdigit():
            continue
        key = (int(pid_text), int(tid_text))
        out.commands.setdefault(key[0], command.strip('"')[:300])
        out.thread_names.setdefault(key, name.lstrip(": ").strip()[:100])
        frames = [parse_frame(p) for p in parts[at + 1 : at + 1 + MAX_FRAMES]]
        out.by_thread.setdefault(key, []).append((frames, int(count)))
        out.samples += int(count)
    return out


class NotAllowed(Exception):
    """py-spy may not read the process (ptrace refused): what is missing, in words."""


def py_spy() -> str | None:
    """py-spy beside this Python (the `attach` extra installs it), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


class Recorder:
    """py-spy sampling one process and its subprocesses for `seconds` at `rate` a
    second (capped at RATE_CEILING), never pausing them, in the background: `done()`,
    `stop()` (on any way out: py-spy detaches on SIGINT), `stacks()`."""

    def __init__(self, pid: int, seconds: float, rate: int, binary: str) -> None:
        self.pid = pid
        self.rate = max(1, min(int(rate), RATE_CEILING))
        self._tmp = tempfile.TemporaryDirectory(prefix="starvecheck-attach-")
        self.out = Path(self._tmp.name) / "raw.txt"
        cmd = [binary, "record", "--pid", str(pid), "--nonblocking", "--idle", "--threads",
               "--full-filenames",
               "--subprocesses", "--rate", str(self.rate),
               "--duration", str(max(1, round(seconds))), "--format", "raw",
               "--output", str(self.out)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )

    def done(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stacks(self) -> Stacks:
        """The samples, once py-spy has ended. NotAllowed where ptrace was refused;
        RuntimeError, with py-spy's last line, for anything else."""
        self.stop()
        try:
            err = (
                self.proc.stderr.read(MAX_BYTES).decode(errors="replace")
                if self.proc.stderr
                else ""
            )
            if self.proc.stderr:
                self.proc.stderr.close()
            if self.proc.returncode != 0 or not self.out.is_file():
                raise NotAllowed(_why(err)) if _refused(err) else RuntimeError(_last(err))
            with self.out.open("rb") as f:
                text = f.read(MAX_BYTES).decode(errors="replace")
        finally:
            self._tmp.cleanup()
        stacks = parse_raw(text)
        stacks.errors = _errors(err)
        return stacks


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


def _errors(err: str) -> int:
    for line in err.splitlines():
        if "Errors:" in line:
            tail = line.rpartition("Errors:")[2].strip().split()[0:1]
            if tail and tail[0].isdigit():
                return int(tail[0])
    return 0
