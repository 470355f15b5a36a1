"""/proc/PID/stat has one parser and one reader (probe/process.py): a process names
itself (prctl PR_SET_NAME, its executable's name), so field 2 may hold spaces,
parentheses, newlines and bytes that are not UTF-8, and nothing else cuts the line up."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from starvecheck.probe import process
from starvecheck.scratch import leftovers

SRC = Path(__file__).parent.parent / "src" / "starvecheck"


def _line(comm: str, state: str = "S", ppid: int = 7, cpu: tuple[int, int] = (300, 100)) -> str:
    """A stat line as the kernel writes it, started at tick 55."""
    after = f"{state} {ppid} 42 42 0 -1 0 0 0 0 0 {cpu[0]} {cpu[1]} 0 0 20 0 3 0 55 1 2"
    return f"42 ({comm}) {after}\n"


def test_names_that_look_like_fields_are_read_as_the_name():
    for comm in ("a b", "a) b) (c", ") Z 1 2 (", "x\ny", "", "((", "))", "R 1"):
        got = process.parse_stat(_line(comm))
        assert got is not None, comm
        assert (got.state, got.ppid, got.start) == ("S", 7, 55), comm
        assert got.cpu_s == 400 * process.TICK_S


def test_a_name_that_is_not_utf8_is_still_read():
    raw = _line("x").encode().replace(b"(x)", b"(\xff\xfe) Z\x00)")
    got = process.parse_stat(raw.decode("utf-8", errors="replace"))
    assert got is not None and (got.state, got.ppid, got.start) == ("S", 7, 55)


def test_a_line_cut_short_or_garbled_is_none():
    assert process.parse_stat("42 (x) R 7") is None
    assert process.parse_stat("42 x R 7 " + "0 " * 30) is None  # no parenthesis
    assert process.parse_stat(_line("x").replace(" 7 ", " -7 ")) is None
    assert process.parse_stat(_line("x").replace(" S ", " SS ")) is None


@given(st.text(max_size=64), st.sampled_from("RSDTtZXI"), st.integers(0, 2**22))
def test_any_name_leaves_the_fields_after_it(comm, state, ppid):
    got = process.parse_stat(_line(comm, state, ppid))
    assert got is not None and (got.state, got.ppid, got.start) == (state, ppid, 55)


@given(st.binary(max_size=600))
def test_garbage_never_raises(data):
    got = process.parse_stat(data.decode("utf-8", errors="replace"))
    assert got is None or (len(got.state) == 1 and got.ppid >= 0 and got.cpu_s >= 0)


def test_own_stat_reads_this_machine_and_refuses_what_is_no_pid():
    me = process.own_stat()
    assert me is not None and me.state == "R" and me.start is not None
    assert process.own_stat(os.getpid()) is not None
    for bad in ("../self", "1/../self", -1, 0, "", " 1", True, 1.5):
        assert process.own_stat(bad) is None, bad  # type: ignore[arg-type]


def test_a_process_named_in_bytes_that_are_not_ascii_is_alive():
    """A scratch marker's creator is alive whatever it is named: its start time was read
    as ASCII, and such a name read as "no such process", its directory removable."""
    name = "b'\\xc3\\xa9t\\xff) Z 1 ('"
    code = (
        "import ctypes, sys, time\n"
        f"ctypes.CDLL(None).prctl(15, {name}, 0, 0, 0)\n"
        "print('named', flush=True)\n"
        "time.sleep(30)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "named\n"
        got = process.own_stat(p.pid)
        assert got is not None and got.state in "RS" and got.ppid == os.getpid()
        assert leftovers.start_ticks(p.pid) == got.start is not None
        owner = {"host": socket.gethostname(), "pid": p.pid, "start_ticks": got.start}
        assert leftovers.alive(owner) is True
    finally:
        p.kill()
        p.wait()
    assert leftovers.start_ticks(p.pid) is None  # reaped: gone


def _cuts_a_stat_line(node: ast.AST) -> bool:
    """`x.rpartition(")")`, `x.rsplit(")")`, `x.rindex(b")")`, ... : a stat line cut by hand."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("rpartition", "rsplit", "rindex", "rfind", "split")
        and any(isinstance(a, ast.Constant) and a.value in (")", b")") for a in node.args)
    )


def test_no_module_but_the_one_reader_parses_a_process_stat():
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "probe" / "process.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, bytes):
                value = value.decode("latin-1")
            if isinstance(value, str) and value.endswith("/stat") and value != "/proc/stat":
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} names a stat file")
            if _cuts_a_stat_line(node):
                offenders.append(f"{path.relative_to(SRC)}:{node.lineno} cuts at ')'")
    assert offenders == []
