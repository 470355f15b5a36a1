"""A batch made alone: what the training process would spend making each batch at
num_workers=0, timed without loading a batch in it.

Where the hand-over holds the step back, the cure to predict is num_workers=0, and the
workers' own timings cannot give its figure: a worker runs one intra-op thread (torch
sets it), writes its batch into shared memory and shares the CPUs and the memory bus
with the other workers, while the training process at num_workers=0 makes the batch on
all its threads into its own memory. A 64 MB batch copied took 43.6 ms in a worker
beside another, 30.6 ms on one thread alone, 17.6 ms on the training process's two.

So the loader's dataset, its index source (batch_sampler, or sampler where batches are
its items) and collate_fn are pickled to a fresh interpreter (this Python, this
process's sys.path and working directory, no GPU visible, its output discarded), which
loads them through a DataLoader at num_workers=0 on as many intra-op threads as the
training process has, and times each batch, its predecessor's freeing included, as a
loop at num_workers=0 pays it; its result comes back on a pipe of its own.

Why a fresh interpreter, not a fork: a forked child of a process whose OpenMP pool has
run hangs in libgomp at its first parallel op (a fork of a process that had made a 64
MB batch on two threads hung there; DataLoader workers run one thread for this
reason). And not spawn or forkserver: both import the main script again, which a
script written for fork does not guard.

What it cannot do, said in `why` with no figure: an IterableDataset; a dataset,
sampler or collate_fn that does not pickle, or whose class is defined in the script run
as __main__; a dataset holding more than PAYLOAD_MAX in arrays. As a guest in the job:
once per dataset and batch size (loop/reporting.py), only where the memory and tasks it
needs are free (at most ROOM_SHARE of the memory free), killed at LIMIT_S, and killed on
any exception (Ctrl-C) in the caller; the training loop waits for it.

Run as `python -m starvecheck.loading.alone FD` it is the child: it reads the pickled
job on stdin and writes one JSON object to FD.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from starvecheck.core import clocks

LIMIT_S = 20.0  # the child's start (an interpreter, torch, the dataset) and its batches
TIMED_S = 1.0  # batches are timed until this many seconds of them ...
BATCHES = 12  # ... or this many, after WARMUP
WARMUP = 2
LEAST = 3  # fewer batches timed than this: no figure
RELEASES = 5  # batches from a worker freed and timed
PAYLOAD_MAX = 512 << 20  # a dataset holding more (its arrays and bytes) is not copied
INTERPRETER_BYTES = 512 << 20  # what the child takes besides its copy: Python, torch
ROOM_SHARE = 0.5  # the child takes at most this share of the memory free
RESULT_MAX = 1 << 16  # bytes read back from the child
VERSION = 1  # the job's layout, checked by the child
_MAIN = "which another process cannot import without running the script"


@dataclass(frozen=True)
class Alone:
    """Each timed batch's seconds at num_workers=0, the whole measurement's seconds
    (start, copy and batches: what the loop waited), and why no batch was timed."""

    batch_s: tuple[float, ...] = ()
    took_s: float = 0.0
    threads: int = 0
    why: str | None = None
    # each batch a worker sent, freed by the process that received it: what the
    # training process pays in its step for every batch now, and not at num_workers=0
    release_s: tuple[float, ...] = ()

    @property
    def measured(self) -> bool:
        return self.why is None and len(self.batch_s) >= LEAST


def held_bytes(obj: Any, depth: int = 3, budget: list[int] | None = None) -> int:
    """The bytes of the arrays and byte strings an object holds, found through its
    attributes, tuples, lists and dicts at most `depth` deep and 2,000 objects in all:
    what pickling it copies. Never imports anything."""
    budget = [2000] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return 0
    if isinstance(obj, bytes | bytearray | str):
        return len(obj)
    n = getattr(obj, "nbytes", None)
    if isinstance(n, int) and not isinstance(obj, type):
        return n
    if depth <= 0:
        return 0
    if isinstance(obj, Mapping):
        items = list(obj.values())
    elif isinstance(obj, tuple | list):
        items = list(obj)
    else:
        items = list(getattr(obj, "__dict__", {}).values())
    return sum(held_bytes(x, depth - 1, budget) for x in items)


def _unfit(loader: object, collate: object) -> str | None:
    """Why the loader's batches cannot be made in another process; None where they can."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return "the loader has no dataset"
    for what, obj in (("dataset", dataset), ("collate_fn", collate)):
        module = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", None)
        if module == "__main__":
            return f"its {what} is defined in the script run as __main__, {_MAIN}"
    torch = sys.modules.get("torch")
    iterable = getattr(getattr(getattr(torch, "utils", None), "data", None), "IterableDataset", ())
    if iterable and isinstance(dataset, iterable):
        return "an IterableDataset: its stream cannot be replayed in another process"
    return None


def _room(need: int, threads: int) -> str | None:
    """Why the child cannot be afforded here (memory or tasks); None where it can."""
    from starvecheck.core.units import format_bytes
    from starvecheck.probe.cgroup import memory_free, pids_free
    from starvecheck.probe.memory import parse_meminfo
    from starvecheck.probe.sysroot import SysRoot

    root = SysRoot.from_environ()
    frees = [parse_meminfo(root.read("/proc/meminfo").value or "").get("MemAvailable")]
    frees.append(memory_free(root))
    known = [f for f in frees if f is not None]
    if known and need > ROOM_SHARE * min(known):
        return (
            f"it would take about {format_bytes(need)}, more than half of the "
            f"{format_bytes(min(known))} of memory free"
        )
    tasks = pids_free(root)
    if tasks is not None and tasks < 2 * (threads + 4):
        return f"the cgroup's pids limit leaves {tasks} tasks to start"
    return None


def _env() -> dict[str, str]:
    """The child's environment: this one, with this process's sys.path, no GPU visible
    (it never takes one of the job's), none of starvecheck's own settings (no exporter)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARVECHECK_")}
    paths = [p if p else os.getcwd() for p in sys.path if isinstance(p, str)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def measure(
    loader: object, collate: object, *, threads: int, batch_bytes: int, limit_s: float = LIMIT_S
) -> Alone:
    """Time `loader`'s batches made at num_workers=0 (with `collate`, the user's own
    collate_fn) on `threads` intra-op threads in a fresh interpreter; never raises but
    for the caller's own interrupt (the child killed first)."""
    begun = clocks.monotonic()

    def failed(why: str) -> Alone:
        return Alone(took_s=clocks.monotonic() - begun, threads=threads, why=why)

    why = _unfit(loader, collate)
    if why is not None:
        return failed(why)
    try:
        dataset = getattr(loader, "dataset", None)
        held = held_bytes(dataset)
        if held > PAYLOAD_MAX:
            return failed(f"the dataset holds {held:,} bytes of arrays: not copied")
        why = _room(2 * held + INTERPRETER_BYTES + 4 * max(0, batch_bytes), threads)
        if why is not None:
            return failed(why)
        batches = getattr(loader, "batch_sampler", None)
        auto = batches is not None
        source = batches if auto else getattr(loader, "sampler", None)
        job = (VERSION, threads, dataset, source, auto, collate, BATCHES, TIMED_S)
        payload = pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # the user's objects: anything can fail to pickle
        return failed(f"the dataset, its sampler or collate_fn does not pickle ({_said(e)})")
    if len(payload) > PAYLOAD_MAX:
        return failed(f"the dataset pickles to {len(payload):,} bytes: not copied")
    try:
        answer = _run(payload, limit_s - (clocks.monotonic() - begun))
    except OSError as e:
        return failed(f"the process could not be started ({_said(e)})")
    if isinstance(answer, str):
        return failed(answer)
    times = answer.get("batch_s")
    if not isinstance(times, list) or not all(isinstance(t, int | float) for t in times):
        return failed(str(answer.get("error") or "no times came back"))
    if len(times) < LEAST:
        return failed(f"only {len(times)} batches could be timed")
    took = clocks.monotonic() - begun
    freed = answer.get("release_s")
    freed = freed if isinstance(freed, list) and len(freed) >= LEAST else []
    release = tuple(float(t) for t in freed if isinstance(t, int | float))
    return Alone(tuple(float(t) for t in times), took, threads, release_s=release)


def _run(payload: bytes, limit_s: float) -> dict[str, Any] | str:
    """The child run on `payload`: its answer, or why there is none."""
    if limit_s <= 0:
        return "no time was left to start it"
    r, w = os.pipe()
    try:
        command = [sys.executable, "-m", "starvecheck.loading.alone", str(w)]
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(w,),
            env=_env(),
            cwd=os.getcwd(),
        )
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    try:
        try:
            proc.communicate(payload, timeout=limit_s)
        except subprocess.TimeoutExpired:
            return f"it took longer than {limit_s:.0f} s"
        data = _read_all(r)
    finally:
        os.close(r)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    try:
        answer = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"it ended without an answer (exit status {proc.returncode})"
    return answer if isinstance(answer, dict) else "its answer did not read"


def _read_all(fd: int) -> bytes:
    """What the ended child wrote, never waiting (a process it started may still hold
    the pipe open)."""
    os.set_blocking(fd, False)
    out = b""
    while len(out) <= RESULT_MAX:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        out += chunk
    return out[:RESULT_MAX]


def _said(e: BaseException) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= 200 else text[:199] + "…"


def _why(e: BaseException) -> str:
    """A child's failure as the report says it."""
    text = _said(e)
    if "__main__" in text or "Can't get attribute" in text:
        return f"a class it needs is defined in the script run as __main__, {_MAIN} ({text})"
    if isinstance(e, ImportError):
        return f"a module it needs does not import in another process ({text})"
    return f"loading at num_workers=0 failed there ({text})"


def child(stdin: BinaryIO) -> dict[str, Any]:
    """The child's work: the job read, its batches made at num_workers=0 and timed."""
    from starvecheck.core.signals import importing

    try:
        with importing("torch"):  # the job's unpickling would import it too
            import torch
            from torch.utils.data import DataLoader
        job = pickle.load(stdin)
    except Exception as e:
        return {"error": _why(e)}
    if not isinstance(job, tuple) or len(job) != 8 or job[0] != VERSION:
        return {"error": "the job did not read"}
    _, threads, dataset, source, auto, collate, batches, timed_s = job
    try:

        def loader(**workers: Any) -> Any:
            if auto:
                return DataLoader(dataset, batch_sampler=source, collate_fn=collate, **workers)
            return DataLoader(dataset, None, sampler=source, collate_fn=collate, **workers)

        # First (before this process runs an OpenMP pool its worker's fork would
        # inherit), each batch a worker sends freed here; a failure here costs only
        # that figure.
        release = _released(loader(num_workers=1, multiprocessing_context="fork"))
        torch.set_num_threads(max(1, int(threads)))
        it = iter(loader())
        times: list[float] = []
        batch = None
        for k in range(WARMUP + int(batches)):
            t0 = clocks.perf_counter()
            try:
                batch = next(it)  # the batch before freed here, as a loop frees it
            except StopIteration:
                break
            if k >= WARMUP:
                times.append(clocks.perf_counter() - t0)
                if sum(times) >= timed_s:
                    break
        del batch
    except Exception as e:
        return {"error": _why(e)}
    return {"batch_s": times, "release_s": release}


def _released(loader: Any) -> list[float]:
    """Seconds freeing each batch a worker sent (its shared memory let go), the worker
    given time to have its next batch made first, so the free is timed alone; [] where
    a worker could not be run."""
    out: list[float] = []
    try:
        it = iter(loader)
        try:
            t0 = clocks.perf_counter()
            batch = next(it)
            batch = next(it)
            ahead = 1.5 * (clocks.perf_counter() - t0) / 2
            for _ in range(RELEASES):
                clocks.sleep(ahead)
                batch = next(it)
                t0 = clocks.perf_counter()
                del batch
                out.append(clocks.perf_counter() - t0)
        finally:
            del it
    except Exception:  # StopIteration too: the figure is left out
        return []
    return out


def main(argv: list[str]) -> int:
    try:
        fd = int(argv[1])
    except (IndexError, ValueError):
        return 2
    answer = child(sys.stdin.buffer)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
