"""attach's words: what a sampled stack is doing (the kinds its shares are labelled
with), what its figures count, each rank read and each GPU seen as records of its
parameters (`ranks`, `gpus`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from starvecheck.core.parameters import Parameters as Base
from starvecheck.core.parameters import mapping, number, records, text
from starvecheck.core.schema.loading import LoadStage
from starvecheck.core.schema.record import Record


class Main(StrEnum):
    """What the training loop's thread is doing in a sample (stages/attach/classify),
    in the order a breakdown shows them."""

    DATA = "data"  # waiting for the next batch
    STEP = "step"  # the model's step
    COPY = "copy"  # copying a batch to the device
    GPU_WAIT = "gpu-wait"  # synchronising with the GPU
    COLLECTIVE = "collective"  # in a collective (all-reduce, barrier)
    OTHER = "other"


class Loading(StrEnum):
    """What a DataLoader worker (or the main thread while it loads) is doing."""

    READ = "read"
    DECODE = "decode"
    TOKENIZE = "tokenize"
    COLLATE = "collate"
    HANDOVER = "handover"
    # workers starting: made, the dataset unpickled in a spawned one, worker_init_fn;
    # the stage of loading's own word (core/schema/loading.py)
    STARTUP = LoadStage.STARTUP.value
    PIN = LoadStage.PIN.value  # pinning a batch (the loop's own, at num_workers=0)
    IDLE = "idle"
    OTHER = "other"


# quantity: attach's own figures (probe/load.py's and /proc's, per rank)
GPU_UTILIZATION = "gpu_utilization"
WORKER_USS_GROWTH = "worker_uss_growth"
WORKERS_BLOCKED_SHARE = "workers_blocked_share"
WORKERS_CPUS = "workers_cpus"
WORKERS_FOUND = "workers_found"
WORKERS_RUNQ_CPUS = "workers_runq_cpus"
MAIN_SHARE = "main_share"  # the loop's thread, by Main
MAIN_LOADING_SHARE = "main_loading_share"  # the loop's thread while it loads, by Loading
WORKER_SHARE = "worker_share"  # the workers, by Loading


@dataclass(frozen=True)
class Rank(Record):
    """One process of the job as read: who it is, its workers, where its loop was
    found, and what became of it over the window."""

    pid: int
    rank: int | None = None
    command: str = ""
    workers: tuple[int, ...] = ()
    thread: str | None = None  # the thread its loop runs in
    loop_found: bool | None = None  # None: not looked for (no stacks)
    data_path: str | None = None  # the frame its batches come through
    stopped_s: float = 0.0  # stopped (State T) this long
    ended: str | None = None  # how it ended (exited, exec'd, ...), where it did
    ended_at_s: float | None = None


@dataclass(frozen=True)
class Gpu(Record):
    """A GPU the job uses, with the PIDs of the job's and of others on it."""

    index: int
    name: str = ""
    job_pids: tuple[int, ...] = ()
    other_pids: tuple[int, ...] = ()


class Parameters(Base):
    seconds = number()  # the seconds sampled
    ranks = records(Rank)
    gpus = records(Gpu)
    gpu_read = text()  # how the job's GPUs were told, or why none were read
    other_frames = mapping()  # each process's `other` frames (pid -> words)
