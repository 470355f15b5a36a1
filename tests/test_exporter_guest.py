"""The exporter is a guest in the training process (issue 58; loop/httpd.py,
loop/identity.py): idle and hostile connections never add a thread or a line to the
job's log, label values from the environment are served as UTF-8, the pod's namespace
file is read bounded and off the loop's path, forked children do not keep the port,
and a real pids limit is not used up by connections."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from starvecheck.loop import httpd, identity
from starvecheck.loop.httpd import MAX_CLIENTS, Server
from starvecheck.loop.timer import Watch
from tests.pidscgroup import pids_cgroup, remove

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def started(render=lambda: b"x 1\n") -> tuple[Server, list[str]]:
    warnings: list[str] = []
    return Server(render, 0, "127.0.0.1", warnings.append), warnings


def ask(port: int, request: bytes = GET, timeout: float = 5.0) -> bytes:
    """What the server answers `request`, read to the connection's close."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_idle_connections_never_add_a_thread_and_a_scrape_is_still_served():
    """prometheus_client's server: a thread per connection, 40 idle ones 40 threads."""
    server, warnings = started()
    try:
        base = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.server_port)) for _ in range(40)]
        time.sleep(0.3)
        assert threading.active_count() == base
        assert server.clients <= MAX_CLIENTS
        assert ask(server.server_port).startswith(b"HTTP/1.1 200 OK")
        assert threading.active_count() == base
        for s in idle:
            s.close()
    finally:
        server.close()
    assert warnings == []


def test_a_client_that_sends_nothing_is_closed_at_its_timeout(monkeypatch):
    monkeypatch.setattr(httpd, "CLIENT_TIMEOUT_S", 0.3)
    server, _ = started()
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as s:
            began = time.monotonic()
            assert s.recv(10) == b""  # closed by the server, not by this timeout
            assert time.monotonic() - began < 3
        assert server.clients == 0
    finally:
        server.close()


def test_a_request_past_the_limit_is_refused_and_closed():
    server, _ = started()
    try:
        got = ask(server.server_port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000)
        assert got.startswith(b"HTTP/1.1 431 ")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (GET, b"200"),
        (b"GET / HTTP/1.0\n\n", b"200"),  # bare line feeds
        (b"GET /metrics?x=1 HTTP/1.1\r\nAccept: ;;;q=abc,\xff/\x00\r\n\r\n", b"200"),
        (b"HEAD /metrics HTTP/1.1\r\n\r\n", b"200"),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc", b"405"),
        (b"GET /x HTTP/1.1\r\n\r\n", b"404"),
        (b"GET\r\n\r\n", b"400"),
        (b"\x00\xff\xfe garbage \x80\r\n\r\n", b"400"),
    ],
)
def test_every_request_gets_one_answer_and_no_line_in_the_jobs_log(capfd, request_, status):
    server, warnings = started(lambda: b"x 1\n")
    try:
        got = ask(server.server_port, request_)
        assert got.split(b" ", 2)[1] == status
        if request_.startswith(b"HEAD"):
            assert got.endswith(b"\r\n\r\n")  # the head only
        elif status == b"200":
            assert got.endswith(b"\r\n\r\nx 1\n")
    finally:
        server.close()
    assert capfd.readouterr().err == "" and warnings == []


def test_resets_and_half_requests_print_nothing_and_the_next_scrape_is_served(capfd):
    server, warnings = started()
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.server_port))
            s.sendall(b"GET /metr")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()  # a reset, mid-request
        for _ in range(5):  # a reset while the answer is being written
            s = socket.create_connection(("127.0.0.1", server.server_port))
            s.sendall(GET)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        assert ask(server.server_port).startswith(b"HTTP/1.1 200 OK")
    finally:
        server.close()
    assert capfd.readouterr().err == "" and warnings == []


def test_scrapers_at_once_share_one_rendering_of_the_page():
    made: list[float] = []

    def render() -> bytes:
        made.append(time.monotonic())
        return b"x 1\n"

    server, _ = started(render)
    try:
        threads = [threading.Thread(target=ask, args=(server.server_port,)) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        # One rendering a PAGE_TTL_S at most, however many ask: the ten are answered at
        # the server's pace (ANSWERS_PER_S), over about two seconds.
        assert 1 <= len(made) <= 3, made
        assert all(b - a >= httpd.PAGE_TTL_S for a, b in itertools.pairwise(made)), made
    finally:
        server.close()


def test_a_page_that_cannot_be_rendered_is_a_500_and_one_warning():
    def broken() -> bytes:
        raise RuntimeError("boom")

    server, warnings = started(broken)
    try:
        assert ask(server.server_port).startswith(b"HTTP/1.1 500 ")
    finally:
        server.close()
    assert warnings == ["a scrape could not read the figures (RuntimeError: boom)"]


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_a_forked_child_does_not_keep_the_port_after_close():
    """A DataLoader worker forked while the exporter serves: before, it held the
    listening socket, scrapes hung and the port could not be bound again."""
    server, _ = started()
    port = server.server_port
    child = multiprocessing.get_context("fork").Process(target=_sleep, args=(30,))
    child.start()
    try:
        time.sleep(0.2)
        server.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        again = socket.create_server(("127.0.0.1", port))  # free while the child lives
        again.close()
        assert child.is_alive()
    finally:
        child.kill()
        child.join(5)


def test_close_is_idempotent_and_from_any_thread():
    server, _ = started()
    threads = [threading.Thread(target=server.close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    server.close()
    assert not any(t.name.startswith("starvecheck-exporter") for t in threading.enumerate())


# --- labels --------------------------------------------------------------------------


def test_a_latin1_label_value_is_served_as_utf8(monkeypatch):
    """A Latin-1 SLURM_JOB_ID made every scrape a 500 with a traceback."""
    monkeypatch.setenv("SLURM_JOB_ID", os.fsdecode(b"caf\xe9-42"))
    w = Watch(range(20), show=False, prometheus=0)
    try:
        list(w)
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{w.exporter.port}/metrics", timeout=10
        ).read()
        assert 'slurm_job_id="caf\ufffd-42"' in text.decode("utf-8")
    finally:
        w.exporter.close()


def _in_thread(fn, timeout: float):
    got: list = []
    t = threading.Thread(target=lambda: got.append(fn()), daemon=True)
    t.start()
    t.join(timeout)
    return t.is_alive(), got


POD = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "p"}


def test_a_fifo_as_the_namespace_file_is_left_alone(tmp_path):
    fifo = tmp_path / "namespace"
    os.mkfifo(fifo)
    try:
        blocked, got = _in_thread(lambda: identity.labels(POD, namespace_file=fifo), 5)
        assert not blocked and "namespace" not in got[0]
    finally:
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # frees a reader left blocked
        os.close(fd)


def test_the_namespace_file_is_read_bounded_and_undecodable_bytes_replaced(tmp_path):
    f = tmp_path / "namespace"
    f.write_bytes(b"team-\xff\n")
    assert identity.labels(POD, namespace_file=f)["namespace"] == "team-\ufffd"
    f.write_bytes(b"a" * (50 << 20))
    assert len(identity.labels(POD, namespace_file=f)["namespace"]) == identity.NAMESPACE_BYTES
    assert "namespace" not in identity.labels(POD, namespace_file=Path("/dev/zero"))


def test_the_loop_never_reads_the_namespace_file(tmp_path, monkeypatch):
    """A FIFO there blocked the loop's first step for ever; the exporter's thread reads
    it at the first scrape, and leaves a FIFO alone."""
    fifo = tmp_path / "namespace"
    os.mkfifo(fifo)
    for k, v in POD.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(identity, "SA_NAMESPACE", fifo)
    w = Watch(range(20), show=False, prometheus=0)
    try:
        blocked, got = _in_thread(lambda: list(w), 10)
        assert not blocked and got == [list(range(20))]
        text = ask(w.exporter.port).decode()
        assert text.startswith("HTTP/1.1 200") and 'pod="p"' in text and "namespace" not in text
    finally:
        w.exporter.close()
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
        os.close(fd)


# --- a real pids limit ---------------------------------------------------------------

TRAINING = textwrap.dedent(
    """
    import sys, threading, warnings
    warnings.filterwarnings("ignore")
    from torch.utils.data import DataLoader
    import starvecheck
    w = starvecheck.watch(DataLoader(list(range(64)), batch_size=8, num_workers=2),
                          show=False, prometheus=0)
    for _ in w:
        pass
    print(w.exporter.port, flush=True)
    sys.stdin.readline()  # the test opens its idle connections
    for _ in w:  # the next epoch starts its workers
        pass
    print("epoch 2 done", flush=True)
    """
)


def settled(cg: Path, within_s: float = 10.0) -> int:
    """The cgroup's task count once the same for half a second."""
    count, deadline = int((cg / "pids.current").read_text()), time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = int((cg / "pids.current").read_text())
        if now == count:
            break
        count = now
    return count


@pytest.mark.slow
def test_idle_connections_do_not_use_up_a_pids_limit_and_the_next_epoch_starts(tmp_path):
    """Under a pids limit, 34 idle connections to prometheus_client's server kept the
    next epoch's workers from starting and the job died."""
    cg = pids_cgroup(tmp_path)
    if cg is None:
        pytest.skip("no writable pids cgroup here")
    job = subprocess.Popen(
        [sys.executable, "-c", TRAINING], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: (cg / "cgroup.procs").write_text(str(os.getpid())),
    )  # fmt: skip
    idle: list[socket.socket] = []
    try:
        assert job.stdout is not None and job.stdin is not None
        port = int(job.stdout.readline())
        in_use = settled(cg)  # the last epoch's queue feeder threads gone
        (cg / "pids.max").write_text(str(in_use + 16))  # room for 2 workers and their threads
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(34)]
        time.sleep(0.5)
        assert int((cg / "pids.current").read_text()) <= in_use
        job.stdin.write("go\n")
        job.stdin.flush()
        out, err = job.communicate(timeout=120)
        assert job.returncode == 0 and out.strip() == "epoch 2 done", err[-2000:]
        assert "Traceback" not in err
    finally:
        for s in idle:
            s.close()
        if job.poll() is None:
            job.kill()
            job.wait(10)
        remove(cg)


def test_a_scrape_of_the_attach_exporter_is_served_too(tmp_path):
    """attach --every --prometheus serves through the same server."""
    from starvecheck.loop.exporter import serve
    from starvecheck.loop.windows import Windows

    warnings: list[str] = []
    server = serve(Windows({}), 0, "127.0.0.1", warnings.append)
    try:
        got = ask(server.server_port)
        assert got.startswith(b"HTTP/1.1 200 OK")
        assert warnings == []
    finally:
        server.close()


def test_scrapers_back_to_back_are_answered_at_the_servers_pace_and_a_lone_one_at_once():
    """Each answer hands the GIL back and forth with the loop: three scrapers back to
    back got 26 answers a second and cost a Python loop 5% of its steps
    (benchmarks/exporter_guest.py). The server answers at most ANSWERS_PER_S a second
    (ANSWER_BURST at once); a lone scrape after a quiet spell is not held back."""
    server, warnings = started()
    port = server.server_port
    answered: list[float] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            if ask(port, timeout=10).startswith(b"HTTP/1.1 200 OK"):
                answered.append(time.monotonic())

    try:
        began = time.monotonic()
        threads = [threading.Thread(target=scrape, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(3.0)
        in_window = [t for t in answered if t - began <= 3.0]
        stop.set()
        for t in threads:
            t.join(15)
        limit = httpd.ANSWERS_PER_S * 3.0 + httpd.ANSWER_BURST + 1
        assert 0.5 * httpd.ANSWERS_PER_S * 3.0 <= len(in_window) <= limit, len(in_window)
        time.sleep(1.0)  # quiet: the burst comes back
        t0 = time.monotonic()
        assert ask(port).startswith(b"HTTP/1.1 200 OK")
        assert time.monotonic() - t0 < 0.15
    finally:
        server.close()
    assert warnings == []
