"""core/surroundings.py: what the process was started in, read before it breaks a run.
The refusals are pure functions of the facts (fed here); the facts themselves are read
from a real removed working directory and a real RLIMIT_AS in tests/test_hostile5_env.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from starvecheck.core import surroundings as s
from starvecheck.core.status import UsageError

MIB = 1 << 20


def test_blas_threads_follow_openblas_variables_in_its_order(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))
    assert s.blas_threads({}) == 64  # OpenBLAS starts at most MAX_THREADS
    assert s.blas_threads({"OMP_NUM_THREADS": "8"}) == 8
    assert s.blas_threads({"OMP_NUM_THREADS": "8", "GOTO_NUM_THREADS": "4"}) == 4
    assert s.blas_threads({"OPENBLAS_NUM_THREADS": "2", "GOTO_NUM_THREADS": "4"}) == 2
    # Not a count: the next variable, or the CPUs.
    assert s.blas_threads({"OPENBLAS_NUM_THREADS": "0", "OMP_NUM_THREADS": "3"}) == 3
    assert s.blas_threads({"OPENBLAS_NUM_THREADS": "x"}) == 64
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert s.blas_threads({"OMP_NUM_THREADS": "16"}) == 2  # never more than the CPUs


def test_what_a_library_needs_grows_with_openblas_threads():
    assert s.need_mib("torch", 1) == s.need_mib("torch", 2) == s.NEED_MIB["torch"]
    assert s.need_mib("torch", 64) == s.NEED_MIB["torch"] + 62 * s.THREAD_MIB
    assert s.need_mib("json", 64) == 0  # not a library whose loading is checked


def facts(**changed: object) -> dict[str, object]:
    return {"torch_loaded": False, "cwd_gone": False, "limit": None, "threads": 2, **changed}


def test_a_removed_working_directory_refuses_what_loads_torch_only():
    for library in ("torch", "transformers", "streaming"):
        why = s.refusal(library, **facts(cwd_gone=True))
        assert why is not None and why.startswith(s.REMOVED) and "cd to an existing" in why
    assert s.refusal("torch", **facts(cwd_gone=True, torch_loaded=True)) is None
    assert s.refusal("numpy", **facts(cwd_gone=True)) is None
    assert s.refusal("matplotlib", **facts(cwd_gone=True)) is None


def test_an_address_space_limit_below_the_need_is_named_as_set():
    why = s.refusal("torch", **facts(limit=300_000 << 10))
    assert why == (
        "the address-space limit (ulimit -v 300000: 293 MiB) is too small to load torch, "
        "which maps about 816 MiB here: raise it or unset it (ulimit -v unlimited)"
    )
    assert s.refusal("torch", **facts(limit=816 * MIB)) is None
    assert s.refusal("torch", **facts(limit=816 * MIB, threads=10)) is not None
    assert s.refusal("numpy", **facts(limit=100 * MIB)) is not None
    assert s.refusal("numpy", **facts(limit=200 * MIB)) is None


def test_check_passes_what_is_loaded_or_not_installed(monkeypatch):
    monkeypatch.setattr(s, "address_limit", lambda: 1 * MIB)
    s.check("os")  # loaded already: nothing to refuse
    s.check("no_such_library_here")  # not installed: its import says so, as before
    monkeypatch.setitem(s.NEED_MIB, "mailbox", 64)  # installed, never imported by tests
    with pytest.raises(UsageError, match=r"too small to load mailbox"):
        s.check("mailbox")


def test_a_real_removed_working_directory_is_seen(tmp_path: Path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert not s.cwd_removed()
    s.check_relative("--json r.json", "r.json")  # the directory is there: nothing
    here.rmdir()
    assert s.cwd_removed()
    with pytest.raises(UsageError) as e:
        s.check_relative("--json r.json", "r.json")
    assert str(e.value) == (
        f"--json r.json: a relative path, and {s.REMOVED}: give an absolute path, or cd "
        "to an existing directory"
    )
    for fine in ("/abs/r.json", "-", "", None):
        s.check_relative("--json", fine)


def test_memory_that_could_not_be_had_names_the_limit(monkeypatch):
    monkeypatch.setattr(s, "address_limit", lambda: 700 * MIB)
    shown = "(ulimit -v 716800: 700 MiB)"
    why = s.limit_cause(ImportError("libtorch_cpu.so: failed to map segment from shared object"))
    assert why == (
        f"ran out of memory under the address-space limit {shown}: ImportError: "
        "libtorch_cpu.so: failed to map segment from shared object; raise the limit or "
        "unset it (ulimit -v unlimited)"
    )
    assert "MemoryError;" in (s.limit_cause(MemoryError()) or "")
    assert "can't start new thread" in (s.limit_cause(RuntimeError("can't start new thread")) or "")
    # What a stage made of it: its own words, and what it was raised from.
    try:
        try:
            raise MemoryError("in a worker")
        except MemoryError as inner:
            raise UsageError("the pipeline raised MemoryError") from inner
    except UsageError as outer:
        assert "MemoryError: in a worker" in (s.limit_cause(outer) or "")
    assert s.limit_cause(ValueError("bad value")) is None


def test_a_cause_is_read_safely_and_only_under_a_limit(monkeypatch):
    class Hostile(MemoryError):
        def __str__(self) -> str:
            raise RuntimeError("str")

    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a  # a cycle ends
    monkeypatch.setattr(s, "address_limit", lambda: 700 * MIB)
    assert "Hostile;" in (s.limit_cause(Hostile()) or "")
    assert s.limit_cause(a) is None
    monkeypatch.setattr(s, "address_limit", lambda: None)
    assert s.limit_cause(MemoryError()) is None  # no limit: not the limit's doing
