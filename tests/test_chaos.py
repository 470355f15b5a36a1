"""Signals to the whole process group, as a closed terminal, systemd, Slurm's scancel
and `kill -- -PGID` send them: the main process and its DataLoader workers get the
signal at once. At random points of io, loader, starve, profile and doctor, every
run must end with one line and the shell's status for the signal (130, 143, 129),
leave nothing behind (scratch data, Streaming's shared memory and lock files,
multiprocessing's /tmp/pymp-* directories) and no process running.

The points are random: the seed is printed, and STARVECHECK_CHAOS_SEED replays a
run. Bounded: the runs go in two waves of five at once, about 40 s in all here."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import group_alive, settled

COMMANDS = {
    "io": ["io", "--samples", "3000", "--runs", "1"],
    "loader": ["loader", "--quick", "--samples", "1500", "--runs", "1"],
    "starve": ["starve", "--quick"],
    "profile": ["profile", "--quick"],
    "doctor": ["doctor", "--quick"],
}
TAKES_PATH = {"io", "loader", "profile", "doctor"}
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
LINE = {
    signal.SIGINT: "starvecheck: error: interrupted",
    signal.SIGTERM: "starvecheck: error: terminated by SIGTERM",
    signal.SIGHUP: "starvecheck: error: terminated by SIGHUP",
}
EXIT_TIMEOUT_S = 60


def _shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def _whose(names: list[str], root: Path) -> str:
    """Which run Streaming's leftover blocks were for: their `locals` block lists the
    dataset's local directory, which is in that run's PATH."""
    found = []
    for name in names:
        if name.endswith("_locals"):
            with contextlib.suppress(OSError):
                text = Path("/dev/shm", name).read_bytes().decode(errors="replace")
                found += [p.name for p in root.iterdir() if str(p) in text]
    return f" (the datasets of {', '.join(found)})" if found else ""


def _describe(pgid: int) -> str:
    """Each live process of the group: pid, state, where the kernel has it waiting."""
    out = []
    for pid in group_alive(pgid):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
        except OSError:
            continue
        out.append(f"{pid} {state} {wchan} {cmd}")
    return "; ".join(out)


def _start(name: str, work: Path) -> subprocess.Popen[bytes]:
    data, tmp = work / "data", work / "tmp"
    data.mkdir(parents=True)
    tmp.mkdir()
    argv = [sys.executable, "-m", "starvecheck", *COMMANDS[name]]
    if name in TAKES_PATH:
        argv.append(str(data))
    # TMPDIR: Streaming's lock files and multiprocessing's pymp-* land here, so what
    # is left is this run's and nobody else's.
    env = {**os.environ, "TMPDIR": str(tmp), "STARVECHECK_DEBUG": ""}
    return subprocess.Popen(
        argv,
        cwd=data,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, as a shell's job is
    )


def _wave(tmp_path: Path, rng: random.Random, wave: int) -> list[str]:
    """Start all five, signal each group at its own random point, check each."""
    shm_before = _shm()
    runs = []
    for name in COMMANDS:
        work = tmp_path / f"{wave}-{name}"
        sig = rng.choice(SIGNALS)
        delay = rng.uniform(0.5, 10.0)
        runs.append((name, sig, delay, work, _start(name, work)))
    started = time.monotonic()
    for _, sig, delay, _, proc in sorted(runs, key=lambda r: r[2]):
        time.sleep(max(0.0, started + delay - time.monotonic()))
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
    problems = []
    for name, sig, delay, work, proc in runs:
        what = f"{name}, {sig.name} after {delay:.1f} s"
        try:
            _, err = proc.communicate(timeout=EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stuck = _describe(proc.pid)
            if os.environ.get("STARVECHECK_CHAOS_PYSPY"):  # a Python stack of each, to debug
                for pid in group_alive(proc.pid):
                    subprocess.run(
                        [os.environ["STARVECHECK_CHAOS_PYSPY"], "dump", "--pid", str(pid)]
                    )
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            problems.append(f"{what}: still running after {EXIT_TIMEOUT_S} s: {stuck}")
            continue
        lines = err.decode(errors="replace").splitlines()
        rc = proc.returncode
        if rc == 128 + sig:
            if lines != [LINE[sig]]:
                problems.append(f"{what}: exit {rc}, stderr {lines!r}")
        elif rc == -sig:
            # Killed by the default action: the signal came before starvecheck set its
            # handlers (while Python starts) or after it restored them (while it exits).
            if any("Traceback" in line for line in lines):
                problems.append(f"{what}: killed, with a traceback: {lines!r}")
        elif rc != 0:  # 0: it ended before the signal came
            problems.append(f"{what}: exit {rc}, stderr {lines!r}")
        deadline = time.monotonic() + 10
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if left := group_alive(proc.pid):
            problems.append(f"{what}: processes of its group still run: {left}")
        if mine := sorted(p.name for p in (work / "data").iterdir()):
            problems.append(f"{what}: left in PATH: {mine}")
        # torchinductor_<user>: torch's own per-user compile cache, which torch makes in
        # every run that imports its profiler and keeps by design; not a leftover.
        temp = sorted(p.name for p in (work / "tmp").iterdir())
        if temp := [t for t in temp if not t.startswith("torchinductor_")]:
            problems.append(f"{what}: left in TMPDIR: {temp}")
    if shm := sorted(settled(lambda: _shm() - shm_before)):
        problems.append(f"wave {wave}: left in /dev/shm: {shm}{_whose(shm, tmp_path)}")
    return problems


@pytest.mark.slow
def test_signals_to_the_process_group_at_random_points(tmp_path: Path) -> None:
    seed = int(os.environ.get("STARVECHECK_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    print(f"STARVECHECK_CHAOS_SEED={seed}")
    rng = random.Random(seed)
    problems = _wave(tmp_path, rng, 1) + _wave(tmp_path, rng, 2)
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
