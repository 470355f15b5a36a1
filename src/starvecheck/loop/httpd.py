"""The scrape server: a guest in the training process (docs/fleet.md, "What the
exporter promises the job").

`watch(..., prometheus=PORT)` puts a listening socket in the training process, where
any local user (and, on 0.0.0.0, anyone on the network) can talk to it. A server that
gives every connection a thread (prometheus_client's `start_http_server` does) lets
idle connections use up the job's pids limit, and the next epoch's DataLoader workers
cannot start. This one never grows:

- two threads, whatever the number of clients: one a selector over the listening socket
  and at most MAX_CLIENTS connections (one more closes the oldest that has not sent a
  whole request, else the oldest), the other rendering the page;
- every connection has CLIENT_TIMEOUT_S to send its request and read the answer, a
  request at most REQUEST_LIMIT bytes; past either it is closed;
- the page is rendered at most every PAGE_TTL_S and served from that copy, so that many
  scrapers cost the loop's lock no more than one; it is rendered off the selector's
  thread, so that a page slow to make (a machine swapping, a lock held) holds back no
  other client: those asking for it wait for it until their time is up;
- the connections' thread uses at most CPU_SHARE of a CPU (and so of the loop's GIL)
  over time: past it, it rests, and clients wait (within their time);
- out of descriptors (the job at its limit), it stops accepting for ACCEPT_PAUSE_S at a
  time, never spinning on a listening socket it cannot accept from;
- nothing it meets is printed as a traceback or raised anywhere: a malformed or reset
  request is closed in silence, a page that cannot be rendered is a 500 and one warning
  line (said once);
- the listening socket and its connections are closed in every process forked from
  this one (DataLoader workers, the user's helpers: `os.register_at_fork`), so the port
  is free once `close()` ran or the process ended, whatever the children do; sockets
  are not inherited across exec (Python's default).

HTTP/1.0 and 1.1 GET and HEAD of `/metrics` (or `/`; a target in absolute form too),
answered once, the connection then closed; the text format (version 0.0.4) whatever
`Accept` says.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import socket
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from starvecheck.core import clocks

MAX_CLIENTS = 8
CLIENT_TIMEOUT_S = 5.0
REQUEST_LIMIT = 8192
PAGE_TTL_S = 1.0
# Connections the kernel holds until the thread accepts them. The thread shares the GIL
# with the loop, so a burst of connections outruns it; a short queue then drops their
# SYNs and every client, a scrape too, waits out TCP's retransmission (1 s, 3 s, ...).
BACKLOG = 128
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
_IDLE_S = 1.0  # the selector's longest wait when no client has a deadline
ACCEPTS = MAX_CLIENTS // 2  # connections accepted a turn of the selector, at most
# The connections' thread takes the GIL from the loop for every request it handles: it
# spends at most CPU_SHARE of a CPU over time (CPU_BURST_S at once), and rests past it.
# A scrape costs it about 0.1 ms of CPU; scrapers back to back, 1,000 a second, had
# it take 15% of a Python loop's steps.
CPU_SHARE = 0.01
CPU_BURST_S = 0.005
# And it answers at most ANSWERS_PER_S requests a second (ANSWER_BURST at once), and
# rests past that: each answer's system calls hand the GIL back and forth with the loop
# (a forced switch each), which cost a Python loop 5% of its steps beside three
# scrapers back to back (26 answers a second) though the thread kept to its 1% of a
# CPU. Prometheus asks once every 15-60 s; a flood waits in the backlog.
ANSWERS_PER_S = 5.0
ANSWER_BURST = 2.0
# Out of descriptors, the listening socket stays readable and accept() keeps failing:
# it is left out of the selector this long, not polled in a loop.
ACCEPT_PAUSE_S = 0.1

_LIVE: weakref.WeakSet[Server] = weakref.WeakSet()


def _forget_all_in_child() -> None:
    """In a child just forked: close this process's copies of every server's sockets
    (only the descriptors: the server's thread is not in the child)."""
    for server in list(_LIVE):
        server._forget_in_child()


os.register_at_fork(after_in_child=_forget_all_in_child)


@dataclass
class _Client:
    sock: socket.socket
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None
    waiting: bool = False  # for the page being rendered (out of the selector meanwhile)
    head_only: bool = False
    draining: bool = False  # answered: what more it sends is read and dropped

    def rank(self) -> tuple[int, float]:
        """Which to close first for a new connection: those that have not sent a whole
        request, then those answered, then those waiting for or reading an answer; the
        oldest first in each."""
        busy = 0 if not (self.waiting or self.outbox is not None) else 2
        return (1 if self.draining else busy, self.deadline)


class Server:
    """Serves `render()`'s page on (addr, port) from two threads of its own (one for
    the connections, one rendering); `port` is the port bound (0 asks for any free
    one). OSError where it cannot bind."""

    def __init__(
        self, render: Callable[[], bytes], port: int, addr: str, warn: Callable[[str], None]
    ) -> None:
        self._render = render
        self._warn = warn
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._sock = socket.create_server((addr, port), family=family, backlog=BACKLOG)
        self._sock.setblocking(False)
        self.server_port: int = self._sock.getsockname()[1]
        self._pid = os.getpid()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._clients: dict[int, _Client] = {}
        self._page: tuple[float, bytes, int] | None = None  # (made at, body, status)
        self._accept_at: float | None = None  # accepting paused until then (descriptors)
        self._asked = threading.Event()  # the selector's thread asks for a page
        self._rendering = False  # asked, and not yet handed over
        self._answered = 0  # answers queued since the last turn (ANSWERS_PER_S)
        self._fresh: tuple[float, bytes, int] | None = None  # rendered, not yet handed over
        self._stop = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # close(), and the render thread's wake-up write
        _LIVE.add(self)
        name = f"starvecheck-exporter:{self.server_port}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._renderer = threading.Thread(target=self._renders, name=f"{name}:page", daemon=True)
        self._thread.start()
        self._renderer.start()

    @property
    def clients(self) -> int:
        """Connections open now (at most MAX_CLIENTS)."""
        return len(self._clients)

    # --- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        credit, counted = CPU_BURST_S, (clocks.monotonic(), clocks.thread_time())
        answers, since = ANSWER_BURST, clocks.monotonic()
        try:
            while not self._stop.is_set():
                arrived = False
                for key, events in self._selector.select(self._timeout()):
                    if key.data == "wake":
                        _drain(self._wake_r)
                    elif key.data is None:
                        arrived = True
                    else:
                        self._serve(key.data, events)
                if arrived:  # after the requests that came: they are not closed for room
                    self._accept()
                self._hand_over()
                now = clocks.monotonic()
                self._expire(now)
                if self._accept_at is not None and now >= self._accept_at:
                    self._accept_at = None
                    self._selector.register(self._sock, selectors.EVENT_READ, None)
                cpu = clocks.thread_time()
                credit += (now - counted[0]) * CPU_SHARE - (cpu - counted[1])
                credit, counted = min(credit, CPU_BURST_S), (now, cpu)
                answers = min(ANSWER_BURST, answers + (now - since) * ANSWERS_PER_S)
                answers, since, self._answered = answers - self._answered, now, 0
                rest = max(-credit / CPU_SHARE, -answers / ANSWERS_PER_S)
                if rest > 0:  # past its share of a CPU or of answers: rests (close() wakes it)
                    self._stop.wait(rest)
        except Exception as e:  # never a traceback in the job's log
            if not self._stop.is_set():
                self._warn(f"the scrape server stopped ({type(e).__name__}: {e})")
        finally:
            for client in list(self._clients.values()):
                self._drop(client)

    def _timeout(self) -> float:
        deadlines = [c.deadline for c in self._clients.values()]
        if self._accept_at is not None:
            deadlines.append(self._accept_at)
        if not deadlines:
            return _IDLE_S
        return min(_IDLE_S, max(0.0, min(deadlines) - clocks.monotonic()))

    def _accept(self) -> None:
        """At most ACCEPTS connections from the backlog: the requests of those accepted
        are read before more are, so that a flood of connections closes its own to make
        room, not a scrape whose request has come."""
        for _ in range(ACCEPTS):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors, or a connection reset on arrival
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # the backlog waits; a client expiring frees one
                    self._selector.unregister(self._sock)
                    self._accept_at = clocks.monotonic() + ACCEPT_PAUSE_S
                    return
                continue
            conn.setblocking(False)
            if len(self._clients) >= MAX_CLIENTS:
                self._drop(min(self._clients.values(), key=_Client.rank))
            client = _Client(conn, clocks.monotonic() + CLIENT_TIMEOUT_S)
            self._clients[conn.fileno()] = client
            self._selector.register(conn, selectors.EVENT_READ, client)

    def _serve(self, client: _Client, events: int) -> None:
        try:
            if client.draining:
                if not client.sock.recv(65536):
                    self._drop(client)
            elif client.outbox is None and events & selectors.EVENT_READ:
                data = client.sock.recv(4096)
                if not data:
                    self._drop(client)
                    return
                client.inbox += data
                head = _head(client.inbox)
                if len(head if head is not None else client.inbox) > REQUEST_LIMIT:
                    self._answer(client, 431, b"request too large\n", head_only=False)
                elif head is not None:
                    self._respond(client, head)
            elif client.outbox is not None and events & selectors.EVENT_WRITE:
                sent = client.sock.send(client.outbox)
                client.outbox = client.outbox[sent:]
                if not client.outbox:  # answered: a lingering close, so that what the
                    # client sent past its request is read, not answered with a reset
                    client.sock.shutdown(socket.SHUT_WR)
                    client.draining = True
                    self._selector.modify(client.sock, selectors.EVENT_READ, client)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset, broken pipe: the client is gone
            self._drop(client)

    def _respond(self, client: _Client, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            self._answer(client, 400, b"bad request\n", head_only=False)
            return
        method, target = parts[0], _path(parts[1])
        if method not in (b"GET", b"HEAD"):
            self._answer(client, 405, b"GET or HEAD\n", head_only=False)
        elif target not in (b"/metrics", b"/"):
            self._answer(client, 404, b"try /metrics\n", head_only=method == b"HEAD")
        elif self._page is not None and clocks.monotonic() - self._page[0] < PAGE_TTL_S:
            self._answer(client, self._page[2], self._page[1], head_only=method == b"HEAD")
        else:  # it waits, out of the selector, for the page the render thread makes
            client.waiting, client.head_only = True, method == b"HEAD"
            self._selector.unregister(client.sock)
            if not self._rendering:
                self._rendering = True
                self._asked.set()

    def _hand_over(self) -> None:
        """The page the render thread made, to every client waiting for it."""
        page, self._fresh = self._fresh, None
        if page is None:
            return
        self._page, self._rendering = page, False
        for client in [c for c in self._clients.values() if c.waiting]:
            client.waiting = False
            self._answer(client, page[2], page[1], client.head_only)

    # --- the render thread ----------------------------------------------------------

    def _renders(self) -> None:
        """Render the page each time the selector's thread asks, and wake it."""
        while True:
            self._asked.wait()
            if self._stop.is_set():
                return
            self._asked.clear()
            made = clocks.monotonic()
            try:
                page = (made, self._render(), 200)
            except Exception as e:
                with contextlib.suppress(Exception):
                    self._warn(f"a scrape could not read the figures ({type(e).__name__}: {e})")
                page = (made, b"the figures could not be read\n", 500)
            self._fresh = page
            with self._lock:  # close() closes the pipe under it: never a stale descriptor
                if self._stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    os.write(self._wake_w, b"p")

    def _answer(self, client: _Client, status: int, body: bytes, head_only: bool) -> None:
        reason = REASONS[status]
        kind = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n"
            + ("Allow: GET, HEAD\r\n" if status == 405 else "")
            + "\r\n"
        ).encode("ascii")
        client.outbox = memoryview(head if head_only else head + body)
        client.inbox.clear()
        self._answered += 1
        try:
            self._selector.modify(client.sock, selectors.EVENT_WRITE, client)
        except KeyError:  # it waited for the page, out of the selector
            self._selector.register(client.sock, selectors.EVENT_WRITE, client)

    def _expire(self, now: float) -> None:
        for client in [c for c in self._clients.values() if c.deadline <= now]:
            self._drop(client)

    def _drop(self, client: _Client) -> None:
        fd = client.sock.fileno()
        self._clients.pop(fd, None)
        try:
            if fd >= 0:
                self._selector.unregister(client.sock)
        except (KeyError, ValueError, OSError):
            pass
        client.sock.close()

    # --- from other threads, and forks -----------------------------------------------

    def close(self) -> None:
        """Stop serving and release the port (idempotent; from any thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._pid:  # a forked child: its copies went at the fork
            return
        self._stop.set()
        self._asked.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        for thread in (self._thread, self._renderer):  # a render under way ends on its own
            if thread is not threading.current_thread():
                thread.join(timeout=2 * _IDLE_S if thread is self._thread else _IDLE_S)
        with self._lock:
            for closing in (self._sock.close, self._selector.close):
                closing()
            for fd in (self._wake_r, self._wake_w):
                _close_fd(fd)
        _LIVE.discard(self)

    def _forget_in_child(self) -> None:
        self._closed = True
        self._stop.set()
        for client in list(self._clients.values()):
            client.sock.close()
        self._clients.clear()
        self._sock.close()
        with contextlib.suppress(Exception):
            self._selector.close()
        for fd in (self._wake_r, self._wake_w):
            _close_fd(fd)


def _head(inbox: bytearray) -> bytes | None:
    """The request's head, once it has come whole (HTTP's CRLF, or bare LF)."""
    for end in (b"\r\n\r\n", b"\n\n"):
        at = inbox.find(end)
        if at >= 0:
            return bytes(inbox[:at])
    return None


def _path(target: bytes) -> bytes:
    """The path a request's target names, its query left out: the origin form's
    (`/metrics?x`), or the absolute form's past its authority (`http://host:9500/metrics`,
    which RFC 9112 3.2.2 has a server accept)."""
    if target[:8].lower().startswith((b"http://", b"https://")):
        rest = target.split(b"://", 1)[1]
        at = min((i for i in (rest.find(b"/"), rest.find(b"?")) if i >= 0), default=len(rest))
        target = rest[at:] if rest[at:].startswith(b"/") else b"/" + rest[at:]
    return target.split(b"?", 1)[0]


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except OSError:
        pass


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
