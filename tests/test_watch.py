"""`starvecheck.watch`: a loop with a known artificial wait, timed exactly with a fake
clock and roughly with a real one; early exits, printing, and what it never changes."""

from __future__ import annotations

import io
import sys
import time

import pytest

import starvecheck
from starvecheck.loop.timer import Watch


class Clock:
    """A clock that moves only when told: the source's wait and the loop's compute."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def source(clock: Clock, waits_ms: list[float]):
    """Yields one item per wait, after advancing the clock by it."""
    for i, w in enumerate(waits_ms):
        clock.t += w / 1e3
        yield i


def watched(waits_ms, computes_ms, **kw) -> Watch:
    clock = Clock()
    w = Watch(source(clock, waits_ms), clock=clock, show=False, **kw)
    for i, _ in enumerate(w):
        clock.t += computes_ms[i] / 1e3
    return w


def values(w: Watch) -> dict:
    return {m.name: m for m in w.times.metrics()}


def test_known_wait_gives_the_known_share():
    # First step 500 ms of start-up, then 20 ms wait + 10 ms compute, ten times.
    w = watched([500] + [20] * 10, [10] * 11)
    v = values(w)
    assert v["steps"].value == 11
    assert v["step_ms"].n == 10 and v["step_ms"].median == pytest.approx(30)
    assert v["data_wait_ms"].median == pytest.approx(20)
    assert v["compute_ms"].median == pytest.approx(10)
    assert v["data_wait_share"].value == pytest.approx(2 / 3)
    assert v["first_step_ms"].value == pytest.approx(510)
    assert v["first_wait_ms"].value == pytest.approx(500)
    ids = {f.id: f for f in w.result().findings}
    assert ids["profile.data-bound"].severity.value == "critical"
    assert "10 of 10 steps" in ids["profile.data-bound"].evidence
    assert "(a mean 20.0 ms of a mean 30.0 ms step)" in ids["profile.data-bound"].evidence
    assert ids["profile.first-step-stall"].severity.value == "info"


def test_share_weighs_long_steps_more():
    # waits 0 and 30 ms, computes 10 and 10 (after a first step): (0 + 30) / (10 + 40).
    w = watched([1, 0, 30], [1, 10, 10])
    assert values(w)["data_wait_share"].value == pytest.approx(30 / 50)


def test_a_fed_loop_passes():
    w = watched([5] + [0.1] * 20, [10] * 21)
    (f,) = w.result().findings
    assert f.id == "profile.data-bound" and f.severity.value == "ok"
    assert w.report().checklist == ()


def test_break_ends_the_last_step_where_the_loop_left():
    clock = Clock()
    w = Watch(source(clock, [10] * 100), clock=clock, show=False)
    for i, _ in enumerate(w):
        clock.t += 0.005
        if i == 4:
            break
    assert len(w.times.waits) == len(w.times.computes) == 5
    assert values(w)["compute_ms"].median == pytest.approx(5)


def test_an_exception_in_the_loop_passes_through_and_keeps_the_figures():
    clock = Clock()
    w = Watch(source(clock, [10] * 10), clock=clock, show=False)
    with pytest.raises(ZeroDivisionError):
        for i, _ in enumerate(w):
            clock.t += 0.002
            if i == 3:
                1 / 0  # noqa: B018
    assert len(w.times.computes) == 4


def test_an_empty_iterable_measures_nothing_and_says_so():
    out = io.StringIO()
    w = Watch([], file=out)
    assert list(w) == []
    assert out.getvalue() == ""  # nothing to report
    v = values(w)
    assert v["step_ms"].value is None and v["step_ms"].reason == "no step completed"
    assert w.result().findings == ()


def test_items_and_length_pass_through_unchanged():
    items = [object() for _ in range(7)]
    w = Watch(items, show=False)
    assert len(w) == 7
    assert list(w) == items


def test_prints_at_the_end_and_every_n_steps():
    out = io.StringIO()
    clock = Clock()
    w = Watch(source(clock, [20] * 11), clock=clock, every=4, file=out)
    for _ in w:
        clock.t += 0.01
    text = out.getvalue()
    # after steps 4 and 8, then at the end (11); never twice for the same count
    assert text.count("starvecheck watch") == 3
    assert "step (10 of 11 measured)" in text
    last = text.rsplit("Checklist", 1)[1]
    assert "\n1 critical: start with profile.data-bound" in last
    assert not any(line != line.rstrip() for line in text.splitlines())


def test_printing_is_counted_in_neither_figure():
    clock = Clock()

    class SlowFile(io.StringIO):
        def write(self, s: str) -> int:
            clock.t += 1.0  # a very slow terminal
            return super().write(s)

    w = Watch(source(clock, [20] * 8), clock=clock, every=2, file=SlowFile())
    for _ in w:
        clock.t += 0.01
    assert values(w)["step_ms"].max == pytest.approx(30)


def test_each_pass_adds_to_the_same_figures():
    clock = Clock()
    items = [1, 2, 3]

    class Epochs:
        def __iter__(self):
            return source(clock, [10] * len(items))

    w = Watch(Epochs(), clock=clock, show=False)
    for _epoch in range(2):
        for _ in w:
            clock.t += 0.01
    assert w.times.passes == 2 and values(w)["steps"].value == 6


def test_every_must_be_a_positive_count():
    with pytest.raises(ValueError, match="positive number of steps"):
        Watch([], every=0)


def test_real_loop_with_a_known_sleep():
    torch = pytest.importorskip("torch")

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 48

        def __getitem__(self, i: int):
            time.sleep(0.0025)  # 10 ms a batch of 4
            return torch.zeros(4)

    loader = torch.utils.data.DataLoader(Slow(), batch_size=4, num_workers=0)
    out = io.StringIO()
    w = starvecheck.watch(loader, file=out)
    for _ in w:
        time.sleep(0.01)  # the step: 10 ms
    v = values(w)
    assert v["steps"].value == 12
    assert 0.35 < v["data_wait_share"].value < 0.65  # 10 of 20 ms, on a busy machine
    result = w.result()
    assert result.parameters["dataloader"] == "_SingleProcessDataLoaderIter"
    bound = next(f for f in result.findings if f.id == "profile.data-bound")
    assert "num_workers=" in bound.recommendation and "starvecheck.watch" in bound.evidence
    assert "data wait" in out.getvalue()


def test_sync_without_cuda_is_a_note_not_an_error():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    w = Watch(range(3), sync=True, show=False)
    assert list(w) == [0, 1, 2]
    assert any("no CUDA device" in c for c in w.result().caveats)
    assert w.result().has_caveat("watch.sync-without-cuda")


def test_importing_starvecheck_loads_no_torch():
    code = "import sys, starvecheck; starvecheck.watch([]); print('torch' in sys.modules)"
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_figure_is_labelled_with_its_quantity_and_no_finding_before_judging():
    w = watched([500] + [20] * 9, [10] * 10)
    for m in w.times.metrics():
        assert m.labels == {"quantity": m.name}  # one of a kind, as a trace's figures
    measured = w.measured()
    assert measured.findings == () and measured.has_caveat("watch.warmup-left-out")
    d = w.report().to_dict()
    assert d["schema_version"] == 3
    assert all(m["labels"]["quantity"] for m in d["stages"][0]["metrics"])


def test_result_is_the_reports_stage():
    w = watched([500] + [20] * 9, [10] * 10)
    assert w.result() == w.report().stages[0]


def test_the_breakdown_and_its_findings_select_by_labels_not_names():
    import dataclasses

    from starvecheck.advice.judge import Results, judge
    from starvecheck.render.trace import split

    r = watched([500] + [20] * 9, [10] * 10).measured()
    renamed = dataclasses.replace(
        r, metrics=tuple(dataclasses.replace(m, name=f"figure{i}") for i, m in enumerate(r.metrics))
    )
    rows = split(r, r.metrics)[0]
    assert rows and split(renamed, renamed.metrics)[0] == rows
    assert "compute (the loop's step)" in [row[0] for row in rows]
    found = judge(Results({"watch": r})).findings
    assert found and judge(Results({"watch": renamed})).findings == found


def test_trainer_hooks_time_the_gap_between_steps_and_survive_misordering():
    clock = Clock()
    w = Watch((), clock=clock, show=False)
    w.begin_pass()
    for wait, compute, other in [(50, 5, 0), (20, 5, 100), (20, 5, 0)]:
        clock.t += wait / 1e3
        w.begin_step()
        clock.t += compute / 1e3
        w.end_step()
        clock.t += other / 1e3  # an evaluation after the step ...
        w.resume_wait()  # ... that the trainer reports: not data wait
    assert [round(x * 1e3) for x in w.times.waits] == [50, 20, 20]
    assert [round(x * 1e3) for x in w.times.computes] == [5, 5, 5]
    w.begin_step()
    w.begin_step()  # a step begun twice (hooks out of order): the first ends, nothing raises
    w.end_step()
    w.end_step()  # an end with no step open is ignored
    assert len(w.times.waits) == len(w.times.computes) == 5
    w.begin_step()
    w.end_pass()  # a step left open is dropped
    assert len(w.times.waits) == len(w.times.computes) == 5
    assert [round(x * 1e3) for x in w.times.waits] == [50, 20, 20, 0, 0]
