"""attach read from hand-built py-spy output (spy.parse_raw): the training loop found in
whichever thread runs it, a loop with no DataLoader's fetch counted as its wait, workers
counted by identity across an epoch, and no verdict without the evidence for one (too
few samples, no loop, no data path, a job stopped in the window)."""

from __future__ import annotations

from starvecheck.advice.attach import rules
from starvecheck.advice.results import Results
from starvecheck.core.metric import value
from starvecheck.core.model import Severity, StageResult
from starvecheck.core.schema.attach import Parameters as AttachParameters
from starvecheck.stages.attach.readings import Fate, follow
from starvecheck.stages.attach.spy import parse_raw
from starvecheck.stages.attach.stage import read_stacks
from starvecheck.stages.attach.target import Process
from starvecheck.stages.attach.threads import loop_thread

SITE = "/venv/lib/python3.11/site-packages/"
DL = f"_BaseDataLoaderIter.__next__ ({SITE}torch/utils/data/dataloader.py:733)"
GET = "Queue.get (/usr/lib/python3.11/multiprocessing/queues.py:113)"
FWD = f"Module._call_impl ({SITE}torch/nn/modules/module.py:1747)"
BWD = f"Tensor.backward ({SITE}torch/_tensor.py:626)"
OPT = f"AdamW.step ({SITE}torch/optim/adamw.py:200)"
JOIN = "Thread.join (/usr/lib/python3.11/threading.py:1119)"
PID = 100


def line(tid: int, name: str, frames: list[str], n: int, pid: int = PID) -> str:
    return f'process {pid}:"python train.py";thread ({tid}): {name};' + ";".join(frames) + f" {n}"


def stage(raw: str, **rank: object) -> StageResult:
    proc = Process(PID, "python train.py")
    figures, workers, top, info = read_stacks(proc, parse_raw(raw), lambda f, n: None)
    metrics = list(figures.metrics())
    params = {
        "pid": PID,
        "ranks": [{**info.to_dict(), "workers": workers, **rank}],
        "seconds": 8.0,
        "other_frames": {str(PID): top} if top else {},
        "effective_cpus": 2,
    }
    return StageResult("attach", params, tuple(metrics))


def judged(r: StageResult) -> dict[str, object]:
    return {f.id: f for f in rules(Results({"attach": r}))}


def ray_style(wait: int, step: int) -> str:
    """Ray Train's shape: the main thread in join(), the loop in a thread of its own."""
    loop = "train_func (/job/train.py:30)"
    return "\n".join([
        line(PID, "MainThread", ["<module> (/job/train.py:50)", JOIN], wait + step),
        line(PID + 1, "train", ["Thread.run (threading.py:975)", loop, DL, GET], wait),
        line(PID + 1, "train", ["Thread.run (threading.py:975)", loop, FWD], step // 2),
        line(PID + 1, "train", ["Thread.run (threading.py:975)", loop, BWD], step - step // 2),
        line(PID + 2, "pin", ["_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:50)",
                              GET], wait + step),
    ])  # fmt: skip


def test_a_loop_run_in_a_thread_is_read_there_and_named():
    s = parse_raw(ray_style(300, 100))
    assert loop_thread(s, PID) == ((PID, PID + 1), True)
    r = stage(ray_style(300, 100))
    assert r.parameters.read(AttachParameters).ranks[0].thread == "train"
    assert value(r.metrics, quantity="main_share", kind="data") == 0.75
    f = judged(r)["attach.data-wait"]
    assert f.severity is Severity.CRITICAL and "'train'" in f.evidence
    assert "75% (71-79%, 400 samples)" in f.evidence


def test_the_main_thread_where_no_thread_runs_a_loop():
    raw = line(PID, "MainThread", ["<module> (/job/x.py:5)", "sleep (time:1)"], 400)
    raw += "\n" + line(PID + 5, "Thread-1", ["run (/job/x.py:9)"], 400)
    assert loop_thread(parse_raw(raw), PID) == ((PID, PID), False)
    f = judged(stage(raw))["attach.data-wait"]
    assert f.severity is Severity.INFO and "no thread's samples show a training loop" in f.title


def nanogpt(fetch: int, step: int, fetch_frames: list[str] | None = None) -> str:
    loop = "<module> (/job/train.py:300)"
    frames = fetch_frames or [
        "get_batch (/job/train.py:116)",
        f"memmap.__new__ ({SITE}numpy/_core/memmap.py:268)",
    ]
    return "\n".join([
        line(PID, "MainThread", [loop, *frames], fetch),
        line(PID, "MainThread", [loop, FWD, "GPT.forward (/job/model.py:170)"], step // 2),
        line(PID, "MainThread", [loop, BWD], step // 4),
        line(PID, "MainThread", [loop, OPT], step - step // 2 - step // 4),
    ])  # fmt: skip


def test_a_get_batch_between_steps_is_the_wait_for_data_and_named():
    r = stage(nanogpt(40, 360))
    assert r.parameters.read(AttachParameters).ranks[0].data_path == "get_batch (train.py)"
    assert value(r.metrics, quantity="main_share", kind="data") == 0.1
    assert value(r.metrics, quantity="main_loading_share", kind="read") == 0.1
    f = judged(r)["attach.data-wait"]
    assert f.severity is Severity.WARNING, f
    assert "get_batch (train.py)" in f.evidence


def test_a_generator_named_for_data_is_a_fetch_and_unknown_work_is_not():
    gen = nanogpt(120, 280, ["batches (/job/train.py:20)", "shuffle (/job/train.py:12)"])
    assert stage(gen).parameters["ranks"][0]["data_path"] == "batches (train.py)"
    odd = stage(nanogpt(120, 280, ["log_metrics (/job/train.py:80)"]))
    assert odd.parameters.read(AttachParameters).ranks[0].data_path is None
    f = judged(odd)["attach.data-wait"]
    # never "Passed": the data path is unknown, and said to be
    assert f.severity is Severity.INFO and "data path could not be identified" in f.title


def test_too_few_samples_give_no_verdict_and_say_what_would():
    few = judged(stage(ray_style(1, 7)))["attach.data-wait"]  # 1 of 8: 2-47%
    assert few.severity is Severity.INFO and "too few samples (8)" in few.title
    assert "--duration" in few.recommendation
    assert "attach.loader-bound" not in judged(stage(ray_style(1, 7)))
    # 0 of 8 is not "Passed" either: it could be 32%
    assert judged(stage(ray_style(0, 8)))["attach.data-wait"].severity is Severity.INFO
    # with enough samples the same shares are judged
    assert judged(stage(ray_style(2, 398)))["attach.data-wait"].severity is Severity.OK
    # at 12%, 400 samples prove input-bound but not highly (9-16%)
    assert judged(stage(ray_style(48, 352)))["attach.data-wait"].severity is Severity.WARNING


def test_a_stopped_job_gets_no_verdict():
    r = stage(ray_style(400, 0), stopped_s=5.0)
    f = judged(r)["attach.data-wait"]
    assert f.severity is Severity.INFO and "stopped" in f.title
    assert "attach.loader-bound" not in judged(r)


def test_a_rank_that_ended_is_judged_without_a_worker_count():
    f = judged(stage(ray_style(300, 100), ended="exited", ended_at_s=3.0))
    assert f["attach.data-wait"].severity is Severity.CRITICAL
    assert "attach.loader-bound" not in f


def test_a_ranks_life_stopped_then_ended():
    from starvecheck.probe.life import Life

    first = Life("S", 1000, "/usr/bin/python3.11", "python train.py")
    fate = Fate()
    follow(fate, first, Life("T", 1000, first.exe, first.cmdline), 1.0, 1.0)
    follow(fate, first, Life("t", 1000, first.exe, first.cmdline), 1.0, 2.0)
    follow(fate, first, Life("R", 1000, first.exe, first.cmdline), 1.0, 3.0)
    assert fate.stopped_s == 2.0 and fate.ended is None
    follow(fate, first, Life("R", 1000, "/usr/bin/bash", "bash"), 1.0, 4.0)
    assert (fate.ended, fate.at_s) == ("exec'd", 4.0)
    gone = Fate()
    follow(gone, first, None, 1.0, 3.0)
    assert gone.ended == "exited"
    zombie = Fate()
    follow(zombie, first, Life("Z", 1000, None, None), 1.0, 2.0)
    assert zombie.ended == "exited"


def test_the_table_shows_each_share_with_its_interval_and_samples():
    from starvecheck.core.schema.attachfigures import AttachFigures
    from starvecheck.render.attach import split

    r = stage(ray_style(300, 100))
    rows, _ = split(r.records(AttachFigures))
    assert ("PID 100", "training loop", "data", "75.0% (71-79%, 400)") in rows


def test_a_fetch_that_stacks_tensors_is_still_the_fetch_and_a_train_batch_is_not():
    it = f"Tensor.__iter__ ({SITE}torch/_tensor.py:1215)"
    r = stage(nanogpt(100, 300, ["get_batch (/job/train.py:116)", it]))
    assert value(r.metrics, quantity="main_share", kind="data") == 0.25
    # a function named for batches that runs the model is the step, not a fetch
    raw = "\n".join([
        line(PID, "MainThread", ["<module> (/job/t.py:9)", "train_batch (/job/t.py:3)", FWD], 300),
        line(PID, "MainThread", ["<module> (/job/t.py:9)", "train_batch (/job/t.py:4)"], 100),
        line(PID, "MainThread", ["<module> (/job/t.py:9)", FWD], 10),
    ])  # fmt: skip
    assert stage(raw).parameters.read(AttachParameters).ranks[0].data_path is None


def test_ranks_each_with_their_interval_and_one_without_a_verdict():
    def rank_of(pid: int, wait: int, step: int, rank: int) -> tuple[list, dict]:
        raw = "\n".join([
            line(pid, "MainThread", ["<module> (/job/t.py:9)", DL, GET], wait, pid=pid),
            line(pid, "MainThread", ["<module> (/job/t.py:9)", FWD], step, pid=pid),
        ])  # fmt: skip
        figures, workers, _, info = read_stacks(Process(pid, "t", rank), parse_raw(raw),
                                                lambda f, n: None)  # fmt: skip
        return list(figures.metrics()), {**info.to_dict(), "rank": rank, "workers": workers}

    (m0, p0), (m1, p1), (m2, p2) = (
        rank_of(1, 40, 360, 0),
        rank_of(2, 200, 200, 1),
        rank_of(3, 1, 7, 2),
    )
    params = {"pid": 1, "ranks": [p0, p1, p2], "seconds": 8.0, "other_frames": {},
              "effective_cpus": 2}  # fmt: skip
    f = judged(StageResult("attach", params, tuple(m0 + m1 + m2)))
    assert "PID 2 (rank 1): 50% (45-55%, 400 samples)" in f["attach.straggler"].evidence
    assert "PID 3 (rank 2)" in f["attach.no-verdict"].title, f["attach.no-verdict"]
    assert "too few samples (8)" in f["attach.no-verdict"].title


def test_no_straggler_from_a_gap_the_samples_cannot_tell():
    def rank_of(pid: int, wait: int, step: int) -> tuple[list, dict]:
        raw = "\n".join([
            line(pid, "MainThread", ["<module> (/job/t.py:9)", DL, GET], wait, pid=pid),
            line(pid, "MainThread", ["<module> (/job/t.py:9)", FWD], step, pid=pid),
        ])  # fmt: skip
        figures, workers, _, info = read_stacks(Process(pid, "t", pid), parse_raw(raw),
                                                lambda f, n: None)  # fmt: skip
        return list(figures.metrics()), {**info.to_dict(), "rank": pid, "workers": workers}

    def straggler(*ranks: tuple[list, dict]) -> bool:
        params = {"pid": 1, "ranks": [p for _, p in ranks], "seconds": 8.0,
                  "other_frames": {}, "effective_cpus": 2}  # fmt: skip
        metrics = tuple(m for got, _ in ranks for m in got)
        return "attach.straggler" in judged(StageResult("attach", params, metrics))

    # 12 points apart: told apart at 400 samples each, not at 40
    assert straggler(rank_of(1, 120, 280), rank_of(2, 72, 328))
    assert not straggler(rank_of(1, 12, 28), rank_of(2, 7, 33))


def test_a_fast_dataloader_never_caught_waiting_is_still_a_dataloader():
    # the loop is never sampled in the DataLoader, but its pin-memory thread is: the
    # data path is known and the loop passes, rather than "could not be identified"
    pin = f"_pin_memory_loop ({SITE}torch/utils/data/_utils/pin_memory.py:50)"
    raw = "\n".join([
        line(PID, "MainThread", ["<module> (/job/t.py:9)", FWD], 300),
        line(PID, "MainThread", ["<module> (/job/t.py:9)", BWD], 100),
        line(PID + 3, "pin", [pin, GET], 400),
    ])  # fmt: skip
    r = stage(raw)
    assert r.parameters.read(AttachParameters).ranks[0].data_path == "DataLoader"
    assert judged(r)["attach.data-wait"].severity is Severity.OK


def test_a_loop_whose_samples_never_waited_still_has_its_data_share():
    """pytorch/examples' imagenet/main.py under load: its one worker decodes, the loop
    is in its step in every sample. The data-wait share is there, 0 with its interval
    (as every share), not left out of the JSON."""
    worker = "_worker_loop (" + SITE + "torch/utils/data/_utils/worker.py:300)"
    decode = "ImageFile.load (" + SITE + "PIL/ImageFile.py:280)"
    raw = "\n".join([
        line(PID, "MainThread", ["<module> (/job/main.py:600)", FWD], 40),
        line(PID, "MainThread", ["<module> (/job/main.py:600)", BWD], 23),
        line(PID + 7, "MainThread", ["<module> (/job/main.py:600)", worker, decode], 63,
             pid=PID + 7),
    ])  # fmt: skip
    r = stage(raw)
    data = [m for m in r.metrics if m.labels.get("quantity") == "main_share"
            and m.labels.get("kind") == "data"]  # fmt: skip
    assert len(data) == 1 and data[0].value == 0.0
    assert data[0].labels["samples"] == 63 and 0.0 < data[0].labels["high95"] < 0.1
