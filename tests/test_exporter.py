"""watch's Prometheus exporter (loop/exporter.py, families.py, identity.py): the families
a scrape yields from a loop's figures, the labels that join with DCGM's, the port from
the environment under torchrun, and nothing ever raised into the loop (a port taken, a
closed exporter, a scrape that fails, a scrape while the loop ends)."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from starvecheck.loop import exporter as exporter_module
from starvecheck.loop import httpd
from starvecheck.loop.exporter import Exporter, wanted
from starvecheck.loop.families import Advice, Tally, families
from starvecheck.loop.identity import job_name, labels, physical_gpu
from starvecheck.loop.options import WatchOptions
from starvecheck.loop.timer import Watch
from starvecheck.loop.times import LoopTimes
from starvecheck.loop.trainers.hooks import Hooked

LABELS = {"job": "j", "Hostname": "h", "rank": "1", "local_rank": "1"}


@pytest.fixture(autouse=True)
def _fresh_pages(monkeypatch):
    """These tests read the figures a few steps apart, faster than the page is cached
    for; the cache has its own test (test_exporter_guest.py)."""
    monkeypatch.setattr(httpd, "PAGE_TTL_S", 0.0)


def scrape(port: int) -> dict[str, dict]:
    """The exporter's families as Prometheus reads them: name -> {labels: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(scraped: dict[str, dict], name: str) -> float:
    (value,) = scraped[name].values()
    return value


def made(waits_ms, computes_ms, **kw) -> LoopTimes:
    return LoopTimes(
        waits=[x / 1e3 for x in waits_ms], computes=[x / 1e3 for x in computes_ms], **kw
    )


def by_name(tally: Tally, advice: Advice | None = None) -> dict:
    return {f.name: f for f in families(tally, LABELS, advice or Advice())}


def test_the_counters_are_watchs_figures_and_their_ratio_its_share():
    t = made([500, 10, 30, 10], [20, 20, 20, 20])
    tally = Tally()
    tally.update(t)
    f = by_name(tally)
    # the first step (500 ms) is the warm-up, left out as watch leaves it out
    assert f["starvecheck_data_wait_seconds"].samples[0].value == pytest.approx(0.050)
    assert f["starvecheck_step_seconds"].samples[0].value == pytest.approx(0.110)
    assert f["starvecheck_batches"].samples[0].value == 4
    share = next(m for m in t.metrics() if m.labels["quantity"] == "data_wait_share").value
    assert f["starvecheck_data_wait_ratio"].samples[0].value == pytest.approx(share)
    assert f["starvecheck_data_wait_seconds"].samples[0].labels == LABELS


def test_a_second_scrape_adds_only_the_steps_completed_since():
    t = made([5, 10], [20, 20])
    tally = Tally()
    tally.update(t)
    t.waits.append(0.030)  # a wait whose step has not completed: not counted yet
    tally.update(t)
    assert tally.wait_s == pytest.approx(0.010) and tally.counted == 2
    t.computes.append(0.020)
    tally.update(t)
    tally.update(t)  # nothing new: nothing added twice
    assert tally.wait_s == pytest.approx(0.040) and tally.step_s == pytest.approx(0.080)
    assert tally.waits.counts[tally.waits.bounds.index(0.01)] == 1  # 10 ms: le 0.01
    assert tally.waits.counts[tally.waits.bounds.index(0.05)] == 1  # 30 ms


def test_the_wait_by_stage_is_a_counter_a_stage_counted_once_settled():
    from starvecheck.core.schema.loading import LoadStage
    from starvecheck.loading.split import INDEX, STAGES

    t = made([500, 10, 30, 10, 20], [20, 20, 20, 20, 20], num_workers=1)

    def split(read: float, handover: float) -> list[float]:
        out = [0.0] * len(STAGES)
        out[INDEX[LoadStage.READ]], out[INDEX[LoadStage.HANDOVER]] = read, handover
        return out

    for step, (read, hand) in enumerate([(0.4, 0.1), (0.008, 0.002), (0.03, 0.0)]):
        t.split.put(step, split(read, hand), split(read, hand))
    tally = Tally()
    tally.update(t)
    # steps 1 and 2 are settled (a step a worker behind the 5 completed), the first left
    # out as the wait counters leave it out
    assert tally.exposed_s[INDEX[LoadStage.READ]] == pytest.approx(0.038)
    t.split.put(3, split(0.01, 0.0), split(0.01, 0.0))
    t.split.put(4, split(0.015, 0.005), split(0.015, 0.005))
    t.waits.append(0.001)
    t.computes.append(0.001)  # a sixth step: the fourth settles
    tally.update(t)
    f = by_name(tally)
    exposed = {
        s.labels["stage"]: s.value for s in f["starvecheck_data_wait_exposed_seconds"].samples
    }
    assert exposed["read"] == pytest.approx(0.048)
    assert exposed["handover"] == pytest.approx(0.002)
    assert set(exposed) == {s.value for s in STAGES}
    busy = {s.labels["stage"]: s.value for s in f["starvecheck_loading_busy_seconds"].samples}
    assert busy["read"] == pytest.approx(0.463)  # every batch's, the first too
    assert "starvecheck_data_wait_exposed_seconds" not in by_name(Tally())  # none: absent


def test_the_wait_histogram_has_cumulative_buckets_from_1_ms_to_10_s():
    t = made([1, 0.5, 1, 3, 20000], [1] * 5)
    tally = Tally()
    tally.update(t)
    buckets = dict(tally.waits.cumulative())
    assert buckets["0.001"] == 2 and buckets["0.005"] == 3
    assert buckets["10.0"] == 3 and buckets["+Inf"] == 4  # 20 s is past the last bound
    assert tally.waits.bounds[0] == 0.001 and tally.waits.bounds[-1] == 10.0


def test_time_to_first_batch_per_pass_and_per_worker():
    # Two passes of 4 steps with 2 workers: worker k's first batch arrives after the
    # waits and steps of the batches dealt before it.
    t = made([900, 100, 5, 5, 800, 50, 5, 5], [10] * 8, num_workers=2)
    tally = Tally(pass_starts=[0, 4])
    tally.update(t)
    assert tally.first.total == pytest.approx(1.7) and sum(tally.first.counts) == 2
    assert tally.workers[0].total == pytest.approx(0.9 + 0.8)
    assert tally.workers[1].total == pytest.approx((0.9 + 0.01 + 0.1) + (0.8 + 0.01 + 0.05))
    f = by_name(tally)
    workers = {s.labels["worker"] for s in f["starvecheck_worker_first_batch_seconds"].samples}
    assert workers == {"0", "1"}


def test_the_recommendation_and_the_weakest_link_are_gauges():
    f = by_name(Tally(), Advice(0, 3, 1.8, 1.6, 2.0, "data loading"))
    assert f["starvecheck_recommended_num_workers"].samples[0].value == 3
    assert f["starvecheck_predicted_speedup_low"].samples[0].value == 1.6
    assert f["starvecheck_predicted_speedup_high"].samples[0].value == 2.0
    assert f["starvecheck_weakest_link"].samples[0].labels["link"] == "data loading"
    assert "starvecheck_predicted_speedup" in by_name(Tally(), Advice(0, 3, 1.8))
    assert "starvecheck_recommended_num_workers" not in by_name(Tally())  # none: absent


def test_a_new_loop_on_the_same_exporter_keeps_the_counters_going_up():
    e = Exporter(set())
    first = made([100, 10, 10], [10, 10, 10])
    e.follow(first, set())
    e.tally.update(first)
    second = made([300, 20, 20], [10, 10, 10])
    e.follow(second, set())
    e.tally.update(second)
    assert e.tally.wait_s == pytest.approx(0.060)  # each loop's first step left out
    assert e.tally.batches == 6


def test_the_port_comes_from_the_environment_offset_by_the_local_rank():
    env = {"STARVECHECK_PROMETHEUS_PORT": "9500", "LOCAL_RANK": "3"}
    assert wanted(None, None, env) == (9503, "127.0.0.1")
    assert wanted(9400, "0.0.0.0", env) == (9403, "0.0.0.0")  # the option's too
    assert wanted(None, None, env | {"STARVECHECK_PROMETHEUS_ADDR": "::"}) == (9503, "::")
    assert wanted(0, None, env) == (0, "127.0.0.1")  # any free port: no offset
    assert wanted(None, None, {}) is None
    with pytest.raises(ValueError, match="STARVECHECK_PROMETHEUS_PORT='x'"):
        wanted(None, None, {"STARVECHECK_PROMETHEUS_PORT": "x"})
    with pytest.raises(ValueError, match="0-65535"):
        wanted(65535, None, {"LOCAL_RANK": "1"})


@pytest.mark.parametrize("port", [-1, 70000, "9400", True, 1.5])
def test_watch_refuses_a_port_that_is_not_one(port):
    with pytest.raises(ValueError, match="prometheus must be a TCP port"):
        WatchOptions(prometheus=port)


def test_labels_name_the_job_host_rank_and_what_kubernetes_and_slurm_say(tmp_path):
    ns = tmp_path / "namespace"
    ns.write_text("research\n")
    env = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "HOSTNAME": "train-0",
        "SLURM_JOB_ID": "123",
        "SLURM_STEP_ID": "0",
        "STARVECHECK_JOB": "llama",
    }
    got = labels(env, hostname="node7", argv0="train.py", namespace_file=ns)
    assert got == {
        "job": "llama",
        "Hostname": "node7",
        "rank": "5",
        "local_rank": "1",
        "pod": "train-0",
        "namespace": "research",
        "slurm_job_id": "123",
        "slurm_step_id": "0",
    }
    bare = labels({}, rank=2, hostname="h", argv0="/x/train.py", namespace_file=ns)
    assert bare == {"job": "train", "Hostname": "h", "rank": "2", "local_rank": "0"}
    assert job_name({"TORCHELASTIC_RUN_ID": "none"}, "a.py") == "a"  # torchrun's default


def test_the_gpu_label_is_the_machines_index_as_dcgm_numbers_it():
    assert physical_gpu(1, "4,6") == "6"
    assert physical_gpu(0, None) == "0"
    assert physical_gpu(0, "GPU-abc") == "0"  # UUIDs: torch's index (the UUID label joins)


def served(**kw) -> Watch:
    w = Watch(range(20), show=False, prometheus=0, **kw)
    assert w.exporter is not None
    return w


def test_a_watch_serves_its_figures_on_a_private_registry():
    from prometheus_client import REGISTRY

    w = served()
    try:
        assert scrape(w.exporter.port) == {}  # nothing before the first pass
        for _ in w:
            pass
        got = scrape(w.exporter.port)
        assert one(got, "starvecheck_batches_total") == 20
        assert one(got, "starvecheck_data_wait_step_seconds_count") == 19
        assert REGISTRY.get_sample_value("starvecheck_batches_total") is None
    finally:
        w.exporter.close()


def test_a_port_already_taken_is_one_warning_and_the_loop_goes_on(capfd):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        w = Watch(range(5), show=False, prometheus=port)
        assert list(w) == list(range(5))
    err = capfd.readouterr().err
    assert w.exporter is None
    assert err.count("\n") == 1 and "could not export to Prometheus (OSError" in err


def test_a_closed_exporter_is_one_warning_and_the_loop_goes_on(capfd):
    w = served()
    w.exporter.close()
    w.exporter.close()
    for _ in range(2):
        assert list(w) == list(range(20))
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "was closed" in err


def test_a_scrape_that_fails_is_one_warning_and_no_exception(capfd, monkeypatch):
    def broken(*a):
        raise RuntimeError("boom")

    w = served()
    try:
        list(w)
        monkeypatch.setattr(exporter_module, "families", broken)
        for _ in range(3):
            assert scrape(w.exporter.port) == {}
        list(w)
    finally:
        w.exporter.close()
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "(RuntimeError: boom)" in err


def test_scrapes_while_the_loop_ends_never_reach_it(capfd):
    w = Watch(range(3000), show=False, prometheus=0)
    got: list[int] = []
    stop = threading.Event()

    def scraping() -> None:
        while not stop.is_set():
            got.append(len(scrape(w.exporter.port)))

    thread = threading.Thread(target=scraping)
    try:
        list(w)  # first pass: labels set, scrapes see families from here
        thread.start()
        passes = 0
        while len(got) < 5 and passes < 500:  # passes end and begin while it scrapes
            for i in w:
                if i == 1500:
                    break  # a loop stopped inside a step
            passes += 1
        stop.set()
        thread.join(30)
        assert len(got) >= 5 and all(got)
        assert one(scrape(w.exporter.port), "starvecheck_batches_total") > 3000
    finally:
        stop.set()
        w.exporter.close()
    assert capfd.readouterr().err == ""


def test_the_trainer_callbacks_pass_the_port_through():
    h = Hooked(prometheus=0)
    try:
        assert h.watch.exporter is not None and h.watch.exporter.port
        h.watch.begin_step()
        h.watch.end_step()
        h.watch.begin_step()
        h.watch.end_step()
        assert one(scrape(h.watch.exporter.port), "starvecheck_batches_total") == 2
    finally:
        h.watch.exporter.close()


def test_no_port_and_no_variable_no_exporter(monkeypatch):
    monkeypatch.delenv("STARVECHECK_PROMETHEUS_PORT", raising=False)
    assert Watch(range(3), show=False).exporter is None


def single_process(wait_ms: float, n: int = 200) -> LoopTimes:
    return LoopTimes(
        waits=[wait_ms / 1e3] * n,
        computes=[0.010] * n,
        wait_cpu=[wait_ms / 1e3] * n,
        compute_cpu=[0.010] * n,
        passes=1,
        num_workers=0,
        iterator="_SingleProcessDataLoaderIter",
    )


def test_the_live_advice_is_watchs_judgement_of_the_figures_so_far():
    from starvecheck.loop.live import DATA, STEP, advice

    starved = advice(single_process(10.0))
    assert starved.num_workers == 0 and starved.link == DATA
    assert isinstance(starved.recommended, int) and starved.recommended >= 1
    fed = advice(single_process(0.01))
    assert fed.link == STEP and fed.recommended is None and fed.speedup is None


def test_the_live_advice_reads_the_last_steps_only():
    from starvecheck.loop.live import snapshot

    t = made([1, 2, 3, 4, 5], [1, 1, 1, 1])  # the fifth batch's step not completed
    s = snapshot(t, window=2)
    assert list(s.waits) == [0.003, 0.004] and list(s.computes) == [0.001, 0.001]
    assert s.offset == 2 and s.steps == 4
    assert s.waits is not t.waits  # the loop's arrays go on without it


def test_a_scrape_carries_the_recommendation_and_the_weakest_link():
    w = served()
    try:
        w.exporter.follow(single_process(10.0), set())
        w.exporter.new_pass(None)
        got = scrape(w.exporter.port)
        assert one(got, "starvecheck_recommended_num_workers") >= 1
        assert one(got, "starvecheck_num_workers") == 0
        (link,) = got["starvecheck_weakest_link"]
        assert dict(link)["link"] == "data loading"
    finally:
        w.exporter.close()
