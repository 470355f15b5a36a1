"""A py-spy that misbehaves, for attach's bounds (tests/test_attach_spy_bounds.py,
tests/test_hostile4_attach.py). Run as py-spy is (`record --pid N ... --output F`),
through a shell script that names its behaviour and a marker word every process of it
carries in its argv (its forks too), so a test finds any left running by scanning /proc:

    fake_spy.py BEHAVIOUR MARKER record --pid N ... --output F

hang         ignores SIGINT and SIGTERM and sleeps for ever
child-holds  forks a child that keeps stdout and stderr open and sleeps; exits at once
garbage      prints garbage to stdout and stderr for ever
raw-garbage  writes garbage to its --output for ever
stacks       writes the raw lines in $FAKE_SPY_STACKS (a file) to --output, then exits
slow-exit    writes the stacks, then ignores SIGINT and sleeps for ever
error        prints a Rust panic to stderr and exits 101
fifo-output  puts a FIFO where its --output was, and exits
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _output(argv: list[str]) -> str | None:
    return argv[argv.index("--output") + 1] if "--output" in argv else None


def _stacks(argv: list[str]) -> None:
    out = _output(argv)
    src = os.environ.get("FAKE_SPY_STACKS")
    if out is None or src is None:
        return
    with open(src) as f:
        text = f.read().replace("{pid}", argv[argv.index("--pid") + 1])
    with open(out, "w") as f:
        f.write(text)
    print("py-spy> Wrote raw flamegraph data. Samples: 100 Errors: 0", flush=True)


def main(behaviour: str, argv: list[str]) -> None:
    if behaviour == "hang":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            time.sleep(60)
    if behaviour == "child-holds":
        if os.fork() == 0:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while True:
                time.sleep(60)
        _stacks(argv)
        os._exit(0)
    if behaviour in ("garbage", "raw-garbage"):
        # Python ignores SIGXFSZ; py-spy (Rust) does not: a write past RLIMIT_FSIZE ends it
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        chunk = (bytes(range(256)) * 64)[:16000] + b"\n"
        where = _output(argv) if behaviour == "raw-garbage" else None
        fds = [os.open(where, os.O_WRONLY | os.O_CREAT)] if where else [1, 2]
        while True:
            for fd in fds:
                os.write(fd, chunk)
    if behaviour == "stacks":
        _stacks(argv)
        return
    if behaviour == "slow-exit":
        _stacks(argv)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            time.sleep(60)
    if behaviour == "fifo-output":
        out = _output(argv)
        if out is not None:
            os.unlink(out)
            os.mkfifo(out)
        return
    if behaviour == "error":
        panic = "thread 'main' panicked at src/main.rs:3\n   7: main\nError: no luck"
        print(panic, file=sys.stderr)
        sys.exit(101)
    sys.exit(f"unknown behaviour {behaviour}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:])
