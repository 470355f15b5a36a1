"""The loop model's step with k workers (advice/loopmodel.py's docstring says the model):
the three bounds it is the slowest of, the CPU a step needs, and how the count is
chosen from them."""

from __future__ import annotations

from dataclasses import dataclass

from starvecheck.advice.machinebound import MIN_GAIN

# The fewest workers whose predicted step is within this factor of the best.
KNEE = 1.05
# A batch whose sending worker is busy with Python work crosses to the training process
# in about this many of that worker's switch intervals (the interpreter's lock: the
# queue's sending thread and the shared-memory file descriptor's both need it).
# Measured: 20 ms steps, 2 workers on 2 CPUs, 0.5-0.76 of their time busy, the receive
# 1.1-2.7 ms longer than with idle workers (benchmarks/stage_split.py).
HELD_SWITCHES = 1.5
SWITCH_MS = 5.0  # CPython's default sys.getswitchinterval(), the workers' unless changed


@dataclass(frozen=True)
class Model:
    """The loop model's figures (see the module docstring), in ms per batch."""

    rest_ms: float  # R: the step after the batch is in hand
    main_cpu: float  # the training thread's CPU in it
    hand_m: float  # Hm: receiving the batch in the training process
    made_ms: float  # W + Hw: a worker's time to make and send a batch
    cpu_ms: float  # C + Hw: its CPU
    effective: float  # E: the effective CPUs
    room: float  # the CPUs the job can have: E less what other processes took of them
    own_cpu_ms: float  # P: the training process's own CPU a step, all its threads

    def bounds(self, k: int) -> dict[str, float]:
        """The step with k workers is the slowest of: the training process's own path
        (its step, and receiving the batch, timed as it is: loop/handover.py; the CPU
        part of both shared with the workers and other processes where they and it
        outnumber the CPUs, the workers counted by the CPUs they keep busy: a sleeping
        worker takes none; and each batch held back while another worker computes:
        `held`), the workers' delivery, and the CPU the loading needs beside the step.
        The own path never falls below the step outside the wait plus receiving: the
        share of the step loading can save caps the gain."""
        out = {
            "own": self.rest_ms + self.hand_m,
            "workers": self.made_ms / k,
            "cpus": self.cpu_step(),
        }
        step = max(out.values())
        contending = self.effective - self.room  # the CPUs other processes keep busy
        busy = min(float(k), self.cpu_ms / max(step, 1e-9))  # the CPUs the workers keep busy
        share = max(1.0, (busy + 1 + contending) / self.effective)
        # Receiving a batch is the training process's CPU work too, stretched as its
        # step's is (20 ms sleep steps, 2 workers on 2 CPUs: the receive 1.4 ms a batch
        # with idle workers, 2.6-2.9 ms with busy ones; benchmarks/stage_split.py).
        own = (self.rest_ms - self.main_cpu) + (self.main_cpu + self.hand_m) * share
        out["own"] = own + self.held(k, step)
        return out

    def held(self, k: int, step: float) -> float:
        """The hand-over held back by the other workers' CPU work: the workers' batches
        reach the training process through one queue, and a batch whose sender's
        interpreter is busy with Python work waits for its lock (a switch interval)
        before it crosses, and the batches behind it with it. With one worker its own
        next batch never holds it (measured); with k, each batch waits on the others,
        busy the share of the step their CPU takes."""
        if k < 2:
            return 0.0
        busy = min(1.0, self.cpu_ms / (k * max(step, 1e-9)))
        return busy * (k - 1) / k * SWITCH_MS * HELD_SWITCHES

    def cpu_step(self) -> float:
        """The step the CPU sets: the workers' CPU for a batch and the training
        process's own a step, over the CPUs the job can have (its CPUs are the workers'
        while it waits, so they count per step, not as taken for good)."""
        return (self.cpu_ms + self.own_cpu_ms) / max(self.room, 1e-2)

    def loading_cpu_bound(self) -> bool:
        """No worker count keeps up: the CPU a step needs past the step itself."""
        return self.cpu_step() > self.rest_ms + self.hand_m

    def workers_cpus(self, step: float) -> float:
        """The CPUs the workers have on average with the step at `step` ms."""
        return max(self.room - self.own_cpu_ms / max(step, 1e-9), 1e-2)

    def step(self, k: int) -> float:
        return max(self.bounds(k).values())

    def choose(self, now: int, most: int, step_now: float) -> int:
        """`most` workers where they are within 5% of the best count up to it, else the
        fewest that are (sharing the CPUs with the training process can make a larger
        count slower); a loop with workers changes only for a gain of 5% or more."""
        counts = range(max(1, now), most + 1)
        best = min(self.step(k) for k in counts)
        good = [k for k in counts if self.step(k) <= KNEE * best]
        workers = most if most in good else min(good)
        return now if now and step_now < MIN_GAIN * self.step(workers) else workers
