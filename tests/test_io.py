"""`io`: page-cache control, timed readers, summarising, --existing sampling, advice,
the throughput table, and the command end to end on this machine's disk.

Interrupts and scratch cleanup on the way out are tested in test_io_cleanup.py.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import random
import types
from dataclasses import replace
from pathlib import Path

import pytest

from starvecheck.advice import io as io_advice
from starvecheck.advice.results import Results
from starvecheck.core.metric import Metric
from starvecheck.core.model import Severity, StageResult
from starvecheck.core.units import format_bytes
from starvecheck.probe.machine import Machine, Storage, collect
from starvecheck.probe.sysroot import SysRoot
from starvecheck.render import throughput
from starvecheck.render.sections import stage_sections
from starvecheck.scratch import directory as scratch
from starvecheck.stages import io as io_stage
from starvecheck.stages.samples import cache, existing
from starvecheck.stages.samples.reads import FileOps, RangeOps, ReadError, RunResult, timed_run
from starvecheck.stages.samples.residency import COLD_MAX_RESIDENT
from tests.conftest import SYSROOTS, run
from tests.fixtures.labels.io import labels as io_labels


def labelled(m: Metric) -> Metric:
    """A hand-made metric with the labels io gives the figure of that name."""
    try:
        return m.labelled(**io_labels(m.name, m.unit))
    except AssertionError:  # not one of io's figures: no labels
        return m


PAGE = mmap.PAGESIZE
MiB = 1 << 20


def fs_type(path: Path) -> str:
    """The filesystem type under `path`, from /proc/mounts (longest mount point wins)."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1].encode().decode("unicode_escape")  # \040 for spaces
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, kind = point, fields[2]
    return kind


def write_file(path: Path, data: bytes, *, fsync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_all(fd: int) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    while os.read(fd, 1 << 20):
        pass


@pytest.fixture
def evictable(tmp_path):
    """tmp_path, when its filesystem honours posix_fadvise(DONTNEED)."""
    kind = fs_type(tmp_path)
    if kind in ("tmpfs", "ramfs", "overlay", "unknown") or kind.startswith("fuse"):
        pytest.skip(f"tmp_path is on {kind}: eviction cannot be checked there")
    return tmp_path


# --- stages/samples/cache.py ------------------------------------------------------------


def test_evict_then_read_moves_residency_from_none_to_all(evictable):
    path = evictable / "data.bin"
    path.write_bytes(os.urandom(2 * MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        cache.evict_fd(fd, sync=True)  # dirty pages: written back first, then dropped
        cold = cache.residency_fd(fd)
        assert cold.total_pages == 2 * MiB // PAGE
        assert cold.fraction is not None and cold.fraction <= 0.05
        read_all(fd)
        warm = cache.residency_fd(fd)
        assert warm.total_pages == 2 * MiB // PAGE
        assert warm.fraction is not None and warm.fraction >= 0.95
    finally:
        os.close(fd)
    # The same by name, through evict() and residency() relative to a directory.
    dfd = os.open(evictable, os.O_RDONLY | os.O_DIRECTORY)
    try:
        cache.evict([path.name], dir_fd=dfd, sync=False)
        res = cache.residency([path.name], dir_fd=dfd)
        assert res.unknown_files == 0 and res.fraction is not None and res.fraction <= 0.05
    finally:
        os.close(dfd)


def test_residency_of_a_byte_range(evictable):
    path = evictable / "data.bin"
    path.write_bytes(os.urandom(MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        cache.evict_fd(fd, sync=True)
        read_all(fd)
        half = MiB // 2
        os.posix_fadvise(fd, 0, half, os.POSIX_FADV_DONTNEED)  # first half cold again
        first = cache.residency_fd(fd, 0, half)
        second = cache.residency_fd(fd, half, half)
        assert first.total_pages == second.total_pages == half // PAGE
        assert first.fraction is not None and first.fraction <= 0.05
        assert second.fraction is not None and second.fraction >= 0.95
        whole = cache.residency_fd(fd)
        assert whole.total_pages == MiB // PAGE
        assert 0.4 <= whole.fraction <= 0.6
        # An unaligned offset counts from its page: [100, 100+PAGE) touches two pages.
        assert cache.residency_fd(fd, 100, PAGE).total_pages == 2
        # A range that runs past the end stops at the end; one past the end is empty.
        assert cache.residency_fd(fd, MiB - PAGE, 10 * PAGE).total_pages == 1
        assert cache.residency_fd(fd, 2 * MiB, PAGE) == cache.Residency(0, 0)
        assert cache.residency_fd(fd, 0, 0) == cache.Residency(0, 0)
    finally:
        os.close(fd)


def test_tmpfs_keeps_its_pages_after_eviction():
    if not os.path.isdir("/dev/shm") or fs_type(Path("/dev/shm")) != "tmpfs":
        pytest.skip("no tmpfs at /dev/shm")
    path = Path("/dev/shm") / f"starvecheck-test-{os.getpid()}.bin"
    try:
        path.write_bytes(os.urandom(256 * 1024))
        fd = os.open(path, os.O_RDONLY)
        try:
            cache.evict_fd(fd, sync=True)
            res = cache.residency_fd(fd)
        finally:
            os.close(fd)
        assert res.total_pages == 256 * 1024 // PAGE
        assert res.fraction == 1.0
    finally:
        path.unlink(missing_ok=True)


def test_residency_arithmetic_and_fraction():
    a = cache.Residency(3, 10)
    b = cache.Residency(1, 10, 1, "first failure")
    c = cache.Residency(0, 0, 2, "second failure")
    total = a + b + c
    assert total == cache.Residency(4, 20, 3, "first failure")
    assert total.fraction == pytest.approx(0.2)
    assert cache.Residency(0, 0).fraction == 0.0  # nothing to check: nothing resident
    assert cache.Residency(0, 0, 1, "mmap refused").fraction is None  # unknown, not 0
    assert cache.Residency(5, 5).fraction == 1.0


def test_missing_file_is_counted_unknown_with_the_reason(tmp_path):
    (tmp_path / "there.bin").write_bytes(b"x" * 5000)
    res = cache.residency([str(tmp_path / "gone.bin"), str(tmp_path / "there.bin")])
    assert res.unknown_files == 1
    assert res.total_pages == 2
    assert res.reason is not None
    assert "gone.bin" in res.reason and os.strerror(errno.ENOENT) in res.reason


def test_symlink_is_not_followed_for_residency(tmp_path):
    (tmp_path / "real.bin").write_bytes(b"x" * 5000)
    (tmp_path / "link.bin").symlink_to(tmp_path / "real.bin")
    res = cache.residency([str(tmp_path / "link.bin")])
    assert res.unknown_files == 1 and res.total_pages == 0 and res.fraction is None


def test_drop_caches_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    problem = cache.drop_caches_problem()
    assert isinstance(problem, str) and "root" in problem


def test_drop_caches_read_only_proc_says_so(monkeypatch):
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if path == cache.DROP_CACHES:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "open", fake_open)
    problem = cache.drop_caches_problem()
    assert problem is not None
    assert cache.DROP_CACHES in problem and "read-only" in problem and "host" in problem


# --- reads.py ---------------------------------------------------------------------------

N_FILES, FILE_SIZE = 37, 5000


@pytest.fixture
def sample_dir(tmp_path):
    """37 files of 5000 bytes, and the same bytes as one shard."""
    d = tmp_path / "samples"
    d.mkdir()
    blobs = [os.urandom(FILE_SIZE) for _ in range(N_FILES)]
    for i, blob in enumerate(blobs):
        (d / f"{i:03d}.bin").write_bytes(blob)
    (tmp_path / "shard.bin").write_bytes(b"".join(blobs))
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    yield tmp_path, d, fd
    os.close(fd)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("buffer_size", [FILE_SIZE, 4096])  # 4096: several reads per file
def test_timed_run_over_files_counts_every_byte_and_op(sample_dir, threads, buffer_size):
    _, d, dfd = sample_dir
    names = sorted(p.name for p in d.iterdir())
    random.Random(1).shuffle(names)
    for ops in (FileOps(names, dfd), FileOps([str(d / n) for n in names])):
        for contiguous in (True, False):
            r = timed_run(ops, threads=threads, buffer_size=buffer_size, contiguous=contiguous)
            assert r.bytes == N_FILES * FILE_SIZE
            assert r.ops == N_FILES
            assert len(r.latencies_ns) == N_FILES
            assert all(x > 0 for x in r.latencies_ns)
            assert r.seconds > 0


@pytest.mark.parametrize("threads", [1, 3])
def test_timed_run_over_ranges_counts_every_byte_and_op(sample_dir, threads):
    root, _, _ = sample_dir
    ranges = [(0, i * FILE_SIZE, FILE_SIZE) for i in range(N_FILES)]
    shuffled = ranges[:]
    random.Random(2).shuffle(shuffled)
    for rs, contiguous in ((ranges, True), (shuffled, False)):
        ops = RangeOps(rs, [str(root / "shard.bin")])
        r = timed_run(ops, threads=threads, buffer_size=FILE_SIZE, contiguous=contiguous)
        assert (r.bytes, r.ops, len(r.latencies_ns)) == (N_FILES * FILE_SIZE, N_FILES, N_FILES)


def test_range_past_the_end_counts_only_what_was_read(sample_dir):
    root, _, _ = sample_dir
    size = N_FILES * FILE_SIZE
    ops = RangeOps([(0, size - 100, FILE_SIZE), (0, 0, 10)], [str(root / "shard.bin")])
    r = timed_run(ops, threads=1, buffer_size=FILE_SIZE, contiguous=False)
    assert r.bytes == 110 and r.ops == 2


def test_timed_run_uses_the_given_clock(sample_dir):
    _, d, dfd = sample_dir
    ticks = iter([10.0, 12.5])
    ops = FileOps(sorted(p.name for p in d.iterdir()), dfd)
    r = timed_run(
        ops, threads=1, buffer_size=FILE_SIZE, contiguous=False, clock=lambda: next(ticks)
    )
    assert r.seconds == pytest.approx(2.5)


def test_part_splits_contiguous_and_interleaved():
    ops = FileOps([str(i) for i in range(10)], 7, 123)
    contiguous = [list(ops.part(i, 3, True).names) for i in range(3)]
    interleaved = [list(ops.part(i, 3, False).names) for i in range(3)]
    assert contiguous == [["0", "1", "2"], ["3", "4", "5"], ["6", "7", "8", "9"]]
    assert interleaved == [["0", "3", "6", "9"], ["1", "4", "7"], ["2", "5", "8"]]
    part = ops.part(1, 3, True)
    assert part.dir_fd == 7 and part.flags == 123
    rops = RangeOps([(0, i, 1) for i in range(5)], ["a", "b"], 9, 5)
    rpart = rops.part(0, 2, False)
    assert list(rpart.ranges) == [(0, 0, 1), (0, 2, 1), (0, 4, 1)]
    assert rpart.files == ["a", "b"] and rpart.dir_fd == 9 and rpart.flags == 5


@pytest.mark.parametrize("count", [0, 1, 2, 7, 37, 100])
@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_parts_cover_every_item_exactly_once(count, n):
    ops = FileOps([f"f{i}" for i in range(count)])
    for contiguous in (True, False):
        parts = [list(ops.part(i, n, contiguous).names) for i in range(n)]
        flat = [x for p in parts for x in p]
        assert sorted(flat) == sorted(ops.names)
        assert len(flat) == count
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1  # balanced
        if contiguous:
            assert flat == list(ops.names)  # each part a run of the original order


@pytest.mark.parametrize("threads", [1, 3])
def test_missing_file_is_a_read_error_naming_it(sample_dir, threads):
    root, d, dfd = sample_dir
    names = sorted(p.name for p in d.iterdir())
    names.insert(20, "vanished.bin")
    with pytest.raises(ReadError, match=r"vanished\.bin"):
        timed_run(FileOps(names, dfd), threads=threads, buffer_size=FILE_SIZE, contiguous=False)
    ranges = [(0, 0, 10), (1, 0, 10)]
    with pytest.raises(ReadError, match=r"no-shard\.bin"):
        timed_run(
            RangeOps(ranges, [str(root / "shard.bin"), str(root / "no-shard.bin")]),
            threads=threads,
            buffer_size=FILE_SIZE,
            contiguous=False,
        )


# --- stages/io.py -----------------------------------------------------------------------


def fake_statvfs(bavail: int, frsize: int = 4096, files: int = 10**6, favail: int = 10**6):
    return types.SimpleNamespace(
        f_bavail=bavail, f_frsize=frsize, f_files=files, f_favail=favail, f_ffree=favail
    )


def test_space_needed_counts_whole_blocks_and_the_shard():
    # 100 files of 5000 bytes take 2 blocks each; the shard 500,000 bytes; metadata 5 blocks.
    assert scratch.space_needed(100, 5000) == 100 * 8192 + 100 * 5000 + 4096 * 5
    assert scratch.space_needed(64, 4096) == 64 * 4096 + 64 * 4096 + 4096 * 5
    assert scratch.space_needed(1, 1) == 4096 + 1 + 4096 * 4


def test_space_problem_reports_sizes(monkeypatch, tmp_path):
    # 400 KiB beyond the margin: too little for this data, enough for less of it.
    blocks = (scratch.MARGIN_BYTES >> 12) + 100
    monkeypatch.setattr(os, "statvfs", lambda p: fake_statvfs(bavail=blocks))
    problem = scratch.space_problem(str(tmp_path), 1000, 16384)
    assert problem is not None
    assert problem.startswith(f"{tmp_path}: not enough free space")
    need = scratch.space_needed(1000, 16384)
    margin = scratch.MARGIN_BYTES + int(need * scratch.MARGIN_SHARE)
    assert format_bytes(need) in problem
    assert format_bytes(margin) in problem
    assert f"{format_bytes(blocks * 4096)} is free" in problem
    assert "--samples" in problem and "--sample-size" in problem


def test_space_problem_boundary(monkeypatch, tmp_path):
    need = scratch.space_needed(10, 4096)
    margin = scratch.MARGIN_BYTES + int(need * scratch.MARGIN_SHARE)
    monkeypatch.setattr(os, "statvfs", lambda p: fake_statvfs(bavail=need + margin, frsize=1))
    assert scratch.space_problem(str(tmp_path), 10, 4096) is None
    monkeypatch.setattr(os, "statvfs", lambda p: fake_statvfs(bavail=need + margin - 1, frsize=1))
    assert "not enough free space" in scratch.space_problem(str(tmp_path), 10, 4096)


def test_space_problem_inodes(monkeypatch, tmp_path):
    plenty = 1 << 40
    monkeypatch.setattr(os, "statvfs", lambda p: fake_statvfs(plenty, 1, files=1000, favail=50))
    problem = scratch.space_problem(str(tmp_path), 100, 4096)
    assert problem is not None and "not enough free inodes" in problem and "116" in problem
    # f_files 0: the filesystem has no inode limit (btrfs), so no inode check at all.
    monkeypatch.setattr(os, "statvfs", lambda p: fake_statvfs(plenty, 1, files=0, favail=0))
    assert scratch.space_problem(str(tmp_path), 100, 4096) is None


def test_space_problem_statvfs_failure(tmp_path):
    problem = scratch.space_problem(str(tmp_path / "missing"), 10, 4096)
    assert problem is not None and "cannot read free space" in problem


def test_metric_name():
    assert io_stage.metric_name("small_files", "random", "cold", 1) == "small_files.random.cold"
    assert io_stage.metric_name("shard", "sequential", "warm", 8) == "shard.sequential.warm.t8"
    assert io_stage.metric_name("files", "random", "cold", 0) == "files.random.cold"


def layout(name: str) -> io_stage.Layout:
    return io_stage.Layout(name, {}, [], None, 0, 0, sync=False)


def plan(runs: int = 3, threads: tuple[int, ...] = (1,)) -> io_stage.Plan:
    return io_stage.Plan(samples=100, sample_size=4000, runs=runs, threads=threads)


def by_name(metrics) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


MS = 1_000_000  # ns


def three_runs() -> list[RunResult]:
    # MB/s 2, 8, 3 and samples/s 50, 200, 75 (medians 3 and 75, means 4.3 and 108);
    # latencies 1..100 ms spread over the runs.
    return [
        RunResult(2.0, 4_000_000, 100, [i * MS for i in range(1, 101, 3)]),
        RunResult(1.0, 8_000_000, 200, [i * MS for i in range(2, 101, 3)]),
        RunResult(1.0, 3_000_000, 75, [i * MS for i in range(3, 101, 3)]),
    ]


def test_summarize_rates_samples_and_percentiles():
    m = io_stage.Measured()
    m.runs[("small_files", "random", "warm", 1)] = three_runs()
    m.runs[("small_files", "random", "warm", 4)] = [RunResult(0.5, 8_000_000, 200, [5 * MS])]
    figures, _ = io_stage.summarize([layout("small_files")], plan(), m)
    metrics = figures.to_metrics()
    got = by_name(metrics)
    rate = got["small_files.random.warm"]
    assert rate.unit == "MB/s" and rate.values == (2.0, 8.0, 3.0) and rate.value == 3.0
    assert (rate.min, rate.max) == (2.0, 8.0)
    sps = got["small_files.random.warm.samples_per_s"]
    assert sps.unit == "samples/s" and sps.values == (50.0, 200.0, 75.0) and sps.value == 75.0
    # Percentiles of every latency of every run, interpolated between ranks.
    assert got["small_files.random.warm.p50_ms"].value == pytest.approx(50.5)
    assert got["small_files.random.warm.p90_ms"].value == pytest.approx(90.1)
    assert got["small_files.random.warm.p99_ms"].value == pytest.approx(99.01)
    assert got["small_files.random.warm.p50_ms"].unit == "ms"
    t4 = got["small_files.random.warm.t4"]
    assert t4.value == 16.0
    assert got["small_files.random.warm.t4.samples_per_s"].value == 400.0
    assert got["small_files.random.warm.t4.p99_ms"].value == 5.0
    assert not any(x.name.startswith("resident_before") for x in metrics)  # no cold runs


def test_summarize_withholds_cold_figures_that_were_not_cold():
    m = io_stage.Measured()
    for temp in ("cold", "warm"):
        m.runs[("small_files", "random", temp, 1)] = three_runs()
        m.runs[("shard", "random", temp, 1)] = three_runs()
    m.resident_cold = {"small_files": [0.0, 0.5, 0.01], "shard": [0.0, 0.04, 0.02]}
    figures, caveats = io_stage.summarize([layout("small_files"), layout("shard")], plan(), m)
    got = by_name(figures.to_metrics())
    for suffix in ("", ".samples_per_s", ".p50_ms", ".p90_ms", ".p99_ms"):
        withheld = got[f"small_files.random.cold{suffix}"]
        assert withheld.value is None
        assert withheld.reason is not None and "not cold" in withheld.reason
        assert "50%" in withheld.reason
        assert got[f"small_files.random.warm{suffix}"].value is not None
        assert got[f"shard.random.cold{suffix}"].value is not None  # 4% resident: cold
    assert got["resident_before.small_files"].value == 0.5  # the worst run decides
    assert got["resident_before.small_files"].values == (0.0, 0.5, 0.01)
    assert got["resident_before.shard"].value == 0.04
    assert got["resident_before.shard"].unit == "fraction"
    text = " ".join(caveats)
    assert "could not be emptied for small_files" in text
    assert [c.id for c in caveats if "could not be emptied" in c] == ["cache.not-cold"]
    assert "shard" not in text.split("could not be emptied for")[1].split(":")[0]


def test_summarize_names_tmpfs_when_cold_is_impossible():
    m = io_stage.Measured()
    m.runs[("shard", "random", "cold", 1)] = three_runs()
    m.resident_cold = {"shard": [1.0, 1.0, 1.0]}
    _, caveats = io_stage.summarize([layout("shard")], plan(), m, fs_kind="memory")
    assert any("tmpfs" in c and "withheld" in c and c.id == "cache.not-cold" for c in caveats)


def test_summarize_unknown_residency_and_partly_warm_caveats():
    m = io_stage.Measured()
    m.runs[("shard", "random", "cold", 1)] = three_runs()
    m.runs[("shard", "random", "warm", 1)] = three_runs()
    m.resident_cold = {"shard": [None, None, None]}
    m.resident_warm = {"shard": [0.6]}
    m.residency_errors = ["shard.bin: Operation not permitted"]
    figures, caveats = io_stage.summarize([layout("shard")], plan(), m)
    got = by_name(figures.to_metrics())
    assert "resident_before.shard" not in got
    assert got["shard.random.cold"].value is not None  # kept, with a caveat
    assert any("could not check" in c and "Operation not permitted" in c for c in caveats)
    assert any("only 60%" in c and "partly cold" in c for c in caveats)
    assert {"cache.unchecked", "cache.partly-warm"} <= {c.id for c in caveats}


def test_summarize_run_count_and_first_cold_run_caveats():
    m = io_stage.Measured()
    # First cold run 100 MB/s, the rest 300: a cache below the kernel.
    m.runs[("shard", "sequential", "cold", 1)] = [
        RunResult(1.0, 100_000_000, 10, [MS]),
        RunResult(1.0, 300_000_000, 10, [MS]),
        RunResult(1.0, 300_000_000, 10, [MS]),
    ]
    m.resident_cold = {"shard": [0.0, 0.0, 0.0]}
    _, caveats = io_stage.summarize([layout("shard")], plan(runs=3), m)
    assert any("first cold run read at 100 MB/s" in c for c in caveats)
    assert not any("run(s) per pattern" in c for c in caveats)
    assert "cache.first-cold-slower" in {c.id for c in caveats}
    m.runs[("shard", "sequential", "cold", 1)] = [RunResult(1.0, 1_000_000, 10, [MS])]
    _, caveats = io_stage.summarize([layout("shard")], plan(runs=1), m)
    assert any("only 1 run(s) per pattern" in c for c in caveats)
    assert [c.id for c in caveats] == ["timing.too-few-runs"]


def test_layout_residency_is_checked_on_the_ranges_read(evictable):
    path = evictable / "big.bin"
    path.write_bytes(os.urandom(MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        cache.evict_fd(fd, sync=True)
        read_all(fd)
        os.posix_fadvise(fd, 0, 256 * 1024, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    ranges = [(0, 0, 64 * 1024), (0, 128 * 1024, 64 * 1024)]  # both in the evicted quarter
    lay = io_stage.Layout("ranges", {}, [str(path)], None, 0, 0, sync=False, ranges=ranges)
    res = lay.residency()
    assert res.total_pages == 2 * 64 * 1024 // PAGE
    assert res.fraction <= 0.05
    whole = io_stage.Layout("files", {}, [str(path)], None, 0, 0, sync=False).residency()
    assert 0.7 <= whole.fraction <= 0.8
    gone = io_stage.Layout("r", {}, [str(evictable / "x")], None, 0, 0, sync=False, ranges=ranges)
    assert gone.residency().unknown_files == 1


# --- stages/samples/existing.py ---------------------------------------------------------


@pytest.fixture
def dataset(tmp_path):
    """A tree: small files at two levels, one sparse 9 MiB file, an empty file, and a
    symlink to a file outside the tree."""
    root = tmp_path / "data"
    (root / "sub" / "deeper").mkdir(parents=True)
    for i in range(5):
        (root / f"a{i}.bin").write_bytes(b"a" * (100 + i))
    for i in range(3):
        (root / "sub" / f"b{i}.bin").write_bytes(b"b" * 2000)
    (root / "sub" / "deeper" / "c.bin").write_bytes(b"c" * 3000)
    with open(root / "sub" / "big.bin", "wb") as f:
        f.truncate(9 * MiB)
    (root / "empty.bin").touch()
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"o" * 500)
    (root / "link.bin").symlink_to(outside)
    return root


def test_discover_walks_the_tree_without_following_symlinks(dataset):
    found = existing.discover(str(dataset), 100, random.Random(0))
    small = dict(found.small)
    assert sorted(os.path.relpath(p, dataset) for p in small) == sorted(
        [f"a{i}.bin" for i in range(5)] + [f"sub/b{i}.bin" for i in range(3)] + ["sub/deeper/c.bin"]
    )
    assert small[str(dataset / "a3.bin")] == 103
    assert found.large == [(str(dataset / "sub" / "big.bin"), 9 * MiB)]
    assert (found.small_seen, found.large_seen) == (9, 1)
    assert found.symlinks == 1
    assert found.unreadable == 0 and not found.truncated
    assert found.owners == {os.geteuid()}
    assert not any("empty" in p or "outside" in p or "link" in p for p, _ in found.small)


def test_discover_a_single_file(dataset):
    found = existing.discover(str(dataset / "a1.bin"), 10, random.Random(0))
    assert found.small == [(str(dataset / "a1.bin"), 101)] and found.large == []
    found = existing.discover(str(dataset / "sub" / "big.bin"), 10, random.Random(0))
    assert found.large == [(str(dataset / "sub" / "big.bin"), 9 * MiB)] and found.small == []


def test_discover_samples_at_most_n_and_is_deterministic(tmp_path):
    for i in range(60):
        d = tmp_path / f"d{i % 4}"
        d.mkdir(exist_ok=True)
        (d / f"{i}.bin").write_bytes(b"x")
    first = existing.discover(str(tmp_path), 10, random.Random(42))
    again = existing.discover(str(tmp_path), 10, random.Random(42))
    other = existing.discover(str(tmp_path), 10, random.Random(43))
    assert len(first.small) == 10 and first.small_seen == 60
    assert len({p for p, _ in first.small}) == 10  # no file twice
    assert first.small == again.small
    assert first.small != other.small
    everything = existing.discover(str(tmp_path), 1000, random.Random(0))
    assert len(everything.small) == 60


def test_reservoir_keeps_each_item_with_equal_probability():
    rng = random.Random(7)
    counts = [0] * 10
    trials = 20_000
    for _ in range(trials):
        keep: list[int] = []
        for seen, item in enumerate(range(10), 1):
            existing._reservoir(keep, item, seen, 3, rng)
        assert len(keep) == 3 and len(set(keep)) == 3
        for item in keep:
            counts[item] += 1
    for c in counts:
        assert c / trials == pytest.approx(0.3, abs=0.02)


def test_discover_stops_at_the_scan_limit(tmp_path, monkeypatch):
    for i in range(6):
        (tmp_path / f"{i}.bin").write_bytes(b"x")
    monkeypatch.setattr(existing, "SCAN_LIMIT", 4)
    found = existing.discover(str(tmp_path), 100, random.Random(0))
    assert found.truncated and found.small_seen == 4


def test_discover_is_not_truncated_when_every_file_was_listed(tmp_path, monkeypatch):
    for i in range(4):
        (tmp_path / f"{i}.bin").write_bytes(b"x")
    monkeypatch.setattr(existing, "SCAN_LIMIT", 4)
    found = existing.discover(str(tmp_path), 100, random.Random(0))
    assert found.small_seen == 4 and not found.truncated


@pytest.mark.parametrize(
    ("sizes", "count", "length"),
    [
        ([9 * MiB, 20 * MiB + 123], 300, 16384),
        ([9 * MiB + 7], 50, 100),  # ranges shorter than a block
        ([10 * 4096 + 5], 100, 4096),  # fewer ranges fit than asked for
        ([9 * MiB], 5, 16 * MiB),  # ranges longer than the file
    ],
)
def test_ranges_are_distinct_aligned_and_inside(sizes, count, length):
    ranges = existing._ranges(sizes, count, length, random.Random(3))
    capacity = sum(max(1, s // max(length, 4096)) for s in sizes)
    assert 0 < len(ranges) <= min(count, capacity)
    assert len({(i, off) for i, off, _ in ranges}) == len(ranges)
    for i, off, n in ranges:
        assert 0 <= i < len(sizes)
        assert off % 4096 == 0
        assert 0 < n <= length
        assert off + n <= sizes[i]
    assert ranges == existing._ranges(sizes, count, length, random.Random(3))
    if count <= capacity and length < min(sizes):
        assert len(ranges) == count


def test_ranges_longer_than_the_file_read_it_whole():
    assert existing._ranges([9 * MiB], 5, 16 * MiB, random.Random(0)) == [(0, 0, 9 * MiB)]


def test_existing_layouts_describe_the_sample(dataset):
    plan_ = io_stage.Plan(samples=100, sample_size=16384, runs=1, threads=(1,))
    layouts, params, caveats = existing.layouts(str(dataset), plan_)
    assert [x.name for x in layouts] == ["files", "ranges"]
    files, ranges = layouts
    assert sorted(files.paths) == sorted(files.ops["random"].names)
    assert len(files.paths) == 9 and files.bytes == sum(100 + i for i in range(5)) + 9000
    assert not files.sync and not ranges.sync  # never fsync a user's files
    assert files.evict_flags & os.O_NOATIME  # we own these files
    assert ranges.ranges is not None and len(ranges.ranges) == 100
    assert params["files_read"] == 9 and params["large_files_read"] == 1
    assert params["ranges_read"] == 100 and params["median_file_bytes"] == 104
    assert any("1 symlinks not followed" in c for c in caveats)
    assert [c.id for c in caveats] == ["io.symlinks-skipped"]


def test_existing_caveats_carry_ids(dataset, monkeypatch):
    """Files another user owns are read without O_NOATIME, and said so."""
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)
    plan_ = io_stage.Plan(samples=100, sample_size=16384, runs=1, threads=(1,))
    _, _, caveats = existing.layouts(str(dataset), plan_)
    assert [c.id for c in caveats] == ["io.symlinks-skipped", "io.atime"]
    assert "without O_NOATIME" in caveats[1]


# --- advice/io.py -----------------------------------------------------------------------


def rate(name: str, value: float | None, unit: str = "MB/s") -> Metric:
    m = Metric(name, value, unit) if value is not None else Metric.missing(name, unit, "x")
    return labelled(m)


NO_STORAGE = dict.fromkeys(
    ("mount_point", "fstype", "source", "kind", "network", "rotational", "free_bytes")
)


def machine_with(storage: dict) -> Machine:
    """A fake machine's facts, its storage as given (unknown where not given)."""
    facts = collect(SysRoot(SYSROOTS / "vm-no-numa-no-gpu"), environ={})
    return replace(facts, storage=Storage(**{"path": "/data", **NO_STORAGE, **storage}))


def judge_io(metrics, params, storage):
    """io's judgement of these figures on a machine with that storage, as advice.judge
    runs it."""
    result = StageResult("io", params, tuple(metrics))
    return io_advice.rules(Results({"io": result}, machine_with(storage)))


def finding(findings, fid):
    hits = [f for f in findings if f.id == fid]
    assert len(hits) <= 1
    return hits[0] if hits else None


GEN = {"threads": [1]}


@pytest.mark.parametrize(
    ("small", "seq", "severity"),
    [
        (100.0, 400.0, Severity.CRITICAL),
        (100.0, 1000.0, Severity.CRITICAL),
        (100.0, 399.0, Severity.WARNING),
        (100.0, 150.0, Severity.WARNING),
        (100.0, 149.0, Severity.OK),
        (100.0, 80.0, Severity.OK),
    ],
)
def test_small_files_severity_follows_the_ratio(small, seq, severity):
    metrics = [rate("small_files.random.cold", small), rate("shard.sequential.cold", seq)]
    f = finding(judge_io(metrics, GEN, {}), "io.small-files")
    assert f is not None and f.severity is severity and f.stage == "io"
    if severity is Severity.OK:
        assert f.gain is None
    else:
        assert f.gain is not None and f.gain.value == pytest.approx(round(seq / small, 2))
        assert "cold" in f.gain.basis
    assert f"({seq / small:.1f}x)" in f.evidence


def test_small_files_prefers_cold_and_falls_back_to_warm():
    both = [
        rate("small_files.random.cold", 100.0),
        rate("shard.sequential.cold", 500.0),
        rate("small_files.random.warm", 1000.0),
        rate("shard.sequential.warm", 1200.0),
    ]
    f = finding(judge_io(both, GEN, {}), "io.small-files")
    assert f.severity is Severity.CRITICAL and f.gain.value == 5.0
    assert f.evidence.startswith("cold")
    warm_only = [
        rate("small_files.random.cold", None),
        rate("shard.sequential.cold", None),
        rate("small_files.random.warm", 100.0),
        rate("shard.sequential.warm", 200.0),
        rate("shard.random.warm", 150.0),
    ]
    f = finding(judge_io(warm_only, GEN, {}), "io.small-files")
    assert f.severity is Severity.WARNING and f.gain.value == 2.0
    assert f.evidence.startswith("warm") and "warm cache" in f.evidence
    assert "shuffled offsets 150 MB/s" in f.evidence
    assert "warm" in f.gain.basis


def test_small_files_needs_both_figures():
    assert (
        finding(judge_io([rate("small_files.random.cold", 5.0)], GEN, {}), "io.small-files") is None
    )


@pytest.mark.parametrize(
    ("one", "many", "severity"),
    [(100.0, 150.0, Severity.INFO), (100.0, 390.0, Severity.INFO), (100.0, 149.0, Severity.OK)],
)
def test_few_readers(one, many, severity):
    metrics = [rate("small_files.random.cold", one), rate("small_files.random.cold.t4", many)]
    f = finding(judge_io(metrics, {"threads": [1, 4]}, {}), "io.few-readers")
    assert f is not None and f.severity is severity
    if severity is Severity.INFO:
        assert f.gain.value == pytest.approx(round(many / one, 2))
        assert "num_workers=4" in f.recommendation
    # One thread count only: nothing to compare.
    assert finding(judge_io(metrics, {"threads": [4]}, {}), "io.few-readers") is None


def test_few_readers_existing_uses_the_files_layout():
    metrics = [rate("files.random.warm", 10.0), rate("files.random.warm.t2", 30.0)]
    params = {"threads": [1, 2], "existing": True}
    f = finding(judge_io(metrics, params, {}), "io.few-readers")
    assert f.severity is Severity.INFO and "files.random, warm" in f.evidence


def test_network_storage_only_when_network_is_true():
    metrics = [
        rate("small_files.random.cold", 50.0),
        rate("small_files.random.cold.p50_ms", 3.0, "ms"),
    ]
    for storage in ({}, {"network": False}, {"network": None}, {"network": "yes"}):
        assert finding(judge_io(metrics, GEN, storage), "io.network-storage") is None
    storage = {"network": True, "fstype": "nfs4", "path": "/data", "mount_point": "/data"}
    f = finding(judge_io(metrics, GEN, storage), "io.network-storage")
    assert f.severity is Severity.WARNING and "nfs4" in f.title
    assert "3.00 ms p50" in f.evidence


@pytest.mark.parametrize(
    ("p50", "severity"),
    [(0.5, Severity.INFO), (1.99, Severity.INFO), (2.0, Severity.WARNING), (8.0, Severity.WARNING)],
)
def test_rotational(p50, severity):
    metrics = [
        rate("small_files.random.cold", 20.0),
        rate("small_files.random.cold.p50_ms", p50, "ms"),
    ]
    f = finding(judge_io(metrics, GEN, {"rotational": True}), "io.rotational")
    assert f is not None and f.severity is severity
    assert finding(judge_io(metrics, GEN, {"rotational": False}), "io.rotational") is None
    # Without cold figures there is nothing to judge the disk by.
    warm = [rate("small_files.random.warm", 20.0)]
    assert finding(judge_io(warm, GEN, {"rotational": True}), "io.rotational") is None


@pytest.mark.parametrize(
    ("cold", "warm", "severity"),
    [(100.0, 150.0, Severity.INFO), (100.0, 1000.0, Severity.INFO), (100.0, 149.0, Severity.OK)],
)
def test_cold_cache_gap(cold, warm, severity):
    metrics = [rate("shard.random.cold", cold), rate("shard.random.warm", warm)]
    f = finding(judge_io(metrics, GEN, {}), "io.cold-cache-gap")
    assert f is not None and f.severity is severity
    assert f"({warm / cold:.1f}x)" in f.evidence


def test_cold_cache_gap_reports_the_widest_gap():
    metrics = [
        rate("shard.random.cold", 100.0),
        rate("shard.random.warm", 120.0),
        rate("small_files.random.cold", 10.0),
        rate("small_files.random.warm", 90.0),
    ]
    f = finding(judge_io(metrics, GEN, {}), "io.cold-cache-gap")
    assert f.severity is Severity.INFO and f.evidence.startswith("small_files.random")
    assert "9.0x" in f.title


def test_no_figures_no_findings():
    assert judge_io([], {"threads": [1, 2]}, {"network": False}) == []


def _labelled_figures() -> list[Metric]:
    """A small run's figures: shuffled small files, the shard both ways, cold and warm,
    one and four readers, a latency and the residency."""
    return [
        labelled(m)
        for m in (
            Metric.repeated("small_files.random.cold", [9.0, 10.0, 11.0], "MB/s"),
            Metric("small_files.random.cold.samples_per_s", 640.0, "samples/s"),
            Metric("small_files.random.cold.p50_ms", 3.0, "ms"),
            Metric("small_files.random.cold.t4", 30.0, "MB/s"),
            Metric("small_files.random.warm", 200.0, "MB/s"),
            Metric("shard.sequential.cold", 100.0, "MB/s"),
            Metric("shard.random.cold", 20.0, "MB/s"),
            Metric("resident_before.shard", 0.01, "fraction"),
        )
    ]


def test_rules_and_table_select_by_labels_not_names():
    """A metric renamed but labelled the same lands in the same finding and table row;
    without labels nothing is found and no row is made, whatever the names say."""
    metrics = _labelled_figures()
    params = {"threads": [1, 4]}
    storage = {"network": True, "rotational": True, "fstype": "nfs4"}
    found = judge_io(metrics, params, storage)
    assert {f.id for f in found} == {
        "io.small-files",
        "io.cold-cache-gap",
        "io.few-readers",
        "io.network-storage",
        "io.rotational",
    }
    renamed = [replace(m, name=f"x{i}") for i, m in enumerate(metrics)]
    assert [f.to_dict() for f in judge_io(renamed, params, storage)] == [f.to_dict() for f in found]
    rows, rest = split_io(tuple(metrics))
    rows_renamed, rest_renamed = split_io(tuple(renamed))
    assert [r.cells() for r in rows_renamed] == [r.cells() for r in rows]
    assert len(rows) == 5 and [m.name for m in rest] == ["resident_before.shard"]
    assert [m.name for m in rest_renamed] == ["x7"]
    unlabelled = [replace(m, labels={}) for m in metrics]
    (network,) = judge_io(unlabelled, params, storage)  # the storage alone, no figures
    assert network.id == "io.network-storage" and "cold small reads" not in network.evidence
    assert split_io(tuple(unlabelled))[0] == []


def test_storage_comes_from_the_machine():
    """io's storage findings need this machine's facts: none for a stored trace."""
    metrics = _labelled_figures()
    result = StageResult("io", {"threads": [1]}, tuple(metrics))
    without = {f.id for f in io_advice.rules(Results({"io": result}))}
    assert without == {"io.small-files", "io.cold-cache-gap"}
    assert io_advice.rules(Results({}, machine_with({"network": True}))) == []


def test_the_throughput_table_is_ios_alone():
    """The stage table gives io's results alone to render/throughput: a loader result
    holding the same figures gets no throughput table."""
    metrics = tuple(_labelled_figures())
    io_headers = {s.headers for s in stage_sections(StageResult("io", {}, metrics))[0]}
    assert throughput.HEADERS in io_headers
    loader = stage_sections(StageResult("loader", {}, metrics))[0]
    assert throughput.HEADERS not in {s.headers for s in loader}


# --- render/throughput.py ---------------------------------------------------------------


def split_io(metrics: tuple[Metric, ...]):
    """The throughput table of an io result holding `metrics`."""
    return throughput.split(metrics)


def test_split_groups_rows_with_their_companions():
    metrics = (
        Metric("resident_before.shard", 0.01, "fraction"),
        Metric.repeated("shard.random.cold", [100.0, 120.0, 110.0], "MB/s"),
        Metric("shard.random.cold.samples_per_s", 6700.0, "samples/s"),
        Metric("shard.random.cold.p50_ms", 0.1, "ms"),
        Metric("shard.random.cold.p90_ms", 0.2, "ms"),
        Metric("shard.random.cold.p99_ms", 0.3, "ms"),
        Metric.repeated("shard.random.cold.t16", [900.0], "MB/s"),
        Metric("shard.random.cold.t16.p50_ms", 0.5, "ms"),
        Metric("small_files.random.warm", 50.0, "MB/s"),
        Metric("other", 1.0, "x"),
        Metric("looks.cold", 1.0, "ms"),  # right name, wrong unit: not a row
    )
    rows, rest = split_io(tuple(labelled(m) for m in metrics))
    assert [(r.what, r.temp, r.threads) for r in rows] == [
        ("shard.random", "cold", 1),
        ("shard.random", "cold", 16),
        ("small_files.random", "warm", 1),
    ]
    assert sorted(rows[0].companions) == sorted(throughput.COMPANIONS)
    assert rows[0].companions["p90_ms"].value == 0.2
    assert list(rows[1].companions) == ["p50_ms"]
    assert rows[2].companions == {}
    assert [m.name for m in rest] == ["resident_before.shard", "other", "looks.cold"]
    cells = rows[0].cells()
    assert len(cells) == len(throughput.HEADERS)
    assert cells[:4] == ("shard.random", "cold", "1", "110")
    assert cells[4] == "100 … 120"
    assert cells[6:] == ("6,700", "0.100", "0.200", "0.300")
    assert rows[1].cells()[6:] == ("-", "0.500", "-", "-")
    assert rows[2].cells()[3] == "50"
    assert throughput.missing_reasons(rows) == []


def test_missing_rate_renders_na_with_its_reason():
    reason = "not cold: 80% of the data was still in the page cache before a cold run"
    metrics = (
        Metric.missing("small_files.random.cold", "MB/s", reason),
        Metric.missing("small_files.random.cold.p50_ms", "ms", reason),
        Metric.missing("small_files.random.cold.t2", "MB/s", reason),
        Metric.missing("shard.random.cold", "MB/s", reason),
        Metric.missing("files.random.warm", "MB/s", "no runs completed"),
    )
    rows, rest = split_io(tuple(labelled(m) for m in metrics))
    assert rest == []
    assert rows[0].cells() == ("small_files.random", "cold", "1", "n/a", *[""] * 6)
    assert throughput.missing_reasons(rows) == [
        f"n/a (small_files.random cold, shard.random cold): {reason}",
        "n/a (files.random warm): no runs completed",
    ]


def test_split_survives_an_absurd_thread_count():
    rows, rest = split_io((Metric("x.cold.t" + "9" * 5000, 1.0, "MB/s"),))
    assert len(rows) + len(rest) == 1


# --- the command end to end -------------------------------------------------------------

LAYOUT_PATTERNS = ("small_files.random", "shard.sequential", "shard.random")
SUFFIXES = ("", ".samples_per_s", ".p50_ms", ".p90_ms", ".p99_ms")


def io_run(options: str, path: str):
    """`starvecheck io OPTIONS PATH` in this process; options split on blanks."""
    return run("io", *options.split(), path)


def stage_metrics(result) -> dict[str, dict]:
    d = result.json
    assert d["command"] == "io" and len(d["stages"]) == 1
    stage = d["stages"][0]
    assert stage["stage"] == "io"
    return {m["name"]: m for m in stage["metrics"]}


def test_io_quick_json_has_every_metric_and_leaves_nothing(tmp_path):
    r = io_run("--quick --samples 300 --runs 2 --threads 1,2 --json -", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    d = r.json
    stage = d["stages"][0]
    got = stage_metrics(r)
    params = stage["parameters"]
    assert params["samples"] == 300 and params["runs"] == 2 and params["threads"] == [1, 2]
    assert params["sample_size_bytes"] == 16384 and params["cold"] is True
    assert params["path"] == str(tmp_path)
    assert params["scratch"].startswith(str(tmp_path / "starvecheck-io-"))
    expected = {
        f"{lp}.{temp}{t}{suffix}"
        for lp in LAYOUT_PATTERNS
        for temp in ("cold", "warm")
        for t in ("", ".t2")
        for suffix in SUFFIXES
    } | {"resident_before.small_files", "resident_before.shard"}
    assert set(got) == expected
    # Every figure carries the labels it was measured under (schema 2).
    for name, m in got.items():
        assert m["labels"].get("quantity"), name
        assert m["labels"] == io_labels(name, m["unit"]), name
    assert got["shard.random.cold.t2.samples_per_s"]["labels"] == {
        "quantity": "samples_per_s",
        "layout": "shard",
        "pattern": "random",
        "cache": "cold",
        "threads": 2,
    }
    assert got["resident_before.shard"]["labels"] == {
        "quantity": "resident_before",
        "layout": "shard",
    }
    on_disk = fs_type(tmp_path) not in ("tmpfs", "ramfs")
    for name, m in got.items():
        if name.startswith("resident_before"):
            # checked before each cold run: 2 runs x 2 thread counts x the layout's patterns
            assert m["unit"] == "fraction"
            assert m["n"] == (4 if name.endswith("small_files") else 8)
            if on_disk:
                assert m["value"] <= COLD_MAX_RESIDENT, m
            continue
        if ".cold" in name and not on_disk:
            continue
        assert m["value"] is not None and m["value"] > 0, m
        if name.endswith("_ms"):
            assert m["unit"] == "ms"
        elif name.endswith(".samples_per_s"):
            assert m["unit"] == "samples/s" and m["n"] == 2
        else:
            assert m["unit"] == "MB/s" and m["n"] == 2
            # bytes were counted right: MB/s is samples/s times the sample size
            sps = got[f"{name}.samples_per_s"]
            assert m["value"] == pytest.approx(sps["value"] * 16384 / 1e6, rel=1e-9)
    for name in got:
        if name.endswith(".p50_ms"):
            base = name[: -len(".p50_ms")]
            assert got[base + ".p50_ms"]["value"] <= got[base + ".p90_ms"]["value"]
            assert got[base + ".p90_ms"]["value"] <= got[base + ".p99_ms"]["value"]
    ids = {f["id"] for f in stage["findings"]}
    assert {"io.small-files", "io.few-readers"} <= ids
    if on_disk:
        assert "io.cold-cache-gap" in ids
    assert any("only 2 run(s)" in c for c in stage["caveats"])
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone


def test_io_no_cold_has_no_cold_metrics(tmp_path):
    r = io_run("--quick --samples 200 --runs 1 --threads 1 --no-cold --json -", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    got = stage_metrics(r)
    assert not any(".cold" in n or n.startswith("resident_before") for n in got)
    assert {f"{lp}.warm" for lp in LAYOUT_PATTERNS} <= set(got)
    assert not any(".t" in n.split("warm")[-1] for n in got)  # one thread count only
    assert r.json["stages"][0]["parameters"]["cold"] is False
    assert list(tmp_path.iterdir()) == []


def test_io_markdown_has_the_throughput_table(tmp_path):
    r = io_run("--quick --samples 200 --runs 1 --threads 1 --markdown -", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("## starvecheck io")
    assert "| " + " | ".join(throughput.HEADERS) + " |" in r.stdout
    assert "| shard.sequential | warm | 1 |" in r.stdout
    assert list(tmp_path.iterdir()) == []


def test_io_terminal_report(tmp_path):
    r = io_run("--quick --samples 200 --runs 1 --threads 1 --no-cold", str(tmp_path))
    assert r.exit_code == 0, r.stderr
    assert "small_files.random" in r.stdout and "Checklist" in r.stdout
    assert list(tmp_path.iterdir()) == []


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every entry under `root`: (sha256 of a regular file's content, mtime_ns)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            digest = ""
            if os.path.isfile(p) and not os.path.islink(p):
                # O_NOATIME: hashing must not move the access times it records.
                fd = os.open(p, os.O_RDONLY | os.O_NOATIME)
                try:
                    h = hashlib.sha256()
                    while chunk := os.read(fd, 1 << 20):
                        h.update(chunk)
                finally:
                    os.close(fd)
                digest = h.hexdigest()
            out[os.path.relpath(p, root)] = (digest, st.st_mtime_ns)
    return out


def atimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_atime_ns for p in root.rglob("*")}


@pytest.fixture
def user_data(tmp_path):
    """200 small files of random sizes and content, and one 9 MiB file, all on disk
    (fsync'd, as a dataset normally is: dirty pages cannot be evicted)."""
    root = tmp_path / "dataset"
    (root / "part").mkdir(parents=True)
    rng = random.Random(5)
    for i in range(200):
        where = root / "part" if i % 2 else root
        write_file(where / f"{i:04d}.jpg", os.urandom(rng.randint(1, 40_000)))
    write_file(root / "shard-000.tar", os.urandom(9 * MiB))
    # Access times older than modification times: relatime would update them on read.
    for p in root.rglob("*"):
        if p.is_file():
            st = p.stat()
            os.utime(p, ns=(st.st_mtime_ns - 10**12, st.st_mtime_ns))
    return root


def test_existing_measures_and_changes_nothing(user_data):
    before, atimes_before = snapshot(user_data), atimes(user_data)
    r = io_run("--existing --quick --runs 2 --threads 1,2 --json -", str(user_data))
    assert r.exit_code == 0, r.stderr
    got = stage_metrics(r)
    stage = r.json["stages"][0]
    for name in ("files.random.cold", "ranges.random.cold", "files.random.warm.t2"):
        assert got[name]["value"] is not None and got[name]["value"] > 0, got[name]
        assert got[name]["n"] == 2
    assert "resident_before.files" in got and "resident_before.ranges" in got
    assert not any(n.startswith(("small_files", "shard")) for n in got)
    params = stage["parameters"]
    assert params["existing"] is True and "scratch" not in params
    assert params["files_seen"] == 201 and params["files_read"] == 200
    assert params["large_files_read"] == 1 and params["ranges_read"] > 0
    cap = stage["capacity"]
    assert cap is not None and cap["value"] > 0 and cap["unit"] == "samples/s"
    assert cap["name"] == "capacity (files.random.cold.t2.samples_per_s)"
    assert snapshot(user_data) == before  # same contents and mtimes, nothing added or gone
    # The large file's ranges are opened with O_NOATIME everywhere: its atime stays.
    assert atimes(user_data)["shard-000.tar"] == atimes_before["shard-000.tar"]


def test_existing_leaves_access_times_alone(user_data):
    before = atimes(user_data)
    r = io_run("--existing --quick --runs 1 --threads 1 --json -", str(user_data))
    assert r.exit_code == 0, r.stderr
    # We own the files, so every open can use O_NOATIME (existing.py's docstring).
    assert r.json["stages"][0]["parameters"]["files_read"] == 200
    assert atimes(user_data) == before


def test_existing_on_a_single_file(user_data):
    one = user_data / "0000.jpg"
    before = snapshot(user_data)
    r = run("io", "--existing", "--quick", "--runs", "1", "--threads", "1", "--json", "-", str(one))
    assert r.exit_code == 0, r.stderr
    got = stage_metrics(r)
    assert got["files.random.warm"]["value"] > 0
    params = r.json["stages"][0]["parameters"]
    assert params["files_seen"] == 1 and params["files_read"] == 1  # no sibling read
    big = user_data / "shard-000.tar"
    r = run("io", "--existing", "--quick", "--runs", "1", "--threads", "1", "--json", "-", str(big))
    assert r.exit_code == 0, r.stderr
    got = stage_metrics(r)
    assert got["ranges.random.warm"]["value"] > 0 and "files.random.warm" not in got
    assert r.json["stages"][0]["capacity"]["name"].startswith("capacity (ranges.random.")
    assert snapshot(user_data) == before


# --- usage errors -----------------------------------------------------------------------


def assert_usage_error(r, message: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("starvecheck: error: "), lines[0]
    assert message in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sample-size", "abc"], "--sample-size 'abc': expected a size"),
        (["--sample-size", "0"], "--sample-size '0': expected a size"),
        (["--sample-size", "0.5"], "expected a size"),
        (["--sample-size", "2G"], "--sample-size 2G: at most 1GiB"),
        (["--threads", "x"], "--threads 'x': expected counts from 1 to 1024"),
        (["--threads", "0"], "--threads '0'"),
        (["--threads", ","], "--threads ','"),
        (["--threads", "1,-4"], "--threads '1,-4'"),
        (["--threads", "2000"], "--threads '2000'"),
        (["--keep", "--existing"], "--keep: nothing is written with --existing"),
        (["--drop-caches", "--no-cold"], "--drop-caches only applies to cold runs"),
        (["--samples", "0"], "--samples"),
        (["--samples", "-3"], "--samples"),
        (["--runs", "0"], "--runs"),
    ],
)
def test_io_bad_options(tmp_path, args, message):
    assert_usage_error(run("io", *args, str(tmp_path)), message)
    assert list(tmp_path.iterdir()) == []


def test_io_threads_with_empty_items_is_refused(tmp_path):
    assert_usage_error(
        run("io", "--threads", "1,,", "--samples", "10", "--runs", "1", str(tmp_path)),
        "--threads '1,,'",
    )


def test_io_huge_sample_size_is_a_usage_error(tmp_path):
    assert_usage_error(run("io", "--sample-size", "9" * 400, str(tmp_path)), "--sample-size")


def test_io_missing_path(tmp_path):
    assert_usage_error(run("io", str(tmp_path / "nope")), "nope: no such file or directory")
    r = run("io", "--existing", str(tmp_path / "nope"))
    assert_usage_error(r, "nope: no such file or directory")


def test_io_path_is_a_file(tmp_path):
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    assert_usage_error(run("io", str(f)), "not a directory")
    assert_usage_error(run("io", str(f)), "--existing")  # says how to read a file


def test_io_drop_caches_as_non_root(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert_usage_error(run("io", "--drop-caches", str(tmp_path)), "--drop-caches: needs root")
    assert list(tmp_path.iterdir()) == []


def test_io_not_enough_space(tmp_path, monkeypatch):
    real = os.statvfs
    target = str(tmp_path)

    def statvfs(path):
        if os.fspath(path) == target:
            return fake_statvfs(bavail=10)
        return real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)
    r = run("io", "--quick", str(tmp_path))
    assert_usage_error(r, "not enough free space")
    assert format_bytes(scratch.space_needed(2000, 16384)) in r.stderr  # --quick's 2,000
    assert list(tmp_path.iterdir()) == []


def test_io_existing_on_an_empty_directory(tmp_path):
    assert_usage_error(run("io", "--existing", str(tmp_path)), "no readable, non-empty regular")
    (tmp_path / "empty.bin").touch()
    (tmp_path / "sub").mkdir()
    assert_usage_error(run("io", "--existing", str(tmp_path)), "no readable, non-empty regular")
