"""MosaicML Streaming for `loader`: imported without its vision package, and cleaned up
after each dataset.

Why not `import streaming`: streaming/__init__.py imports streaming.vision, which
imports torchvision, and a torchvision that does not match the installed torch (a
CPU-only torch here) fails at import time ("operator torchvision::nms does not
exist"). It also imports streaming.base.dataloader, which imports transformers (about
a second). `loader` needs neither: only MDSWriter and StreamingDataset, which live in
streaming.base and import neither torchvision nor transformers.

So `load_streaming` registers the `streaming` and `streaming.base` packages as empty
package modules that point at the installed directories, without running their
__init__.py files, and then imports the submodules it needs from the installed source
as usual. Where `streaming` was already imported (the user's process), that is used.
DataLoader workers are forked (Linux's default start method), so they inherit these
modules and never import `streaming` themselves.

Cleanup: a StreamingDataset registers shared memory (/dev/shm/NNNNNN_locals and the
like, NNNNNN its prefix) that it removes only at interpreter exit, and leaves two
lock files in the temporary directory (NNNNNN_barrier_filelock, ...) for good.
`release` removes exactly those of one dataset's prefix as soon as it is done.
streaming.base.util.clean_stale_shared_memory() is not used: it unlinks every
prefix's shared memory on the machine, including that of a training job running
next to us.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Any

from starvecheck.core.signals import importing

LOCALS = "locals"  # the block that holds a prefix (streaming.base.shared.prefix)
INSTALL_HINT = "install the streaming extra: pip install 'starvecheck[streaming]'"


class StreamingUnavailable(Exception):
    """mosaicml-streaming is not installed, or does not import; the message says which."""


@dataclass(frozen=True)
class Streaming:
    MDSWriter: Any
    StreamingDataset: Any
    SharedMemory: Any  # streaming's wrapper, which registers an atexit cleanup
    shm_names: tuple[str, ...]  # the shared-memory names each prefix may use
    filelock_names: tuple[str, ...]


def load_streaming() -> Streaming:
    """streaming.base's writer and dataset, without running streaming/__init__.py."""
    spec = importlib.util.find_spec("streaming")  # finding a package does not import it
    if spec is None or not spec.submodule_search_locations:
        raise StreamingUnavailable(INSTALL_HINT)
    added = _hollow_packages(next(iter(spec.submodule_search_locations)))
    try:
        with importing("streaming"):
            from streaming.base import constant
            from streaming.base.dataset import StreamingDataset
            from streaming.base.format.mds.writer import MDSWriter
            from streaming.base.shared.memory import SharedMemory
    except Exception as e:  # a broken install: numpy or torch of the wrong version, ...
        for name in added:
            sys.modules.pop(name, None)
        raise StreamingUnavailable(
            f"mosaicml-streaming is installed but does not import: {type(e).__name__}: {e}"
        ) from e
    _quiet_resource_tracker()
    return Streaming(
        MDSWriter,
        StreamingDataset,
        SharedMemory,
        tuple(constant.SHM_TO_CLEAN),
        (constant.BARRIER_FILELOCK, constant.CACHE_FILELOCK),
    )


def _quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (a process of its own, which Streaming's
    shared memory uses) with its stderr on /dev/null and SIGHUP ignored. Streaming
    unregisters the blocks its workers attach to, and `release` attaches and unlinks
    what workers made: when a signal stops a run half-way the counts no longer match,
    and the tracker prints a KeyError traceback for each name on the user's terminal.
    It ignores SIGINT and SIGTERM itself, but not SIGHUP: sent to the process group,
    SIGHUP killed it, and the next unlink started a new one on the terminal. What it
    would clean up, `release` already has (after SIGKILL, `starvecheck clean` does)."""
    import signal
    from multiprocessing import resource_tracker

    from starvecheck.core.signals import in_main_thread

    if not in_main_thread():  # signal.signal refuses
        resource_tracker.ensure_running()
        return

    # Blocked, signals arriving meanwhile wait (Linux keeps a blocked signal pending
    # even while its action is to ignore it) and reach our handlers afterwards; the
    # tracker inherits SIGHUP ignored across its exec.
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    saved = os.dup(2)
    try:
        os.dup2(devnull, 2)
        resource_tracker.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        signal.signal(signal.SIGHUP, hup)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _hollow_packages(root: str) -> list[str]:
    """Register `streaming` and `streaming.base` as package modules whose submodules
    load from the installed directory `root`, without executing either __init__.py."""
    if "streaming" in sys.modules:  # imported already (for real, or by an earlier call)
        return []
    added = []
    parent = None
    for name, path in (("streaming", root), ("streaming.base", os.path.join(root, "base"))):
        pkg_spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        pkg_spec.submodule_search_locations = [path]
        module = importlib.util.module_from_spec(pkg_spec)
        sys.modules[name] = module
        added.append(name)
        if parent is not None:
            parent.base = module  # as a normal import would set the attribute
        parent = module
    return added


def release(dataset: Any, streaming: Streaming) -> None:
    """Stop a StreamingDataset's threads and remove its shared memory and lock files now.

    Only this dataset's prefix is touched: its shared-memory names cannot belong to
    anyone else while the dataset holds the prefix (streaming hands out a prefix only
    when its `locals` block is absent). So `locals` goes last: once it is gone, another
    process's dataset may take the prefix, and its blocks are not ours to remove.
    """
    iterator = getattr(dataset, "_iterator", None)
    if iterator is not None:  # num_workers=0: the epoch's threads run in this process
        iterator.exit()
    executor = getattr(dataset, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=True)
    for shm in _shared_memories(dataset, streaming.SharedMemory):
        # Drop the atexit cleanup: at exit it would unlink the same names again, which
        # by then may be another process's.
        atexit.unregister(shm.cleanup)
    prefix = getattr(dataset, "_shm_prefix_int", None)
    if prefix is None:
        return
    root = getattr(dataset, "_filelock_root", None)
    for name in streaming.filelock_names if root else ():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(root, f"{prefix:06}_{name}"))
    # Every block of the prefix, this process's and those its workers made and never
    # unlinked (as after an interrupt): attach and unlink each, which also keeps
    # Python's resource tracker in step.
    from multiprocessing.shared_memory import SharedMemory

    names = [n for n in streaming.shm_names if n != LOCALS] + [LOCALS]
    for name in names:
        try:
            block = SharedMemory(f"{prefix:06}_{name}")
        except (FileNotFoundError, ValueError):
            continue
        block.close()
        with contextlib.suppress(FileNotFoundError):
            block.unlink()
    for shm in _shared_memories(dataset, streaming.SharedMemory):
        for block in (*shm.created_shms, *shm.opened_shms):
            # Unlinked above: only the mapping and its descriptor are left (a view of it
            # still held by an array keeps it until that is freed: BufferError).
            with contextlib.suppress(BufferError, OSError):
                block.close()


def marker_line(dataset: Any, streaming: Streaming) -> dict[str, Any]:
    """What `release` removes, as a scratch marker records it (scratch/leftovers.py): should
    the run be killed, `starvecheck clean` removes the same, by Streaming's own names
    and in the temporary directory it uses, whatever a marker says (scratch/claims.py)."""
    return {
        "streaming_prefix": getattr(dataset, "_shm_prefix_int", None),
        "shm_names": list(streaming.shm_names),
        "filelock_root": getattr(dataset, "_filelock_root", None),
        "filelock_names": list(streaming.filelock_names),
    }


def _shared_memories(obj: Any, kind: type, depth: int = 3) -> list[Any]:
    """streaming SharedMemory objects held by `obj`, directly or through streaming's
    shared arrays, scalars and barriers (a few attributes deep)."""
    found: list[Any] = []
    for value in list(getattr(obj, "__dict__", {}).values()):
        if isinstance(value, kind):
            found.append(value)
        elif depth > 1 and type(value).__module__.startswith("streaming.base.shared"):
            found += _shared_memories(value, kind, depth - 1)
    return found


def unusable_under(path: str) -> str | None:
    """Why Streaming cannot read a dataset written under `path`, or None. It records
    each dataset's local directory in shared memory as UTF-8
    (streaming.base.shared.prefix), so a name holding bytes that are not UTF-8
    (os.fsdecode's surrogates) raised UnicodeEncodeError in StreamingDataset, after
    the other layouts had been measured: decided here, before anything is written."""
    try:
        os.path.abspath(path).encode("utf-8")
    except UnicodeEncodeError:
        return (
            f"Streaming cannot read under {path}: the name is not UTF-8, and Streaming "
            "records its directory as UTF-8; give a PATH whose name is UTF-8 to measure it"
        )
    return None


def streaming_or_why(path: str | None = None) -> tuple[Streaming | None, str]:
    """Streaming, loaded (`load_streaming`), or None and why it cannot be: not
    installed, or (with `path`) unable to read a dataset there (`unusable_under`)."""
    if path is not None and (why := unusable_under(path)):
        return None, why
    try:
        return load_streaming(), ""
    except StreamingUnavailable as e:
        return None, str(e)
