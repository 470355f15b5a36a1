"""attach bounds every wait on py-spy (stages/attach/spy.py): a py-spy that never ends
(SIGINT and SIGTERM ignored), one whose child keeps its stdout and stderr open after it
exits, one that prints garbage for ever: attach ends within its duration and a bounded
margin (spy.END_GRACE_S to end by itself, spy.STOP_S once asked, spy.REAP_S once
killed, and start-up), reports the /proc part with one caveat, exit 0, and leaves no
process of it running (each fake's processes carry a marker word in their argv) and
nothing in its TMPDIR. Ended by SIGTERM while py-spy hangs: 143, nothing left."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from starvecheck.stages.attach import spy
from tests.loops.attachjob import HERE, attach, env, fake_spy, job, marked, none_left

DURATION = 2
START_S = 40.0  # imports, the machine's facts, the job found: generous on a loaded machine
BOUND_S = DURATION + spy.END_GRACE_S + spy.STOP_S + spy.REAP_S + START_S


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    where = tmp_path_factory.mktemp("job")
    with job(str(where / "train.py"), where) as p:
        yield p.pid


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["hang", "child-holds", "garbage", "slow-exit"])
def test_a_misbehaving_py_spy_never_holds_attach(target, tmp_path, behaviour):
    fake = fake_spy(tmp_path, behaviour)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    try:
        r = attach(target, fake, "--duration", str(DURATION), timeout=BOUND_S + 60,
                   TMPDIR=str(tmp))  # fmt: skip
    finally:
        left = none_left(fake.marker)
    assert left == [], f"{behaviour}: py-spy's processes left running: {left}"
    assert r.took_s < BOUND_S, r.took_s
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert list(tmp.iterdir()) == []
    if behaviour != "child-holds":  # that one wrote no samples: read as none
        said = [c for c in r.stage()["caveats"] if "Python stacks of" in c]
        assert len(said) == 1, r.stage()["caveats"]


@pytest.mark.slow
def test_sigterm_while_py_spy_hangs_is_143_and_nothing_left(target, tmp_path):
    fake = fake_spy(tmp_path, "hang")
    cmd = [sys.executable, str(HERE / "attach_with_spy.py"), str(fake.path), "attach",
           str(target), "--duration", "30"]  # fmt: skip
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env())  # fmt: skip
    try:
        deadline = time.time() + START_S
        while not marked(fake.marker) and time.time() < deadline:
            time.sleep(0.05)
        assert marked(fake.marker), "py-spy never started"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=spy.STOP_S + spy.REAP_S + 30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        left = none_left(fake.marker)
    assert p.returncode == 143, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert left == []


def test_the_helpers_marker_finds_nothing_of_a_fake_that_never_ran(tmp_path):
    assert marked(fake_spy(tmp_path, "hang").marker) == []
    assert Path(HERE / "fake_spy.py").exists()


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    from starvecheck.stages.attach import costs

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with costs.scratch(True) as made:
        assert made is not None
        yield made


@pytest.mark.slow
def test_a_py_spy_printing_for_ever_is_ended_by_its_output_bound(target, tmp_path, scratch):
    fake = fake_spy(tmp_path, "garbage")
    rec = spy.Recorder(target, 60, 10, str(fake.path), scratch)
    try:
        deadline = time.time() + 60  # 64 MiB at the pace of a loaded machine
        while not rec.done() and time.time() < deadline:
            time.sleep(0.1)
        assert rec.done(), "a py-spy printing for ever was never ended"
        sizes = [p.stat().st_size for p in Path(scratch.path).iterdir()]
        assert max(sizes) <= spy.MAX_BYTES, sizes
        with pytest.raises(RuntimeError):
            rec.stacks()
    finally:
        rec.kill()
        assert none_left(fake.marker) == []


@pytest.mark.slow
def test_several_py_spys_that_hang_are_stopped_within_one_deadline(target, tmp_path, scratch):
    fake = fake_spy(tmp_path, "hang")
    recs = [spy.Recorder(target, 60, 10, str(fake.path), scratch) for _ in range(4)]
    try:
        deadline = time.time() + START_S
        while len(marked(fake.marker)) < 4 and time.time() < deadline:
            time.sleep(0.05)  # each has set SIGINT aside before it is asked to end
        time.sleep(1.0)
        t0 = time.monotonic()
        spy.stop_all(recs)
        took = time.monotonic() - t0
    finally:
        for r in recs:
            r.kill()
    assert all(r.done() for r in recs)
    assert none_left(fake.marker) == []
    # One wait for all: STOP_S (the fakes ignore SIGINT), then the kills. One after the
    # other was 4 x STOP_S (20 s): the bound sits well below that, and leaves four
    # group kills and reaps 10 s on a loaded machine, not the 5 s of STOP_S + REAP_S + 3.
    assert took < 3 * spy.STOP_S, took


def test_a_py_spy_ended_by_its_output_bound_is_said_so_not_its_garbage():
    said = spy.error_line("\x00\x01\x02\x03\n\x05\x06", -signal.SIGXFSZ)
    assert said == spy.error_line("", -signal.SIGXFSZ)
    assert f"more than {spy.MAX_BYTES >> 20} MiB" in said
