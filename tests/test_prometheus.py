"""The fleet's side, against the real tools (Debian's prometheus package: `make
system-deps` installs it as root): the rules checked and unit-tested by promtool, and a
real 2-rank gloo job under torchrun, its exporters scraped by a real Prometheus server,
whose PromQL names the slow rank and gives each rank's data-wait ratio as the job's own
clock does; every PromQL expression of the Grafana dashboard run on that server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "starvecheck-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "starvecheck-rules.test.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "starvecheck.json"
MISSING = "needs Debian's prometheus package (promtool, prometheus): `make system-deps` as root"
JOB = "fleet-test"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed: {MISSING}")
    return path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_the_rules_pass_promtool_check():
    p = promtool("check", "rules", str(RULES), cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 8 rules found" in p.stdout


def test_the_rules_pass_their_unit_tests():
    p = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


@pytest.mark.parametrize(
    ("rule", "weakened"),
    [
        (
            "(3 * starvecheck:data_wait_p95_others:median)",
            "(30 * starvecheck:data_wait_p95_others:median)",
        ),
        (
            "expr: starvecheck:data_wait_ratio:rate5m > 0.2",
            "expr: starvecheck:data_wait_ratio:rate5m > 0.6",
        ),
        ("on (Hostname, gpu) avg_over_time", "on (Hostname) avg_over_time"),
    ],
)
def test_the_unit_tests_fail_a_rule_that_is_changed(tmp_path, rule, weakened):
    text = RULES.read_text()
    assert rule in text
    (tmp_path / RULES.name).write_text(text.replace(rule, weakened))
    shutil.copy(RULE_TESTS, tmp_path)
    p = promtool("test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert p.returncode != 0 and "FAILED" in p.stdout + p.stderr


def test_the_scrape_config_passes_promtool_check(tmp_path):
    shutil.copy(SCRAPE, tmp_path)
    shutil.copy(RULES, tmp_path)
    p = promtool("check", "config", SCRAPE.name, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def dashboard_targets() -> list[tuple[str, str, str]]:
    """(panel title, refId, expression) of every target of the dashboard, its Grafana
    variables given the values a query sends: this job, a 1-minute rate window."""
    d = json.loads(DASHBOARD.read_text())
    out = []
    for panel in d["panels"]:
        for t in panel["targets"]:
            expr = t["expr"].replace("$job", JOB).replace("$__rate_interval", "1m")
            out.append((panel["title"], t["refId"], expr))
    return out


def test_the_dashboard_shows_the_data_wait_ratio_beside_dcgms_utilization():
    exprs = " ".join(e for _, _, e in dashboard_targets())
    assert "starvecheck_data_wait_seconds_total" in exprs and "DCGM_FI_DEV_GPU_UTIL" in exprs
    assert "$" not in exprs  # every variable given a value


# The real server and a real job.

JOB_SCRIPT = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
import starvecheck

dist.init_process_group("gloo")
rank = dist.get_rank()
out, steps = sys.argv[1], int(sys.argv[2])

class Samples(Dataset):  # rank 1's data is slow: 20 ms a sample against 0.5 ms
    def __len__(self):
        return 4 * steps
    def __getitem__(self, i):
        time.sleep(0.020 if rank == 1 else 0.0005)
        return torch.zeros(8)

w = starvecheck.watch(DataLoader(Samples(), batch_size=4), show=False)
x = torch.zeros(1)
for batch in w:
    time.sleep(0.010)  # the step
    dist.all_reduce(x)
share = next(m.value for m in w.times.metrics() if m.labels["quantity"] == "data_wait_share")
mine = {"rank": rank, "share": share, "steps": len(w.times.computes), "port": w.exporter.port}
with open(os.path.join(out, f"rank{rank}.tmp"), "w") as f:
    json.dump(mine, f)
os.rename(os.path.join(out, f"rank{rank}.tmp"), os.path.join(out, f"rank{rank}.json"))
stop = time.monotonic() + 120  # scraped until the test is done with it
while not os.path.exists(os.path.join(out, "stop")) and time.monotonic() < stop:
    time.sleep(0.1)
dist.destroy_process_group()
"""


def free_ports(n: int) -> int:
    """A base port with n consecutive ports free on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + n):
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no consecutive free ports")


class Server:
    """A Prometheus server on a free port, its storage in tmp_path."""

    def __init__(self, tmp_path: Path, targets: list[int]) -> None:
        self.port = free_ports(1)
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(RULES)],
                    "scrape_configs": [
                        {
                            "job_name": "starvecheck",
                            "honor_labels": True,
                            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in targets]}],
                        }
                    ],
                }
            )
        )
        self.log = (tmp_path / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    def ready(self, timeout: float = 60) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.process.poll() is None, "prometheus exited at start"
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(self.url + "/-/ready", timeout=2).status == 200:
                    return
            time.sleep(0.2)
        raise AssertionError("prometheus not ready")

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            body = urllib.request.urlopen(url, timeout=10).read()
        except urllib.error.HTTPError as e:  # a bad query: 400 with the error as JSON
            body = e.read()
        return json.loads(body)

    def query(self, expr: str) -> list[dict]:
        got = self.get("/api/v1/query", query=expr)
        assert got["status"] == "success", f"{expr}: {got}"
        return got["data"]["result"]

    def by_rank(self, expr: str) -> dict[str, float]:
        return {r["metric"]["rank"]: float(r["value"][1]) for r in self.query(expr)}

    def stop(self) -> None:
        stop_group(self.process)
        self.log.close()


def stop_group(p: subprocess.Popen) -> None:
    """End a process we started and every process of its session."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def torchrun(tmp_path: Path, base: int, steps: int) -> subprocess.Popen:
    pytest.importorskip("torch.distributed.run")
    script = tmp_path / "job.py"
    script.write_text(JOB_SCRIPT)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    }
    src = str(ROOT / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env |= {"STARVECHECK_PROMETHEUS_PORT": str(base), "STARVECHECK_JOB": JOB}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*cmd, str(script), str(tmp_path), str(steps)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )


def wait_for(what: str, ready, timeout: float, alive: subprocess.Popen | None = None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (got := ready()) is not None:
            return got
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {alive.stderr.read()[-3000:]}")
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def own_clock(tmp_path: Path) -> dict[str, dict] | None:
    files = [tmp_path / f"rank{r}.json" for r in (0, 1)]
    if not all(f.exists() for f in files):
        return None
    return {str(r): json.loads(f.read_text()) for r, f in enumerate(files)}


RATIO = (
    f'starvecheck_data_wait_seconds_total{{job="{JOB}"}}'
    f' / starvecheck_step_seconds_total{{job="{JOB}"}}'
)
# Dashboard targets that must return one series per rank here (a CPU job at
# num_workers=0: no DCGM, no device clock, no workers' first batches).
PER_RANK = {
    ("Data-wait ratio per rank", "A"),
    ("p95 data wait per step", "A"),
    ("p95 data wait per step", "B"),
    ("Time to first batch (mean per pass)", "A"),
    ("num_workers: now and recommended", "A"),
    ("Weakest link per rank", "A"),
    ("Steps per second per rank", "A"),
}
NONE_HERE = {
    ("GPU utilization (DCGM) of the job's GPUs", "A"),
    ("GPU idle waiting for data (device clock)", "A"),
    ("Time to first batch (mean per pass)", "B"),
}


@pytest.mark.slow
def test_a_torchrun_job_scraped_names_its_slow_rank_and_each_ranks_ratio(tmp_path, capsys):
    base = free_ports(2)
    server = Server(tmp_path, [base, base + 1])
    job: subprocess.Popen | None = None
    try:
        server.ready()
        # STARVECHECK_FLEET_STEPS: a longer run for docs/fleet.md's picture
        job = torchrun(tmp_path, base, steps=int(os.environ.get("STARVECHECK_FLEET_STEPS", 120)))
        mine = wait_for("each rank's own figures", lambda: own_clock(tmp_path), 300, job)
        assert {m["port"] for m in mine.values()} == {base, base + 1}  # LOCAL_RANK's offset

        def scraped_to_the_end() -> dict | None:
            got = server.by_rank(f'starvecheck_batches_total{{job="{JOB}"}}')
            done = all(got.get(r) == m["steps"] for r, m in mine.items())
            return got if done else None

        wait_for("the last steps scraped", scraped_to_the_end, 60, job)
        ratios = server.by_rank(RATIO)
        slowest = server.query(f"topk(1, {RATIO})")
        with capsys.disabled():
            for r in sorted(mine):
                print(f"\nrank {r}: PromQL {ratios[r]:.4f}, own clock {mine[r]['share']:.4f}")
        assert set(ratios) == {"0", "1"}
        for r, m in mine.items():
            assert ratios[r] == pytest.approx(m["share"], abs=0.05)
        assert [s["metric"]["rank"] for s in slowest] == ["1"]
        assert mine["1"]["share"] > 3 * mine["0"]["share"]  # the job did have a slow rank

        for title, ref, expr in dashboard_targets():
            ranks = {s["metric"].get("rank") for s in server.query(expr)}
            if (title, ref) in PER_RANK:
                assert ranks == {"0", "1"}, (title, ref, expr)
            if (title, ref) in NONE_HERE:
                assert ranks == set(), (title, ref, expr)
        window = dict(dashboard_targets_by_title())["Data-wait ratio per rank"]
        assert max(server.by_rank(window).items(), key=lambda kv: kv[1])[0] == "1"

        # The rules load in the real server and are evaluated on these series.
        rules = server.get("/api/v1/rules")["data"]["groups"]
        assert sum(len(g["rules"]) for g in rules) == 8
        assert all(r["health"] != "err" for g in rules for r in g["rules"])
        recorded = wait_for(
            "a recording rule evaluated",
            lambda: server.by_rank("starvecheck:data_wait_ratio:rate5m") or None,
            30,
        )
        assert set(recorded) == {"0", "1"}
        # The straggler alert's comparison (less its 50 ms floor) names rank 1 alone. Its
        # 80 ms a step (4 sleeps of 20 ms: never less) puts its p95 in the histogram's
        # 50-100 ms bucket; rank 0's p95 would have to pass a third of that. With 6 ms a
        # sample (24 ms, the 10-25 ms bucket) rank 0's p95 had only to pass 8 ms, which
        # waits for a CPU on a loaded machine can reach.
        straggler = (
            "starvecheck:data_wait_p95:rate5m > on (job) group_left () "
            "(3 * starvecheck:data_wait_p95_others:median)"
        )
        named = wait_for("the straggler named", lambda: server.by_rank(straggler) or None, 30)
        assert set(named) == {"1"}
        screenshot(server, window)
    finally:
        (tmp_path / "stop").touch()
        if job is not None:
            try:
                _, err = job.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                stop_group(job)
                _, err = job.communicate()
            stop_group(job)
        server.stop()
    assert job.returncode == 0, err[-3000:]
    # scraped every second while it ended: never a warning nor a traceback of ours
    assert "starvecheck: warning" not in err and "Traceback" not in err, err[-3000:]


def dashboard_targets_by_title() -> list[tuple[str, str]]:
    return [(title, expr) for title, ref, expr in dashboard_targets() if ref == "A"]


def screenshot(server: Server, expr: str) -> None:
    """Where STARVECHECK_FLEET_SCREENSHOT names a PNG: Prometheus's own graph page of
    `expr`, taken by headless Chromium (docs/fleet.md's picture)."""
    path = os.environ.get("STARVECHECK_FLEET_SCREENSHOT")
    if not path:
        return
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "STARVECHECK_FLEET_SCREENSHOT needs chromium (apt-get install chromium)"
    page = (
        server.url
        + "/graph?"
        + urllib.parse.urlencode(
            {"g0.expr": expr, "g0.tab": "0", "g0.range_input": "2m", "g0.stacked": "0"}
        )
    )
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={Path(path).resolve()}", "--window-size=1400,900",
         "--virtual-time-budget=15000", page],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
