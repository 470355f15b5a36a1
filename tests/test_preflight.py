"""Resource preflight: a low open-file limit or a small /dev/shm lowers the work (worker
counts that do not fit are left out, with a warning) or is refused in one line; a
run never hangs on them."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from starvecheck.core.status import UsageError
from starvecheck.stages.dataloader import preflight


def test_worker_counts_that_need_more_files_than_the_limit_are_left_out() -> None:
    fit = preflight.fit_open_files((0, 1, 2, 4), limit=80)
    assert fit.workers == (0, 1, 2)
    assert "num_workers=4 would need 96" in (fit.warning or "")
    assert preflight.fit_open_files((0, 2), limit=1024) == preflight.Fit((0, 2), None)


def test_a_limit_below_what_no_worker_needs_is_refused() -> None:
    with pytest.raises(UsageError, match=r"open-file limit is 40 .*\(ulimit -n 1024\)"):
        preflight.fit_open_files((0, 2), limit=40)


def test_batches_that_do_not_fit_in_dev_shm_are_left_out() -> None:
    mib = 1 << 20
    # 2 workers x 2 batches x 4 MiB, doubled, plus 16 MiB: 48 MiB.
    fit = preflight.fit_shm((0, 2, 4), 4 * mib, 2, free=50 * mib)
    assert fit.workers == (0, 2)
    assert "num_workers=4" in (fit.warning or "") and "--shm-size" in (fit.warning or "")
    assert preflight.fit_shm((0, 2), 4 * mib, 2, free=None).workers == (0, 2)  # no /dev/shm
    assert preflight.fit_shm((0, 8), 4 * mib, 2, free=0).workers == (0,)


def _limited(soft: int, hard: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _loader(tmp_path: Path, soft: int, hard: int) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "starvecheck", "loader", "--quick", "--no-cold"]
    argv += ["--samples", "1000", "--runs", "1", "--workers", "0,2", "--json", "-"]
    return subprocess.run(
        [*argv, str(tmp_path)],
        preexec_fn=lambda: _limited(soft, hard),
        capture_output=True,
        text=True,
        timeout=120,  # it used to hang here for good, in Streaming's barrier
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )


def _workers_measured(report: str) -> set[int]:
    stage = json.loads(report)["stages"][0]
    return {m["labels"]["workers"] for m in stage["metrics"] if "workers" in m["labels"]}


@pytest.mark.slow
def test_a_hard_limit_of_72_files_measures_what_fits(tmp_path: Path) -> None:
    r = _loader(tmp_path, 72, 72)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        "starvecheck: warning: the open-file limit is 72 (ulimit -n, its hard limit): "
        "num_workers=2 would need 80 and was not measured; raise the limit (ulimit -n 1024) "
        "to measure it"
    ]
    assert _workers_measured(r.stdout) == {0}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_low_soft_limit_is_raised_and_everything_measured(tmp_path: Path) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    r = _loader(tmp_path, 36, hard)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert _workers_measured(r.stdout) == {0, 2}


def test_a_limit_too_low_for_anything_is_one_line(tmp_path: Path) -> None:
    # 32: `ulimit -n 32` hung for good in Streaming's barrier before 0.2.
    r = _loader(tmp_path, 32, 32)
    assert r.returncode == 2
    assert r.stderr.startswith("starvecheck: error: the open-file limit is 32")
    assert r.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_long_temporary_directory_does_not_break_the_workers(tmp_path: Path) -> None:
    # Workers hand batches over through a Unix socket under multiprocessing's pymp-*
    # directory; under a TMPDIR this long its path passed 107 bytes, every hand-over
    # failed ("AF_UNIX path too long") and the DataLoader waited for good.
    long_tmp = tmp_path / ("t" * 80)
    long_tmp.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    argv = [sys.executable, "-m", "starvecheck", "loader", "--quick", "--no-cold"]
    argv += ["--samples", "600", "--runs", "1", "--workers", "0,1", "--json", "-", str(data)]
    r = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(long_tmp)},
    )
    assert r.returncode == 0 and "AF_UNIX" not in r.stderr, r.stderr[-2000:]
    assert _workers_measured(r.stdout) == {0, 1}
