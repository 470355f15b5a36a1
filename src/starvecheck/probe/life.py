"""Whether a process read over some seconds stayed the same running process: stopped
(SIGSTOP, a debugger: State T or t), exited, or replaced (exec'd into another program
or the same one again, its command changed, or its PID reused, in this PID namespace or
another). `attach` reads this once a second, because a
sampler's figures of a stopped process are its last stack repeated, and those of a
process that ended are of the seconds before.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from starvecheck.probe import process
from starvecheck.probe.sysroot import SysRoot

DELETED = " (deleted)"  # what /proc/PID/exe says of a binary replaced on disk
AUXV_BYTES = 4096  # /proc/PID/auxv: a few hundred bytes on x86-64 and arm64


@dataclass(frozen=True)
class Life:
    """One reading of a process: its state letter, start time (clock ticks after
    boot: a new process under a reused PID has another), program and command line."""

    state: str
    start: int | None
    exe: str | None
    cmdline: str | None
    pidns: str | None = None  # /proc/PID/ns/pid
    image: str | None = None  # /proc/PID/auxv's digest: ASLR draws it afresh at each exec

    @property
    def stopped(self) -> bool:
        return self.state in ("T", "t")

    @property
    def ended(self) -> bool:
        """A zombie (exited, not yet reaped by its parent) or dead."""
        return self.state in ("Z", "X", "x")

    def replaced_by(self, later: Life) -> str | None:
        """How `later` is not the process this reading was of: `exec'd` (another
        program), `changed command`, `PID reused`; None where it is the same."""
        if self.start is not None and later.start is not None and later.start != self.start:
            return "PID reused"
        if self.pidns is not None and later.pidns is not None and later.pidns != self.pidns:
            return "PID reused"
        if self.exe is not None and later.exe is not None and later.exe != self.exe:
            return "exec'd"
        if self.image is not None and later.image is not None and later.image != self.image:
            return "exec'd"  # the same binary again
        # An exiting process's command line reads empty (its memory is gone) before it
        # turns zombie: that is its end, read as such a second later, not a new command.
        if self.cmdline is not None and later.cmdline and later.cmdline != self.cmdline:
            return "changed command"
        return None


def read_life(pid: int, root: SysRoot | None = None) -> Life | None:
    """The process now; None where it no longer exists (or its stat cannot be read)."""
    root = root or SysRoot.from_environ()
    stat = process.stat(root, pid)
    if stat is None:
        return None
    words = process.cmdline(root, pid)
    exe = root.readlink(f"/proc/{pid}/exe").value
    if exe is not None and exe.endswith(DELETED):  # an upgraded binary: the same program
        exe = exe[: -len(DELETED)]
    cmdline = " ".join(words)[:1000] if words is not None else None
    pidns = root.readlink(f"/proc/{pid}/ns/pid").value
    return Life(stat.state, stat.start, exe, cmdline, pidns, _image(root, pid))


def _image(root: SysRoot, pid: int) -> str | None:
    """A digest of the auxiliary vector the kernel gave the process at exec (its
    addresses drawn afresh by ASLR at each exec); None where it cannot be read."""
    try:
        fd = os.open(root.path(f"/proc/{pid}/auxv"), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # a fake machine's FIFO: not waited on
                return None
            auxv = f.read(AUXV_BYTES)
    except (OSError, ValueError):
        return None
    return hashlib.blake2b(auxv, digest_size=16).hexdigest() if auxv else None
