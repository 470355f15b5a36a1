"""py-spy's thread ids, in the ids starvecheck sees.

py-spy names a process by the id it has in py-spy's own PID namespace (ours), but a
thread by the id the thread has in its innermost namespace (what the Python thread
state holds): from the node, the main thread of a container's PID 1 is "thread (1)",
not the host id that /proc shows. Each thread's `NSpid:` line (probe/process.py) maps
one to the other; where a process shares our namespace the two are the same and
nothing changes. (py-spy 0.4.3, tried with `unshare --pid --fork --mount-proc`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starvecheck.probe import process
from starvecheck.probe.sysroot import SysRoot

if TYPE_CHECKING:
    from starvecheck.stages.attach.spy import Stacks
    from starvecheck.stages.attach.target import Process


def renumber(stacks: Stacks, maps: dict[int, dict[int, int]]) -> Stacks:
    """`stacks` with each thread id replaced through `maps` (process -> innermost id ->
    ours); threads not in the map keep their id. Samples of two keys that meet are
    put together, the first's in order before the second's (a thread with no order
    where either had none)."""
    if not any(maps.values()):
        return stacks
    by_thread: dict[tuple[int, int], list] = {}
    names: dict[tuple[int, int], str] = {}
    order: dict[tuple[int, int], list[int]] = {}
    unordered: set[tuple[int, int]] = set()
    for key, samples in stacks.by_thread.items():
        ours = process.id_map(maps.get(key[0], {}), key)
        before = by_thread.setdefault(ours, [])
        if key in stacks.order and ours not in unordered:
            order.setdefault(ours, []).extend(len(before) + i for i in stacks.order[key])
        else:
            unordered.add(ours)
            order.pop(ours, None)
        before.extend(samples)
        if key in stacks.thread_names:
            names.setdefault(ours, stacks.thread_names[key])
    stacks.by_thread, stacks.thread_names, stacks.order = by_thread, names, order
    return stacks


def in_our_ids(stacks: Stacks, rank: Process, root: SysRoot | None = None) -> Stacks:
    """`stacks` of `rank` and its subprocesses with thread ids in ours: each process's
    threads as /proc shows them now, and the rank's main thread from the id it had
    when it was found (where it has exited since)."""
    root = root or SysRoot.from_environ()
    maps = {pid: process.thread_ids(root, pid) for pid in {p for p, _ in stacks.by_thread}}
    if rank.ns_pid is not None:
        maps.setdefault(rank.pid, {}).setdefault(rank.ns_pid, rank.pid)
    return renumber(stacks, maps)
