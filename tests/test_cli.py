"""The command line end to end: options, outputs, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run

REQUIRED_KEYS = [
    "cpu.logical",
    "cpu.affinity",
    "cpu.quota_cpus",
    "cpu.effective_cpus",
    "cgroup.version",
    "memory.total_bytes",
    "memory.limit_bytes",
    "shm.size_bytes",
    "limits.memlock_bytes",
    "limits.nofile",
    "numa.nodes",
    "container.runtime",
    "container.kubernetes",
    "gpus",
]
GPU_KEYS = [
    "name",
    "pcie.gen_current",
    "pcie.gen_max",
    "pcie.width_current",
    "pcie.width_max",
    "numa_node",
]


def dig(d, dotted):
    for part in dotted.split("."):
        assert isinstance(d, dict) and part in d, f"missing key {dotted}"
        d = d[part]
    return d


def test_env_json_on_this_machine_has_every_key_and_true_values():
    r = run("env", "--json", "-")
    assert r.exit_code == 0, r.stderr
    d = r.json
    assert d["schema_version"] == 3 and d["command"] == "env"
    m = d["machine"]
    for key in REQUIRED_KEYS:
        value = dig(m, key)
        if value is None:
            assert key in m["unknown"] or key in m["not_applicable"], key
    # The facts this machine can be checked against directly.
    assert dig(m, "cpu.logical") == os.cpu_count()
    assert dig(m, "cpu.affinity") == len(os.sched_getaffinity(0))
    assert dig(m, "cpu.effective_cpus") <= dig(m, "cpu.logical")
    assert isinstance(dig(m, "memory.total_bytes"), int)
    assert isinstance(dig(m, "container.kubernetes"), bool)
    st = os.statvfs("/dev/shm")
    assert dig(m, "shm.size_bytes") == st.f_blocks * st.f_frsize
    import resource

    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    expected = None if soft == resource.RLIM_INFINITY else soft
    assert dig(m, "limits.memlock_bytes") == expected
    assert dig(m, "limits.nofile") == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for gpu in m["gpus"]:
        for key in GPU_KEYS:
            dig(gpu, key)
    # The checklist is the stage's non-ok findings, ranked.
    stage_ids = {f["id"] for f in d["stages"][0]["findings"] if f["severity"] != "ok"}
    assert {f["id"] for f in d["checklist"]} == stage_ids


def test_terminal_report_ends_with_checklist_and_verdict():
    r = run("env")
    assert r.exit_code == 0
    assert "Checklist" in r.stdout
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert lines[-1] == run("env", "--json", "-").json["verdict"]
    assert not any(line != line.rstrip() for line in r.stdout.splitlines())


def test_json_and_markdown_files(tmp_path):
    j, md = tmp_path / "r.json", tmp_path / "r.md"
    r = run("env", "--json", str(j), "--markdown", str(md))
    assert r.exit_code == 0
    assert "Checklist" in r.stdout  # the terminal report still shows
    assert json.loads(j.read_text())["command"] == "env"
    text = md.read_text()
    assert text.startswith("## starvecheck env") and "### Checklist" in text


def test_markdown_to_stdout_replaces_the_terminal_report():
    r = run("env", "--markdown", "-")
    assert r.exit_code == 0 and r.stdout.startswith("## starvecheck env")


def test_quick_is_accepted():
    assert run("env", "--quick", "--json", "-").exit_code == 0


@pytest.mark.parametrize(
    ("fail_on", "findings", "expected"),
    [
        ("never", ["critical"], 0),
        ("critical", ["warning"], 0),
        ("critical", ["critical"], 1),
        ("warning", ["warning"], 1),
        ("warning", ["info", "ok"], 0),
    ],
)
def test_fail_on(monkeypatch, fail_on, findings, expected):
    from starvecheck.advice import env as env_advice
    from starvecheck.core.model import Finding, Severity

    fake = tuple(Finding(f"env.t{i}", Severity(s), s) for i, s in enumerate(findings))
    monkeypatch.setattr(env_advice, "advise", lambda m: fake)
    assert run("env", "--fail-on", fail_on, "--json", "-").exit_code == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["env", "/no/such/dir"], "/no/such/dir: no such file or directory"),
        (["env", "--fail-on", "sometimes"], "'sometimes' is not one of"),
        (["env", "--bogus"], "No such option: --bogus"),
        (["env", "--json"], "requires an argument"),
        (["env", "--json", "/no/such/dir/r.json"], "directory /no/such/dir does not exist"),
        (["env", "--json", "-", "--markdown", "-"], "cannot both write to stdout"),
        (["env", "a", "b"], "unexpected extra argument"),
        (["frobnicate"], "No such command"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = run(*args)
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("starvecheck: error: ") and message in lines[0]
    assert "Traceback" not in r.stderr


def test_json_path_that_is_a_directory(tmp_path):
    r = run("env", "--json", str(tmp_path))
    assert r.exit_code == 2 and "is a directory" in r.stderr


def test_bad_sysroot_is_usage_error(tmp_path):
    r = run("env", env={"STARVECHECK_SYSROOT": str(tmp_path / "missing")})
    assert r.exit_code == 2 and "not a directory" in r.stderr


def test_internal_error_is_one_line_without_debug_and_a_traceback_with(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr("starvecheck.stages.env.collect", boom)
    r = run("env")
    assert r.exit_code == 70
    assert r.stderr.count("\n") == 1 and "probe exploded" in r.stderr and "--debug" in r.stderr
    r = run("--debug", "env")
    assert "Traceback" in r.stderr and "probe exploded" in r.stderr


def test_ctrl_c_is_exit_130(monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("starvecheck.stages.env.collect", interrupted)
    r = run("env")
    assert r.exit_code == 130 and r.stderr == "starvecheck: error: interrupted\n"


def test_help_and_version():
    r = run("--help")
    assert r.exit_code == 0 and "env" in r.stdout
    r = run("env", "--help")
    for option in ("--json", "--markdown", "--fail-on", "--quick"):
        assert option in r.stdout
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.startswith("starvecheck ")


def _subprocess(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "starvecheck", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_module_entry_point_and_exit_codes():
    ok = _subprocess("env", "--json", "-")
    assert ok.returncode == 0 and json.loads(ok.stdout)["command"] == "env"
    bad = _subprocess("env", "--fail-on", "x")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_env_imports_no_heavy_library():
    code = (
        "import sys\nfrom starvecheck.cli import main\nmain(['env', '--json', '-'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'streaming', 'matplotlib', 'numpy')"
        " if m in sys.modules]\nprint(heavy, file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "[]"


def test_no_color_and_pipes_have_no_escape_codes():
    r = _subprocess("env", env={"NO_COLOR": "1"})
    assert r.returncode == 0 and "\x1b[" not in r.stdout


def test_env_with_a_relative_path(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    monkeypatch.chdir(tmp_path)
    r = run("env", "data", "--json", "-")
    assert r.json["machine"]["storage"]["path"] == str(Path(tmp_path / "data").resolve())
