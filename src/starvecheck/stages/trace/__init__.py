"""`profile --trace`: where the step time of runs already profiled goes, every rank.

Reads torch.profiler / Kineto Chrome traces (plain or gzip JSON): one file, several,
or a directory of them (one per rank, as `tensorboard_trace_handler` writes), and a
file that merges several ranks. Each rank's profiler steps (`ProfilerStep#N`):

  data wait   host time inside `enumerate(DataLoader)#...__next__` (and inside
              `record_function("DATALOADER_WAIT")` where the loop marks it), as the
              union of those ranges cut to the step: nested or overlapping fetches
              count once, a fetch that straddles two steps is split between them
  GPU busy    per GPU device, the union of its kernel, memcpy and memset intervals
              inside the step; the rest of the step is that GPU's idle time, split
              two ways, each named for what it is:
              - starvecheck's: idle while the host waits for data (the part of the
                idle time that overlaps a data fetch), and the rest;
              - HolisticTraceAnalysis's idle time breakdown (host wait, kernel wait,
                other; see hta.py), so the figures compare with HTA's
  copies      memcpy time by direction (host to device, from pageable memory or
              not; device to host; device to device)
  collectives time in NCCL/RCCL kernels: the fast ranks of a synchronous job wait
              there for the slow one
  phases      the five `record_function` phases of starvecheck's own loop, where
              the trace has them

Timestamps are microseconds (Chrome trace format); Kineto writes GPU events on the
host's clock, so host and device intervals compare directly.

Left out, each with a caveat: the profiler's very first step (ProfilerStep#0) where
two or more follow (start-up lands there; a trace that starts later came from a
schedule whose wait/warm-up steps were that already), and a last step under a tenth
of the others' median (the profiler closing). GPU work after the last step closes is
in no step: a caveat says how much.

Modules: load (reading files fast), intervals (interval arithmetic), events (a
file's events sorted into processes and devices), steps (a rank's timeline cut into
steps; the warm-up and stub rules), analyze (per-rank, per-device figures and their
caveats, a job's ranks), hta (HTA's idle split), stage (figures, the registry's
stage).
"""

from __future__ import annotations

from starvecheck.stages.trace.analyze import Analysis, Job, analyze, analyze_job
from starvecheck.stages.trace.events import NO_GPU
from starvecheck.stages.trace.intervals import clip, length, overlap, union
from starvecheck.stages.trace.load import Event, TraceFile, load, trace_files
from starvecheck.stages.trace.stage import STAGE, TraceStage, read, result
from starvecheck.stages.trace.steps import Step, warmup_steps


def load_events(path: str) -> list[Event]:
    """One file's events (the file's rank aside)."""
    return load(path).events


__all__ = [
    "NO_GPU",
    "STAGE",
    "Analysis",
    "Event",
    "Job",
    "Step",
    "TraceFile",
    "TraceStage",
    "analyze",
    "analyze_job",
    "clip",
    "length",
    "load",
    "load_events",
    "overlap",
    "read",
    "result",
    "trace_files",
    "union",
    "warmup_steps",
]
