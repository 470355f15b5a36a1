"""What hostile clients of watch's Prometheus exporter cost the training loop it is a
guest in (issue 58; docs/fleet.md, "A guest in the training process").

    python benchmarks/exporter_guest.py [--rounds 7] [--round-s 5] [--step-ms 3]
        [--idle 300] [--scrapers 3] [--reopen] [--no-pin]

A pure-Python loop of a fixed --step-ms of work a step (no sleep: it holds the GIL as a
Python-heavy training step does, the worst case for threads beside it), watched with
the exporter on as a user turns it on (`watch(..., prometheus=0)`, a pass of
--pass-steps steps an epoch), in rounds of --round-s seconds that alternate, in turn
each order first:
  calm     nothing connected to the exporter;
  hostile  one helper process opens --idle connections to it at the round's start and
           holds them (with --reopen, opens again each one the server closes: a flood of
           connections), while --scrapers processes each scrape it back to back.
The helpers are other processes, so they share no GIL with the loop; with --no-pin
unset (and more than one CPU) the loop's process is kept on one CPU and the helpers on
the others, so that their own CPU is not counted as the exporter's.

Printed: the loop's steps a second in each (median, min .. max over the rounds) and the
hostile/calm ratio of each round; the process's threads (threading.active_count) and
tasks (/proc/self/task) at their most in each; the scrapes answered whole and those that
failed, by why; and what became of the idle connections (closed by the server at once
to make room or at their timeout: how long each was held, connected, before the server
closed it; and how many were still open, in the server or its backlog, at the round's
end). Target (exit 1 when missed): the ratio's median at least 0.97, and no thread or
task more in the hostile rounds than in the calm ones. On a shared machine the spread
is the neighbours' too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field

from starvecheck.loop.timer import Watch

TARGET = 0.97

HELPER = textwrap.dedent(
    """
    import json, selectors, socket, sys, time
    role, n, reopen = sys.argv[1], int(sys.argv[3]), sys.argv[4] == "1"
    port = 0  # each "go PORT" names the server
    GET = b"GET /metrics HTTP/1.1\\r\\nHost: bench\\r\\n\\r\\n"

    def told(timeout):  # a line on stdin, or None
        sel = selectors.DefaultSelector()
        sel.register(sys.stdin, selectors.EVENT_READ)
        ready = sel.select(timeout)
        sel.close()
        return sys.stdin.readline().strip() if ready else None

    def scrape(out):
        began = time.perf_counter()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(GET)
                got = b""
                while chunk := s.recv(65536):
                    got += chunk
        except ConnectionRefusedError:
            out["refused"] += 1
            return
        except ConnectionResetError:
            out["reset"] += 1
            return
        except TimeoutError:
            out["timed out"] += 1
            return
        head, _, body = got.partition(b"\\r\\n\\r\\n")
        length = [l for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length:")]
        if head.startswith(b"HTTP/1.1 200 ") and length and int(length[0][15:]) == len(body):
            out["ok"] += 1
            out["ms"].append((time.perf_counter() - began) * 1e3)
        elif not got:
            out["closed unanswered"] += 1
        else:
            out["cut or not 200"] += 1

    def go():  # "go PORT": the port of this round's server; None: stop for good
        global port
        word = told(None)
        if not word or not word.startswith("go "):
            return False
        port = int(word.split()[1])
        return True

    def scraper():
        while go():
            out = {"ok": 0, "refused": 0, "reset": 0, "timed out": 0, "closed unanswered": 0,
                   "cut or not 200": 0, "ms": []}
            while told(0) is None:
                scrape(out)
            print(json.dumps(out), flush=True)

    def idle():
        while go():
            sel = selectors.DefaultSelector()
            out = {"opened": 0, "failed": 0, "held_s": [], "open at end": 0}

            def open_one():
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=10)
                except OSError:
                    out["failed"] += 1
                    return
                out["opened"] += 1
                sel.register(s, selectors.EVENT_READ, time.monotonic())

            for _ in range(n):
                open_one()
            while told(0) is None:
                for key, _ in sel.select(0.05):
                    try:
                        closed = key.fileobj.recv(1) == b""
                    except OSError:
                        closed = True
                    if closed:
                        out["held_s"].append(time.monotonic() - key.data)
                        sel.unregister(key.fileobj)
                        key.fileobj.close()
                        if reopen:
                            open_one()
            for key in list(sel.get_map().values()):
                out["open at end"] += 1
                key.fileobj.close()
            sel.close()
            print(json.dumps(out), flush=True)

    scraper() if role == "scraper" else idle()
    """
)


# The decoy: the same server (loop/httpd.py) with a page of the exporter's size, in a
# process of its own on the helpers' CPUs. Calm rounds send the helpers to it, hostile
# rounds to the exporter: the machine carries the same hostile traffic either way, and
# the ratio is what it costs the loop to be its target (on a 2-CPU VM, traffic on one
# CPU alone moved a loop on the other by -12% to +15% a round).
DECOY = textwrap.dedent(
    """
    import sys, threading
    from starvecheck.loop.httpd import Server
    page = b"# decoy\\n" + b"x 1\\n" * (int(sys.argv[1]) // 4)
    server = Server(lambda: page, 0, "127.0.0.1", lambda message: None)
    print(server.server_port, flush=True)
    sys.stdin.readline()
    server.close()
    """
)


def work(n: int) -> int:
    """A training step's stand-in: `n` rounds of pure Python, holding the GIL."""
    x = 0
    for i in range(n):
        x += i * i % 7
    return x


def calibrate(step_ms: float) -> int:
    """The `n` for which work(n) takes step_ms here (the best of a few tries)."""
    n, best = 10_000, float("inf")
    for _ in range(5):
        start = time.perf_counter()
        work(n)
        best = min(best, time.perf_counter() - start)
    return max(1, int(n * step_ms / 1e3 / best))


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


@dataclass
class Round:
    steps_s: float
    threads: int  # at most, over the round
    tasks: int


def run_round(w: Watch, n: int, seconds: float) -> Round:
    """The loop's steps a second over passes of `w` for `seconds`."""
    steps, most_threads, most_tasks = 0, 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in w:
            work(n)
            steps += 1
            if steps % 50 == 0:
                most_threads = max(most_threads, threading.active_count())
                most_tasks = max(most_tasks, tasks())
    return Round(steps / (time.perf_counter() - start), most_threads, most_tasks)


@dataclass
class Helpers:
    """The hostile processes: `tell` starts them, `stop` stops them and keeps in `said`
    what each reports."""

    procs: list[subprocess.Popen[str]]
    said: list[dict] = field(default_factory=list)

    @classmethod
    def start(cls, port: int, idle: int, scrapers: int, reopen: bool, cpus: set[int]) -> Helpers:
        def pinned() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        roles = [("idle", idle)] * (1 if idle else 0) + [("scraper", 0)] * scrapers
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", HELPER, role, "0", str(k), "1" if reopen else "0"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=pinned,
            )
            for role, k in roles
        ]
        return cls(procs)

    def tell(self, word: str) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(word + "\n")
            p.stdin.flush()

    def stop(self) -> None:
        self.tell("stop")  # ends the round; "go PORT" starts the next
        for p in self.procs:
            assert p.stdout is not None
            self.said.append(json.loads(p.stdout.readline()))

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}} .. {max(values):{fmt}})"


def page_bytes(port: int) -> int:
    """The exporter's page, in bytes (one scrape)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return len(got.partition(b"\r\n\r\n")[2])


def start_decoy(size: int, cpus: set[int]) -> tuple[subprocess.Popen[str], int]:
    """The decoy server (DECOY) on the helpers' CPUs: (its process, its port)."""

    def pinned() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        [sys.executable, "-c", DECOY, str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=pinned,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--round-s", type=float, default=5.0)
    p.add_argument("--step-ms", type=float, default=3.0)
    p.add_argument("--pass-steps", type=int, default=100)
    p.add_argument("--idle", type=int, default=300)
    p.add_argument("--scrapers", type=int, default=3)
    p.add_argument("--reopen", action="store_true", help="re-open each idle one closed")
    p.add_argument("--no-pin", action="store_true", help="leave CPU affinity alone")
    p.add_argument(
        "--no-decoy",
        action="store_true",
        help="calm rounds without the helpers (the machine quiet), not against the decoy",
    )
    a = p.parse_args()

    cpus = sorted(os.sched_getaffinity(0))
    loop_cpus, helper_cpus = set(cpus), set()
    if not a.no_pin and len(cpus) > 1:
        loop_cpus, helper_cpus = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(0, loop_cpus)
    n = calibrate(a.step_ms)
    w = Watch(range(a.pass_steps), show=False, prometheus=0)
    if w.exporter is None or w.exporter.port is None:
        print("the exporter did not start (prometheus_client?)", file=sys.stderr)
        return 2
    target = w.exporter.port
    helpers = Helpers.start(target, a.idle, a.scrapers, a.reopen, helper_cpus)
    decoy = None
    calm: list[Round] = []
    hostile: list[Round] = []
    try:
        run_round(w, n, 1.0)  # warm-up: imports, the first page, the first judging
        if not a.no_decoy:
            decoy = start_decoy(page_bytes(target), helper_cpus)
        helpers.tell(f"go {target}")
        run_round(w, n, 1.0)
        helpers.stop()
        helpers.said.clear()
        for r in range(a.rounds):
            for kind in ("calm", "hostile") if r % 2 == 0 else ("hostile", "calm"):
                if kind == "calm" and decoy is None:
                    calm.append(run_round(w, n, a.round_s))
                elif kind == "calm":
                    helpers.tell(f"go {decoy[1]}")
                    calm.append(run_round(w, n, a.round_s))
                    helpers.stop()
                    del helpers.said[-len(helpers.procs) :]  # the decoy's answers
                else:
                    helpers.tell(f"go {target}")
                    hostile.append(run_round(w, n, a.round_s))
                    helpers.stop()
    finally:
        helpers.close()
        if decoy is not None:
            decoy[0].kill()
            decoy[0].wait()
        w.exporter.close()

    ratios = [h.steps_s / c.steps_s for c, h in zip(calm, hostile, strict=True)]
    scrapes = [s for s in helpers.said if "ok" in s]
    idles = [s for s in helpers.said if "opened" in s]
    pinned = (
        f"loop on CPU {sorted(loop_cpus)}, helpers on {sorted(helper_cpus)}"
        if helper_cpus
        else "CPU affinity left alone"
    )
    pinned += (
        "; calm rounds: the helpers quiet"
        if decoy is None
        else "; calm rounds: the same helpers against a decoy server (its own process)"
    )
    print(
        f"exporter_guest: a {a.step_ms:g} ms pure-Python step watched with prometheus=0, "
        f"{a.rounds} rounds of {a.round_s:g} s each way, interleaved; {pinned}"
    )
    print(f"{'':<10} {'steps/s median (min .. max)':<30} {'threads':>8} {'tasks':>6}")
    for name, rounds in (("calm", calm), ("hostile", hostile)):
        print(
            f"{name:<10} {spread([x.steps_s for x in rounds], '.1f'):<30} "
            f"{max(x.threads for x in rounds):>8} {max(x.tasks for x in rounds):>6}"
        )
    ok_ratio = statistics.median(ratios) >= TARGET
    threads_same = max(x.threads for x in hostile) <= max(x.threads for x in calm) and max(
        x.tasks for x in hostile
    ) <= max(x.tasks for x in calm)
    print(
        f"hostile/calm {spread(ratios, '.4f')} over {len(ratios)} rounds: "
        f"{'meets' if ok_ratio else 'misses'} the {TARGET} target; threads and tasks "
        f"{'unchanged' if threads_same else 'GREW'}"
    )
    if scrapes:
        fails = {k: sum(s[k] for s in scrapes) for k in scrapes[0] if k not in ("ok", "ms")}
        ms = [m for s in scrapes for m in s["ms"]]
        answered = sum(s["ok"] for s in scrapes)
        took = (
            f"; a scrape took {statistics.median(ms):.1f} ms median, "
            f"{statistics.quantiles(ms, n=20)[-1]:.1f} ms p95"
            if len(ms) >= 2
            else ""
        )
        print(
            f"scrapers   {a.scrapers} processes back to back: {answered} answered whole "
            f"({answered / (a.round_s * len(hostile)):.1f}/s), {sum(fails.values())} failed "
            f"({', '.join(f'{v} {k}' for k, v in fails.items())}){took}"
        )
    if idles:
        held = sorted(h for s in idles for h in s["held_s"])
        per = {
            k: sum(s[k] for s in idles) / len(idles) for k in ("opened", "failed", "open at end")
        }
        shut = (
            f"closed by the server {len(held) / len(idles):.0f} (held {spread(held, '.2f')} s: "
            f"{sum(h < 0.5 for h in held) / len(idles):.0f} within 0.5 s)"
            if held
            else "none closed by the server"
        )
        print(
            f"idle       {a.idle} a round{' (re-opened when closed)' if a.reopen else ''}: "
            f"per round {per['opened']:.0f} opened, {per['failed']:.0f} failed to connect; "
            f"{shut}; open at the round's end {per['open at end']:.0f}"
        )
    return 0 if ok_ratio and threads_same else 1


if __name__ == "__main__":
    sys.exit(main())
