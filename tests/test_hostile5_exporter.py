"""Hostile clients and a broken environment against watch's Prometheus exporter
(issue 58; loop/httpd.py, loop/exporter.py, loop/identity.py, docs/fleet.md).

Every case runs a stand-in training loop in the main thread, a watch with the
exporter on as a user turns it on (`prometheus=`, or the environment), passes of
STEPS steps as epochs, while the hostile client acts from one thread of its own;
`hosted` then asserts what the exporter promises the job: no traceback and at most
the warning lines the case expects on stderr, no step of the loop held back (none
raised, none waiting LONGEST_GAP_S), no thread or task added by clients, a normal
scrape still served and parsed, and after `close()` the port free and this process's
descriptors and threads back to what they were. Client sockets always have a timeout,
so a hang fails the case instead of the run. CLIENT_TIMEOUT_S is TIMEOUT_S here (5 s
in the server) so that the cases that wait for it stay short.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from starvecheck.loop import exporter as exporter_module
from starvecheck.loop import httpd, identity
from starvecheck.loop.exporter import ENV_ADDR, ENV_PORT
from starvecheck.loop.timer import Watch

STEPS = 20  # a pass of the stand-in loop: an epoch every STEPS steps
LONGEST_GAP_S = 2.0  # a step held back this long is the loop waiting on the exporter
TIMEOUT_S = 1.5  # the server's CLIENT_TIMEOUT_S in these cases
SOCK_S = 5.0  # every client socket operation's timeout
GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "p"}


@pytest.fixture(autouse=True)
def _short_timeouts(monkeypatch):
    monkeypatch.setattr(httpd, "CLIENT_TIMEOUT_S", TIMEOUT_S)
    for var in (ENV_PORT, ENV_ADDR, "LOCAL_RANK", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)


# --- the harness ---------------------------------------------------------------------


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def step_work() -> None:
    """A step of the stand-in loop: a little Python, then a wait as for the device."""
    sum(range(2000))
    time.sleep(0.001)


@dataclass
class Job:
    """What a hostile client knows of the job: where the exporter listens."""

    port: int | None
    host: str  # where a client connects (a wildcard address's loopback)
    watch: Watch


def connect_to(addr: str) -> str:
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(addr, addr)


def family_of(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def hosted(
    capfd: pytest.CaptureFixture[str],
    act: Callable[[Job], Any],
    *,
    warnings: int = 0,
    client_threads: int = 1,
    served: bytes | None = b"200",
    figures: bool = True,
    limit_s: float = 30.0,
    **watch: Any,
) -> tuple[Any, str]:
    """Run `act` against a watched loop's exporter and assert the guest's promises;
    `act`'s result and what was written on stderr. `warnings`: the warning lines the
    case expects; `served`: the status of a normal scrape afterwards (None: no scrape,
    nothing serves); `figures`: whether that page has the loop's figures."""
    watch.setdefault("prometheus", 0)
    addr = watch.get("prometheus_addr") or "127.0.0.1"
    capfd.readouterr()
    fds0, threads0, tasks0 = fds(), threading.active_count(), tasks()
    w = Watch(range(STEPS), show=False, **watch)
    try:
        port = w.exporter.port if w.exporter is not None else None
        job = Job(port, connect_to(addr), w)
        got = stand_in_loop(w, job, act, client_threads, limit_s)
        if served is not None:
            answer = ask(job, GET)
            assert status(answer) == served, answer[:200]
            if served == b"200":
                assert bool(parsed(answer).get("starvecheck_batches")) is figures
    finally:
        if w.exporter is not None:
            w.exporter.close()
    if port:
        again = socket.create_server((addr, port), family=family_of(addr))
        again.close()
    settle = time.monotonic() + 3.0
    while fds() > fds0 or threading.active_count() > threads0 or tasks() > tasks0:
        assert time.monotonic() < settle, (fds(), fds0, threading.active_count(), threads0)
        time.sleep(0.05)
    err = capfd.readouterr().err
    assert "Traceback" not in err and len(err.splitlines()) == warnings, err
    assert all(line.startswith("starvecheck: warning: ") for line in err.splitlines())
    return got, err


def stand_in_loop(
    w: Watch, job: Job, act: Callable[[Job], Any], client_threads: int, limit_s: float
) -> Any:
    """Passes of the loop while `act` runs in a thread: `act`'s result, or its error
    raised here; none of the loop's steps raised or held back, no thread added."""
    for _ in w:  # a calm pass first
        step_work()
    calm_threads, calm_tasks = threading.active_count(), tasks()
    got: list[Any] = []
    failed: list[BaseException] = []

    def client() -> None:
        try:
            got.append(act(job))
        except BaseException as e:  # re-raised in the test's thread
            failed.append(e)

    thread = threading.Thread(target=client, name="hostile-client", daemon=True)
    thread.start()
    steps, longest, most_threads, most_tasks = 0, 0.0, 0, 0
    began = last = time.monotonic()
    while True:
        for _ in w:
            step_work()
            now = time.monotonic()
            longest, last, steps = max(longest, now - last), now, steps + 1
            most_threads = max(most_threads, threading.active_count())
            most_tasks = max(most_tasks, tasks())
        if not thread.is_alive() or time.monotonic() - began > limit_s:
            break
    assert not thread.is_alive(), f"the hostile client was still at it after {limit_s} s"
    if failed:
        raise failed[0]
    assert steps >= STEPS and longest < LONGEST_GAP_S, (steps, longest)
    assert most_threads <= calm_threads + client_threads, (most_threads, calm_threads)
    assert most_tasks <= calm_tasks + client_threads, (most_tasks, calm_tasks)
    return got[0]


def connect(job: Job, timeout: float = SOCK_S) -> socket.socket:
    assert job.port is not None
    return socket.create_connection((job.host, job.port), timeout=timeout)


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def ask(job: Job, request: bytes = GET, half_close: bool = False) -> bytes:
    """The whole answer to `request` (b"": closed with none)."""
    with connect(job) as s:
        s.sendall(request)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return read_all(s)


def status(answer: bytes) -> bytes:
    return answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else b""


def body(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


def header(answer: bytes, name: bytes) -> bytes:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == name.lower():
            return v.strip()
    return b""


def parsed(answer: bytes) -> dict[str, list]:
    """The page as Prometheus's text parser reads it: family name -> samples."""
    assert whole(answer)
    assert header(answer, b"Content-Type").startswith(b"text/plain; version=0.0.4")
    text = body(answer).decode("utf-8")
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def whole(answer: bytes) -> bool:
    """A 200 with all the body its Content-Length says (a big page, not parsed)."""
    return status(answer) == b"200" and int(header(answer, b"Content-Length")) == len(body(answer))


def closed_by_server(s: socket.socket, within: float) -> float:
    """Seconds until the server closed `s` (reading and dropping what it sends)."""
    began = time.monotonic()
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def small_window(job: Job, rcvbuf: int = 4096) -> socket.socket:
    """A connection whose receive buffer (and so its window) is small from the start."""
    s = socket.socket(family_of(job.host))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(SOCK_S)
    s.connect((job.host, job.port))
    return s


def reset(s: socket.socket) -> None:
    """Close with a reset (RST), as a crashed client or a middlebox does."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


# --- requests of every shape ---------------------------------------------------------

# (request, the status answered; b"": closed at the client's timeout with no answer)
SHAPES = {
    "http09": (b"GET /metrics\r\n", b""),
    "http09-blank-line": (b"GET /metrics\r\n\r\n", b"400"),
    "no-crlf": (b"GET /metrics HTTP/1.1", b""),
    "empty-request": (b"\r\n\r\n", b"400"),
    "extra-word": (b"GET /metrics HTTP/1.1 x\r\n\r\n", b"400"),
    "no-version": (b"GET /metrics FOO/1.1\r\n\r\n", b"400"),
    "nul-bytes": (b"\x00" * 100 + b"\r\n\r\n", b"400"),
    "tls-client-hello": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)), b""),
    "http2-preface": (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"405"),
    "options": (b"OPTIONS * HTTP/1.1\r\n\r\n", b"405"),
    "connect": (b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n", b"405"),
    "trace": (b"TRACE /metrics HTTP/1.1\r\n\r\n", b"405"),
    "put": (b"PUT /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi", b"405"),
    "delete": (b"DELETE /metrics HTTP/1.1\r\n\r\n", b"405"),
    "lowercase-get": (b"get /metrics HTTP/1.1\r\n\r\n", b"405"),
    "absolute-uri": (b"GET http://127.0.0.1/metrics HTTP/1.1\r\n\r\n", b"200"),
    "absolute-uri-query": (b"GET HTTP://x:1/metrics?a=%00 HTTP/1.1\r\n\r\n", b"200"),
    "absolute-uri-elsewhere": (b"GET http://x/etc/passwd HTTP/1.1\r\n\r\n", b"404"),
    "percent-nul-path": (b"GET /metrics%00 HTTP/1.1\r\n\r\n", b"404"),
    "raw-nul-path": (b"GET /metrics\x00.txt HTTP/1.1\r\n\r\n", b"404"),
    "dot-dot": (b"GET /../../../etc/passwd HTTP/1.1\r\n\r\n", b"404"),
    "dot-dot-back": (b"GET /x/../metrics HTTP/1.1\r\n\r\n", b"404"),
    "long-path": (b"GET /" + b"a" * 8000 + b" HTTP/1.1\r\n\r\n", b"404"),
    "path-past-the-limit": (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", b"431"),
    "line-past-the-limit": (b"GET /" + b"a" * 20000, b"431"),
    "huge-content-length": (
        b"GET /metrics HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
        b"200",
    ),
    "chunked-body": (
        b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"200",
    ),
    "expect-continue": (b"GET /metrics HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", b"200"),
    "header-without-colon": (b"GET /metrics HTTP/1.1\r\nnot a header\r\n\r\n", b"200"),
    "accept-garbage": (b"GET /metrics HTTP/1.1\r\nAccept: ;q=,;;\xff\xfe,/\r\n\r\n", b"200"),
}


@pytest.mark.parametrize(("request_", "answered"), SHAPES.values(), ids=SHAPES.keys())
def test_a_request_of_any_shape_gets_one_answer_or_a_close(capfd, request_, answered):
    def act(job: Job) -> None:
        began = time.monotonic()
        got = ask(job, request_)
        assert status(got) == answered, got[:200]
        assert got.count(b"HTTP/1.1 ") <= 1
        if answered == b"":
            assert got == b"" and TIMEOUT_S - 0.2 < time.monotonic() - began < TIMEOUT_S + 2
        elif answered == b"200":
            assert parsed(got)
        elif answered == b"405":
            assert header(got, b"Allow") == b"GET, HEAD"

    hosted(capfd, act)


def past_the_limit(job: Job, request: bytes) -> bytes:
    """Send all of `request` (far past REQUEST_LIMIT) and read the answer."""
    with connect(job) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        return read_all(s)


BIG = {
    "1-MB-request": GET[:-2] + b"X-Pad: " + b"a" * (1 << 20) + b"\r\n\r\n",
    "10000-headers": GET[:-2] + b"".join(b"H%d: v\r\n" % i for i in range(10000)) + b"\r\n",
    "100-KB-header": GET[:-2] + b"Cookie: " + b"c" * 100_000 + b"\r\n\r\n",
    "64-KB-garbage": bytes((i * 7 + 3) % 256 or 1 for i in range(65536)).replace(b"\n", b"."),
}


@pytest.mark.parametrize("request_", BIG.values(), ids=BIG.keys())
def test_a_request_far_past_the_limit_is_refused_once_and_read_no_further(capfd, request_):
    hosted(capfd, lambda job: assert_status(past_the_limit(job, request_), b"431"))


def assert_status(answer: bytes, wanted: bytes) -> None:
    assert status(answer) == wanted, answer[:200]


ACCEPTS = [
    b"application/openmetrics-text",
    b"application/openmetrics-text; version=1.0.0; charset=utf-8",
    b"application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    b"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited",
    b"application/openmetrics-text; version=\xff\x00; q=NaN",
]


@pytest.mark.parametrize("accept", ACCEPTS, ids=range(len(ACCEPTS)))
def test_any_accept_header_is_answered_in_the_text_format(capfd, accept):
    request = GET[:-2] + b"Accept: " + accept + b"\r\n\r\n"
    hosted(capfd, lambda job: parsed(ask(job, request)))


# --- connections that misbehave ------------------------------------------------------


def idle_300(job: Job) -> None:
    """300 connections that send nothing: all but the newest few are closed at once,
    the last MAX_CLIENTS at their timeout; a scrape among them is served."""
    idle = [connect(job) for _ in range(300)]
    try:
        sel = selectors.DefaultSelector()
        for s in idle:
            sel.register(s, selectors.EVENT_READ)
        closed, deadline = 0, time.monotonic() + 2
        while closed < 300 - httpd.MAX_CLIENTS and time.monotonic() < deadline:
            for key, _ in sel.select(0.1):
                assert key.fileobj.recv(16) == b""  # type: ignore[union-attr]
                sel.unregister(key.fileobj)
                closed += 1
        sel.close()
        assert closed >= 300 - httpd.MAX_CLIENTS
        assert parsed(ask(job))
    finally:
        for s in idle:
            s.close()


def slowloris(job: Job) -> None:
    """A byte every 0.25 s never extends the client's time."""
    with connect(job) as s:
        began = time.monotonic()
        for byte in GET[:-4]:
            try:
                s.sendall(bytes([byte]))
                r, _, _ = select.select([s], [], [], 0.25)
                if r and s.recv(16) == b"":
                    break
            except (BrokenPipeError, ConnectionResetError):  # a byte came as it closed
                break
        assert time.monotonic() - began < TIMEOUT_S + 1


def slowloris_fills_every_slot(job: Job) -> None:
    """MAX_CLIENTS connections trickling their requests: a scrape still gets through."""
    trickling = [connect(job) for _ in range(httpd.MAX_CLIENTS)]
    try:
        for s in trickling:
            s.sendall(b"GET /met")
        began = time.monotonic()
        assert parsed(ask(job))
        assert time.monotonic() - began < 1.0
    finally:
        for s in trickling:
            s.close()


def scrapes_in_a_flood(job: Job) -> None:
    """Each scrape followed at once by a burst of 2 * MAX_CLIENTS idle connections: the
    connections closed to make room are the burst's, never the scrape, whose request
    came first."""
    held: list[socket.socket] = []
    try:
        for _ in range(10):
            with connect(job) as scrape:
                scrape.sendall(GET)
                held += [connect(job) for _ in range(2 * httpd.MAX_CLIENTS)]
                assert status(read_all(scrape)) == b"200"
    finally:
        for s in held:
            s.close()


def big_page_slow_reader_in_a_flood(job: Job) -> None:
    """A scrape being answered is not the connection closed to make room: 40 idle
    connections while a slow reader takes a page of about 1 MB."""
    with small_window(job, 8192) as s:
        s.sendall(GET)
        first = s.recv(65536)
        idle = [connect(job) for _ in range(40)]
        try:
            out = first
            while chunk := s.recv(8192):
                out += chunk
                time.sleep(0.0005)
        finally:
            for c in idle:
                c.close()
    assert whole(out)


def never_reads(job: Job) -> None:
    """A client that never reads a page of about 1 MB: the server's sends never wait on
    it, others are served meanwhile, and its end is closed at its timeout (what the
    kernel had taken of the page is still delivered)."""
    with small_window(job) as lazy:
        lazy.sendall(GET)
        assert lazy.recv(1, socket.MSG_PEEK) == b"H"  # its answer is being written
        for _ in range(2):
            began = time.monotonic()
            got = ask(job)
            assert time.monotonic() - began < 0.5
            assert whole(got)
        time.sleep(TIMEOUT_S)
        with contextlib.suppress(ConnectionResetError):
            read_all(lazy)  # to the server's close, not this socket's timeout


def reset_mid_request(job: Job) -> None:
    for n in (0, 1, 9, len(GET) - 1):
        for _ in range(5):
            with connect(job) as s:
                s.sendall(GET[:n])
                reset(s)
    assert parsed(ask(job))


def reset_mid_response(job: Job) -> None:
    for _ in range(10):
        with connect(job) as s:
            s.sendall(GET)
            s.recv(1000)
            reset(s)
    assert whole(ask(job))


def half_close_mid_request(job: Job) -> None:
    """The client's end of sending before its request ended: closed, unanswered, at once."""
    began = time.monotonic()
    assert ask(job, GET[:12], half_close=True) == b""
    assert time.monotonic() - began < 1.0


def half_close_after_request(job: Job) -> None:
    assert parsed(ask(job, GET, half_close=True))


def keep_alive_then_idle(job: Job) -> None:
    """Asked to keep the connection: answered once, then the server's close comes
    with the answer, not at the timeout."""
    with connect(job) as s:
        began = time.monotonic()
        s.sendall(GET[:-2] + b"Connection: keep-alive\r\n\r\n")
        got = read_all(s)
        assert parsed(got) and header(got, b"Connection") == b"close"
        assert time.monotonic() - began < 1.0
        time.sleep(TIMEOUT_S + 0.2)  # idle past the timeout: nothing more, no error


def pipelined(job: Job) -> None:
    got = ask(job, GET + GET + b"GET /x HTTP/1.1\r\n\r\n")
    assert parsed(got) and got.count(b"HTTP/1.1 ") == 1


def churn(job: Job) -> None:
    """100 connections a second for 2 s, each closed (FIN, RST, mid-request)."""
    for i in range(200):
        with connect(job) as s:
            if i % 3 == 1:
                s.sendall(GET[:7])
            if i % 2:
                reset(s)
        time.sleep(0.01)
    assert parsed(ask(job))


def tls_scraper(job: Job) -> None:
    """Prometheus told `scheme: https`: its handshake is closed at the timeout."""
    import ssl

    ctx = ssl.create_default_context()
    began = time.monotonic()
    with connect(job) as s, pytest.raises((ssl.SSLError, ConnectionError)):
        ctx.wrap_socket(s, server_hostname="x").close()
    assert time.monotonic() - began < TIMEOUT_S + 1


BIG_SAMPLES = 20_000


@pytest.fixture
def big_page(monkeypatch):
    """The page with a family of BIG_SAMPLES samples beside the loop's (about 1 MB),
    rendered once a case (half a second of CPU)."""
    real = exporter_module.families
    monkeypatch.setattr(httpd, "PAGE_TTL_S", 60.0)

    def with_big(*args: Any) -> Iterator[Any]:
        yield from real(*args)
        big = GaugeMetricFamily("big", "many samples", labels=["i"])
        for i in range(BIG_SAMPLES):
            big.add_metric([f"{i:040d}"], float(i))
        yield big

    monkeypatch.setattr(exporter_module, "families", with_big)


CONNECTIONS = {
    "300-idle": idle_300,
    "slowloris": slowloris,
    "slowloris-in-every-slot": slowloris_fills_every_slot,
    "reset-mid-request": reset_mid_request,
    "half-close-mid-request": half_close_mid_request,
    "half-close-after-request": half_close_after_request,
    "keep-alive-then-idle": keep_alive_then_idle,
    "pipelined": pipelined,
    "100-a-second-for-2-s": churn,
    "tls-handshake": tls_scraper,
}
ON_A_BIG_PAGE = {
    "never-reads": never_reads,
    "reset-mid-response": reset_mid_response,
    "slow-reader-in-a-flood": big_page_slow_reader_in_a_flood,
}


@pytest.mark.parametrize("act", CONNECTIONS.values(), ids=CONNECTIONS.keys())
def test_a_connection_that_misbehaves_harms_neither_the_loop_nor_a_scrape(capfd, act):
    hosted(capfd, act)


def test_a_flood_of_connections_never_closes_a_scrape_whose_request_came(capfd):
    hosted(capfd, scrapes_in_a_flood, client_threads=2)


@pytest.mark.parametrize("act", ON_A_BIG_PAGE.values(), ids=ON_A_BIG_PAGE.keys())
def test_a_client_of_a_big_page_never_blocks_the_server(capfd, big_page, act):
    hosted(capfd, act)


# --- addresses -----------------------------------------------------------------------


def has_ipv6() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("addr", ["127.0.0.1", "0.0.0.0", "localhost", "::1", "::"])
def test_every_address_family_serves_and_refuses_alike(capfd, addr):
    if ":" in addr and not has_ipv6():
        pytest.skip("no IPv6 here")

    def act(job: Job) -> None:
        assert parsed(ask(job))
        assert status(ask(job, b"\xff\xfe\r\n\r\n")) == b"400"
        with connect(job) as s:
            s.sendall(b"GET /m")
            reset(s)

    hosted(capfd, act, prometheus_addr=addr)


# --- the figures ---------------------------------------------------------------------

HOSTILE_VALUES = {
    "quotes-backslashes-newlines": 'a"b\\c\nd\\n"\r\n',
    "invalid-utf8": os.fsdecode(b"caf\xe9\xff\xfe-\xc3"),
    "unicode-separators": "a\u2028b\u2029c\x85d\x7fe\tf",
    "label-syntax": '"} 1e9\nstarvecheck_batches_total{job="x"} 7\n#',
    "100-KB": "j" * 100_000,
}


@pytest.mark.parametrize("value", HOSTILE_VALUES.values(), ids=HOSTILE_VALUES.keys())
def test_a_hostile_label_value_is_escaped_and_parses(capfd, monkeypatch, value):
    monkeypatch.setenv("STARVECHECK_JOB", value)
    monkeypatch.setenv("SLURM_JOB_ID", value)
    wanted = identity.utf8(value).strip()

    def act(job: Job) -> None:
        samples = parsed(ask(job))["starvecheck_batches"]
        assert [s.labels["job"] for s in samples] == [wanted]
        assert [s.labels["slurm_job_id"] for s in samples] == [identity.utf8(value)]

    hosted(capfd, act)


def test_a_figure_that_cannot_be_read_is_one_warning_and_the_loop_goes_on(capfd, monkeypatch):
    def broken(*args: Any) -> Iterator[Any]:
        raise RuntimeError("boom\nand a second line")
        yield

    monkeypatch.setattr(exporter_module, "families", broken)

    def act(job: Job) -> None:
        for _ in range(3):
            assert status(ask(job)) == b"200"

    hosted(capfd, act, warnings=1, figures=False)  # the page is served, empty


def test_nan_and_infinite_figures_are_served_as_prometheus_reads_them(capfd, monkeypatch):
    real = exporter_module.families

    def odd(*args: Any) -> Iterator[Any]:
        yield from real(*args)
        g = GaugeMetricFamily("odd", "not finite", labels=["v"])
        for name, v in (("nan", float("nan")), ("inf", float("inf")), ("-inf", float("-inf"))):
            g.add_metric([name], v)
        yield g

    monkeypatch.setattr(exporter_module, "families", odd)

    def act(job: Job) -> None:
        got = {s.labels["v"]: s.value for s in parsed(ask(job))["odd"]}
        assert got["nan"] != got["nan"] and got["inf"] == float("inf") == -got["-inf"]

    hosted(capfd, act)


def test_a_page_that_takes_10_s_holds_back_neither_the_loop_nor_other_clients(capfd, monkeypatch):
    """The figures take 10 s to read (a machine swapping, a lock held elsewhere): the
    loop's passes go on, other requests are answered at once, and a scrape waiting for
    the page is closed at its timeout, never later. (The 10 s are cut short once the
    loop has gone on past LONGEST_GAP_S, to keep the case short.)"""
    release = threading.Event()
    real = exporter_module.families
    slow_once: list[bool] = []

    def slow(*args: Any) -> Iterator[Any]:
        if not slow_once:
            slow_once.append(True)
            release.wait(10)
        yield from real(*args)

    monkeypatch.setattr(exporter_module, "families", slow)

    others = (b"GET /x HTTP/1.1\r\n\r\n", b"\xff\r\n\r\n", b"OPTIONS * HTTP/1.1\r\n\r\n")

    def act(job: Job) -> None:
        try:
            with connect(job) as waiting:
                waiting.sendall(GET)
                time.sleep(0.2)  # the page is being read
                began = time.monotonic()
                for request in others:
                    assert status(ask(job, request)) in (b"404", b"400", b"405")
                assert time.monotonic() - began < 1.0
                assert closed_by_server(waiting, SOCK_S) < TIMEOUT_S + 1
            time.sleep(max(0.0, began + LONGEST_GAP_S + 0.5 - time.monotonic()))
        finally:  # the page is still being read past the loop's longest step
            release.set()

    hosted(capfd, act)


def test_a_scrape_waiting_for_the_page_is_not_closed_to_make_room(capfd, monkeypatch):
    """A flood of idle connections while the page is being made: the connections closed
    to make room are the idle ones, not the scrape waiting for the page."""
    real = exporter_module.families

    def slow(*args: Any) -> Iterator[Any]:
        time.sleep(0.5)
        yield from real(*args)

    monkeypatch.setattr(exporter_module, "families", slow)

    def act(job: Job) -> None:
        with connect(job) as waiting:
            waiting.sendall(GET)
            time.sleep(0.1)
            idle = [connect(job) for _ in range(3 * httpd.MAX_CLIENTS)]
            try:
                assert parsed(read_all(waiting))
            finally:
                for s in idle:
                    s.close()

    hosted(capfd, act)


# --- the pod's namespace file --------------------------------------------------------


def namespace_fifo(p: Path) -> None:
    os.mkfifo(p)


def namespace_sparse(p: Path) -> None:
    with open(p, "wb") as f:
        f.truncate(1 << 30)


def namespace_socket(p: Path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(p))  # the socket file stays


NAMESPACES = {
    "fifo": (namespace_fifo, None),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), None),
    "sparse-1-GB": (namespace_sparse, None),
    "dangling-link": (lambda p: p.symlink_to(p.parent / "nowhere"), None),
    "directory": (lambda p: p.mkdir(), None),
    "unix-socket": (namespace_socket, None),
    "proc-self-mem": (lambda p: p.symlink_to("/proc/self/mem"), None),
    "undecodable": (lambda p: p.write_bytes(b"team-\xff\xfe\n"), "team-\ufffd\ufffd"),
    "control-characters": (lambda p: p.write_bytes(b"\x00te\x1bam\r\n\x00"), "team"),
}


@pytest.mark.parametrize(("make", "served_as"), NAMESPACES.values(), ids=NAMESPACES.keys())
def test_a_namespace_file_of_any_kind_is_read_bounded_or_left_alone(
    capfd, monkeypatch, tmp_path, make, served_as
):
    path = tmp_path / "namespace"
    make(path)
    for k, v in POD.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(identity, "SA_NAMESPACE", path)

    def act(job: Job) -> None:
        began = time.monotonic()
        (sample,) = parsed(ask(job))["starvecheck_batches"]
        assert sample.labels["pod"] == "p" and sample.labels.get("namespace") == served_as
        assert time.monotonic() - began < 1.0

    try:
        hosted(capfd, act)
    finally:
        if path.is_fifo():
            os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


# --- ports and addresses from the user -----------------------------------------------


@pytest.mark.parametrize(
    "value", ["65536", "-1", "abc", "1e3", "0x1f90", "9500.0", "99999999999999999999"]
)
def test_a_port_in_the_environment_that_is_no_port_is_one_warning_and_no_export(
    capfd, monkeypatch, value
):
    monkeypatch.setenv(ENV_PORT, value)
    exporter, err = hosted(
        capfd, lambda job: job.watch.exporter, prometheus=None, served=None, warnings=1
    )
    assert exporter is None and ENV_PORT in err


def test_port_0_in_the_environment_serves_on_a_free_port(capfd, monkeypatch):
    monkeypatch.setenv(ENV_PORT, "0")
    hosted(capfd, lambda job: parsed(ask(job)), prometheus=None)


def test_a_port_past_65535_with_the_local_rank_is_one_warning(capfd, monkeypatch):
    monkeypatch.setenv(ENV_PORT, "65535")
    monkeypatch.setenv("LOCAL_RANK", "1")
    exporter, err = hosted(
        capfd, lambda job: job.watch.exporter, prometheus=None, served=None, warnings=1
    )
    assert exporter is None and "LOCAL_RANK" in err


@pytest.mark.parametrize("local_rank", ["-1", "abc", "", "\xff"])
def test_a_local_rank_that_is_no_number_adds_nothing_to_the_port(capfd, monkeypatch, local_rank):
    with socket.create_server(("127.0.0.1", 0)) as probe:
        free = probe.getsockname()[1]
    monkeypatch.setenv(ENV_PORT, str(free))
    monkeypatch.setenv("LOCAL_RANK", local_rank)

    def act(job: Job) -> None:
        assert job.port == free
        assert parsed(ask(job))

    hosted(capfd, act, prometheus=None)


def test_a_port_already_in_use_is_one_warning_the_loop_runs_on_and_nothing_serves(
    capfd, monkeypatch
):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        monkeypatch.setenv(ENV_PORT, str(port))

        def act(job: Job) -> None:
            assert job.watch.exporter is None and job.port is None

        _, err = hosted(capfd, act, prometheus=None, served=None, warnings=1)
        assert "in use" in err


@pytest.mark.parametrize("addr", ["999.0.0.1", "1.2.3.4", "[::1]", "::1%nope", "localhost:9500"])
def test_an_address_that_is_not_this_hosts_is_one_warning(capfd, monkeypatch, addr):
    monkeypatch.setenv(ENV_ADDR, addr)
    exporter, err = hosted(
        capfd, lambda job: job.watch.exporter, prometheus=0, served=None, warnings=1
    )
    assert exporter is None and "export to Prometheus" in err


@pytest.mark.parametrize("port", [-1, 65536, "abc", 9500.0, True])
def test_a_port_in_code_that_is_no_port_is_refused_before_the_loop(capfd, port):
    threads0, fds0 = threading.active_count(), fds()
    with pytest.raises(ValueError, match="TCP port"):
        Watch(range(3), show=False, prometheus=port)
    assert (threading.active_count(), fds()) == (threads0, fds0)
    assert capfd.readouterr().err == ""


def test_another_socket_cannot_share_the_port_to_take_scrapes(capfd):
    def act(job: Job) -> None:
        for option in (socket.SO_REUSEPORT, socket.SO_REUSEADDR):
            thief = socket.socket()
            thief.setsockopt(socket.SOL_SOCKET, option, 1)
            with thief, pytest.raises(OSError) as e:
                thief.bind(("127.0.0.1", job.port))
                thief.listen()
            assert e.value.errno == errno.EADDRINUSE

    hosted(capfd, act)


# --- close and fork ------------------------------------------------------------------


def test_close_from_another_thread_while_scrapes_run(capfd):
    """Scrapers at work while the exporter is closed: each ends, answered or refused,
    never hung; the loop's next pass is one warning, once."""

    def act(job: Job) -> None:
        ends: list[str] = []

        def scrape() -> None:
            for _ in range(200):
                try:
                    got = ask(job)
                    assert status(got) in (b"200", b"")
                except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
                    ends.append("refused")
                    return
            ends.append("done")

        scrapers = [threading.Thread(target=scrape) for _ in range(3)]
        for t in scrapers:
            t.start()
        time.sleep(0.2)
        job.watch.exporter.close()
        job.watch.exporter.close()
        for t in scrapers:
            t.join(SOCK_S)
        assert not any(t.is_alive() for t in scrapers) and len(ends) == 3
        time.sleep(0.1)  # the loop begins a pass on the closed exporter

    hosted(capfd, act, client_threads=4, served=None, warnings=1)


def listening_inode(port: int) -> str:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:
            return f[9]
    raise AssertionError(f"nothing listens on {port}")


def test_a_child_forked_after_start_does_not_hold_the_port(capfd):
    children: list[int] = []

    def act(job: Job) -> None:
        inode = f"socket:[{listening_inode(job.port)}]"
        pid = os.fork()
        if pid == 0:  # the child: as a DataLoader worker would, it lives on
            try:
                time.sleep(30)
            finally:
                os._exit(0)
        children.append(pid)
        time.sleep(0.2)
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        assert inode not in held
        assert parsed(ask(job))

    try:
        hosted(capfd, act)  # closes the exporter, binds the port again: the child lives
        assert os.waitpid(children[0], os.WNOHANG) == (0, 0)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


# --- the process around it: signals, descriptors -------------------------------------

GUEST = textwrap.dedent(
    """
    import json, os, resource, signal, sys, threading, time
    from starvecheck.loop.timer import Watch
    case, WINDOW_S = sys.argv[1], float(sys.argv[2])
    if case == "sigpipe":  # what a CLI does to die quietly in a pipe
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    w = Watch(range(20), show=False, prometheus=0)
    for _ in w:
        pass
    print(w.exporter.port, flush=True)
    tid = next(t.native_id for t in threading.enumerate() if t.name.endswith(str(w.exporter.port)))
    stat = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
    def cpu():  # the server's thread's, in seconds
        return int(os.pread(stat, 100, 0).split()[0]) / 1e9
    if case == "emfile":  # the job at its descriptor limit
        soft = len(os.listdir("/proc/self/fd")) + 2
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    sys.stdin.readline()  # the clients act
    cpu0, steps, began = cpu(), 0, time.monotonic()
    while time.monotonic() - began < WINDOW_S:
        for _ in w:
            sum(range(2000))  # a step of pure Python, holding the GIL
            steps += 1
    print(json.dumps({"steps": steps, "server_cpu_s": cpu() - cpu0}), flush=True)
    sys.stdin.readline()
    w.exporter.close()
    """
)


def big_answer_reset(port: int) -> None:
    """Scrapes reset once their answers (1 MB) began: the server writes into a reset socket."""
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", port), timeout=SOCK_S) as s:
            s.sendall(GET)
            s.recv(100)
            reset(s)


def scrapers(port: int, until: threading.Event) -> tuple[list[threading.Thread], list[int]]:
    """Three threads scraping back to back until `until`; the answers each had whole."""
    answered = [0, 0, 0]

    def scrape(k: int) -> None:
        while not until.is_set():
            with contextlib.suppress(OSError):
                if status(ask(Job(port, "127.0.0.1", None), GET)) == b"200":  # type: ignore[arg-type]
                    answered[k] += 1

    threads = [threading.Thread(target=scrape, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    return threads, answered


def many_connections(port: int) -> list[socket.socket]:
    held = []
    for _ in range(30):
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=0.5))
        except OSError:
            break
    return held


WINDOW_S = 1.5


@pytest.mark.parametrize("case", ["sigpipe", "emfile", "scrapers"])
def test_the_process_around_the_server_is_not_harmed(case):
    """sigpipe: the job restored SIGPIPE's default (a CLI's idiom) and scrapers reset
    while their answers are written: the job must not die. emfile: the job is at its
    descriptor limit and connections wait in the backlog: the server must not spin.
    scrapers: three scrape back to back beside a loop of pure Python: they are served,
    and the server's thread keeps to its share of a CPU (before, about 15% of the loop's
    steps went to them). In each, that thread's CPU over the window is within its share."""
    big = {"STARVECHECK_JOB": "x" * 20000} if case == "sigpipe" else {}  # a page of 1 MB
    job = subprocess.Popen(
        [sys.executable, "-c", GUEST, case, str(WINDOW_S)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **big},
    )  # fmt: skip
    held: list[socket.socket] = []
    until = threading.Event()
    threads: list[threading.Thread] = []
    answered: list[int] = []
    try:
        assert job.stdout is not None and job.stdin is not None
        port = int(job.stdout.readline())
        job.stdin.write("go\n")
        job.stdin.flush()
        if case == "sigpipe":
            big_answer_reset(port)
        elif case == "emfile":
            held = many_connections(port)
        else:
            threads, answered = scrapers(port, until)
        line = job.stdout.readline()
        assert line, f"the job died: {job.wait(10)}, {job.stderr.read()[-2000:]}"  # type: ignore[union-attr]
        got = json.loads(line)
        share = 2 * (WINDOW_S * httpd.CPU_SHARE + httpd.CPU_BURST_S)
        assert got["steps"] > 100 and got["server_cpu_s"] < share, got
        if case == "scrapers":  # served, at the pace the server keeps (ANSWERS_PER_S)
            assert sum(answered) >= 0.6 * httpd.ANSWERS_PER_S * WINDOW_S, answered
        job.stdin.write("end\n")
        job.stdin.flush()
        _, err = job.communicate(timeout=30)
        assert job.returncode == 0 and err == "", err[-2000:]
    finally:
        until.set()
        for t in threads:
            t.join(SOCK_S)
        for s in held:
            s.close()
        if job.poll() is None:
            job.kill()
            job.wait(10)
