"""attach's split of the loop's wait over the stages of loading (stages/attach/classify.py's
rules for start-up, pinning and the pin-memory thread; stages/attach/waitsplit.py), read
from hand-built py-spy speedscope output: each thread's samples in the order taken."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from starvecheck.core.metric import one, select
from starvecheck.core.schema.attach import Loading
from starvecheck.core.schema.loading import EXPOSED_SHARE, LoadStage
from starvecheck.stages.attach import classify as c
from starvecheck.stages.attach import waitsplit
from starvecheck.stages.attach.shares import read_stacks
from starvecheck.stages.attach.spy import parse_speedscope
from starvecheck.stages.attach.target import Process

SITE = "/venv/lib/python3.11/site-packages/"
DLP = f"{SITE}torch/utils/data/dataloader.py"
MP = "/usr/lib/python3.11/multiprocessing/"
PID = 100

# frames as (function, file)
LOOP = ("<module>", "/job/train.py")
NEXT = ("_BaseDataLoaderIter.__next__", DLP)
NEXT_DATA = ("_MultiProcessingDataLoaderIter._next_data", DLP)
GET_DATA = ("_MultiProcessingDataLoaderIter._get_data", DLP)
MPGET = ("Queue.get", f"{MP}queues.py")
POLL = ("Connection.poll", f"{MP}connection.py")
SELECT = ("BaseSelector.select", "/usr/lib/python3.11/selectors.py")
RECV = ("Connection.recv_bytes", f"{MP}connection.py")
FWD = ("Module._call_impl", f"{SITE}torch/nn/modules/module.py")
WAIT = [LOOP, NEXT, NEXT_DATA, GET_DATA, MPGET, POLL, SELECT]  # on the queue, for a worker
TAKE = [LOOP, NEXT, NEXT_DATA, GET_DATA, MPGET, RECV]  # receiving a batch
STEP = [LOOP, FWD]
WLOOP = ("_worker_loop", f"{SITE}torch/utils/data/_utils/worker.py")
FORKED = [("_bootstrap", f"{MP}process.py"), ("run", f"{MP}process.py"), WLOOP]
FETCH = ("_MapDatasetFetcher.fetch", f"{SITE}torch/utils/data/_utils/fetch.py")
W_READ = [*FORKED, FETCH, ("Shards.__getitem__", "/job/data.py"), ("TarFile.next", "tarfile.py")]
W_DECODE = [*FORKED, FETCH, ("Shards.__getitem__", "/job/data.py"), ("Image.open", "PIL/Image.py")]
W_COLLATE = [*FORKED, FETCH, ("default_collate", f"{SITE}torch/utils/data/_utils/collate.py")]
W_IDLE = [*FORKED, MPGET, POLL, SELECT]
PIN = f"{SITE}torch/utils/data/_utils/pin_memory.py"
PIN_LOOP = [("Thread._bootstrap", "threading.py"), ("_pin_memory_loop", PIN), ("do_one_step", PIN)]
P_PIN = [*PIN_LOOP, ("pin_memory", PIN)]
P_RECV = [*PIN_LOOP, MPGET, RECV]
P_WAIT = [*PIN_LOOP, MPGET, POLL, SELECT]


def f(*pairs: tuple[str, str]) -> list[c.Frame]:
    return [c.Frame(fn, file, 1) for fn, file in pairs]


def speedscope(threads: dict[tuple[int, int, str], list[list[tuple[str, str]]]]) -> str:
    """py-spy's speedscope JSON for `threads`: (pid, tid, name) -> its samples in order,
    each a stack of (function, file), root first."""
    table: list[tuple[str, str]] = []
    profiles = []
    for (pid, tid, name), samples in threads.items():
        rows = []
        for stack in samples:
            row = []
            for frame in stack:
                if frame not in table:
                    table.append(frame)
                row.append(table.index(frame))
            rows.append(row)
        profiles.append(
            {
                "type": "sampled",
                "name": f'Process {pid} Thread {tid} "{name}"',
                "samples": rows,
                "weights": [0.05] * len(rows),
            }
        )
    frames = [{"name": n, "file": file, "line": 1} for n, file in table]
    return json.dumps({"shared": {"frames": frames}, "profiles": profiles})


def split_of(threads: dict) -> dict[str, tuple[float, float, float, bool]]:
    """{stage: (share, low, high, from_workers)} of the rank's wait, read by attach."""
    figures, *_ = read_stacks(
        Process(PID, "python train.py"),
        parse_speedscope(speedscope(threads)),
        lambda file, line: None,
    )
    return {
        p.stage.value: (p.value, p.interval.low, p.interval.high, p.from_workers)
        for p in figures.wait
    }


# --- the rules -------------------------------------------------------------------------


def test_a_pass_making_its_workers_is_startup_not_a_hand_over():
    # spawn pickles the dataset for each worker inside the loop's iter(): reduction.dump
    made = f(
        LOOP,
        ("DataLoader.__iter__", DLP),
        ("DataLoader._get_iterator", DLP),
        ("_MultiProcessingDataLoaderIter.__init__", DLP),
        ("BaseProcess.start", f"{MP}process.py"),
        ("Popen._launch", f"{MP}popen_spawn_posix.py"),
        ("dump", f"{MP}reduction.py"),
    )
    assert c.main_kind(made) == "data"
    assert c.loading_kind(c.loading_frames(made)) == Loading.STARTUP
    # the last pass's workers joined as the next begins: the loop's wait, start-up
    ended = f(
        LOOP,
        ("_MultiProcessingDataLoaderIter.__del__", DLP),
        ("_MultiProcessingDataLoaderIter._shutdown_workers", DLP),
        ("BaseProcess.join", f"{MP}process.py"),
    )
    assert c.main_kind(ended) == "data"
    assert c.loading_kind(c.loading_frames(ended)) == Loading.STARTUP


def test_pinning_waiting_on_the_pin_thread_and_a_sleep_are_named():
    single = ("_SingleProcessDataLoaderIter._next_data", DLP)
    pinning = f(LOOP, NEXT, single, ("pin_memory", PIN), ("pin_memory", PIN))
    assert c.loading_kind(c.loading_frames(pinning)) == Loading.PIN
    on_pin_thread = f(
        LOOP,
        NEXT,
        NEXT_DATA,
        GET_DATA,
        ("Queue.get", "/usr/lib/python3.11/queue.py"),
        ("Condition.wait", "/usr/lib/python3.11/threading.py"),
    )
    assert c.loading_kind(c.loading_frames(on_pin_thread)) == Loading.IDLE
    sleeping = f(LOOP, NEXT, single, FETCH, ("Slow.__getitem__", "/job/train.py"))
    src = {1: "        time.sleep(0.4)"}
    assert c.loading_kind(c.loading_frames(sleeping), lambda file, n: src.get(n)) == Loading.READ


def test_a_workers_start_is_startup_and_its_work_is_its_work():
    spawned = f(
        ("<module>", "<string>"),
        ("spawn_main", f"{MP}spawn.py"),
        ("_main", f"{MP}spawn.py"),
        ("Shards.__setstate__", "/job/data.py"),
    )
    assert c.worker_kind(spawned) == Loading.STARTUP
    init_fn = f(*FORKED, ("seed_worker", "/job/train.py"))
    assert c.worker_kind(init_fn) == Loading.STARTUP
    fetcher = f(*FORKED, ("_DatasetKind.create_fetcher", DLP))
    assert c.worker_kind(fetcher) == Loading.STARTUP
    assert c.worker_kind(f(*W_READ)) == Loading.READ
    assert c.worker_kind(f(*W_COLLATE)) == Loading.COLLATE
    assert c.worker_kind(f(*W_IDLE)) == Loading.IDLE
    feeder = f(("Thread._bootstrap", "threading.py"), ("Queue._feed", f"{MP}queues.py"))
    assert c.worker_kind(feeder) is None


def test_the_pin_memory_thread_pins_receives_or_waits():
    assert c.pin_thread_kind(f(*P_PIN)) == Loading.PIN
    assert c.pin_thread_kind(f(*P_RECV)) == Loading.HANDOVER
    assert c.pin_thread_kind(f(*P_WAIT)) == Loading.IDLE
    assert c.pin_thread_kind(f(*STEP)) is None


# --- the split -------------------------------------------------------------------------


def test_at_num_workers_0_the_loops_own_samples_say_the_stage():
    single = ("_SingleProcessDataLoaderIter._next_data", DLP)
    read = [
        LOOP,
        NEXT,
        single,
        FETCH,
        ("Shards.__getitem__", "/job/data.py"),
        ("TarFile.next", "tarfile.py"),
    ]
    decode = [LOOP, NEXT, single, FETCH, ("Image.open", "PIL/Image.py")]
    collate = [LOOP, NEXT, single, ("default_collate", f"{SITE}torch/utils/data/_utils/collate.py")]
    # each step: 6 samples reading, 3 decoding, 1 collating, 10 in the step; 20 steps
    loop = ([read] * 6 + [decode] * 3 + [collate] + [STEP] * 10) * 20
    got = split_of({(PID, PID, "MainThread"): loop})
    assert set(got) == {"read", "transform", "collate"}
    for stage, share in (("read", 0.6), ("transform", 0.3), ("collate", 0.1)):
        value, low, high, from_workers = got[stage]
        assert abs(value - share) < 1e-9 and low < share < high and not from_workers


def test_waiting_for_a_worker_is_split_by_what_the_workers_did_and_says_so():
    rng = random.Random(3)
    loop = [WAIT if rng.random() < 0.5 else STEP for _ in range(400)]
    worker = [W_READ] * 300 + [W_COLLATE] * 100  # three reads to a collate, in runs
    rng.shuffle(worker)
    got = split_of({(PID, PID, "MainThread"): loop, (201, 201, "pt_data_worker"): worker})
    assert set(got) == {"read", "collate"}
    read, collate = got["read"], got["collate"]
    assert abs(read[0] - 0.75) < 1e-9 and abs(collate[0] - 0.25) < 1e-9
    assert read[3] and collate[3]  # from the workers: the assumption, labelled
    assert read[1] < 0.75 < read[2] and collate[1] < 0.25 < collate[2]
    assert read[1] > collate[2]  # the evidence decides which is larger


def test_the_pin_threads_sample_at_the_same_tick_says_pin_or_handover():
    rng = random.Random(5)
    ticks = []
    for _ in range(300):
        r = rng.random()
        ticks.append((STEP, P_WAIT) if r < 0.4 else (WAIT, P_PIN) if r < 0.8 else (WAIT, P_RECV))
    threads = {
        (PID, PID, "MainThread"): [m for m, _ in ticks],
        (PID, PID + 1, "Thread-2"): [p for _, p in ticks],
    }
    got = split_of(threads)
    pin, handover = got["pin"], got["handover"]
    waits = sum(1 for m, _ in ticks if m is WAIT)
    pinned = sum(1 for m, p in ticks if m is WAIT and p is P_PIN)
    assert abs(pin[0] - pinned / waits) < 1e-4 and not pin[3] and not handover[3]
    assert abs(pin[0] + handover[0] - 1) < 1e-4


def test_workers_all_idle_leave_the_wait_to_the_hand_over_and_none_sampled_leave_it_unsplit():
    loop = [WAIT, WAIT, STEP, STEP] * 50
    idle = {(PID, PID, "MainThread"): loop, (201, 201, "pt_data_worker"): [W_IDLE] * 200}
    got = split_of(idle)
    assert set(got) == {"handover"} and got["handover"][0] == 1.0 and got["handover"][3]
    assert split_of({(PID, PID, "MainThread"): loop}) == {}
    # taking a batch over is the loop's own hand-over, counted with no worker at all
    got = split_of({(PID, PID, "MainThread"): [WAIT, TAKE, STEP, STEP] * 50})
    assert got["handover"][0] == 0.5 and not got["handover"][3]


def test_a_stage_in_long_runs_has_a_wider_interval_than_one_in_short_runs():
    single = ("_SingleProcessDataLoaderIter._next_data", DLP)
    read = [LOOP, NEXT, single, FETCH, ("TarFile.next", "tarfile.py")]
    decode = [LOOP, NEXT, single, FETCH, ("Image.open", "PIL/Image.py")]
    rng = random.Random(9)
    fine, bursty = [], []
    for _ in range(40):
        fine += [rng.choice([read, decode]) for _ in range(5)] + [STEP] * 5
        k = rng.choice([1, 9])  # a read of 1 or of 9 samples, then decoding
        bursty += [read] * k + [decode] * (10 - k) + [STEP] * 5
    a = split_of({(PID, PID, "MainThread"): fine})["read"]
    b = split_of({(PID, PID, "MainThread"): bursty})["read"]
    assert (b[2] - b[1]) > 1.5 * (a[2] - a[1])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(list(Loading)), max_size=80),
    st.lists(st.lists(st.sampled_from(list(Loading)), max_size=40), max_size=3),
    st.booleans(),
)
def test_property_any_kinds_give_shares_inside_their_intervals(waits, workers, ordered):
    pinning = [random.Random(len(waits)).choice([None, *Loading]) for _ in waits]
    got = waitsplit.split(waits, pinning, workers, (ordered, ordered))
    for p in got:
        assert p.stage in LoadStage and p.value is not None
        assert p.interval.low is not None and p.interval.high is not None
        assert 0 <= p.interval.low <= p.value <= p.interval.high <= 1
    assert sum(p.value or 0.0 for p in got) <= 1 + 1e-3
    # written as the JSON carries it: each labelled by its stage and its interval
    written = [p.metric({"rank": 0, "pid": 1}) for p in got]
    assert [m.labels["load_stage"] for m in select(written, quantity=EXPOSED_SHARE)] == [
        p.stage.value for p in got
    ]
    assert one(written, quantity="nonesuch") is None


# --- the finding -----------------------------------------------------------------------


def judged(threads: dict) -> dict[str, object]:
    from starvecheck.advice.attach import rules
    from starvecheck.advice.results import Results
    from starvecheck.core.model import StageResult

    proc = Process(PID, "python train.py")
    figures, workers, _, info = read_stacks(
        proc, parse_speedscope(speedscope(threads)), lambda file, line: None
    )
    metrics = list(figures.metrics())
    params = {
        "pid": PID,
        "ranks": [{**info.to_dict(), "workers": workers}],
        "seconds": 10.0,
        "other_frames": {},
        "effective_cpus": 2,
    }
    r = StageResult("attach", params, tuple(metrics))
    return {f.id: f for f in rules(Results({"attach": r}))}


def test_the_stage_the_evidence_decides_is_named_with_its_fix():
    rng = random.Random(3)
    loop = [WAIT if rng.random() < 0.5 else STEP for _ in range(400)]
    worker = [W_READ] * 300 + [W_COLLATE] * 100
    rng.shuffle(worker)
    found = judged({(PID, PID, "MainThread"): loop, (201, 201, "pt_data_worker"): worker})
    f = found["attach.load-stage"]
    assert "most of its wait for data is read (75% of it" in f.title
    assert "threads inside the dataset" in f.recommendation
    assert "not lined up" in f.evidence and "read 75%*" in f.evidence
    assert f.gain is not None and f.gain.value is None  # a worker count's gain is elsewhere
    assert "by stage" in found["attach.data-wait"].evidence


def test_workers_starting_every_pass_name_persistent_workers():
    spawned = [
        ("<module>", "<string>"),
        ("spawn_main", f"{MP}spawn.py"),
        ("_main", f"{MP}spawn.py"),
    ]
    loop = [WAIT, WAIT, STEP, STEP] * 100
    # each of five passes: 30 samples starting (a spawned worker unpickling), 6 reading
    a_pass = [spawned] * 30 + [W_READ] * 6 + [W_IDLE] * 4
    found = judged(
        {
            (PID, PID, "MainThread"): loop,
            (201, 201, "pt_data_worker"): a_pass * 5,
            (202, 202, "pt_data_worker"): a_pass[5:] * 5,
        }
    )
    f = found["attach.load-stage"]
    assert "is startup" in f.title and f.fix == {"persistent_workers": True}
    assert "persistent_workers=True" in f.recommendation
    assert f.gain is not None and 0 < (f.gain.value or 0) <= 0.5  # at most the wait's half


def test_no_stage_named_where_the_evidence_cannot_tell_or_the_data_keeps_up():
    single = ("_SingleProcessDataLoaderIter._next_data", DLP)
    read = [LOOP, NEXT, single, FETCH, ("TarFile.next", "tarfile.py")]
    decode = [LOOP, NEXT, single, FETCH, ("Image.open", "PIL/Image.py")]
    # read and decode about even, in long runs: neither interval clear of the other
    loop = ([read] * 20 + [decode] * 18 + [STEP] * 40) * 5
    assert "attach.load-stage" not in judged({(PID, PID, "MainThread"): loop})
    # a loop that hardly waits: no finding on what its wait is made of
    loop = [read] + [STEP] * 399
    found = judged({(PID, PID, "MainThread"): loop})
    assert found["attach.data-wait"].severity.value == "ok"
    assert "attach.load-stage" not in found


def test_a_wait_in_a_few_long_runs_gives_no_verdict_and_names_a_longer_window():
    # two waits of 1 and 1.5 s in 10 s at 20/s: 25%, which 200 independent samples would
    # put above 5% at once; two runs say little of the job
    loop = [STEP] * 60 + [WAIT] * 20 + [STEP] * 60 + [WAIT] * 30 + [STEP] * 30
    f = judged({(PID, PID, "MainThread"): loop})["attach.data-wait"]
    assert f.severity.value == "info" and "too few samples (200)" in f.title
    assert "the wait comes in runs" in f.evidence
    seconds = int(f.recommendation.split("--duration ")[1].split(".")[0])
    assert seconds > 10 and "a higher --rate would not" in f.recommendation


def test_the_table_shows_the_split_marked_and_what_runs_made_the_samples_worth():
    from starvecheck.core.schema.attachfigures import AttachFigures
    from starvecheck.render.attach import split

    rng = random.Random(3)
    loop = [WAIT if rng.random() < 0.5 else STEP for _ in range(400)]
    worker = [W_READ] * 300 + [W_COLLATE] * 100
    figures, *_ = read_stacks(
        Process(PID, "python train.py"),
        parse_speedscope(speedscope({(PID, PID, "MainThread"): loop, (201, 201, "w"): worker})),
        lambda file, line: None,
    )
    rows, notes = split(AttachFigures(ranks=(figures,)))
    by_stage = {r[2]: r[3] for r in rows if r[1].strip() == "its wait, by stage"}
    assert set(by_stage) == {"read *", "collate *"}
    assert by_stage["read *"].startswith("75.0% (")
    workers = {r[2]: r[3] for r in rows if r[1] == "DataLoader workers"}
    assert "worth" in workers["read"]  # one worker's reads in runs: worth fewer
    assert "not at the same moments" in notes[0]
