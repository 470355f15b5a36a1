"""Which thread of a sampled process runs its training loop (`attach`): chosen by what
its samples do, never by its id, so that a loop run in a thread (Ray Train runs
`train_func` in one while the main thread waits in `join()`) is read where it runs,
and py-spy's thread ids need not match the process's.
"""

from __future__ import annotations

from starvecheck.stages.attach import classify
from starvecheck.stages.attach.spy import Stacks


def loop_thread(stacks: Stacks, pid: int) -> tuple[tuple[int, int] | None, bool]:
    """The thread of process `pid` that runs the training loop, chosen by its samples
    (classify.loop_score), not by its id: a loop run in a thread (Ray Train's
    `train_func`) is read there. The main thread (its id the process's, or named
    MainThread) where no thread's samples look like a loop; (key, a loop was seen)."""
    threads = [k for k in stacks.by_thread if k[0] == pid]
    if not threads:
        return None, False
    scores = {k: classify.loop_score(stacks.by_thread[k]) for k in threads}

    def rank(k: tuple[int, int]) -> tuple[int, bool, bool]:
        return scores[k], k[1] == pid, stacks.thread_names.get(k) == "MainThread"

    best = max(threads, key=rank)
    if scores[best] == 0:
        best = max(threads, key=lambda k: rank(k)[1:])
    return best, scores[best] > 0
