"""The stages of loading a batch, the words every layer uses for them: what a training
step waits for when it waits for data (watch, the trainers' callbacks, `loader
--factory`, attach), and what each stage's figures count.

A batch goes through these stages, in this order, before the step can use it:

  startup    the workers starting: a process made (fork, forkserver or spawn), the
             dataset unpickled in it (not under fork), worker_init_fn; every pass
             without persistent_workers
  read       the dataset's fetch (`__getitem__`, an IterableDataset's `next`) off a CPU:
             storage, the network, a sleep, a lock
  transform  the dataset's fetch on a CPU, or runnable and waiting for one: decode,
             transforms, tokenizing
  collate    the collate_fn making one batch of the samples
  handover   a worker's batch reaching the training process: the queue, shared memory,
             unpickling it there (with pin_memory, the pinning thread's hand-over too)
  pin        copying the batch into pinned memory (pin_memory=True, with CUDA)
  copy       the batch copied to the device, where the wait holds it (a trainer that
             copies before its step begins)

Each stage has two figures. *Exposed*: the part of the training loop's wait for its
batch that this stage was on the critical path of (what prefetching did not hide);
the exposed stages of a step add up to its wait. *Busy*: the stage's time per batch
wherever it ran, hidden or not (a worker's fetch while the step computes is busy and
not exposed). A fix is for the stage with the most exposed time, never for the
busiest one.
"""

from __future__ import annotations

from enum import StrEnum


class LoadStage(StrEnum):
    """A stage of loading a batch, in the order a batch goes through them."""

    STARTUP = "startup"
    READ = "read"
    TRANSFORM = "transform"
    COLLATE = "collate"
    HANDOVER = "handover"
    PIN = "pin"
    COPY = "copy"


# The stages a DataLoader worker runs (the rest run in the training process).
IN_WORKERS = (LoadStage.STARTUP, LoadStage.READ, LoadStage.TRANSFORM, LoadStage.COLLATE)

# quantity: each labelled with its `load_stage`
EXPOSED_MS = "exposed_ms"  # the stage's part of the data wait, ms a step (mean)
EXPOSED_SHARE = "exposed_share"  # ... of the whole data wait
BUSY_MS = "busy_ms"  # the stage's time per batch wherever it ran, ms (mean)
# quantity: a batch's fetch and collate with a CPU of their own (their CPU and blocked
# time, not their wait for a CPU), ms (mean): what the training process would spend
# making it at num_workers=0, where no hand-over is
SOLO_MS = "solo_ms"
# quantity: a pass's worker start-up (loading/tap.Startup), seconds
STARTUP_S = "startup_s"  # the slowest worker ready, from the pass's start
STARTUP_UNPICKLE_S = "startup_unpickle_s"  # a worker's birth to worker_init_fn
# quantity: ms a step, the start-up exposed in every pass but the first (what persistent
# workers would save: they start once)
RESTART_EXPOSED_MS = "restart_exposed_ms"
# quantity: the steps whose wait could be split (each step's wait is split, or none of it)
SPLIT_STEPS = "split_steps"

# How the workers are started, as multiprocessing names it (the DataLoader's
# multiprocessing_context, else the platform's default)
START_METHODS = ("fork", "forkserver", "spawn")
