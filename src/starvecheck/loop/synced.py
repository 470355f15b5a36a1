"""What the Watch (loop/timer.py) keeps in step with beside the loop: the other ranks
under torch.distributed (their figures exchanged, loop/ranks.py; the timed barrier,
loop/barrier.py) and the GPU (`torch.cuda.synchronize()` where sync=True; its idle
time by CUDA events, loop/gpuclock.py), each found once, with a note where asked for
and not there."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from starvecheck.core.metric import Caveat
from starvecheck.loop.barrier import Barrier
from starvecheck.loop.gpuclock import CudaDevice, Device, DeviceIdle, NoDevice
from starvecheck.loop.output import never_raising
from starvecheck.loop.times import LoopTimes, _cuda_in_use

if TYPE_CHECKING:
    from starvecheck.loop.ranks import Gathered, Peers

NO_EVENTS = "gpu_events=True, but torch sees no CUDA device: the GPU's idle time is not read"


class Synced:
    """Mixed into Watch: what it needs of it is declared here."""

    times: LoopTimes
    barrier: bool
    barrier_timeout: float
    peers: Peers | None
    gathered: Gathered | None
    _found_peers: bool
    _barrier: Barrier | None
    _synchronize: Callable[[], None] | None
    _gpu: DeviceIdle | NoDevice | None
    _want_events: bool | None
    _device: Device | None
    _warned: set[str]

    if TYPE_CHECKING:  # Watch's own

        @property
        def sync(self) -> bool: ...
        def _print(self) -> None: ...

    def _distributed(self) -> Peers | None:
        if not self._found_peers:
            from starvecheck.loop.ranks import Peers

            self._found_peers = True
            self.peers = Peers.find()
        return self.peers

    def _exchange(self, *, final: bool, show: bool) -> None:
        """Post this rank's figures; rank 0 gathers every rank's (never blocking a
        rank: see loop/ranks.py) and prints them when `show`."""
        assert self.peers is not None
        gathered = self.peers.post(self.times, final=final)
        if gathered is None:  # not rank 0
            return
        self.gathered = gathered
        if show and len(self.times.computes):
            self._print()

    def _rank_barrier(self) -> Barrier | None:
        """The barrier when barrier=True and a process group is there, else None (with
        a note saying why, once): none either once it was given up (loop/barrier.py)."""
        if not self.barrier:
            return None
        if self._barrier is not None:
            if self._barrier:
                return self._barrier
            self.barrier = False
            assert self._barrier.gave_up is not None
            self.times.notes.append(self._barrier.gave_up)
            return None
        peers = self._distributed()
        if peers is None:
            self.barrier = False
            self.times.notes.append(
                Caveat(
                    "watch.barrier-without-ranks",
                    "barrier=True, but no torch.distributed process group of two or more "
                    "ranks was initialised when the loop started: nothing to wait for",
                )
            )
            return None
        self._barrier = Barrier.make(self.barrier_timeout, peers.rank)
        return self._rank_barrier()

    def _sync(self) -> Callable[[], None]:
        if self._synchronize is not None:
            return self._synchronize
        self._synchronize = _nothing
        if self.sync:
            import torch

            if torch.cuda.is_available():
                self._synchronize = torch.cuda.synchronize
            else:
                self.times.notes.append(
                    Caveat(
                        "watch.sync-without-cuda",
                        "sync=True, but torch sees no CUDA device: nothing to synchronise",
                    )
                )
        return self._synchronize

    def _events(self) -> DeviceIdle | NoDevice:
        """The GPU's clock (loop/gpuclock.py): on where CUDA is in use, unless
        gpu_events=False; a note where gpu_events=True and there is no device."""
        if self._gpu is None:
            self._gpu = NoDevice()
            t = self.times
            if self._want_events is not False and self._device is not None:
                self._gpu = DeviceIdle(self._device, t.gpu_idle, t.gpu_period)
            elif self._want_events is not False and _cuda_in_use():
                self._gpu = DeviceIdle(CudaDevice(), t.gpu_idle, t.gpu_period)
            elif self._want_events:
                t.notes.append(Caveat("watch.events-without-cuda", NO_EVENTS))
        return self._gpu

    def _read_gpu(self) -> None:
        """The GPU's steps whose events have completed, read without waiting."""
        if isinstance(self._gpu, DeviceIdle):
            with never_raising(self._warned, "read the GPU's events"):
                self._gpu.resolve()
                self.times.gpu_unresolved = self._gpu.unresolved

    def _replay_sync(self) -> Callable[[], None] | None:
        """What times a headspace replay on a GPU: a synchronize before and after."""
        if not _cuda_in_use():
            return None
        import torch

        return torch.cuda.synchronize


def _nothing() -> None:
    pass
