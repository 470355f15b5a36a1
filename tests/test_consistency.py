"""One judgement per report: every command's results, judged on every fake machine and
in scripted scenarios, never contradict themselves.

The stage results are real runs (the stored reports in tests/golden, real loops under
`starvecheck.watch`, the trace fixtures through `profile --trace`) and scripted
variations of them (the issue's contradictions). Each is judged as a command or doctor
judges it, on each machine in tests/fixtures/sysroots, this machine and none, and the
findings must hold:

- no two findings recommend different values for one setting (their `fix`, per
  layout), and no recommended `DataLoader(..., num_workers=N)` names a count that no
  finding's fix holds;
- no passed check ("ok") asserts a value another finding changes;
- no finding compares a setting with itself ("num_workers=0 ... than 0");
- every critical finding has a gain, and one that recommends a setting predicts a
  speed-up above 1 (or says it cannot estimate one);
- a measurement replaces the flag it measured: io's rotational verdict, never beside
  env's.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from starvecheck.advice.judge import Results, judge
from starvecheck.advice.starve import recommended
from starvecheck.core.model import Finding, Severity, StageResult
from starvecheck.core.report import Report
from starvecheck.inputs.workload import Workload
from starvecheck.probe.machine import Machine, collect
from starvecheck.probe.sysroot import SysRoot
from tests.conftest import FIXTURES, SYSROOTS, run

GOLDEN = Path(__file__).parent / "golden"
STORED = sorted(p.stem for p in GOLDEN.glob("*.json"))


def machines() -> dict[str, Machine | None]:
    out: dict[str, Machine | None] = {"none": None, "this": collect(SysRoot(Path("/")), environ={})}
    for d in sorted(SYSROOTS.iterdir()):
        if d.is_dir():
            out[d.name] = collect(SysRoot(d), environ={})
    return out


MACHINES = machines()


def stored(name: str) -> tuple[list[StageResult], Workload | None]:
    report = Report.from_dict(json.loads((GOLDEN / f"{name}.json").read_text()))
    stages = [replace(s, findings=()) for s in report.stages]
    data = json.loads((GOLDEN / f"{name}.json").read_text())
    workload = Workload.from_dict(data["workload"]) if data.get("workload") else None
    return stages, workload


def judged(
    stages: Sequence[StageResult], machine: Machine | None, workload: Workload | None = None
) -> list[Finding]:
    results = Results({s.stage: s for s in stages}, machine, workload)
    return list(judge(results).findings)


# The checks


CODE = re.compile(r"`[^`]*`")
WORKERS_IN_CODE = re.compile(r"num_workers=(\d+)")
SELF_COMPARISON = (
    re.compile(r"num_workers=(\d+)\b[^.;]*?\b(?:than|vs\.?|against)\s+(?:num_workers=)?(\d+)\b"),
    re.compile(r"\b(\d+) workers?\b[^.;]*?\b(?:than|vs\.?)\s+(\d+)\b(?! CPU| ms| s\b|%|x)"),
)


def problems(findings: Iterable[Finding]) -> list[str]:
    fs = list(findings)
    out: list[str] = []
    with_fix = [f for f in fs if f.fix]
    for key in sorted({k for f in with_fix for k in f.fix if k != "layout"}):
        holders = [f for f in with_fix if key in f.fix]
        for a, b in itertools.combinations(holders, 2):
            la, lb = a.fix.get("layout"), b.fix.get("layout")
            if la is not None and lb is not None and la != lb:
                continue  # one value per layout
            if a.fix[key] != b.fix[key]:
                out.append(f"{a.id} says {key}={a.fix[key]}, {b.id} says {b.fix[key]}")
    fixed = {f.fix["num_workers"] for f in with_fix if "num_workers" in f.fix}
    for f in fs:
        if f.severity is Severity.OK:
            continue
        for span in CODE.findall(f.recommendation):
            for n in WORKERS_IN_CODE.findall(span):
                if "DataLoader" in span and int(n) not in fixed:
                    out.append(f"{f.id} recommends num_workers={n}, which no fix holds")
    for f in fs:
        for pattern in SELF_COMPARISON:
            for text in (f.title, f.evidence):
                for a, b in pattern.findall(text):
                    if a == b:
                        out.append(f"{f.id} compares {a} with itself: {text!r}")
        if f.severity is Severity.CRITICAL:
            g = f.gain
            if g is None or (g.kind.value != "blocker" and not g.value):
                out.append(f"{f.id} is critical without a gain")
        if f.fix and f.severity is not Severity.OK and f.gain is not None:
            s = f.gain.speedup
            if s is not None and s < 1.0:
                out.append(f"{f.id} recommends {dict(f.fix)} predicting a slower step ({s:.2f}x)")
    ids = {f.id for f in fs}
    if {"env.rotational-storage", "io.rotational"} <= ids:
        out.append("env.rotational-storage beside io.rotational: the measurement decides")
    return out


# Real runs, stored, on every machine

# A judge that says nothing agrees with itself: each stored run says what its
# judgement must hold on every machine: the stages whose rules must speak (env's only
# where there is a machine to judge; others may, on some machine) and the ids that do
# not depend on the machine.
ENV_ONLY = ({"env"}, set())
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "baremetal-numa-8gpu": ENV_ONLY,
    "docker-v1-shm64": ENV_ONLY,
    "k8s-pod-v2": ENV_ONLY,
    "vm-no-numa-no-gpu": ENV_ONLY,
    "doctor-nodes": ({"env", "loader", "pad"}, {"loader.workers", "pad.waste"}),
    # loader's own num_workers gives way to starve's (see the scenario below).
    "doctor-quick": (
        {"env", "io", "starve", "pad"},
        {
            "io.cold-cache-gap",
            "io.few-readers",
            "io.small-files",
            "starve.workers-needed",
            "pad.waste",
        },
    ),
    "io-ext4": ({"io"}, {"io.cold-cache-gap", "io.few-readers", "io.small-files"}),
    "pad-default": ({"pad"}, {"pad.waste"}),
    "loader-quick": ({"loader"}, {"loader.workers", "loader.small-files"}),
    "loader-factory": (
        {"factory"},
        {"loader.own-config", "loader.copy-on-read", "loader.start-method"},
    ),
    "loader-factory-undecided": ({"factory"}, {"loader.own-config"}),
    "starve-quick": ({"starve"}, {"starve.not-enough-cpu"}),
    "profile-quick": ({"profile"}, {"profile.data-bound"}),
    "trace-gpu": ({"trace"}, {"profile.data-bound", "profile.first-step-stall"}),
    "trace-gloo-straggler": ({"trace"}, {"profile.data-bound", "profile.straggler"}),
    "watch-cpu-bound": ({"watch"}, {"profile.data-bound"}),
    "attach-one-rank": ({"attach"}, {"attach.data-wait", "attach.load-stage"}),
    "attach-ranks": ({"attach"}, {"attach.data-wait", "attach.straggler"}),
    # pcie on the CUDA stand-in (tests/test_pcie_golden.py): every figure, none from
    # NVML, and none at all (no GPU: nothing to judge).
    "pcie-full": (
        {"pcie"},
        {
            "pcie.link-below-max",
            "pcie.low-efficiency",
            "pcie.pageable-d2h",
            "pcie.overlap",
            "pcie.numa-remote",
            "pcie.reference",
        },
    ),
    "pcie-no-nvml": (
        {"pcie"},
        {"pcie.pageable-d2h", "pcie.overlap", "pcie.numa-remote", "pcie.reference"},
    ),
    "pcie-no-gpu": (set(), set()),
}
# The stage a stage's findings carry where it is judged by another's rules: a watched
# loop by a step breakdown's (advice/trace.py), loader --factory's under loader's name.
JUDGED_AS = {"watch": {"trace"}, "factory": {"loader"}}
# What the checks find in a stored run today, each a defect of its rules to fix (then
# its line goes: the test below fails while a listed problem is no longer there).
KNOWN: dict[str, set[str]] = {}


def speaking(stages: set[str], machine: Machine | None) -> set[str]:
    """The stages whose rules must find something: env's judge the machine, and
    doctor's own findings come from the chain, judged with the stages it joins."""
    return stages - {"doctor"} - ({"env"} if machine is None else set())


@pytest.mark.parametrize("machine", sorted(MACHINES))
@pytest.mark.parametrize("name", STORED)
def test_stored_runs_judged_on_every_machine_agree_with_themselves(name, machine):
    assert name in EXPECTED, f"{name}: say what its judgement must hold"
    stages, workload = stored(name)
    findings = judged(stages, MACHINES[machine], workload)
    assert set(problems(findings)) == KNOWN.get(name, set())
    expected_stages, expected_ids = EXPECTED[name]
    spoke = {f.stage for f in findings}
    own = {s.stage for s in stages}
    judged_as = own.union(*(JUDGED_AS.get(s, set()) for s in own))
    spoken = speaking(expected_stages, MACHINES[machine])
    assert spoken <= spoke | {s for s in spoken if JUDGED_AS.get(s, set()) & spoke}
    assert spoke <= judged_as
    assert expected_ids <= {f.id for f in findings}


@pytest.mark.parametrize("machine", sorted(MACHINES))
def test_each_stage_alone_agrees_with_itself(machine):
    """Each command's own report (one stage), from the stored doctor run: every
    stage's rules speak of it alone, and what they say agrees with itself."""
    stages, _ = stored("doctor-quick")
    assert {s.stage for s in stages} >= {"env", "io", "loader", "starve", "pad"}
    for s in stages:
        findings = judged([s], MACHINES[machine])
        assert problems(findings) == [], s.stage
        assert {f.stage for f in findings} == speaking({s.stage}, MACHINES[machine]), s.stage


# Scripted scenarios: the contradictions the issue found


def _with_value(s: StageResult, value: float, **labels: object) -> StageResult:
    metrics = [
        replace(m, value=value)
        if all(m.labels.get(k) == v for k, v in labels.items()) and set(m.labels) == set(labels)
        else m
        for m in s.metrics
    ]
    return replace(s, metrics=tuple(metrics))


def _stage(stages: Sequence[StageResult], name: str) -> StageResult:
    return next(s for s in stages if s.stage == name)


def test_a_passed_loader_check_never_sits_beside_a_worker_recommendation():
    """loader: num_workers=0 reads as fast as any count; starve: the CPU work needs 2.
    The workers must do both: 2, and no "passed: num_workers=0" beside it."""
    stages, workload = stored("doctor-quick")
    loader, starve = _stage(stages, "loader"), _stage(stages, "starve")
    assert loader.value(quantity="recommended_num_workers", layout="shard") == 0
    assert starve.value(quantity="recommended_num_workers") == 2
    findings = judged(stages, MACHINES["this"], workload)
    assert problems(findings) == []
    by = {f.id: f for f in findings}
    assert "loader.workers" not in by  # its "num_workers=0 is enough" went
    assert {f.fix["num_workers"] for f in findings if "num_workers" in f.fix} == {2}


def test_a_measured_read_overrides_the_rotational_flag():
    stages, _ = stored("io-ext4")
    this = MACHINES["this"]
    assert this is not None
    spinning = replace(this, storage=replace(this.storage, rotational=True))
    env = StageResult(stage="env", parameters={})
    io = replace(stages[0], parameters={**stages[0].parameters})
    ids = {f.id for f in judged([env, io], spinning)}
    assert "io.rotational" in ids and "env.rotational-storage" not in ids
    # env alone still says what the kernel says.
    assert "env.rotational-storage" in {f.id for f in judged([env], spinning)}


def test_a_fractional_quota_is_said_as_it_is():
    stages, _ = stored("doctor-quick")
    this = MACHINES["this"]
    assert this is not None
    half = replace(this, cpu=replace(this.cpu, quota_cpus=0.5, effective_cpus=1))
    starve = _stage(stages, "starve")
    # The sweep on one CPU: one worker idles the GPU as little as two.
    (w2,) = starve.select(quantity="idle_share", workers=2)
    w1 = replace(w2, name="idle_share.w1", labels={**w2.labels, "workers": 1})
    starve = replace(
        starve,
        parameters={**starve.parameters, "effective_cpus": 1},
        metrics=(w1, *starve.metrics),
    )
    findings = judged([starve], half)
    assert problems(findings) == []
    text = " ".join(f.evidence + f.title for f in findings)
    assert "0.5-CPU cgroup quota" in text
    assert not any(f.severity is Severity.OK and "still helped" in f.title for f in findings)


def test_starve_never_compares_no_workers_with_itself():
    """Nothing beats num_workers=0: no starve.workers-zero finding at all."""
    stages, _ = stored("doctor-quick")
    starve = _with_value(_stage(stages, "starve"), 0.6, quantity="idle_share", workers=2)
    (w2,) = starve.select(quantity="idle_share", workers=2)
    w0 = replace(w2, name="idle_share.w0", value=0.6, labels={**w2.labels, "workers": 0})
    starve = replace(starve, metrics=(*starve.metrics, w0))
    assert starve.value(quantity="idle_share", workers=0) == 0.6
    assert recommended(starve) == 0  # as idle with two workers as with none
    findings = judged([starve], MACHINES["this"])
    assert problems(findings) == []
    assert findings and {f.stage for f in findings} == {"starve"}  # it judged, and spoke
    assert "starve.workers-zero" not in {f.id for f in findings}


# Real loops under watch


def _watched(loader: Iterable[object], step_s: float) -> list[Finding]:
    import starvecheck

    w = starvecheck.watch(loader, show=False)
    for _ in w:
        time.sleep(step_s)
    return list(w.result().findings)


def test_watched_loops_agree_with_themselves():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, Dataset

    class Work(Dataset):
        def __init__(self, cpu: bool) -> None:
            self.cpu = cpu

        def __len__(self) -> int:
            return 4 * 24

        def __getitem__(self, i: int):
            if self.cpu:
                end = time.thread_time() + 0.002
                while time.thread_time() < end:
                    pass
            else:
                time.sleep(0.002)
            return torch.zeros(4)

    loops = {
        "cpu work, no workers": (DataLoader(Work(True), batch_size=4), 0.004),
        "sleeping, no workers": (DataLoader(Work(False), batch_size=4), 0.004),
        "sleeping, one worker": (DataLoader(Work(False), batch_size=4, num_workers=1), 0.004),
        "fed": (list(range(30)), 0.002),
        "no time at all": (itertools.islice(itertools.count(), 50), 0.0),
    }
    for name, (loader, step) in loops.items():
        findings = _watched(loader, step)
        assert problems(findings) == [], name
        assert "profile.data-bound" in {f.id for f in findings}, name  # judged, fed or not
        if name == "no time at all":
            assert all(f.severity.rank <= Severity.INFO.rank for f in findings), name


# Traces of other runs


@pytest.mark.parametrize(
    "trace", sorted(p.name for p in (FIXTURES / "traces").iterdir() if ".json" in p.name)
)
def test_traces_agree_with_themselves(trace):
    r = run("profile", "--trace", str(FIXTURES / "traces" / trace), "--json", "-")
    assert r.exit_code == 0, r.stderr
    findings = [Finding.from_dict(f) for s in r.json["stages"] for f in s["findings"]]
    assert problems(findings) == []
    assert "profile.data-bound" in {f.id for f in findings}  # every trace is judged


# The checks themselves catch what they are for


def test_the_checks_catch_each_contradiction():
    def f(id_: str, sev: Severity = Severity.WARNING, **kw: object) -> Finding:
        return Finding(id_, sev, kw.pop("title", "t"), **kw)  # type: ignore[arg-type]

    assert problems([f("a", fix={"num_workers": 2}), f("b", fix={"num_workers": 4})])
    assert not problems(
        [
            f("a", fix={"num_workers": 2, "layout": "x"}),
            f("b", fix={"num_workers": 4, "layout": "y"}),
        ]
    )
    assert problems([f("a", Severity.OK, fix={"num_workers": 0}), f("b", fix={"num_workers": 2})])
    assert problems([f("a", recommendation="`DataLoader(x, num_workers=3)`")])
    assert problems([f("a", title="num_workers=0 leaves the GPU idle, no better than 0")])
    assert problems([f("a", title="num_workers=0 is slower than num_workers=0")])
    assert problems([f("a", Severity.CRITICAL)])
    assert problems([f("env.rotational-storage"), f("io.rotational")])
    assert not problems([f("a", title="num_workers=2 loads 3.0x faster than num_workers=0")])
