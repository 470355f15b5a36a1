"""`watch` under torch.distributed: every rank's figures on rank 0, the straggler named
by the rule profile --trace and doctor use, fixed or rotating; the exchange through the
store never blocks a rank that stopped; and the README's torchrun example, for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from starvecheck.advice.report import build_report
from starvecheck.core.context import Context
from starvecheck.loop import ranks
from starvecheck.loop.ranks import Gathered, Peers
from starvecheck.loop.timer import Watch
from starvecheck.loop.times import LoopTimes, RankTimes

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def rank_loop(waits_ms, computes_ms, barrier_ms=None) -> LoopTimes:
    """One rank's figures, as its timer would have taken them (one pass)."""
    n = len(waits_ms)
    return LoopTimes(
        waits=[x / 1e3 for x in waits_ms],
        computes=[x / 1e3 for x in computes_ms],
        wait_cpu=[0] * n,
        compute_cpu=[0] * n,
        rank_waits=[x / 1e3 for x in barrier_ms or ()],
        passes=1,
    )


def sent(t: LoopTimes, rank: int = 0, *, final: bool = True) -> RankTimes:
    """A rank's figures as rank 0 receives them, through the store's encoding."""
    return RankTimes.decode(t.encode(rank=rank, final=final, window=ranks.WINDOW))


def judged(loops: dict[int, LoopTimes], late: dict[int, str] | None = None):
    """Rank 0's report from these loops, each sent through the store's encoding, built
    as watch builds it: combined, then judged by build_report."""
    g = Gathered({r: sent(t, r) for r, t in loops.items()}, len(loops), late or {})
    report = build_report("watch", None, [ranks.combine(loops[0], 0, g)], Context())
    stage = report.stages[0]
    return stage, {f.id: f for f in stage.findings}


def test_payload_round_trip_keeps_every_step():
    t = rank_loop([30, 1, 2], [5, 6, 7], barrier_ms=[0, 3, 4])
    p = sent(t, 1, final=False)
    assert (p.rank, p.steps, p.final, p.passes) == (1, 3, False, 1)
    assert list(p.times.rank_waits) == pytest.approx([0, 0.003, 0.004])
    assert p.times == t
    assert p.times.metrics() == t.metrics()


def test_a_rank_whose_data_is_slow_is_the_straggler_and_the_others_wait_for_it():
    n = 20
    # Rank 1 waits 20 ms for each batch; rank 0 waits 1 ms and then 19 more inside its
    # step's all-reduce (its compute 24 against rank 1's 5).
    fast = rank_loop([50] + [1] * n, [5] + [24] * n)
    slow = rank_loop([50] + [20] * n, [5] + [5] * n)
    stage, f = judged({0: fast, 1: slow})
    s = f["profile.straggler"]
    assert s.title == "rank 1 is a straggler: every step waits 19.0 ms for it"
    assert s.severity.value == "critical" and "waits for data longer" in s.recommendation
    assert "estimated" in s.evidence and s.fix == {"rank": "rank 1", "cause": "data wait"}
    p = stage.parameters
    assert p["headline_rank"] == "rank 1" and p["rank_wait_source"] == "estimated"
    verdict = stage.judged.straggler  # judging's, typed; the JSON keeps parameters.straggler
    assert verdict is not None and (verdict.pattern, verdict.rank) == ("fixed", "rank 1")
    assert verdict.slowest_in == {"rank 0": 0, "rank 1": n}
    assert stage.to_dict()["parameters"]["straggler"]["slowest_in"] == {"rank 0": 0, "rank 1": n}
    rows = {r["rank"]: r for r in p["ranks"]}
    assert rows["rank 0"]["rank_wait_ms"] == pytest.approx(19)
    assert rows["rank 1"]["rank_wait_ms"] == pytest.approx(0)
    assert rows["rank 1"]["data_wait_ms"] == pytest.approx(20)
    assert stage.has_caveat("watch.rank-wait-estimated")
    # the headline breakdown is the straggler's own
    assert stage.one(quantity="data_wait_ms", rank=None).median == pytest.approx(20)


def test_ranks_on_one_host_share_its_cpus_and_the_worker_gain_says_so():
    n = 20
    fast = rank_loop([50] + [1] * n, [5] + [24] * n)
    slow = rank_loop([50] + [20] * n, [5] + [5] * n)
    for t in (fast, slow):
        t.iterator, t.num_workers = "_SingleProcessDataLoaderIter", 0
    stage, f = judged({0: fast, 1: slow})  # both payloads name this host
    assert stage.parameters["ranks_on_host"] == 2
    cpus = sent(slow, 1).params["effective_cpus"]
    assert stage.parameters["effective_cpus"] == pytest.approx(cpus / 2)
    assert stage.has_caveat("watch.ranks-share-host")
    gain = f["profile.data-bound"].gain
    assert gain.kind.value == "throughput"
    assert "an upper bound: 2 ranks share this host's CPUs" in gain.basis


def test_a_barrier_measures_the_wait_instead_of_estimating_it():
    n = 12
    fast = rank_loop([50] + [1] * n, [5] + [5] * n, barrier_ms=[0] + [19] * n)
    slow = rank_loop([50] + [20] * n, [5] + [5] * n, barrier_ms=[0] + [0] * n)
    stage, f = judged({0: fast, 1: slow})
    assert stage.parameters["rank_wait_source"] == "barrier"
    assert "at the barrier" in f["profile.straggler"].evidence
    assert not stage.has_caveat("watch.rank-wait-estimated")
    text = "\n".join(stage.caveats)
    assert "estimated" not in text


def test_ranks_alike_name_no_straggler():
    n = 30
    a = rank_loop([9] + [2, 2.2] * (n // 2), [5] + [5.1, 5] * (n // 2))
    b = rank_loop([9] + [2.2, 2] * (n // 2), [5] + [5, 5.1] * (n // 2))
    stage, f = judged({0: a, 1: b})
    assert "profile.straggler" not in f and "profile.straggler-rotating" not in f
    assert stage.judged.straggler is not None and stage.judged.straggler.pattern == "none"


def test_a_slow_rank_that_changes_from_step_to_step_is_called_rotating():
    n = 20
    # Each rank's batch is slow every other step, in turn.
    a = rank_loop([9] + [20, 1] * (n // 2), [5] * (n + 1))
    b = rank_loop([9] + [1, 20] * (n // 2), [5] * (n + 1))
    stage, f = judged({0: a, 1: b})
    assert "profile.straggler" not in f
    rot = f["profile.straggler-rotating"]
    assert "rank 0 (10 steps)" in rot.evidence and "rank 1 (10 steps)" in rot.evidence
    assert stage.judged.straggler is not None and stage.judged.straggler.pattern == "rotating"


def test_uneven_and_late_ranks_are_said():
    a = rank_loop([9] + [1] * 20, [5] * 21)
    b = rank_loop([9] + [1] * 12, [5] * 13)
    stage, _ = judged({0: a, 1: b}, late={1: "sent no figures"})
    ids = {c.id for c in stage.caveats}
    assert {"watch.ranks-steps-differ", "watch.rank-late"} <= ids
    assert "over the 12 steps every rank has" in "\n".join(stage.caveats)


def own(t: LoopTimes, *, final: bool) -> RankTimes:
    """Rank 0's own figures, as it hands them to collect."""
    return sent(t, 0, final=final)


class Store:
    """A dict with torch.distributed.Store's check/get/set."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}
        self.sets: list[str] = []

    def set(self, k: str, v: bytes) -> None:
        self.d[k] = v
        self.sets.append(k)

    def check(self, keys: list[str]) -> bool:
        return all(k in self.d for k in keys)

    def get(self, k: str) -> bytes:
        return self.d[k]

    def delete_key(self, k: str) -> bool:
        return self.d.pop(k, None) is not None


def test_collect_takes_a_rank_that_stopped_at_once_and_waits_bounded_for_a_silent_one(
    monkeypatch,
):
    store = Store()
    me = rank_loop([9] + [1] * 20, [5] * 21)
    peers = Peers(0, 3, store, "k")
    stopped = rank_loop([9] + [1] * 5, [5] * 6)  # rank 1 broke out after 6 steps
    assert Peers(1, 3, store, "k").post(stopped, final=True) is None
    monkeypatch.setattr(ranks, "WAIT_END_S", 0.3)
    import time

    t0 = time.monotonic()
    g = peers.collect(own(me, final=True))
    took = time.monotonic() - t0
    assert sorted(g.payloads) == [0, 1]
    assert g.late == {2: "sent no figures"}  # rank 2 never sent: waited 0.3 s, not forever
    assert 0.25 < took < 10  # waited its 0.3 s (a loaded machine may add seconds), not for ever
    assert store.d == {}  # rank 1's final figures, read, are not left in the store
    # an `every` report waits for a rank behind it only WAIT_EVERY_S
    behind = rank_loop([9] + [1] * 3, [5] * 4)
    Peers(2, 3, store, "k").post(behind, final=False)
    monkeypatch.setattr(ranks, "WAIT_EVERY_S", 0.1)
    g = peers.collect(own(me, final=False))
    assert "sent figures up to step 4 of pass 1" in g.late[2]


def test_only_the_other_ranks_write_to_the_store():
    store = Store()
    posted = [Peers(1, 2, store, "k").post(rank_loop([9] + [1] * 5, [5] * 6), final=True)]
    posted.append(Peers(0, 2, store, "k").post(rank_loop([9] + [1] * 5, [5] * 6), final=True))
    # rank 1 wrote and rank 0 read it (and let it go); rank 0 wrote nothing
    assert posted[0] is None
    assert posted[1] is not None and sorted(posted[1].payloads) == [0, 1]
    assert store.sets == ["k/1"] and store.d == {}


def test_a_pass_that_ends_posts_the_figures_whatever_show_says(monkeypatch):
    """The timer's end of a pass, under torch.distributed: rank 1 posts, rank 0
    gathers (and would print only with show)."""
    store = Store()
    found = iter([Peers(1, 2, store, "k"), Peers(0, 2, store, "k")])
    monkeypatch.setattr(Peers, "find", classmethod(lambda cls: next(found)))
    for _ in range(2):
        w = Watch(range(6), show=False)
        assert list(w) == list(range(6))
    assert w.gathered is not None and sorted(w.gathered.payloads) == [0, 1]
    assert store.sets == ["k/1"] and store.d == {}
    assert w.result().judged.straggler is not None  # judged: the summary attached


def test_a_store_that_fails_leaves_rank_0_its_own_figures():
    class Broken(Store):
        def check(self, keys):
            raise RuntimeError("Connection reset by peer")

    me = rank_loop([9] + [1] * 20, [5] * 21)
    g = Peers(0, 2, Broken(), "k").collect(own(me, final=True))
    assert list(g.payloads) == [0] and "Connection reset" in (g.unreachable or "")
    stage = build_report("watch", None, [ranks.combine(me, 0, g)], Context()).stages[0]
    assert stage.has_caveat("watch.ranks-unreachable")
    assert "ranks" not in stage.parameters


def test_barrier_without_a_process_group_is_a_note():
    w = Watch(range(5), show=False, barrier=True)
    assert list(w) == list(range(5))
    assert w.result().has_caveat("watch.barrier-without-ranks")
    assert len(w.times.rank_waits) == 0


# Real ranks: torchrun on this machine, gloo on loopback.


def torchrun(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("torch.distributed.run")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


def example(tmp_path: Path, *args: str) -> tuple[str, dict]:
    """examples/watch_ddp.py on two ranks: its stderr (rank 0 alone printed the
    report, once) and the watch stage of the JSON rank 0 wrote."""
    out = tmp_path / "report.json"
    p = torchrun("examples/watch_ddp.py", *args, "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.count("starvecheck watch") == 1
    return p.stderr, json.loads(out.read_text())["stages"][0]


# The examples' sleeps, set so that the signal dwarfs what waiting for a CPU adds to a
# step on a loaded machine: a sleep never returns early, so a batch of 8 samples on the
# slow rank waits at least 8 x (0.2 + 5) ms, whatever the load.
SLOW_MS = 5.0


@pytest.mark.slow
def test_the_readme_example_names_the_slow_rank(tmp_path):
    stderr, stage = example(tmp_path, "--slow-rank", "1", "--slow-ms", str(SLOW_MS))
    assert "every rank" in stderr
    assert "rank 1 is a straggler: every step waits" in stderr
    ranks = {r["rank"]: r for r in stage["parameters"]["ranks"]}
    # Not a ratio of the two (rank 0's 1.6 ms of sleeps grows with the load): rank 1's
    # wait is at least its sleeps, and longer than rank 0's.
    assert ranks["rank 1"]["data_wait_ms"] >= 8 * (0.2 + SLOW_MS)
    assert ranks["rank 1"]["data_wait_ms"] > ranks["rank 0"]["data_wait_ms"]
    assert ranks["rank 0"]["rank_wait_ms"] > 10  # rank 0 waits in the all-reduce
    assert stage["parameters"]["straggler"]["rank"] == "rank 1"
    assert stage["parameters"]["straggler"]["pattern"] == "fixed"


@pytest.mark.slow
def test_the_example_with_no_slow_rank_names_no_straggler(tmp_path):
    # 2 ms a sample (16 ms a batch): a step's wait for a CPU is small beside it, so no
    # rank's work runs over 1.25x the median's by the load alone.
    stderr, stage = example(tmp_path, "--barrier", "--sample-ms", "2")
    assert "straggler" not in stderr
    assert stage["parameters"]["rank_wait_source"] == "barrier"
    assert stage["parameters"]["straggler"]["pattern"] == "none"


@pytest.mark.slow
def test_the_example_whose_slow_rank_rotates_names_no_one_rank(tmp_path):
    stderr, stage = example(tmp_path, "--rotate", "--slow-ms", str(SLOW_MS))
    assert "A different rank holds up the step" in stderr
    assert "is a straggler" not in stderr
    straggler = stage["parameters"]["straggler"]
    assert straggler["pattern"] == "rotating" and straggler["rank"] is None
    assert min(straggler["slowest_in"].values()) >= 10  # each rank in turn


STOPS_EARLY = """
import sys, time
import torch.distributed as dist
import starvecheck
dist.init_process_group("gloo")
rank = dist.get_rank()
steps = 6 if rank == 1 else 30
for i, _ in enumerate(starvecheck.watch(range(steps), every=5)):
    time.sleep(0.002)
print(f"rank {rank} done", file=sys.stderr)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_rank_that_stops_early_blocks_no_one(tmp_path):
    script = tmp_path / "stops_early.py"
    script.write_text(STOPS_EARLY)
    p = torchrun(str(script), timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 done" in p.stderr and "rank 1 done" in p.stderr
    # every 5 of rank 0's 30 steps, the pass's end on the 30th not printed again
    assert p.stderr.count("starvecheck watch") == 6
    last = p.stderr.rsplit("starvecheck watch", 1)[1]
    assert "ranks completed different numbers of steps (rank 0 30, rank 1 6)" in " ".join(
        last.split()
    )


def test_a_long_run_sends_only_its_last_steps(monkeypatch):
    monkeypatch.setattr(ranks, "WINDOW", 8)
    n = 40
    fast = rank_loop([50] + [1] * n, [5] + [24] * n)
    slow = rank_loop([50] + [20] * n, [5] + [5] * n)
    p = sent(slow, 1)
    assert p.steps == n + 1 and p.times.offset == n + 1 - 8 and len(p.times.waits) == 8
    stage, f = judged({0: fast, 1: slow})
    assert stage.has_caveat("watch.ranks-window")
    assert stage.one(quantity="steps", rank="rank 1").value == n + 1
    # all 8 steps sent are measured: the warm-up was not among them
    assert stage.one(quantity="step_ms", rank="rank 1").n == 8
    assert stage.parameters["common_steps"] == 8
    assert f["profile.straggler"].title.startswith("rank 1 is a straggler")


STOPS_EARLY_AT_THE_BARRIER = """
import sys, time
import torch.distributed as dist
import starvecheck
dist.init_process_group("gloo")
rank = dist.get_rank()
steps = 6 if rank == 1 else 30
started = time.monotonic()
for _ in starvecheck.watch(range(steps), barrier=True, barrier_timeout=TIMEOUT):
    time.sleep(0.002)
print(f"rank {rank} done in {time.monotonic() - started:.1f} s", file=sys.stderr)
if rank == 1:
    time.sleep(LIVES_S)  # other work, or a hang: it never comes to the barrier again
dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("lives_s", [12, 0])
def test_a_barrier_that_a_rank_left_is_given_up_within_its_timeout(tmp_path, lives_s):
    """Rank 1 stops after 6 steps, then lives on 12 s (or leaves at once): rank 0's 7th
    barrier waits at most barrier_timeout, goes on without it, and says so."""
    timeout = 2
    script = tmp_path / "stops_early.py"
    script.write_text(f"TIMEOUT, LIVES_S = {timeout}, {lives_s}\n" + STOPS_EARLY_AT_THE_BARRIER)
    p = torchrun(str(script), timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    text = " ".join(p.stderr.split())
    assert "barrier=True: rank 0 gave up its barrier at step 7 after" in text
    # The barrier's own wait, timed around dist.barrier: at most its timeout (gloo ends
    # it), with room for a loaded machine's scheduling; waiting for rank 1 to leave
    # would be lives_s (12 s), the default timeout 60 s.
    waited = float(text.split("gave up its barrier at step 7 after ", 1)[1].split(" s", 1)[0])
    assert waited <= timeout + 3, text[-3000:]
    # The whole loop (30 steps, the report) bounded too, but not within 2x of its quiet
    # figure (about the timeout): a loaded machine slows the rest of the loop, and a
    # barrier never given up would be 60 s.
    took = float(p.stderr.split("rank 0 done in ", 1)[1].split(" s", 1)[0])
    assert took < timeout + 20, p.stderr[-3000:]
    assert "ranks completed different numbers of steps (rank 0 30, rank 1 6)" in text
    assert "Traceback" not in p.stderr
