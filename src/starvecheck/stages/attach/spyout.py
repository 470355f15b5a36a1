"""py-spy's output parsed (stages/attach/spy.py runs it; its docstring says the two
formats): each thread's distinct stacks with their counts and, from speedscope's JSON,
the order its samples were taken in. Bounded throughout (lines, profiles, samples,
frames): it comes from another program, and a job's command line is written into it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from starvecheck.core.units import parse_uint
from starvecheck.stages.attach.classify import Frame, parse_frame

MAX_LINES = 200_000
MAX_FRAMES = 512


@dataclass
class Stacks:
    """Samples by (process, thread): each distinct stack with its count."""

    by_thread: dict[tuple[int, int], list[tuple[list[Frame], int]]] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    commands: dict[int, str] = field(default_factory=dict)
    samples: int = 0  # what py-spy kept
    errors: int = 0  # samples py-spy dropped (a stack caught mid-change)
    # Each thread's samples in the order taken, as indices into its `by_thread` list;
    # absent where the output gave no order (raw).
    order: dict[tuple[int, int], list[int]] = field(default_factory=dict)

    def count(self, key: tuple[int, int]) -> int:
        return sum(n for _, n in self.by_thread.get(key, ()))


def parse_raw(text: str, pid: int | None = None) -> Stacks:
    """py-spy's raw output, as above; lines that do not parse are skipped. Without
    --subprocesses py-spy names no process (`thread (123): MainThread;...`): `pid`,
    the process it sampled, is theirs."""
    out = Stacks()
    for line in text.splitlines()[:MAX_LINES]:
        stack, _, count = line.rpartition(" ")
        samples = parse_uint(count)
        if not stack or samples is None:
            continue
        parts = stack.split(";", MAX_FRAMES + 8)
        # --subprocesses: a child's line names its parents first, itself last.
        at = 0
        while at < min(len(parts), 8) and parts[at].startswith("process "):
            at += 1
        if at == 0 and pid is not None and parts[0].startswith("thread ("):
            parts, at = [f"process {pid}:", *parts], 1
        if at == 0 or at >= len(parts) or not parts[at].startswith("thread ("):
            continue
        pid_text, _, command = parts[at - 1][len("process ") :].partition(":")
        tid_text, _, name = parts[at][len("thread (") :].partition(")")
        pid_read, tid_read = parse_uint(pid_text), parse_uint(tid_text)
        if pid_read is None or tid_read is None:  # a command line may forge "thread (²)"
            continue
        key = (pid_read, tid_read)
        out.commands.setdefault(key[0], command.strip('"')[:300])
        out.thread_names.setdefault(key, name.lstrip(": ").strip()[:100])
        frames = [parse_frame(p) for p in parts[at + 1 : at + 1 + MAX_FRAMES]]
        out.by_thread.setdefault(key, []).append((frames, samples))
        out.samples += samples
    return out


MAX_PROFILES = 4096  # threads in one py-spy's output
MAX_SAMPLES = 2_000_000  # samples in one py-spy's output, all threads
_THREAD = re.compile(r'^(?:Process (\d{1,10}) )?Thread (\d{1,20})(?: "(.*)")?$', re.S)


def parse_speedscope(text: str, pid: int | None = None) -> Stacks:
    """py-spy's speedscope JSON, as above, into the same stacks as the raw output with
    each thread's order kept; anything that does not parse is skipped (a profile, a
    sample, a frame), never raised. Text that is not JSON is read as raw output."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return parse_raw(text, pid)
    out = Stacks()
    shared = doc.get("shared") if isinstance(doc, dict) else None
    table = shared.get("frames") if isinstance(shared, dict) else None
    frames = [_frame(f) for f in table] if isinstance(table, list) else []
    profiles = doc.get("profiles") if isinstance(doc, dict) else None
    budget = MAX_SAMPLES
    for profile in profiles[:MAX_PROFILES] if isinstance(profiles, list) else ():
        key_name = _thread_of(profile, pid)
        samples = profile.get("samples") if isinstance(profile, dict) else None
        if key_name is None or not isinstance(samples, list):
            continue
        key, name = key_name
        seen: dict[tuple[int, ...], int] = {}
        stacks: list[tuple[list[Frame], int]] = out.by_thread.setdefault(key, [])
        order = out.order.setdefault(key, [])
        for sample in samples[: max(0, budget)]:
            stack = _stack(sample, len(frames))
            if stack is None:
                continue
            at = seen.get(stack)
            if at is None:
                at = seen[stack] = len(stacks)
                stacks.append((_own(frames, stack, out, key), 0))
            stacks[at] = (stacks[at][0], stacks[at][1] + 1)
            order.append(at)
        budget -= len(samples)
        out.samples += len(order)
        out.thread_names.setdefault(key, name)
    return out


def _own(
    frames: list[Frame], stack: tuple[int, ...], out: Stacks, key: tuple[int, int]
) -> list[Frame]:
    """A sample's frames without py-spy's own at its root: `process 123:"cmd"` (with
    --subprocesses) and `thread (456): name` (with --threads) name the sample's process
    and thread, as the raw output's header does; the process's command is kept."""
    got = [frames[i] for i in stack]
    at = 0
    while at < min(len(got), 4) and not got[at].file:
        name = got[at].function
        if name.startswith("process "):
            out.commands.setdefault(key[0], name.partition(":")[2].strip('"')[:300])
        elif not name.startswith("thread ("):
            break
        at += 1
    return got[at:]


def _frame(f: object) -> Frame:
    if not isinstance(f, dict):
        return Frame("?", "")
    name, file, line = f.get("name"), f.get("file"), f.get("line")
    return Frame(
        str(name)[:200] if name is not None else "?",
        str(file)[:400] if file is not None else "",
        line if isinstance(line, int) and 0 <= line < 10**9 else 0,
    )


def _thread_of(profile: object, pid: int | None) -> tuple[tuple[int, int], str] | None:
    """(pid, thread id) and the thread's name from a profile's name; None where it names
    no thread, or no process and none was sampled alone."""
    name = profile.get("name") if isinstance(profile, dict) else None
    m = _THREAD.match(name) if isinstance(name, str) else None
    if m is None:
        return None
    process = parse_uint(m[1]) if m[1] is not None else pid
    tid = parse_uint(m[2])
    if process is None or tid is None:
        return None
    return (process, tid), (m[3] or "")[:100]


def _stack(sample: object, frames: int) -> tuple[int, ...] | None:
    """A sample's frame indices, root first, each into the table; None if any is not."""
    if not isinstance(sample, list) or len(sample) > MAX_FRAMES:
        return None
    if not all(isinstance(i, int) and 0 <= i < frames for i in sample):
        return None
    return tuple(sample)
