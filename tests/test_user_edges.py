"""User code at the edges of a `loader --factory` run cannot break its contract (issue
58, item 4): what the pipeline prints, from any thread or worker at any time, never
reaches a report on stdout (core/streams.py); a pipeline that freezes the clocks
(by hand or with freezegun) cannot make the run endless (core/clocks.py); os._exit
from a thread of the pipeline's at any point of the run is one line and exit 2.

Each case is a real factory file and the real command, as a program."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

from tests.test_factory_user import error_line, factory, run_cli

QUICK = ("--quick", "--budget", "0.6", "--workers", "0,2")
SRC = Path(__file__).resolve().parents[1] / "src" / "starvecheck"

NOISY = """
    import ctypes

    class Loud(Small):
        def __getitem__(self, i):
            print("noise: sample", i)  # the main process's and each worker's
            os.write(1, b"noise: fd 1\\n")  # as a C library's printf would
            return super().__getitem__(i)

    def _chatter():
        while True:
            print("noise: thread", flush=True)
            time.sleep(0.01)

    def loud():
        print("noise: factory")
        threading.Thread(target=_chatter, daemon=True).start()
        return DataLoader(Loud(), batch_size=4)
    """


def _noise_free(text: str) -> None:
    assert "noise:" not in text, [x for x in text.splitlines() if "noise:" in x][:3]


@pytest.mark.slow
def test_prints_from_samples_threads_and_workers_never_reach_json_on_stdout(
    tmp_path: Path,
) -> None:
    """--json -: stdout is one JSON document, whatever the pipeline printed and kept
    printing from its daemon thread while the report was written; the prints go to
    stderr. Before core/streams.py, only the import and FUNC's call were redirected."""
    pipe = factory(tmp_path, NOISY)
    r = run_cli("--factory", f"{pipe}:loud", *QUICK, "--json", "-")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)  # one document, nothing before or after it
    assert report["command"] == "loader"
    for piece in ("noise: sample", "noise: fd 1", "noise: thread", "noise: factory"):
        assert piece in r.stderr, piece


@pytest.mark.slow
@pytest.mark.parametrize("form", ["markdown", "dev-stdout", "terminal"])
def test_prints_never_reach_the_other_reports_on_stdout(tmp_path: Path, form: str) -> None:
    """--markdown -, --json /dev/stdout (a link to fd 1, which the run moved to stderr:
    the report still reaches the real stdout) and the terminal report."""
    pipe = factory(tmp_path, NOISY)
    extra = {"markdown": ["--markdown", "-"], "dev-stdout": ["--json", "/dev/stdout"]}
    r = run_cli("--factory", f"{pipe}:loud", *QUICK, *extra.get(form, []))
    assert r.returncode == 0, r.stderr[-2000:]
    _noise_free(r.stdout)
    if form == "dev-stdout":
        report, end = json.JSONDecoder().raw_decode(r.stdout)
        assert report["command"] == "loader"
        assert "starvecheck loader" in r.stdout[end:]  # then the terminal report
    else:
        assert "loader" in r.stdout
    assert "noise: thread" in r.stderr


FROZEN = """
    def by_hand():
        time.perf_counter = lambda: 1.0
        time.monotonic = lambda: 1.0
        time.time = lambda: 1.0
        time.sleep = lambda seconds: None
        return DataLoader(Small(), batch_size=4)

    def with_freezegun():
        import freezegun

        freezegun.freeze_time("2020-01-01").start()  # never stopped
        return DataLoader(Small(), batch_size=4)
    """


@pytest.mark.slow
@pytest.mark.parametrize("how", ["by_hand", "with_freezegun"])
def test_a_pipeline_that_freezes_the_clocks_cannot_make_the_run_endless(
    tmp_path: Path, how: str
) -> None:
    """Every window, budget and time limit is read from the clocks bound at import: the
    run ends, measured, in about the time it takes with the clocks running (before,
    it ran until the test's timeout)."""
    if how == "with_freezegun":
        import freezegun  # noqa: F401  # the test extra installs it: its absence is a failure
    pipe = factory(tmp_path, FROZEN)
    try:
        r = run_cli("--factory", f"{pipe}:{how}", *QUICK, "--json", "-", timeout=150)
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not end with the clocks frozen")
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert not report["created_at"].startswith("2020"), report["created_at"]
    rates = [
        m["value"]
        for stage in report["stages"]
        for m in stage["metrics"]
        if m["name"].endswith(".samples_per_s")
    ]
    assert rates and all(v > 0 for v in rates), rates


EXITS = """
    def _after(path, status=0):
        def wait():
            while not os.path.exists(path):
                time.sleep(0.001)
            os._exit(status)
        threading.Thread(target=wait, daemon=True).start()

    def once_written():
        _after(os.environ["EXIT_WHEN"])  # the report's file exists: the run is ending
        return DataLoader(Small(), batch_size=4)

    class Marks(Small):
        def __getitem__(self, i):
            if i == 20:
                open(os.environ["EXIT_WHEN"], "w").close()
            return super().__getitem__(i)

    def mid_run():
        _after(os.environ["EXIT_WHEN"])  # the 21st sample was read
        return DataLoader(Marks(), batch_size=4)
    """


@pytest.mark.slow
@pytest.mark.parametrize("when", ["once_written", "mid_run"])
def test_os_exit_from_a_thread_at_any_point_is_exit_2(tmp_path: Path, when: str) -> None:
    """A thread of the pipeline's calls os._exit(0) once the report's file was written
    (the run's last moments) or in the middle of the measurement: one line, exit 2."""
    pipe = factory(tmp_path, EXITS)
    mark = tmp_path / ("report.json" if when == "once_written" else "mark")
    r = run_cli(
        "--factory", f"{pipe}:{when}", *QUICK, "--json", str(tmp_path / "report.json"),
        env={"EXIT_WHEN": str(mark)},
    )  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert "called os._exit(0)" in error_line(r)


# --- the source: starvecheck reads time through core/clocks.py only -------------------

_FNS = "perf_counter_ns|perf_counter|monotonic|time|sleep|process_time|thread_time|clock_gettime"
_IN_FSTRING = re.compile(rf"\{{[^}}]*(?<![\w.])time\.({_FNS})\b")


def _time_reads(path: Path) -> list[str]:
    """`time.<clock>` read as code (a call or a reference, f-strings' fields included),
    not in comments or docstrings."""
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, t in enumerate(tokens[:-2]):
        after = tokens[i + 1 : i + 3]
        if (
            t.type == tokenize.NAME
            and t.string == "time"
            and after[0].string == "."
            and re.fullmatch(_FNS, after[1].string)
            and (i == 0 or tokens[i - 1].string != ".")
        ):
            found.append(f"{path.name}:{t.start[0]}")
        if t.type == tokenize.STRING and t.string.lstrip("rRbB").startswith(("f", "F")):
            found += [f"{path.name}:{t.start[0]}" for _ in _IN_FSTRING.finditer(t.string)]
    return found


def test_starvecheck_reads_the_clocks_only_through_core_clocks() -> None:
    reads = [r for p in sorted(SRC.rglob("*.py")) if p.name != "clocks.py" for r in _time_reads(p)]
    assert reads == []


def test_the_source_check_finds_a_read_of_time(tmp_path: Path) -> None:
    """The check above can fail: a call, a reference and an f-string field are found; a
    docstring, a comment and time.strftime are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""time.perf_counter() in a docstring."""\n'
        "import time\n"
        "a = time.monotonic()  # time.sleep(1) in a comment\n"
        "b = time.perf_counter\n"
        "c = f'{time.time() - a:.1f}'\n"
        "d = time.strftime('%Y')\n"
    )
    assert _time_reads(probe) == ["probe.py:3", "probe.py:4", "probe.py:5"]


def test_the_clocks_are_the_real_ones_whatever_time_holds_now(monkeypatch) -> None:
    from starvecheck.core import clocks

    monkeypatch.setattr("time.perf_counter", lambda: 1.0)
    monkeypatch.setattr("time.monotonic", lambda: 1.0)
    a = clocks.perf_counter(), clocks.monotonic()
    clocks.sleep(0.01)
    b = clocks.perf_counter(), clocks.monotonic()
    assert b[0] > a[0] and b[1] > a[1]
