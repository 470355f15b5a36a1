"""What a sampled Python stack of a training job is doing: the one place its rules live
(`attach`). Rules read the frames py-spy records (`Class.function (file:line)`, files as
py-spy shortens them: `torch/utils/data/dataloader.py`, the script's own name), root
first, and, where a frame of the user's own code decides (a `.to(device)` or an
`.item()` is C, not a Python frame), the line of source it names (`source`: a callable
that returns it, or None).

Main thread (the training loop), first rule that holds:

  data        inside the DataLoader's (or WebDataset's, Streaming's, Hugging Face
              datasets') iteration: waiting for a batch, or making it at num_workers=0
  collective  inside torch.distributed: waiting for the other ranks
  gpu-wait    torch.cuda.synchronize, or a line with `.item()`, `.cpu()`, `.tolist()`,
              `.numpy()`, `synchronize(`: waiting on the GPU
  copy        pinning, or a line with `.to(`, `.cuda(`: the host-to-device copy
  step        torch.nn modules, autograd, optimizers, torch.amp, compiled code: the step
  other       anything else, named by its innermost frames (never guessed)

The training loop's thread (`loop_thread`): whichever thread's samples are inside the
DataLoader's iteration and the step (Ray Train runs `train_func` in a thread while the
main thread sits in `join()`), the main thread only where no thread is.

A loop with no DataLoader (nanoGPT's `get_batch` over a memmap, a generator): the
loop's own frame is the user frame that calls the step (`loop_frame`); a function it
calls between its steps that never runs the step (no forward, backward or optimizer
below it in any sample) and that reads or is named for data (`get_batch`,
`next_batch`, `load_*`, a generator `batches`) is its fetch (`fetches`): all its
samples, the torch calls that stack a batch included, are the loop's wait for data,
the function named.

A worker (its frames after the DataLoader's `_worker_loop`), and the main thread's own
loading at num_workers=0 (its frames inside the DataLoader):

  startup     workers starting: in the training process, a pass's iterator made (which
              starts them; spawn pickles the dataset for each) or the last pass's
              workers joined; in a worker, before `_worker_loop` (a spawned worker
              unpickling the dataset) or in it before its first index (seeds,
              worker_init_fn, the fetcher made)
  idle        waiting: a worker for the next index (the index queue's `get`), the main
              thread for a worker's batch (polling the result queue) or for the
              pin-memory thread's
  handover    handing the batch over: pickling, sending or receiving its bytes, shared
              memory (a worker's queue feeder thread does the sending: `feeder`; with
              pin_memory, the pin-memory thread receives)
  pin         pinning the batch (the loop's own at num_workers=0; the pin-memory
              thread's otherwise, `pin_thread_kind`)
  collate     the collate function (torch's default_collate, transformers' collators)
  tokenize    tokenizers, transformers' tokenization
  decode      decoding and transforming: PIL, cv2, torchvision, torchaudio, soundfile,
              librosa, scipy.signal, torch functional ops
  read        reading, or waiting off a CPU: tarfile, WebDataset's tar readers and gopen,
              Streaming, Arrow and datasets, numpy's load, h5py, zipfile, fsspec; a
              user line with `open(`, `.read(`, `np.load(`, `sleep(`, `urlopen(`,
              `.recv(`, `.acquire(`
  other       anything else, named by its innermost frames
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from starvecheck.core.schema.attach import Loading, Main

Source = Callable[[str, int], "str | None"]  # (file, line) -> the source line, or None

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Frame:
    function: str  # as py-spy names it: `Class.function` or `function`
    file: str
    line: int = 0

    @property
    def name(self) -> str:
        """The function's own name, without its class."""
        return self.function.rpartition(".")[2]

    def short(self) -> str:
        return f"{self.function} ({self.file.rpartition('/')[2]})"


def parse_frame(text: str) -> Frame:
    """One frame as py-spy writes it; anything else kept whole as a function name."""
    m = _FRAME.match(text.strip())
    if m is None:
        return Frame(text.strip()[:200], "")
    return Frame(m["func"][:200], m["file"][:400], int(m["line"] or 0))


def _in(frame: Frame, *paths: str) -> bool:
    f = frame.file.replace("\\", "/")
    return any(f.startswith(p) or f"/{p}" in f for p in paths)


DATALOADER = "torch/utils/data/dataloader.py"
WORKER_LOOP = "torch/utils/data/_utils/worker.py"
_LOADERS = ("webdataset/", "streaming/base/", "datasets/iterable_dataset.py")
# The DataLoader's iteration, and the end of a pass's workers (a non-persistent
# iterator's, when the next pass replaces it: the loop waits for them to be joined)
_ITERATING = {"__next__", "_next_data", "_get_data", "_try_get_data", "__iter__", "_next_index",
              "_shutdown_workers"}  # fmt: skip


def _data(frame: Frame) -> bool:
    if _in(frame, DATALOADER) and frame.name in _ITERATING:
        return True
    return _in(frame, *_LOADERS) and frame.name in ("__iter__", "__next__", "iterator")


_GPU_WAIT = re.compile(r"\.(item|cpu|tolist|numpy)\(\)|synchronize\(")
_COPY = re.compile(r"\.(to|cuda)\(|non_blocking")
_STEP = (
    "torch/nn/",
    "torch/autograd/",
    "torch/_tensor.py",
    "torch/optim/",
    "torch/amp/",
    "torch/cuda/amp/",
    "torch/_dynamo/",
    "torch/_inductor/",
    "torch/functional.py",
)


def main_kind(frames: Sequence[Frame], source: Source | None = None) -> Main:
    """The main thread's sample: a Main (core/schema/attach.py)."""
    if any(_data(f) for f in frames):
        return Main.DATA
    if any(_in(f, "torch/distributed/") for f in frames):
        return Main.COLLECTIVE
    if any(_in(f, "torch/cuda/__init__.py", "torch/cuda/streams.py") and f.name == "synchronize"
           for f in frames):  # fmt: skip
        return Main.GPU_WAIT
    if any(_in(f, "torch/utils/data/_utils/pin_memory.py") for f in frames):
        return Main.COPY
    if any(_in(f, *_STEP) for f in frames):
        return Main.STEP
    line = _leaf_line(frames, source)
    if line is not None and _GPU_WAIT.search(line):
        return Main.GPU_WAIT
    if line is not None and _COPY.search(line):
        return Main.COPY
    return Main.OTHER


def _leaf_line(frames: Sequence[Frame], source: Source | None) -> str | None:
    if source is None or not frames or not frames[-1].line:
        return None
    return source(frames[-1].file, frames[-1].line)


def worker_frames(frames: Sequence[Frame]) -> list[Frame] | None:
    """A worker's frames after the DataLoader's `_worker_loop` (a forked worker's stack
    starts with its parent's at the fork); None where the stack is not a worker's."""
    for i, f in enumerate(frames):
        if _in(f, WORKER_LOOP) and f.name == "_worker_loop":
            return list(frames[i + 1 :])
    return None


def loading_frames(frames: Sequence[Frame]) -> list[Frame]:
    """The main thread's frames inside the DataLoader's iteration (its own loading at
    num_workers=0, or receiving a batch from a worker)."""
    for i, f in enumerate(frames):
        if _data(f):  # the pass's workers ended is itself start-up: kept
            return list(frames[i + (f.name != "_shutdown_workers") :])
    return []


_HANDOVER = (
    "multiprocessing/reduction.py",
    "torch/multiprocessing/reductions.py",
    "multiprocessing/resource_sharer.py",
)
# multiprocessing/connection.py: these move bytes; its poll and wait only wait.
_MOVING = {"send", "send_bytes", "_send", "_send_bytes", "recv", "recv_bytes", "_recv",
           "_recv_bytes", "dumps", "loads"}  # fmt: skip
_COLLATE = ("torch/utils/data/_utils/collate.py", "transformers/data/data_collator.py")
_TOKENIZE = ("tokenizers/", "transformers/tokenization_utils", "sentencepiece/", "tiktoken/")
_DECODE = (
    "PIL/",
    "cv2/",
    "torchvision/",
    "torchaudio/",
    "soundfile.py",
    "librosa/",
    "scipy/signal/",
    "torch/nn/functional.py",
    "torch/functional.py",
    "simplejpeg/",
    "turbojpeg",
    "imageio/",
)
_READ = (
    "tarfile.py",
    "webdataset/tariterators.py",
    "webdataset/gopen.py",
    "streaming/base/",
    "pyarrow/",
    "datasets/arrow_dataset.py",
    "datasets/formatting/",
    "numpy/lib/npyio.py",
    "numpy/lib/_npyio_impl.py",
    "numpy/lib/format.py",
    "h5py/",
    "zipfile",
    "fsspec/",
    "s3fs/",
    "lmdb",
    "pathlib.py",
    "numpy/core/memmap.py",
    "numpy/_core/memmap.py",
)
# A user's line that reads or waits off a CPU: a file, the network, a sleep, a lock
_READ_LINE = re.compile(
    r"\bopen\(|\.read\(|\.read_bytes\(|np\.load\(|numpy\.load\(|\.readline|\bsleep\(|"
    r"urlopen\(|requests\.get\(|\.recv\(|\.acquire\("
)
_QUEUE = "multiprocessing/queues.py"


def loading_kind(frames: Sequence[Frame], source: Source | None = None) -> Loading:
    """A worker's sample (its frames after `_worker_loop`), or the main thread's inside
    the DataLoader: a Loading (core/schema/attach.py)."""
    if not frames:
        return Loading.IDLE
    if any(_starting(f) for f in frames):
        return Loading.STARTUP  # a pass's workers made (spawn pickles the dataset) or ended
    if _in(frames[0], _QUEUE) and frames[0].name == "get":
        return Loading.IDLE  # the index queue: nothing asked of it
    if any(_moving(f) for f in frames):
        return Loading.HANDOVER
    if frames and _in(frames[-1], "multiprocessing/connection.py", "selectors.py", _QUEUE):
        return Loading.IDLE  # polling a queue: waiting, with nothing to move yet
    if _on_queue(frames):
        return Loading.IDLE  # the pin-memory thread's queue: waiting for it
    if any(_in(f, _PIN) and f.name == "pin_memory" for f in frames):
        return Loading.PIN  # at num_workers=0, pin_memory=True: the loop pins its batch
    for kind, paths in (
        (Loading.COLLATE, _COLLATE),
        (Loading.TOKENIZE, _TOKENIZE),
        (Loading.DECODE, _DECODE),
        (Loading.READ, _READ),
    ):
        if any(_in(f, *paths) for f in frames):
            return kind
    if any("collate" in f.name for f in frames):
        return Loading.COLLATE
    line = _leaf_line(frames, source)
    if line is not None and _READ_LINE.search(line):
        return Loading.READ
    return Loading.OTHER


_PIN = "torch/utils/data/_utils/pin_memory.py"
_FETCH = "torch/utils/data/_utils/fetch.py"


def _starting(f: Frame) -> bool:
    """A frame of a pass's workers being made or ended, in the training process: the
    iterator made (`_get_iterator`, which starts them: spawn and forkserver pickle the
    dataset for each there), or the last pass's workers joined (`_shutdown_workers`).
    Not any process a dataset starts: only under the DataLoader's own frames."""
    return _in(f, DATALOADER) and (
        f.name in ("_get_iterator", "_shutdown_workers")
        or (f.name == "__init__" and "MultiProcessing" in f.function)
    )


def _on_queue(frames: Sequence[Frame]) -> bool:
    """The loop's thread, past the DataLoader's own frames, in a `queue.Queue`'s get:
    the pin-memory thread's queue (pin_memory=True), waiting for it."""
    rest = [f for f in frames if not _in(f, DATALOADER)]
    return (
        bool(rest)
        and rest[0].name == "get"
        and _in(rest[0], "queue.py")
        and not _in(rest[0], _QUEUE)
    )


def worker_kind(frames: Sequence[Frame], source: Source | None = None) -> Loading | None:
    """A sample of a DataLoader worker's process: what its main thread does (a
    Loading), None for its other threads (the queue's feeder, a dataset's own).
    STARTUP while it starts: before `_worker_loop` (a spawned or forkserver worker
    unpickling the dataset), or in `_worker_loop` before it takes its first index (its
    seeds, worker_init_fn, the fetcher made; an IterableDataset's `__iter__`): any
    callee of `_worker_loop` but the fetch and its queues."""
    after = worker_frames(frames)
    if after is None:
        starting = any(_in(f, "multiprocessing/spawn.py", "multiprocessing/forkserver.py")
                       or (_in(f, "multiprocessing/process.py") and f.name == "_bootstrap")
                       for f in frames)  # fmt: skip
        return Loading.STARTUP if starting else None
    if after and not (
        _in(after[0], _FETCH, _QUEUE, "multiprocessing/connection.py", "torch/_utils.py")
        or after[0].name == "is_alive"
    ):
        return Loading.STARTUP
    return loading_kind(after, source)


def pin_thread_kind(frames: Sequence[Frame]) -> Loading | None:
    """A sample of the pin-memory thread (pin_memory=True): PIN while it pins a batch,
    HANDOVER while it receives one from a worker (unpickling, shared memory), IDLE
    while it waits for one; None for any other thread."""
    for i, f in enumerate(frames):
        if _in(f, _PIN) and f.name == "_pin_memory_loop":
            rest = frames[i + 1 :]
            if any(_in(g, _PIN) and g.name == "pin_memory" for g in rest):
                return Loading.PIN
            return Loading.HANDOVER if any(_moving(g) for g in rest) else Loading.IDLE
    return None


def named(frames: Sequence[Frame], depth: int = 2) -> str:
    """The innermost frames, innermost first: what an `other` sample was doing."""
    return " < ".join(f.short() for f in reversed(frames[-depth:])) or "no Python frame"


def feeder_busy(frames: Sequence[Frame]) -> bool | None:
    """A worker's queue feeder thread (multiprocessing's `_feed`): True while it pickles
    or sends a batch, False while it waits; None for any other thread."""
    if not any(_in(f, _QUEUE) and f.name == "_feed" for f in frames):
        return None
    return any(_moving(f) for f in frames)


def _moving(f: Frame) -> bool:
    return _in(f, *_HANDOVER) or (
        _in(f, "multiprocessing/connection.py", _QUEUE) and f.name in _MOVING
    )


# The frames of threads that are never the training loop, though their stacks touch
# the DataLoader: pin-memory, a worker's queue feeder, a worker itself.
_HELPERS = ("_pin_memory_loop", "_feed", "_worker_loop", "_handle_results", "_handle_workers")


def loop_score(samples: Sequence[tuple[Sequence[Frame], int]]) -> int:
    """How many of a thread's samples look like a training loop's: waiting for data,
    in the step, on a collective or on the GPU (never a helper thread's)."""
    score = 0
    for frames, n in samples:
        if any(f.name in _HELPERS for f in frames):
            return 0
        if main_kind(frames) in (Main.DATA, Main.STEP, Main.COLLECTIVE, Main.GPU_WAIT):
            score += n
    return score


def in_dataloader(frames: Sequence[Frame]) -> bool:
    """A stack inside torch's data loading (a worker, the pin-memory thread, the
    iteration): the job has a DataLoader, even where its loop is never caught waiting
    on it (a fast loader over a long step)."""
    return any(_in(f, "torch/utils/data/") for f in frames)


def _stepping(f: Frame) -> bool:
    """A frame of the step itself: a module's forward, autograd, an optimizer (not any
    torch call: a fetch indexes and stacks tensors too)."""
    step = ("torch/nn/modules/", "torch/autograd/", "torch/optim/", "torch/amp/", "torch/_dynamo/")
    return _in(f, *step) or (_in(f, "torch/_tensor.py") and f.name == "backward")


def loop_frame(samples: Sequence[tuple[Sequence[Frame], int]]) -> tuple[str, str] | None:
    """(function, file) of the loop's own frame: the frame that calls into the step
    (a module's forward, backward, an optimizer) in most of the step's samples."""
    callers: dict[tuple[str, str], int] = {}
    for frames, n in samples:
        for i, f in enumerate(frames):
            if _stepping(f):
                if i > 0:
                    key = (frames[i - 1].function, frames[i - 1].file)
                    callers[key] = callers.get(key, 0) + n
                break
    return max(callers, key=lambda k: callers[k]) if callers else None


def callee_of(frames: Sequence[Frame], loop: tuple[str, str]) -> int | None:
    """Where in `frames` the function the loop's frame calls is (its index), None
    where the sample is in the loop's frame itself or not under it."""
    at = None
    for i, f in enumerate(frames):
        if (f.function, f.file) == loop:
            at = i
    return None if at is None or at + 1 >= len(frames) else at + 1


_FETCH_NAME = re.compile(r"batch|data|fetch|load|sample|next|read|shard|token", re.IGNORECASE)


def fetches(
    samples: Sequence[tuple[Sequence[Frame], int]], loop: tuple[str, str]
) -> set[tuple[str, str]]:
    """The functions the loop's frame calls between its steps that fetch its data:
    named for data or reading below them (a memmap, a file), never torch's own, and
    never one that runs the step in any sample (a `train_batch` calling the model)."""
    named: set[tuple[str, str]] = set()
    stepping: set[tuple[str, str]] = set()
    for frames, _ in samples:
        at = callee_of(frames, loop)
        if at is None:
            continue
        callee, below = frames[at], frames[at:]
        key = (callee.function, callee.file)
        if _in(callee, "torch/") or callee.name in _HELPERS:
            continue
        if any(_stepping(f) for f in below):
            stepping.add(key)
        elif _FETCH_NAME.search(callee.name) or any(_in(f, *_READ) for f in below):
            named.add(key)
    return named - stepping
