"""attach's own cost (stages/attach/budget.py, spy.py): the rate chosen from the threads
to sample and from py-spy's measured CPU, what py-spy printed about samples dropped or
late, its failures in one line of words, and which children are DataLoader workers.
Pure functions fed figures and text; nothing timed."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from starvecheck.probe.sysroot import SysRoot
from starvecheck.stages.attach import budget, spy

# --- the rate ---------------------------------------------------------------------------


def test_a_light_process_keeps_the_rate_asked_for_on_a_big_machine() -> None:
    # 64 CPUs: a budget of 0.64 CPUs; 10 threads at 50/s cost 0.1.
    assert budget.choose_rate(50, 10, budget.budget_cpus(64)) == 50


def test_cpus_the_machine_left_idle_raise_the_budget_to_half_of_them() -> None:
    # 2 CPUs, 1.1 of them busy before sampling: 0.9 idle; a quarter of it, up to 5% of
    # the CPUs (0.1), for py-spy.
    idle = budget.idle_cpus(busy_s=0.55, seconds=0.5, cpus=2)
    assert idle == pytest.approx(0.9)
    assert budget.budget_cpus(2, idle) == pytest.approx(0.1)
    assert budget.budget_cpus(8, 0.2) == pytest.approx(0.08)  # 1% of 8 is less than 0.05
    # 10 threads at 50/s cost 0.1 CPUs: within it, where 1% (0.02) would allow 10/s.
    assert budget.choose_rate(50, 10, budget.budget_cpus(2, idle)) == 50
    assert budget.choose_rate(50, 10, budget.budget_cpus(2)) == 10


def test_idle_cpus_raise_the_budget_of_a_light_job_only() -> None:
    # 2 CPUs, 0.9 idle: a quarter of it, capped at 5% of the CPUs (0.1)
    assert budget.sampling_budget(2, 0.9, threads=10) == pytest.approx(0.1)
    # 3,000 threads: 1 a second costs 0.6 CPUs, past the 1% share: the 1% stays
    assert budget.sampling_budget(2, 0.9, threads=3000) == pytest.approx(0.02)


def test_a_machine_with_no_idle_cpu_keeps_the_one_percent_share() -> None:
    assert budget.idle_cpus(busy_s=1.2, seconds=0.5, cpus=2) == 0.0
    assert budget.budget_cpus(2, 0.0) == pytest.approx(0.02)
    assert budget.budget_cpus(2, None) == pytest.approx(0.02)
    assert budget.budget_cpus(2, float("nan")) == pytest.approx(0.02)
    # idle never counts past the effective CPUs (a quota smaller than the machine)
    assert budget.budget_cpus(1, 8.0) == pytest.approx(0.05)
    assert budget.idle_cpus(0.0, 0.0, 2) is None


def test_more_threads_lower_the_rate_to_fit_the_budget() -> None:
    cpus = budget.budget_cpus(2)  # 0.02 CPUs
    rates = [budget.choose_rate(50, n, cpus) for n in (1, 10, 200, 3000)]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] == 50  # 1 thread at 50/s: 0.01 CPUs
    assert rates[1] == 10  # 10 threads x 10/s x 200 us = 0.02
    for n, rate in zip((1, 10, 200, 3000), rates, strict=True):
        assert rate == 1 or rate * n * budget.COST_PER_THREAD_S <= cpus + 1e-12


def test_the_lowest_rate_is_one_a_second_and_says_it_is_over_budget() -> None:
    cpus = budget.budget_cpus(2)
    assert budget.choose_rate(50, 3000, cpus) == 1
    assert budget.over_budget(1, 3000, cpus)
    assert not budget.over_budget(10, 10, cpus)


def test_a_rate_is_never_above_what_was_asked() -> None:
    assert budget.choose_rate(5, 1, budget.budget_cpus(128)) == 5


@given(
    st.integers(-5, 500),
    st.integers(-5, 100_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1, allow_nan=False),
)
@example(0, 0, 1.797693134862316e299, 0.0)  # budget / cost: inf
def test_the_rate_is_a_whole_rate_whatever_it_is_fed(
    requested: int, threads: int, cpus: float, cost: float
) -> None:
    rate = budget.choose_rate(requested, threads, cpus, cost)
    assert isinstance(rate, int) and 1 <= rate <= max(1, requested)


def test_py_spy_over_its_budget_is_restarted_at_the_rate_that_fits() -> None:
    # At 20/s it took 0.1 CPUs: 5 mCPU a sample-second; 0.02 CPUs allow 4/s.
    assert budget.refit_rate(20, 0.1, 0.02) == 4
    assert budget.refit_rate(20, 0.021, 0.02) is None  # within the margin: kept
    assert budget.refit_rate(1, 0.5, 0.02) is None  # nothing lower to go to
    assert budget.refit_rate(3, 10.0, 0.02) == 1


@given(st.integers(-3, 300), st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_a_refit_is_lower_or_none(rate: int, used: float, cpus: float) -> None:
    got = budget.refit_rate(rate, used, cpus)
    assert got is None or 1 <= got < rate


def test_py_spy_far_under_its_budget_is_restarted_faster_where_that_gives_more() -> None:
    # 2 py-spys at 5/s took 0.01 CPU seconds over 1 s: with CPU_SLACK_S each counted
    # against them, 2.2 mCPU s a sample; 80% of 0.64 CPUs allows 232/s, at most the 50 asked.
    assert budget.raise_rate(5, 50, 0.01, 1.0, 2, 0.64, 8.5, 10.0) == 50
    assert budget.raise_rate(50, 50, 0.01, 1.0, 2, 0.64, 8.5, 10.0) is None  # as asked
    # 0.3 s left: restarting would give fewer samples than staying
    assert budget.raise_rate(5, 50, 0.01, 1.0, 2, 0.64, 0.5, 10.0) is None
    # 32/s to 50/s over the 8.5 s left, against 32/s over 10 s: not worth a restart
    assert budget.raise_rate(32, 50, 0.002, 1.0, 2, 0.64, 8.5, 10.0) is None
    # at 2/s it took 0.018 CPU s in a second, 90% of 0.02 CPUs: no room
    assert budget.raise_rate(2, 50, 0.018, 1.0, 1, 0.02, 8.5, 10.0) is None
    # 1 py-spy at 1/s on 2 CPUs took 0.004 CPU s in 2 s (2 ms a sample, 128 threads
    # of which one Python's): 80% of 0.02 over 2.25 ms a sample, 7/s, fits, and gives
    # more in --quick's 2.7 s left
    assert budget.raise_rate(1, 50, 0.004, 2.0, 1, 0.02, 2.7, 5.0) == 7


@example(209, 210, 0.0, 8.6e305, 0, 1.0, 0.0, 0.0)  # the cost a sample underflows to 0
@example(1, 2, 0.0, 1.0, 0, 1.12e305, 0.0, 0.0)  # the room overflows to infinity
@given(
    st.integers(-3, 300),
    st.integers(-3, 300),
    st.floats(allow_nan=True),
    st.floats(allow_nan=True),
    st.integers(-2, 20),
    st.floats(allow_nan=True),
    st.floats(allow_nan=True),
    st.floats(allow_nan=True),
)
def test_a_raise_is_higher_within_what_was_asked_and_the_budget_or_none(
    rate: int, asked: int, used: float, span: float, procs: int, cpus: float, left: float,
    window: float,
) -> None:  # fmt: skip
    got = budget.raise_rate(rate, asked, used, span, procs, cpus, left, window)
    assert got is None or rate < got <= asked
    if got is not None:
        cost = (max(0.0, used) + budget.CPU_SLACK_S * max(1, procs)) / (span * rate)
        assert got * cost <= cpus * budget.RAISE_MARGIN * (1 + 1e-9)


def test_too_few_samples_name_the_duration_that_gives_enough() -> None:
    assert budget.duration_for(2) == 25
    assert budget.samples_expected(2, 25) >= budget.MIN_SAMPLES
    assert budget.samples_expected(2, 24) < budget.MIN_SAMPLES


# --- what py-spy printed ----------------------------------------------------------------

PRINTED = """py-spy> Sampling process 50 times a second for 10 seconds. Press Control-C to exit.

py-spy> 1.52s behind in sampling, results may be inaccurate. Try reducing the sampling rate
py-spy> 110.40s behind in sampling, results may be inaccurate. Try reducing the sampling rate
py-spy> 650.00ms behind in sampling, results may be inaccurate. Try reducing the sampling rate

py-spy> Stopped sampling because process exited
py-spy> Wrote raw flamegraph data to '/tmp/x/spy.raw'. Samples: 396 Errors: 7
py-spy> You can use the flamegraph.pl script from https://github.com/brendangregg/fla
"""


def test_samples_errors_and_how_far_behind_are_read() -> None:
    p = spy.parse_progress(PRINTED)
    assert (p.samples, p.errors) == (396, 7)
    assert p.behind_s == pytest.approx(110.40)


def test_a_run_that_kept_up_says_nothing_behind() -> None:
    p = spy.parse_progress("py-spy> Wrote raw flamegraph data to 'r'. Samples: 99 Errors: 0\n")
    assert (p.samples, p.errors, p.behind_s) == (99, 0, None)
    assert spy.parse_progress("") == spy.Progress()


@given(st.text(max_size=2000))
def test_garbage_printed_is_read_without_raising(text: str) -> None:
    p = spy.parse_progress(text)
    assert p.errors is None or p.errors >= 0
    assert p.behind_s is None or p.behind_s >= 0


@given(st.text(max_size=2000), st.integers(-300, 300) | st.none())
def test_any_failure_is_one_line(err: str, status: int | None) -> None:
    line = spy.error_line(err, status)
    assert line and "\n" not in line and len(line) <= 300


def test_a_failure_is_py_spys_error_line_never_a_backtrace_line() -> None:
    err = (
        "Error: Failed to find python version from target process\n"
        "Reason: No such file or directory (os error 2)\n"
        "stack backtrace:\n"
        "   6: py_spy::main\n"
        "   7: main\n"
    )
    line = spy.error_line(err, 1)
    assert line.startswith("Failed to find python version")
    assert "No such file or directory" in line
    assert "7: main" not in line
    assert spy.error_line("   7: main\n  at src/main.rs:3\n", 101) == (
        "py-spy failed with no message (exit status 101)"
    )


# --- samples of one process, without --subprocesses ----------------------------------------

RAW = (
    "thread (5500): MainThread;<module> (/x/train.py:3) 99\n"
    "thread (5503): Thread-2 (wait);Event.wait (/usr/lib/threading.py:629) 99\n"
)


def test_samples_without_a_process_part_belong_to_the_process_sampled() -> None:
    s = spy.parse_raw(RAW, 5500)
    assert set(s.by_thread) == {(5500, 5500), (5500, 5503)}
    assert s.count((5500, 5500)) == 99 and s.samples == 198
    assert spy.parse_raw(RAW).samples == 0  # with --subprocesses every line names one


# --- which children are DataLoader workers ----------------------------------------------------

RANK = "python\0train.py\0--lr\x000.1\0"
EXE = "/usr/bin/python3.11"


@pytest.mark.parametrize(
    ("cmdline", "exe", "worker"),
    [
        (RANK, EXE, True),  # a fork of the rank (fork start method)
        (RANK, "/usr/bin/other", False),  # same words, another program
        ("python\0-c\0from multiprocessing.spawn import spawn_main; spawn_main()\0", EXE, True),
        ("python\0-c\0from multiprocessing.forkserver import main; main(3)\0", EXE, True),
        ("python\0-c\0from multiprocessing.resource_tracker import main;main(9)\0", EXE, False),
        ("python\0-m\0torch._inductor.compile_worker\0", EXE, False),
        ("/bin/sh\0-c\0nvidia-smi\0", "/bin/dash", False),
        (None, None, False),  # gone, or not readable
    ],
)
def test_a_worker_is_a_fork_of_the_rank_or_a_spawned_child(
    cmdline: str | None, exe: str | None, worker: bool
) -> None:
    assert budget.is_worker(cmdline, exe, RANK, EXE) is worker


def _proc(root: Path, pid: int, comm: str, cmdline: str, ppid: int, exe: str = EXE) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cmdline").write_text(cmdline)
    # A whole line, as the kernel writes it: the one parser (probe/process.py) reads it.
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0 -1 0 0 0 0 0 3 1 0 0 20 0 1 0 55\n")
    (d / "exe").symlink_to(exe)


def test_workers_named_by_torch_are_the_workers_not_the_jobs_other_forks(tmp_path: Path) -> None:
    root = SysRoot(tmp_path)
    _proc(tmp_path, 100, "python", RANK, 1)
    for pid in range(101, 105):  # a pool of the job's own: forks, not named
        _proc(tmp_path, pid, "python", RANK, 100)
    _proc(tmp_path, 110, "pt_data_worker", RANK, 100)
    _proc(tmp_path, 111, "pt_data_worker", RANK, 100)
    kids = [*range(101, 105), 110, 111]
    assert budget.workers_of(100, kids, root=root) == [110, 111]
    # Once told by name, a later unnamed fork is not a worker.
    assert budget.workers_of(100, [101], named_only=True, root=root) == []


def test_without_names_forks_are_taken_newest_first_and_not_the_forkserver(
    tmp_path: Path,
) -> None:
    root = SysRoot(tmp_path)
    server = "python\0-c\0from multiprocessing.forkserver import main; main(3)\0"
    _proc(tmp_path, 100, "python", RANK, 1)
    _proc(tmp_path, 101, "python", RANK, 100)
    _proc(tmp_path, 102, "python", server, 100)
    _proc(tmp_path, 103, "python", server, 102)
    _proc(tmp_path, 104, "sh", "/bin/sh\0-c\0true\0", 100, exe="/bin/dash")
    assert budget.workers_of(100, [101, 102, 103, 104], root=root) == [103, 101]


def test_where_even_one_a_second_is_over_budget_only_the_seconds_that_fit_are_sampled() -> None:
    cpus = budget.budget_cpus(2)  # 0.02 CPUs: over 10 s, 0.2 CPU seconds
    assert budget.sample_seconds(10, 10, cpus, 10.0) == 10.0  # fits: the whole window
    # 300 threads: 0.06 CPU s a sample; 3 samples fit in 10 s.
    assert budget.sample_seconds(1, 300, cpus, 10.0) == 3.0
    # 3,000 threads: 0.6 CPU s a sample; none fits in 10 s, and 50 need 1,500 s.
    assert budget.sample_seconds(1, 3000, cpus, 10.0) == 0.0
    assert budget.duration_within_budget(3000 * budget.COST_PER_THREAD_S, cpus) == (
        pytest.approx(1500)
    )


@given(
    st.integers(1, 200),
    st.integers(0, 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, 600),
)
def test_the_seconds_sampled_are_within_the_window(
    rate: int, threads: int, cpus: float, seconds: float
) -> None:
    got = budget.sample_seconds(rate, threads, cpus, seconds)
    assert 0.0 <= got <= seconds


# --- one py-spy, faked: what it printed and wrote, its failure, its files -------------------

FAKE = """#!/bin/sh
# the --output path is the argument after --output
out=""
while [ $# -gt 0 ]; do [ "$1" = "--output" ] && out="$2"; shift; done
{MODE}
"""


def _fake(tmp_path: Path, mode: str) -> str:
    path = tmp_path / "py-spy"
    path.write_text(FAKE.replace("{MODE}", mode))
    path.chmod(0o755)
    return str(path)


def _ended(rec: spy.Recorder) -> None:
    import time

    for _ in range(600):  # the fake's own few lines of shell; a deadline, not a timing
        if rec.done():
            return
        time.sleep(0.05)
    raise AssertionError("the fake py-spy never ended")


def test_a_recorders_samples_errors_and_files(tmp_path: Path) -> None:
    from starvecheck.scratch.directory import Scratch

    binary = _fake(
        tmp_path,
        "printf 'thread (77): MainThread;main (/x/t.py:1) 40\\n' > \"$out\"\n"
        'echo "py-spy> 2.50s behind in sampling, results may be inaccurate"\n'
        "echo \"py-spy> Wrote raw flamegraph data to '$out'. Samples: 40 Errors: 3\"\n"
        'echo "backtraces=$RUST_BACKTRACE"',
    )
    work = tmp_path / "tmp"
    work.mkdir()
    with Scratch(str(work), prefix="starvecheck-attach-") as scratch:
        rec = spy.Recorder(77, 2, 50, binary, scratch)
        _ended(rec)
        stacks = rec.stacks()
        assert stacks.count((77, 77)) == 40 and stacks.errors == 3
        assert spy.parse_progress(rec.printed()).behind_s == pytest.approx(2.5)
        assert "backtraces=0" in rec.printed()  # no Rust backtrace to show for a failure
        assert rec.cpu_s is not None and rec.proc.returncode == 0
    assert list(work.iterdir()) == []  # its files went with the directory


def test_a_recorders_failure_is_its_error_line(tmp_path: Path) -> None:
    from starvecheck.scratch.directory import Scratch

    binary = _fake(
        tmp_path,
        "echo 'Error: Failed to find python version from target process' >&2\n"
        "echo '   7: main' >&2\nexit 1",
    )
    with Scratch(str(tmp_path), prefix="starvecheck-attach-") as scratch:
        rec = spy.Recorder(77, 2, 50, binary, scratch)
        _ended(rec)
        with pytest.raises(RuntimeError, match=r"^Failed to find python version"):
            rec.stacks()


def test_a_py_spy_that_cannot_start_leaves_nothing_running(tmp_path: Path) -> None:
    import os

    from starvecheck.scratch.directory import Scratch
    from starvecheck.stages.attach.sampling import Sampling

    with Scratch(str(tmp_path), prefix="starvecheck-attach-") as scratch, pytest.raises(OSError):
        Sampling({os.getpid(): []}, 2.0, 50, str(tmp_path / "no-py-spy"), scratch, 2)


# --- the py-spys of one attach, with fake py-spys and a fake clock ----------------------------


class FakeRecorder:
    """A py-spy that runs until killed or stopped, its CPU growing at `cpus` a second of
    the fake clock."""

    started: ClassVar[list[FakeRecorder]] = []

    def __init__(self, pid: int, seconds: float, rate: int, binary: str, scratch: object):
        self.pid, self.seconds, self.rate = pid, seconds, rate
        self.at, self.ended = CLOCK[0], False
        FakeRecorder.started.append(self)

    def cpu_now(self) -> float:
        return (CLOCK[0] - self.at) * CPUS_PER_RECORDER[0]

    def done(self) -> bool:
        return self.ended

    def kill(self) -> None:
        self.ended = True

    stop = interrupt = kill


CLOCK = [0.0]
CPUS_PER_RECORDER = [0.0]


@pytest.fixture
def fake_spies(monkeypatch: pytest.MonkeyPatch) -> None:
    from starvecheck.stages.attach import sampling

    CLOCK[0], CPUS_PER_RECORDER[0] = 0.0, 0.0
    FakeRecorder.started = []
    monkeypatch.setattr(sampling.spy, "Recorder", FakeRecorder)
    monkeypatch.setattr(sampling.clocks, "monotonic", lambda: CLOCK[0])
    monkeypatch.setattr(sampling.budget, "threads_of", lambda pid, root=None: 1)
    monkeypatch.setattr(sampling.budget, "workers_of", lambda rank, kids, named=False: kids)
    monkeypatch.setattr(sampling.budget, "is_named_worker", lambda pid, root=None: True)


def test_at_most_eight_workers_a_rank_are_sampled_and_the_rest_counted(fake_spies: None) -> None:
    from starvecheck.stages.attach.sampling import Sampling

    s = Sampling({10: list(range(100, 112))}, 10.0, 50, "py-spy", object(), 64)  # type: ignore[arg-type]
    rank = s.samplers[10]
    assert rank.rank.pid == 10 and len(rank.workers) == budget.MAX_WORKERS
    assert rank.skipped == set(range(100 + budget.MAX_WORKERS, 112))


def test_a_py_spy_over_its_budget_is_restarted_once_at_the_rate_that_fits(
    fake_spies: None,
) -> None:
    from starvecheck.stages.attach.sampling import Sampling

    # 2 CPUs: 0.02 CPUs of budget; 2 processes of 1 thread: 50/s is chosen.
    s = Sampling({10: [11]}, 10.0, 50, "py-spy", object(), 2)  # type: ignore[arg-type]
    assert s.rate == 50
    first = list(FakeRecorder.started)
    CPUS_PER_RECORDER[0] = 0.05  # 0.1 CPUs for the two: 5x the budget
    for t in (0.5, 1.0, 1.6, 2.0, 3.0):
        CLOCK[0] = t
        s.tick({10: [11]})
    assert s.refit and s.rate == 10  # 0.1 CPUs at 50/s: 0.02 allow 10/s
    assert all(r.ended for r in first)  # the first ones ended, their samples dropped
    assert {r.rate for r in s.samplers[10].all()} == {10}
    assert len(FakeRecorder.started) == 4  # restarted once, not again
    cost = s.cost()
    assert cost.lowered is not None and "at 50/s" in cost.lowered


def test_a_py_spy_within_its_budget_is_left_alone(fake_spies: None) -> None:
    from starvecheck.stages.attach.sampling import Sampling

    s = Sampling({10: []}, 10.0, 50, "py-spy", object(), 2)  # type: ignore[arg-type]
    CPUS_PER_RECORDER[0] = 0.01
    for t in (0.5, 1.6, 3.0):
        CLOCK[0] = t
        s.tick({10: []})
    assert not s.refit and s.rate == 50 and len(FakeRecorder.started) == 1
    assert s.cost().lowered is None


def test_thousands_of_threads_on_a_small_machine_start_no_py_spy(
    fake_spies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starvecheck.stages.attach import sampling

    monkeypatch.setattr(sampling.budget, "threads_of", lambda pid, root=None: 3000)
    s = sampling.Sampling({10: []}, 10.0, 50, "py-spy", object(), 2)  # type: ignore[arg-type]
    assert s.samplers == {} and FakeRecorder.started == [] and s.sample_s == 0.0


def test_at_the_lowest_rate_and_still_over_budget_sampling_stops_when_the_budget_is_spent(
    fake_spies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starvecheck.stages.attach import sampling

    # 150 threads on 2 CPUs: 1/s, which half the estimate says fits; measured (over 2 s,
    # 2 samples at 1/s, from 0.5 s), it does not: 0.05 CPUs. At 4 s it has taken 0.2 CPU
    # seconds, the whole window's budget: it stops there.
    monkeypatch.setattr(sampling.budget, "threads_of", lambda pid, root=None: 150)
    s = sampling.Sampling({10: []}, 10.0, 50, "py-spy", object(), 2)  # type: ignore[arg-type]
    assert s.rate == 1 and s.sample_s == 10.0
    CPUS_PER_RECORDER[0] = 0.05
    for t in (0.5, 1.6, 2.0, 3.0):
        CLOCK[0] = t
        s.tick({10: []})
    assert not FakeRecorder.started[0].ended  # 4 s fit: not yet
    CLOCK[0] = 4.0
    s.tick({10: []})
    assert FakeRecorder.started[0].ended and s.sample_s == 4.0
    cost = s.cost()
    assert cost.measured and cost.per_sample_cpu_s == pytest.approx(0.05)


def test_a_py_spy_far_under_its_estimate_is_restarted_faster_once_and_checked_again(
    fake_spies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starvecheck.stages.attach import sampling

    # 500 threads each, 64 CPUs: 0.64 CPUs of budget, 0.2 CPU s a sample estimated:
    # 3/s. Measured, 0.001 CPUs each (their threads were not Python's): 50/s fits.
    monkeypatch.setattr(sampling.budget, "threads_of", lambda pid, root=None: 500)
    s = sampling.Sampling({10: [11]}, 10.0, 50, "py-spy", object(), 64)  # type: ignore[arg-type]
    assert s.rate == 3
    first = list(FakeRecorder.started)
    CPUS_PER_RECORDER[0] = 0.001
    for t in (0.3, 1.3):
        CLOCK[0] = t
        s.tick({10: [11]})
    assert s.raised and not s.refit and s.rate == 50
    assert all(r.ended for r in first) and {r.rate for r in s.samplers[10].all()} == {50}
    # checked again over the next second: within the budget, kept; never raised twice
    for t in (1.6, 2.6, 4.0):
        CLOCK[0] = t
        s.tick({10: [11]})
    assert s.rate == 50 and len(FakeRecorder.started) == 4
    cost = s.cost()
    assert cost.raised and cost.first_rate == 3 and cost.rate == 50 and cost.lowered is None


def test_a_raised_rate_over_its_budget_after_all_is_lowered(
    fake_spies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from starvecheck.stages.attach import sampling

    monkeypatch.setattr(sampling.budget, "threads_of", lambda pid, root=None: 500)
    s = sampling.Sampling({10: [11]}, 10.0, 50, "py-spy", object(), 64)  # type: ignore[arg-type]
    CPUS_PER_RECORDER[0] = 0.001
    for t in (0.3, 1.3):
        CLOCK[0] = t
        s.tick({10: [11]})
    assert s.rate == 50
    CPUS_PER_RECORDER[0] = 0.8  # 1.6 CPUs for the two at 50/s: 0.64 allow 20/s
    for t in (1.6, 2.6, 4.0):
        CLOCK[0] = t
        s.tick({10: [11]})
    assert s.refit and s.rate == 20 and len(FakeRecorder.started) == 6
    assert "at 50/s" in (s.cost().lowered or "")
