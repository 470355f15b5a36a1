"""doctor's chain maths against hand-computed cases: each link's capacity, the weakest
link and what fixing it buys, the checklist reweighed for the workload, stragglers."""

from __future__ import annotations

import json

import pytest

from starvecheck.advice import capacity, chain, stragglers
from starvecheck.advice.results import Results
from starvecheck.cli.ranks import from_environ, slow_ms
from starvecheck.core.metric import Metric
from starvecheck.core.model import Finding, Gain, GainKind, Severity, StageResult
from starvecheck.core.report import Link, Report
from starvecheck.core.schema.doctor import Context as DoctorContext
from starvecheck.core.schema.nodes import Node
from starvecheck.core.status import UsageError
from starvecheck.inputs.workload import Workload


def _rate(layout: str, cache: str, threads: int) -> dict:
    return dict(
        quantity="samples_per_s", layout=layout, pattern="random", cache=cache, threads=threads
    )


def _io(cold: float | None, warm: float, reason: str = "tmpfs") -> StageResult:
    name = "shard.random.cold.t2.samples_per_s"
    cold_m = (
        Metric.repeated(name, [cold], "samples/s", _rate("shard", "cold", 2))
        if cold is not None
        else Metric.missing(name, "samples/s", reason, _rate("shard", "cold", 2))
    )
    return StageResult(
        "io",
        parameters={"threads": [1, 2]},
        metrics=(
            Metric.repeated(
                "shard.random.cold.samples_per_s", [50.0], "samples/s", _rate("shard", "cold", 1)
            ),
            cold_m,
            Metric.repeated(
                "shard.random.warm.t2.samples_per_s", [warm], "samples/s", _rate("shard", "warm", 2)
            ),
            Metric.repeated(
                "small_files.random.cold.t2.samples_per_s",
                [7.0],
                "samples/s",
                _rate("small_files", "cold", 2),
            ),
        ),
    )


def test_storage_is_the_layouts_cold_random_read_with_the_most_readers():
    link = capacity.storage(_io(1000.0, 9000.0), "shard", demand=400.0)
    assert link.capacity == 1000.0 and link.demand == 400.0
    assert "shard.random.cold, 2 reader(s)" in link.basis
    assert capacity.storage(_io(1000.0, 9000.0), "small_files", 400.0).capacity == 7.0


def test_storage_falls_back_to_warm_and_says_why():
    link = capacity.storage(_io(None, 9000.0, "this path is on tmpfs"), "shard", 400.0)
    assert link.capacity == 9000.0
    assert "warm" in link.basis and "this path is on tmpfs" in link.basis


def test_storage_without_figures_is_null_with_a_reason():
    link = capacity.storage(StageResult("io", parameters={"threads": [1]}), "shard", 400.0)
    assert link.capacity is None and "no shard.random" in (link.reason or "")


def _loader(rec: int, **curve: float) -> StageResult:
    metrics = [
        Metric.repeated(
            f"throughput.shard.warm.w{w[1:]}",
            [v],
            "samples/s",
            dict(quantity="samples_per_s", layout="shard", cache="warm", workers=int(w[1:])),
        )
        for w, v in curve.items()
    ]
    metrics.append(
        Metric.single(
            "recommended_num_workers.shard",
            rec,
            "workers",
            dict(quantity="recommended_num_workers", layout="shard"),
        )
    )
    return StageResult("loader", metrics=tuple(metrics))


def test_loader_is_the_lower_of_reading_and_cpu_and_names_it():
    read = capacity.read_capacity(_loader(2, w0=900.0, w1=1500.0, w2=2000.0), "shard")
    assert read[0] == 2000.0 and "2 worker(s)" in read[1]
    link = capacity.loader(read, (800.0, "starve"), demand=400.0)
    assert link.capacity == 800.0 and link.limited_by == "cpu"
    assert link.parts == {"reading": 2000.0, "cpu": 800.0}
    link = capacity.loader(read, (5000.0, "starve"), 400.0)
    assert link.capacity == 2000.0 and link.limited_by == "reading"


def test_loader_with_one_part_missing_uses_the_other_and_says_so():
    link = capacity.loader((None, "loader not selected"), (800.0, "starve"), 400.0)
    assert link.capacity == 800.0 and "reading not measured (loader not selected)" in link.basis
    both = capacity.loader((None, "loader not selected"), (None, "starve not selected"), 400.0)
    assert both.capacity is None
    assert both.reason == "loader not selected; starve not selected"


def test_cpu_capacity_comes_from_starves_capacity():
    starve = StageResult(
        "starve",
        parameters={"sample_cpu_ms": 2.0, "capacity_workers": 2},
        capacity=Metric.repeated("capacity.w2", [950.0, 1000.0, 990.0], "samples/s"),
    )
    assert capacity.cpu_capacity(starve) == (990.0, "starve, 2.0 ms CPU per sample in 2 worker(s)")
    assert capacity.cpu_capacity(StageResult("starve"))[0] is None


def _pad(**eff: float) -> StageResult:
    return StageResult(
        "pad",
        metrics=tuple(
            Metric.single(f"efficiency.{k}", v, "fraction", dict(quantity="efficiency", strategy=k))
            for k, v in eff.items()
        ),
    )


def test_less_padding_raises_the_gpus_rate_by_the_efficiency_ratio():
    rate, basis = capacity.padding(
        _pad(dynamic=0.4, length_grouped=0.8, bfd_pack=0.99), "dynamic", 100.0
    )
    assert rate == pytest.approx(100 * 0.99 / 0.4) and "dynamic padding 40.0%" in basis
    # Already the best: exactly the rate trained at.
    assert capacity.padding(_pad(dynamic=0.4), "dynamic", 100.0)[0] == 100.0
    assert capacity.padding(_pad(dynamic=0.4), "bfd_pack", 100.0)[0] is None
    assert capacity.padding(_pad(dynamic=0.4), "dynamic", None)[0] is None
    gpu = capacity.gpu(
        100.0, "step_ms 160", capacity.padding(_pad(dynamic=0.4, bfd_pack=0.99), "dynamic", 100.0)
    )
    assert gpu.capacity == 100.0 and gpu.parts["padding_fixed"] == pytest.approx(247.5)


def test_best_strategy_ties_go_to_the_simpler():
    assert capacity.best_strategy({"padding_free": 1.0, "bfd_pack": 1.0}) == "padding_free"
    assert capacity.best_strategy({}) is None


def _copy(memory: str, size: int, **more: str) -> dict:
    labels = dict(quantity="gbps", direction="h2d", memory=memory, size=size)
    return {**labels, "clock": "wall", "source": "torch", **more}


def _pcie() -> StageResult:
    rates = {"64KiB": 5.0, "1MiB": 10.0, "16MiB": 20.0, "256MiB": 24.0, "1GiB": 25.0}
    sizes = {"64KiB": 64 << 10, "1MiB": 1 << 20, "16MiB": 16 << 20, "256MiB": 256 << 20}
    sizes["1GiB"] = 1 << 30
    return StageResult(
        "pcie",
        metrics=(
            *(
                Metric.repeated(f"h2d.pinned.{k}", [v], "GB/s", _copy("pinned", sizes[k]))
                for k, v in rates.items()
            ),
            Metric.repeated("h2d.pageable.1MiB", [3.0], "GB/s", _copy("pageable", 1 << 20)),
            # Not the wall-clock figure of a torch copy: never the link's capacity.
            Metric.repeated(
                "h2d.pinned.1MiB.events", [99.0], "GB/s", _copy("pinned", 1 << 20, clock="events")
            ),
            Metric.repeated(
                "reference.h2d.pinned.1MiB",
                [98.0],
                "GB/s",
                _copy("pinned", 1 << 20, source="cudart"),
            ),
        ),
    )


def test_pcie_uses_pinned_bandwidth_at_the_size_nearest_a_batch():
    # 2,048 tokens x 8 bytes = 16 KiB a sample; 32 of them 512 KiB, nearest 1 MiB.
    link = capacity.pcie(_pcie(), 16384, 32, demand=80.0)
    assert link.capacity == pytest.approx(10e9 / 16384)
    assert "1MiB" in link.basis
    assert capacity.nearest_size([64 << 10, 1 << 20], 300 << 10) == 1 << 20
    assert capacity.nearest_size([64 << 10, 1 << 20], 256 << 10) == 64 << 10  # a tie: the smaller
    assert capacity.pcie(StageResult("pcie"), 16384, 32, 80.0).capacity is None


def test_build_chain_with_a_pcie_result_and_skipped_stages():
    w = Workload(step_ms=200.0)  # 16 per 0.2 s: 80 samples/s
    why = {"io": "io not selected (--only/--skip)", "pad": "pad not selected (--only/--skip)"}
    doctor = DoctorContext("step_ms 200 (option)", why)
    links = capacity.build(Results({"pcie": _pcie()}, workload=w, doctor=doctor))
    assert "padding" not in {x.link for x in links}  # a property of the GPU step
    by = {x.link: x for x in links}
    assert [x.link for x in links] == list(chain.LINKS)
    # 16 x 16 KiB = 256 KiB: as far from 64 KiB as from 1 MiB; the smaller, 5 GB/s.
    assert by["pcie"].capacity == pytest.approx(5e9 / 16384)
    assert by["gpu"].capacity == by["gpu"].demand == 80.0
    assert by["storage"].capacity is None and "io not selected" in (by["storage"].reason or "")
    why["pcie"] = "no CUDA device"
    skipped = capacity.build(Results({}, workload=w, doctor=DoctorContext(unavailable=why)))
    assert skipped[2].link == "pcie" and skipped[2].reason == "not measured: no CUDA device"


def _chain(**caps: float | None) -> list[Link]:
    demand = caps.pop("demand")
    fixed = caps.pop("padding_fixed", None)
    out = [Link(name, cap, demand) for name, cap in caps.items()]
    parts = {"as_trained": demand, "padding_fixed": fixed} if fixed else {}
    return [*out, Link("gpu", demand, demand, parts=parts)]


def test_weakest_and_what_fixing_it_buys():
    w = chain.weakest(_chain(storage=1000, loader=200, pcie=300, demand=400))
    assert (w.link, w.next_link) == ("loader", "pcie")
    assert w.speedup == pytest.approx(1.5)  # until pcie, not the GPU
    assert "1.5x faster (until pcie at 300 samples/s)" in w.message
    w = chain.weakest(_chain(storage=1000, loader=300, demand=400))
    assert w.link == "loader" and w.next_link == "the GPU's demand"
    assert w.speedup == pytest.approx(400 / 300)


def test_padding_is_the_gpus_fix_never_a_link():
    """The issue's case: batch 32, a 10 ms step (3,200 samples/s), the loader at 661/s,
    dynamic padding at 40% real tokens. The loader is weakest, worth 4.8x; padding buys
    nothing until it is fixed."""
    links = _chain(storage=15_000, loader=661, demand=3200, padding_fixed=3200 / 0.402)
    w = chain.weakest(links)
    assert w.link == "loader" and w.speedup == pytest.approx(3200 / 661)
    assert chain.padding_room(links, 2.49)[0] == 1.0
    # A fed GPU: less padding is the first fix, up to the pipeline.
    fed = _chain(storage=15_000, loader=6000, demand=3200, padding_fixed=3200 * 2.49)
    w = chain.weakest(fed)
    assert w.link == "gpu" and w.speedup == pytest.approx(6000 / 3200)
    assert "less padding would make training up to 1.9x faster (until loader at 6,000" in w.message
    assert chain.padding_room(fed, 2.49) == (pytest.approx(6000 / 3200), "then loader limits it")
    roomy = _chain(storage=15_000, loader=90_000, demand=3200, padding_fixed=3200 * 2.49)
    assert chain.weakest(roomy).speedup == pytest.approx(2.49)
    assert "(until all padding removed)" in chain.weakest(roomy).message
    assert chain.padding_room(roomy, 2.49) == (2.49, "")


def test_a_fed_gpu_is_the_weakest_and_says_so():
    w = chain.weakest(_chain(storage=1000, loader=800, demand=400))
    assert w.link == "gpu" and w.speedup == 1.0 and w.headroom == pytest.approx(2.0)
    assert "keeps up" in w.message and "loader at 2.0x" in w.message


def test_ties_go_to_the_gpu_then_upstream():
    assert chain.weakest(_chain(storage=1000, loader=400, demand=400)).link == "gpu"
    w = chain.weakest(_chain(storage=200, loader=200, demand=400))
    assert (w.link, w.next_link, w.speedup) == ("storage", "loader", 1.0)


def test_null_links_are_never_the_weakest_and_too_few_say_so():
    w = chain.weakest(_chain(storage=None, loader=500, demand=400))
    assert w.link == "gpu"
    few = chain.weakest(_chain(storage=None, loader=None, demand=400))
    assert few.link is None and "too few links" in few.message


def test_weakest_link_finding_only_when_it_matters():
    links = _chain(storage=1000, loader=100, demand=400)
    (f,) = chain.advise(links, chain.weakest(links))
    assert f.id == "doctor.weakest-link" and f.severity is Severity.CRITICAL
    assert f.gain == Gain(GainKind.THROUGHPUT, 4.0, f.gain.basis)
    links = _chain(storage=1000, loader=300, demand=400)
    assert chain.advise(links, chain.weakest(links))[0].severity is Severity.WARNING
    fed = _chain(storage=1000, loader=800, demand=400)
    assert chain.advise(fed, chain.weakest(fed)) == ()


def test_reweigh_caps_a_stage_gain_at_what_training_gets():
    links = _chain(storage=8000, loader=600, demand=400, padding_fixed=800)
    big = Finding("io.small-files", Severity.CRITICAL, "t", gain=Gain(GainKind.THROUGHPUT, 15.8))
    pad = Finding("pad.waste", Severity.CRITICAL, "t", gain=Gain(GainKind.THROUGHPUT, 2.0))
    env = Finding("env.x", Severity.WARNING, "t")
    io_f, pad_f, env_f = chain.reweigh(
        [
            Finding(**{**big.__dict__, "stage": "io"}),
            Finding(**{**pad.__dict__, "stage": "pad"}),
            Finding(**{**env.__dict__, "stage": "env"}),
        ],
        links,
    )
    assert io_f.gain.value == 1.0 and "already delivers more" in io_f.gain.basis
    # True of storage, but buys this workload nothing: info here, and says so.
    assert io_f.severity is Severity.INFO and "critical for storage alone" in io_f.gain.basis
    # The GPU step is the limit: half the padding, 1.5x, until the loader at 600.
    assert pad_f.severity is Severity.CRITICAL
    assert pad_f.gain.value == 1.5 and "then loader limits it" in pad_f.gain.basis
    assert env_f.gain is None
    # With the loader below the GPU's rate, padding buys nothing yet.
    starved = _chain(storage=8000, loader=300, demand=400, padding_fixed=800)
    (p,) = chain.reweigh([Finding(**{**pad.__dict__, "stage": "pad"})], starved)
    assert p.gain.value == 1.0 and p.severity is Severity.INFO
    assert "buys nothing until loader is fixed" in p.gain.basis
    assert chain.headroom(links, "pcie") is None


def test_link_and_doctor_report_round_trip_and_other_reports_are_unchanged():
    link = Link("loader", 800.0, 400.0, "b", None, {"reading": 2000.0, "cpu": 800.0}, "cpu")
    d = link.to_dict()
    assert d["capacity_samples_per_s"] == 800.0 and d["demand_samples_per_s"] == 400.0
    assert Link.from_dict(json.loads(json.dumps(d))) == link
    report = Report(
        "doctor",
        {},
        chain=(link, Link("pcie", None, 400.0, reason="no CUDA device")),
        weakest_link="loader",
        workload=Workload().to_dict(),
        nodes=(Node(0, "a", {"loader": 800.0}, 800.0),),
    )
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert again.to_dict()["chain"][1]["reason"] == "no CUDA device"
    plain = Report("env", {}).to_dict()
    assert not {"chain", "workload", "nodes"} & plain.keys()


def test_stragglers_below_80_percent_of_the_median():
    assert stragglers.below_median({0: 1000.0, 1: 100.0}) == (550.0, [1])
    assert stragglers.below_median({0: 1000.0, 1: 1000.0, 2: 790.0}) == (1000.0, [2])
    assert stragglers.below_median({0: 1000.0, 1: 1000.0, 2: 800.0}) == (1000.0, [])  # exactly 80%
    assert stragglers.below_median({0: 1000.0, 1: None, 2: 950.0}) == (975.0, [])
    assert stragglers.below_median({0: 1000.0}) == (None, [])


def _payload(rank: int, storage: float | None, loader: float | None) -> dict:
    links = [Link("storage", storage, 400.0), Link("loader", loader, 400.0)]
    return {"rank": rank, "host": f"node{rank}", "report": {"chain": [x.to_dict() for x in links]}}


def test_judge_marks_the_straggler_with_severity_by_demand():
    table, (f,) = stragglers.among_nodes(
        [_payload(1, 5000.0, 300.0), _payload(0, 5000.0, 3000.0)], 400.0
    )
    assert [r.rank for r in table] == [0, 1]
    assert table[1].straggler and not table[0].straggler
    assert table[1].data_pipeline_samples_per_s == 300.0
    assert f.id == "doctor.straggler" and f.severity is Severity.CRITICAL
    assert "Rank 1 on node1" in f.title and f.gain.value == pytest.approx(400 / 300, abs=1e-3)
    _, (g,) = stragglers.among_nodes(
        [_payload(0, 5000.0, 3000.0), _payload(1, 5000.0, 1000.0)], 400.0
    )
    assert g.severity is Severity.WARNING and g.gain is None
    assert stragglers.data_pipeline({"storage": None, "loader": 7.0, "gpu": 1.0}) == 7.0


def test_rank_environment_and_the_slow_ranks_hook():
    assert from_environ({}) is None
    r = from_environ({"RANK": "1", "WORLD_SIZE": "2"})
    assert (r.rank, r.world) == (1, 2)
    for bad in ({"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}):
        with pytest.raises(UsageError, match="RANK"):
            from_environ(bad)
    env = {"STARVECHECK_SLOW_RANKS": "1,3:20"}
    assert (slow_ms(env, 1), slow_ms(env, 3), slow_ms(env, 0)) == (20.0, 20.0, 0.0)
    assert slow_ms({}, 1) == 0.0
    for bad in ("1", "1:", ":5", "a:5", "1:-5", "1:nan", "-1:5"):
        with pytest.raises(UsageError, match="STARVECHECK_SLOW_RANKS"):
            slow_ms({"STARVECHECK_SLOW_RANKS": bad}, 1)
