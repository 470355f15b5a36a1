"""`watch` never breaks the loop it watches: a `file=` that can never take the report is
refused when the watch is made; one that fails later (a full disk: /dev/full) and any
failure of starvecheck's own while reporting are one warning line on stderr; and an
exception the loop raises is the one the loop sees."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest

import starvecheck
from starvecheck.integrations import __getattr__ as integration
from starvecheck.loop.timer import Watch
from starvecheck.loop.trainers.hooks import Hooked

WARNING = "starvecheck: warning: watch could not write its report"


@pytest.fixture
def full():
    """A text file whose every flush fails: ENOSPC, as on a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    f = open("/dev/full", "w")  # noqa: SIM115
    yield f
    with contextlib.suppress(OSError):  # what is left in its buffer cannot go anywhere
        f.close()


def bad_files(tmp_path: Path) -> dict[str, tuple[object, type[Exception], str]]:
    """Each file= that can never take the report, the error, and what it says."""
    (tmp_path / "r.txt").write_text("")
    closed = open(tmp_path / "closed.txt", "w")  # noqa: SIM115
    closed.close()
    return {
        "a path": (str(tmp_path / "report.txt"), TypeError, "not the path"),
        "a Path": (tmp_path / "report.txt", TypeError, "not the path"),
        "a closed file": (closed, ValueError, "file is closed"),
        "a file open for reading": (
            open(tmp_path / "r.txt"),
            ValueError,
            "not open for writing .*mode 'r'",
        ),
        "a binary file": (open(tmp_path / "b.bin", "wb"), TypeError, "binary"),
        "no write()": (object(), TypeError, "open text stream"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "a path",
        "a Path",
        "a closed file",
        "a file open for reading",
        "a binary file",
        "no write()",
    ],
)
def test_a_file_that_can_never_take_the_report_is_refused_when_the_watch_is_made(tmp_path, case):
    file, error, says = bad_files(tmp_path)[case]
    with pytest.raises(error, match=says):
        starvecheck.watch(range(3), file=file)  # type: ignore[arg-type]
    with pytest.raises(error, match=says):
        Hooked(file=file)  # type: ignore[arg-type]  # the trainers' callbacks


def test_good_files_are_taken(tmp_path):
    with open(tmp_path / "a.txt", "a") as f, open(tmp_path / "rw.txt", "w+") as g:
        for file in (None, io.StringIO(), f, g):
            assert list(starvecheck.watch(range(3), file=file)) == [0, 1, 2]
    assert "starvecheck watch" in (tmp_path / "a.txt").read_text()


@pytest.mark.parametrize("barrier_timeout", [0, -1, float("nan"), "60"])
def test_barrier_timeout_must_be_a_positive_number_of_seconds(barrier_timeout):
    with pytest.raises(ValueError, match="barrier_timeout must be a positive number"):
        starvecheck.watch(range(3), barrier=True, barrier_timeout=barrier_timeout)


def test_a_report_that_cannot_be_written_is_one_warning_line(full, capsys):
    items = list(starvecheck.watch(range(20), file=full, every=3))
    assert items == list(range(20))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(WARNING), err
    assert "OSError: [Errno 28] No space left on device" in err[0]
    assert err[0].endswith("the loop goes on")


def test_the_loops_own_exception_is_the_one_it_sees(full, capsys):
    with pytest.raises(ValueError, match="the user's own"):
        for i in starvecheck.watch(range(10), file=full):
            if i == 4:
                raise ValueError("the user's own")
    err = capsys.readouterr().err
    assert err.count(WARNING) == 1 and "Traceback" not in err and "ignored" not in err


def test_the_loaders_own_exception_is_the_one_the_loop_sees(full, capsys):
    def loader():
        yield from range(5)
        raise KeyError("a sample the dataset could not read")

    with pytest.raises(KeyError, match="could not read") as caught:
        for _ in starvecheck.watch(loader(), file=full):
            pass
    assert caught.value.__context__ is None  # nothing of ours in its chain
    assert capsys.readouterr().err.count(WARNING) == 1


def test_a_file_closed_during_the_loop_is_one_warning_line(tmp_path, capsys):
    f = open(tmp_path / "report.txt", "w")  # noqa: SIM115
    for i in starvecheck.watch(range(10), file=f, every=4):
        if i == 2:
            f.close()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(WARNING) and "ValueError: I/O operation on closed file" in line


def test_a_failure_of_starvecheck_while_reporting_never_reaches_the_loop(monkeypatch, capsys):
    def broken(self, *args, **kwargs):
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(Watch, "summary", broken)
    assert list(starvecheck.watch(range(10), every=2)) == list(range(10))
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(WARNING) and "RuntimeError: a bug of ours" in line


def test_a_trainers_hooks_never_raise_from_a_failing_file(full, capsys):
    pytest.importorskip("transformers")
    callback = integration("TransformersCallback")(file=full, every=2)
    for _ in range(5):
        callback.on_step_begin(None, None, None)
        callback.on_step_end(None, None, None)
    callback.on_train_end(None, None, None)
    assert capsys.readouterr().err.count(WARNING) == 1
    assert len(callback.watch.times.computes) == 5


def test_a_batch_whose_size_cannot_be_read_is_passed_on():
    class Odd:
        @property
        def nbytes(self) -> int:
            raise RuntimeError("no size here")

    batch = Odd()
    assert list(starvecheck.watch([batch, batch], show=False)) == [batch, batch]
