"""A batch made at num_workers=0 in a fresh interpreter (loading/alone.py): timed where
the dataset pickles, refused with one reason where it cannot be, the child's failures
said, never raised, and the child never left behind; the cgroup's memory room it
checks (probe/cgroup.memory_free)."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset, TensorDataset  # noqa: E402

from starvecheck.core import clocks  # noqa: E402
from starvecheck.loading import alone  # noqa: E402
from starvecheck.probe.cgroup import memory_free  # noqa: E402
from starvecheck.probe.sysroot import SysRoot  # noqa: E402


def rows(n: int = 64, width: int = 4096) -> TensorDataset:
    """Samples of 16 KiB from a class every interpreter imports (torch's own)."""
    return TensorDataset(torch.arange(n * width, dtype=torch.float32).reshape(n, width))


def test_a_picklable_loader_is_timed_at_num_workers_0_and_its_workers_batches_freed() -> None:
    loader = DataLoader(rows(), batch_size=4, num_workers=2)
    a = alone.measure(loader, loader.collate_fn, threads=2, batch_bytes=4 * 16384)
    assert a.why is None and a.measured, a.why
    assert alone.LEAST <= len(a.batch_s) <= alone.BATCHES
    assert all(0 < t < 5 for t in a.batch_s)
    assert len(a.release_s) == alone.RELEASES and all(t >= 0 for t in a.release_s)
    assert a.threads == 2 and a.took_s >= sum(a.batch_s)


def test_batches_that_are_items_are_timed_through_the_sampler() -> None:
    loader = DataLoader(rows(), batch_size=None, num_workers=2)  # each item a batch
    a = alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=16384)
    assert a.measured, a.why


class Stream(IterableDataset):  # type: ignore[type-arg]
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(10))


class Local(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return i


def test_what_cannot_be_made_elsewhere_is_refused_with_its_reason_and_no_process() -> None:
    started = clocks.monotonic()
    s = DataLoader(Stream(), batch_size=2, num_workers=1)
    assert "IterableDataset" in str(alone.measure(s, s.collate_fn, threads=1, batch_bytes=0).why)
    Local.__module__ = "__main__"  # as a class in the script run is
    m = DataLoader(Local(), batch_size=2, num_workers=1)
    why = str(alone.measure(m, m.collate_fn, threads=1, batch_bytes=0).why)
    assert "dataset is defined in the script run as __main__" in why
    lam = DataLoader(rows(), batch_size=2, num_workers=1, collate_fn=lambda b: b)
    why = str(alone.measure(lam, lam.collate_fn, threads=1, batch_bytes=0).why)
    assert "collate_fn is defined in the script run as __main__" in why or "pickle" in why
    assert clocks.monotonic() - started < 2.0  # no interpreter was started for these


def test_a_child_that_fails_says_why_in_one_line() -> None:
    # Indices past the dataset's end: the child's fetch raises IndexError.
    loader = DataLoader(rows(8), batch_sampler=[[100, 101]] * 20, num_workers=1)
    a = alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=0)
    assert not a.measured and a.why is not None
    assert a.why.startswith("loading at num_workers=0 failed there (IndexError")
    assert "\n" not in a.why


def test_a_child_past_its_limit_is_killed_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(rows(), batch_size=4, num_workers=1)
    started = clocks.monotonic()
    a = alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=0, limit_s=0.05)
    assert a.why is not None and ("longer than" in a.why or "no time" in a.why)
    assert clocks.monotonic() - started < 3.0


def test_no_room_for_the_child_is_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(alone, "ROOM_SHARE", 1e-12)
    loader = DataLoader(rows(), batch_size=4, num_workers=1)
    a = alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=1 << 20)
    assert a.why is not None and "of memory free" in a.why


def test_a_dataset_holding_more_than_the_payload_bound_is_not_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(alone, "PAYLOAD_MAX", 1000)
    loader = DataLoader(rows(), batch_size=4, num_workers=1)
    a = alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=0)
    assert a.why is not None and "not copied" in a.why


def test_held_bytes_counts_arrays_and_bytes_inside_and_ends_on_a_cycle() -> None:
    class Holder:
        def __init__(self) -> None:
            self.table = bytes(1000)
            self.arrays = [torch.zeros(10), {"x": torch.zeros(5, dtype=torch.float64)}]

    assert alone.held_bytes(Holder()) == 1000 + 40 + 40
    loop: list[object] = []
    loop.append(loop)
    assert alone.held_bytes(loop) == 0  # bounded: the walk ends


def test_the_child_reads_its_job_and_times_it_in_process() -> None:
    loader = DataLoader(rows(), batch_size=4)
    job = (alone.VERSION, 1, loader.dataset, loader.batch_sampler, True, loader.collate_fn, 4, 1.0)
    out = alone.child(io.BytesIO(pickle.dumps(job)))
    assert len(out["batch_s"]) == 4 and len(out["release_s"]) == alone.RELEASES


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=200))
def test_the_child_given_garbage_answers_an_error_and_never_raises(data: bytes) -> None:
    out = alone.child(io.BytesIO(data))
    assert set(out) == {"error"} and isinstance(out["error"], str)


def _cgroup_v2(root: Path, limit: str, usage: str, parent: tuple[str, str] | None) -> SysRoot:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/job/pod\n")
    (root / "proc/self/mountinfo").write_text(
        "30 1 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    )
    leaf = root / "sys/fs/cgroup/job/pod"
    leaf.mkdir(parents=True)
    (leaf / "memory.max").write_text(limit)
    (leaf / "memory.current").write_text(usage)
    if parent is not None:
        (leaf.parent / "memory.max").write_text(parent[0])
        (leaf.parent / "memory.current").write_text(parent[1])
    return SysRoot(root)


def test_memory_free_is_the_tightest_limit_less_usage_up_the_tree(tmp_path: Path) -> None:
    root = _cgroup_v2(tmp_path / "a", "1000000", "400000", ("800000", "700000"))
    assert memory_free(root) == 100000  # the parent's 800,000 less its 700,000
    assert memory_free(_cgroup_v2(tmp_path / "b", "max", "5", None)) is None
    assert memory_free(_cgroup_v2(tmp_path / "c", "2000", "3000", None)) == 0
    assert memory_free(SysRoot(tmp_path / "none")) is None


def test_an_interrupt_while_the_child_runs_kills_it_and_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import subprocess

    made: list[subprocess.Popen[bytes]] = []
    real = subprocess.Popen

    class Interrupted(real):  # type: ignore[misc,valid-type]
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)  # type: ignore[arg-type]
            made.append(self)

        def communicate(self, *a: object, **kw: object) -> tuple[None, None]:
            raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", Interrupted)
    loader = DataLoader(rows(), batch_size=4, num_workers=1)
    with pytest.raises(KeyboardInterrupt):
        alone.measure(loader, loader.collate_fn, threads=1, batch_bytes=0)
    assert len(made) == 1 and made[0].returncode is not None  # killed and reaped


def _watched(monkeypatch: pytest.MonkeyPatch, top: object) -> tuple[object, list[int]]:
    """A watched loop of 1 MiB batches, the hand-over made its top stage where `top`
    says so, and the measurement stubbed: (the watch, each call's batch bytes)."""
    import starvecheck
    from starvecheck.core.schema.loading import LoadFigures
    from starvecheck.loop import reporting

    calls: list[int] = []

    def measured(loader: object, collate: object, *, threads: int, batch_bytes: int) -> object:
        calls.append(batch_bytes)
        return alone.Alone((0.02,) * 5, 1.5, threads, release_s=(0.008,) * 5)

    monkeypatch.setattr(alone, "measure", measured)
    monkeypatch.setattr(reporting, "worth_measuring", lambda *a: True)
    monkeypatch.setattr(LoadFigures, "top", property(lambda self: top))
    loader = DataLoader(rows(32, 65536), batch_size=4, num_workers=1)  # 1 MiB batches
    w = starvecheck.watch(loader, show=False)
    for _ in w:
        pass
    return w, calls


def test_a_watch_whose_hand_over_holds_it_back_times_num_workers_0_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from starvecheck.core.schema.loading import LoadFigures, LoadStage
    from starvecheck.loop.splits import ALONE_MEASURED

    w, calls = _watched(monkeypatch, LoadStage.HANDOVER)
    first = w.result()  # type: ignore[attr-defined]
    w.result()  # type: ignore[attr-defined]
    assert calls == [1 << 20]  # once per dataset and batch size, however many reports
    figures = first.records(LoadFigures)
    assert figures.alone_ms is not None and figures.alone_ms.value == pytest.approx(20.0)
    assert figures.release_ms is not None and figures.release_ms.value == pytest.approx(8.0)
    said = [c for c in first.caveats if c.id == ALONE_MEASURED]
    assert said and "waited 1.5 s for it, once" in said[0].text


def test_a_watch_held_back_by_another_stage_starts_no_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from starvecheck.core.schema.loading import LoadFigures, LoadStage

    w, calls = _watched(monkeypatch, LoadStage.TRANSFORM)
    figures = w.result().records(LoadFigures)  # type: ignore[attr-defined]
    assert calls == [] and figures.alone_ms is None


def test_a_trainers_hooks_read_the_batches_bytes_and_their_threads_run_queue() -> None:
    import threading

    from starvecheck.loop.samples import SIZED
    from starvecheck.loop.timer import Watch

    w = Watch((), show=False)
    w.begin_pass()
    for n in range(SIZED + 2):
        w.begin_step(torch.zeros(100 * (n + 1)))  # the first SIZED batches are read
        w.end_step()
    assert w.times.batch_bytes == 4 * 100 * SIZED
    assert len(w.times.compute_runq) == len(w.times.computes) == SIZED + 2
    # A hook on another thread than the first hook's: that step's run queue not read.
    w.begin_step()
    other = threading.Thread(target=w.end_step)
    other.start()
    other.join()
    assert len(w.times.compute_runq) == len(w.times.computes) and w.times.compute_runq[-1] == 0.0
    w.release_loader()  # the run queue's file closed with the training
    assert w._hook_runq is None
