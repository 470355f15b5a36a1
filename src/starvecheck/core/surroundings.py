"""What the process was started in, where it decides whether a run can work: the
working directory (removed?) and the address-space limit (`ulimit -v`). Each is read
before what it would break, and a run it breaks ends in one line and exit 2, never in
a message from C naming the wrong cause.

- A working directory removed after the shell entered it: torch's oneMKL reads it
  (getcwd) as torch loads, and ends the process ("Intel oneMKL FATAL ERROR: Cannot load
  libtorch_cpu.so", exit 2). A relative path names nothing there either.
- An address-space limit below what a library maps: torch's import fails ("failed to
  map segment from shared object"), or OpenBLAS aborts the process as it starts its
  threads, or a C++ std::bad_alloc does (exit 134). Only the first is an exception, so
  `check` refuses before the import, from figures measured here (NEED_MIB); what runs
  out later, as an exception, is named after the limit by `limit_cause`.

The rest of the run's work reads these through `check` (`core.signals.importing`
calls it before each heavy import; commands that load torch call it first thing) and
`check_relative` (every option that names a file).
"""

from __future__ import annotations

import errno
import os
import resource
import sys
from importlib.util import find_spec

from starvecheck.core.status import StarvecheckError, UsageError

REMOVED = "the working directory no longer exists (removed after the shell entered it)"

# What loading each library (and the small run after it) maps, in MiB: VmPeak of one
# process on a 2-CPU x86-64 machine (Python 3.11, torch 2.13 CPU, numpy's OpenBLAS
# 0.3.27), rounded up. torch: `loader --factory --quick` on a Dataset of tensors (814
# MiB; the import alone 577). numpy: `pad` (125). matplotlib: `pad --plot` (217).
# pyarrow: its parquet reader imported (286). streaming and transformers import torch,
# and hold about 20 and 70 MiB more. Below torch's, runs ended in every way there is
# (exit 70, 127, 134, a hang) between 488 and 610 MiB; from 684 MiB they ran.
NEED_MIB = {
    "numpy": 128,
    "matplotlib": 224,
    "pyarrow": 320,
    "torch": 816,
    "streaming": 840,
    "transformers": 896,
}
# Each of OpenBLAS's threads past the two counted above maps about this much more
# (numpy with one thread 61 MiB, with two 101): its buffer and the thread's 8 MiB stack.
THREAD_MIB = 40
OPENBLAS_MAX_THREADS = 64  # the most numpy's and torch's OpenBLAS builds start
# What loads torch as it is imported: the working directory must exist for these.
LOADS_TORCH = {"torch", "transformers", "streaming"}


def cwd_removed() -> bool:
    """Whether the working directory was removed (getcwd fails): the shell entered it,
    then it was deleted."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    except OSError:  # no permission on a parent (EACCES): it still exists
        return False
    return False


def check_relative(where: str, path: str | None) -> None:
    """Refuse `path` where it is relative and the working directory is gone: one line
    saying so, in place of the "no such file" that hides why."""
    if path in (None, "", "-") or os.path.isabs(path) or not cwd_removed():
        return
    raise UsageError(
        f"{where}: a relative path, and {REMOVED}: give an absolute path, or cd to an "
        "existing directory"
    )


def address_limit() -> int | None:
    """The soft address-space limit in bytes (ulimit -v), or None where there is none."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else soft


def blas_threads(environ: dict[str, str] | None = None) -> int:
    """The threads OpenBLAS starts as numpy loads: as many as the CPUs this process may
    run on, or fewer where OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS
    (read in that order, as OpenBLAS does) says so; never more than 64."""
    env = os.environ if environ is None else environ
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        text = env.get(name, "").strip()
        if text.isdigit() and int(text) > 0:
            cpus = min(cpus, int(text))
            break
    return max(1, min(cpus, OPENBLAS_MAX_THREADS))


def need_mib(library: str, threads: int) -> int:
    """What loading `library` maps, in MiB, where OpenBLAS starts `threads` threads (0
    for a library not in NEED_MIB)."""
    if library not in NEED_MIB:
        return 0
    return NEED_MIB[library] + THREAD_MIB * max(0, threads - 2)


def _shown(limit: int) -> str:
    """The limit as the user set it (ulimit -v counts KiB), and in MiB."""
    return f"ulimit -v {limit >> 10}: {limit / (1 << 20):,.0f} MiB"


def refusal(
    library: str, *, torch_loaded: bool, cwd_gone: bool, limit: int | None, threads: int
) -> str | None:
    """Why `library` cannot be loaded in a process so placed, in one line; None where
    it can. A pure function of the facts, which `check` reads."""
    if library in LOADS_TORCH and not torch_loaded and cwd_gone:
        return (
            f"{REMOVED}: torch cannot load from there (its oneMKL reads the directory as it "
            "starts); cd to an existing directory and rerun"
        )
    need = need_mib(library, threads)
    if limit is not None and limit < need << 20:
        return (
            f"the address-space limit ({_shown(limit)}) is too small to load {library}, "
            f"which maps about {need:,} MiB here: raise it or unset it (ulimit -v unlimited)"
        )
    return None


def check(library: str) -> None:
    """Refuse, before `library` is imported, what would end the process as it loads
    (`refusal`). Nothing where it is loaded already or not installed."""
    if library in sys.modules or find_spec(library) is None:
        return
    why = refusal(
        library,
        torch_loaded="torch" in sys.modules,
        cwd_gone=cwd_removed(),
        limit=address_limit(),
        threads=blas_threads(),
    )
    if why is not None:
        raise UsageError(why)


# What an exception says when it is memory that could not be mapped: a shared
# library's segment, a thread's stack, an allocation in C.
_OUT_OF_ROOM = (
    "failed to map segment",
    "cannot allocate memory",
    "can't start new thread",
    "can't allocate memory",
    "std::bad_alloc",
)


def limit_cause(e: BaseException) -> str | None:
    """One line naming the address-space limit, where one is set and `e` (or what it
    was raised from) is memory that could not be had; None otherwise."""
    limit = address_limit()
    if limit is None:
        return None
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        try:
            text = " ".join(str(x).split())
        except Exception:  # an exception of the user's code whose __str__ raises
            text = ""
        if (
            isinstance(x, MemoryError)
            or (isinstance(x, OSError) and x.errno == errno.ENOMEM)
            or any(t in text.lower() for t in _OUT_OF_ROOM)
        ):
            text = text if len(text) <= 160 else text[:157] + "..."
            # Our own error's words as they are; another's with its type.
            said = text if isinstance(x, StarvecheckError) else type(x).__name__
            if text and not isinstance(x, StarvecheckError):
                said += f": {text}"
            return (
                f"ran out of memory under the address-space limit ({_shown(limit)}): "
                f"{said}; raise the limit or unset it (ulimit -v unlimited)"
            )
        x = x.__cause__ or x.__context__
    return None
