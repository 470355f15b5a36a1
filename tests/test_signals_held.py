"""A signal held around an import is delivered after it, whatever the dispositions at
entry (issue 48, item 4): a background job (`starvecheck ... &` from a script) starts
with SIGINT ignored, `nohup` with SIGHUP ignored; a group's SIGINT (ignored) or SIGHUP
(ignored) held first must not take the place of the SIGTERM held after it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import group_alive, source_env

# Signals held, then ignored ones and SIGTERM sent to the process itself inside.
HELD = """
import os, signal, sys
from starvecheck.core.signals import Terminated, signals_held, signals_raise
sent = [getattr(signal, name) for name in sys.argv[1:]]
try:
    with signals_raise():
        with signals_held():
            for s in sent:
                os.kill(os.getpid(), s)
        print("not delivered")
except Terminated as e:
    print("delivered", e.signum)
except KeyboardInterrupt:
    print("delivered", int(signal.SIGINT))
"""


def _ignoring(*names: str):
    def preexec() -> None:
        for name in names:
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    return preexec


def _env(tmp: Path) -> dict[str, str]:
    return source_env(TMPDIR=str(tmp), STARVECHECK_DEBUG="")


@pytest.mark.parametrize(
    "ignored, sent, delivered",
    [
        (("SIGINT",), ("SIGINT", "SIGTERM"), signal.SIGTERM),
        (("SIGINT",), ("SIGTERM", "SIGINT"), signal.SIGTERM),
        (("SIGINT",), ("SIGTERM",), signal.SIGTERM),
        (("SIGHUP",), ("SIGHUP", "SIGTERM"), signal.SIGTERM),
        (("SIGINT", "SIGHUP"), ("SIGHUP", "SIGINT", "SIGTERM"), signal.SIGTERM),
        ((), ("SIGINT", "SIGTERM"), signal.SIGINT),
    ],
)
def test_a_held_signal_is_delivered_whatever_was_ignored_at_entry(
    tmp_path: Path, ignored, sent, delivered
) -> None:
    p = subprocess.run(
        [sys.executable, "-c", HELD, *sent],
        env=_env(tmp_path),
        preexec_fn=_ignoring(*ignored),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.strip() == f"delivered {int(delivered)}", (p.stdout, p.stderr)


def test_ignored_signals_stay_ignored_when_held(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-c", HELD, "SIGINT", "SIGHUP"],
        env=_env(tmp_path),
        preexec_fn=_ignoring("SIGINT", "SIGHUP"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.stdout.strip() == "not delivered", (p.stdout, p.stderr)


# starvecheck itself, a background job: SIGINT ignored, then SIGINT and SIGTERM to its
# process group from inside torch's C++ start-up, where signals are held.
INSIDE_IMPORT = """
import os, runpy, signal, sys
inside = []
def profile(frame, event, arg):
    if event == "c_call" and str(getattr(arg, "__module__", "")).startswith("torch._C"):
        inside.append(arg)
    elif event in ("c_return", "c_exception") and inside and arg is inside[-1]:
        inside.pop()
    elif event == "call" and inside and inside[-1].__name__ == "_c10d_init":
        sys.setprofile(None)
        os.killpg(0, signal.SIGINT)
        os.killpg(0, signal.SIGTERM)
sys.argv = ["starvecheck", *sys.argv[1:]]
sys.setprofile(profile)
runpy.run_module("starvecheck", run_name="__main__")
"""


@pytest.mark.slow
def test_sigterm_held_in_a_background_job_ends_it_with_143(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    data, tmp = tmp_path / "data", tmp_path / "tmp"
    data.mkdir()
    tmp.mkdir()
    p = subprocess.Popen(
        [sys.executable, "-c", INSIDE_IMPORT, "loader", "--quick", "--runs", "1", str(data)],
        cwd=data,
        env=_env(tmp),
        preexec_fn=_ignoring("SIGINT"),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 143, (p.returncode, err[-2000:])
    assert err == "starvecheck: error: terminated by SIGTERM\n", err
    assert sorted(os.listdir(data)) == []
    assert [n for n in os.listdir(tmp) if not n.startswith("torchinductor_")] == []
    assert group_alive(p.pid) == []
