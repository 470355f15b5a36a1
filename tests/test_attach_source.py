"""attach reads a job's source files with the job's own rights (stages/attach/source.py,
rights.py): a real job run as nobody, sampled by the real py-spy, whose code names a
file through a directory link into a root-only directory, a file in a directory nobody
may not enter, a FIFO whose writer waits for a reader: none is read (the verdict
stays as the job's own rights make it, one caveat says so), the FIFO is never opened
(its writer still waits); a file the job may read is read as before. Each file's line
3 would make the job's samples `gpu-wait`: the sentinel that shows a read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.loops.attachjob import GPU_LINE, NOBODY, can_switch_user, env, job, shared_dir


def attach(pid: int) -> dict:
    cmd = [sys.executable, "-m", "starvecheck", "attach", str(pid), "--json", "-",
           "--duration", "3"]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env())
    assert r.returncode in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)["stages"][0]


def kinds(stage: dict) -> dict[str, float]:
    return {m["labels"]["kind"]: m["value"] for m in stage["metrics"]
            if m["labels"].get("quantity") == "main_share"}  # fmt: skip


def unread(stage: dict) -> list[str]:
    return [c for c in stage["caveats"] if c.startswith("Source lines of")]


@pytest.fixture
def as_nobody():
    why = can_switch_user()
    if why:
        pytest.skip(why)


@pytest.mark.slow
def test_a_directory_link_into_a_root_only_directory_is_not_followed(as_nobody, tmp_path):
    secret = tmp_path / "secret"  # tmp_path's parents are root's alone; this is 0700 too
    secret.mkdir(mode=0o700)
    (secret / "train.py").write_text(GPU_LINE)
    with shared_dir() as shared:
        (shared / "code").symlink_to(secret)
        with job(str(shared / "code" / "train.py"), shared, NOBODY) as p:
            stage = attach(p.pid)
    assert "gpu-wait" not in kinds(stage), kinds(stage)  # the root-only line never read
    assert kinds(stage).get("other", 0) > 0.9, kinds(stage)
    (said,) = unread(stage)
    assert "code/train.py (a symbolic link on its path)" in said, said


@pytest.mark.slow
def test_a_file_in_a_directory_the_job_may_not_enter_is_not_read(as_nobody, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "train.py").write_text(GPU_LINE)
    (secret / "train.py").chmod(0o644)  # the file is anyone's: its directory is not
    with shared_dir() as shared, job(str(secret / "train.py"), shared, NOBODY) as p:
        stage = attach(p.pid)
    assert "gpu-wait" not in kinds(stage), kinds(stage)
    (said,) = unread(stage)
    assert "not readable by the job's own user" in said, said


@pytest.mark.slow
def test_a_fifo_named_as_source_is_never_opened(as_nobody):
    with shared_dir() as shared:
        fifo = shared / "train.py"
        os.mkfifo(fifo, 0o666)
        # A writer waits for a reader: attach opening the FIFO would release it.
        writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w')"])
        try:
            with job(str(fifo), shared, NOBODY) as p:
                stage = attach(p.pid)
            time.sleep(0.5)
            assert writer.poll() is None, "the FIFO was opened: its writer went on"
        finally:
            writer.kill()
            writer.wait()
    (said,) = unread(stage)
    assert "train.py (not a regular file)" in said, said


@pytest.mark.slow
def test_a_file_the_job_may_read_is_read_as_before(as_nobody):
    with shared_dir() as shared:
        code = shared / "train.py"
        code.write_text(GPU_LINE)
        code.chmod(0o600)
        os.chown(code, NOBODY, NOBODY)  # its own file, which only it may read
        with job(str(code), shared, NOBODY) as p:
            stage = attach(p.pid)
    assert kinds(stage).get("gpu-wait", 0) > 0.9, kinds(stage)
    assert unread(stage) == []


@pytest.mark.slow
def test_a_relative_name_is_read_in_the_jobs_working_directory(as_nobody):
    with shared_dir() as shared:
        (shared / "train.py").write_text(GPU_LINE)
        (shared / "train.py").chmod(0o644)
        with job("train.py", shared, NOBODY) as p:
            stage = attach(p.pid)
    assert kinds(stage).get("gpu-wait", 0) > 0.9, kinds(stage)


def test_no_file_is_read_for_a_job_whose_ids_cannot_be_read(tmp_path, monkeypatch):
    from starvecheck.stages.attach import source

    (tmp_path / "train.py").write_text(GPU_LINE)
    files = source.JobFiles(os.open(tmp_path, os.O_PATH), None, None)
    lines = source.Lines(files)
    with lines:
        assert lines(str(tmp_path / "train.py"), 3) is None
    assert list(lines.refused.values()) == [source.UNKNOWN_RIGHTS]
    assert Path(tmp_path / "train.py").exists()


def test_the_jobs_ids_and_groups_from_its_status(tmp_path):
    from starvecheck.probe.sysroot import SysRoot
    from starvecheck.stages.attach import rights

    (tmp_path / "proc" / "7").mkdir(parents=True)
    # a set-uid root program run by uid 1000: every id counts, each must be allowed
    (tmp_path / "proc" / "7" / "status").write_text(
        "Name:\tjob\nUid:\t1000\t0\t0\t0\nGid:\t100\t100\t100\t100\nGroups:\t4 27 \n"
        "CapEff:\t000001ffffffffff\n"
    )
    got = rights.of_job(7, SysRoot(tmp_path))
    assert got is not None
    assert got.ids == (rights.Identity(1000, 100), rights.Identity(0, 100))
    assert got.groups == {4, 27}
    assert got.override is False  # not every uid is 0: its capabilities do not count
