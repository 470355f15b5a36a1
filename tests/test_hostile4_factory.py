"""Hostile round IV, `loader --factory` (issue 48, items 3 and 5): the user's code at the
edges of a run. Threads of every kind, exits from every place (the factory, a sample,
__len__, num_shards, the collate_fn, the worker_init_fn, the sampler, an exit handler),
signals the user's code sets, and batches of every odd type. Each case is a real run of
`python -m starvecheck loader --factory` in a subprocess, and each asserts: no
traceback, no hang, the expected exit status (0, with what was left said, where the
pipeline is valid; 2 and one line where the user's code is at fault; never 0 where the
user's code ended the process, never 70), no file made outside starvecheck's own (the
working directory and TMPDIR left as they were), and no process left running (none
whose command line holds the test's directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import marked

PIPE = textwrap.dedent(
    """
    import atexit, os, signal, sys, threading, time, warnings
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
    warnings.simplefilter("ignore")

    class Small(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return torch.full((4,), i, dtype=torch.int64)

    def dl(ds=None, **kw):
        return DataLoader(ds if ds is not None else Small(), batch_size=4, **kw)

    class Indices(Small):
        def __getitem__(self, i):
            return i

    def collate(make):
        return DataLoader(Indices(), batch_size=4, collate_fn=make)

    # --- threads -------------------------------------------------------------------
    def nondaemon():
        threading.Thread(target=time.sleep, args=(1e6,), name="user-prefetch").start()
        return dl()

    def pool():
        from concurrent.futures import ThreadPoolExecutor
        ThreadPoolExecutor(2, thread_name_prefix="user-pool").submit(time.sleep, 1e6)
        return dl()

    def daemon():
        threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()
        return dl()

    def timer():
        threading.Timer(1e6, print).start()
        return dl()

    class ThreadPerSample(Small):
        started = []
        def __getitem__(self, i):
            if len(self.started) < 3:  # a thread from a sample, a few of them
                t = threading.Thread(target=time.sleep, args=(1e6,), name=f"user-{i}")
                t.start()
                self.started.append(t)
            return super().__getitem__(i)

    def thread_per_sample():
        return dl(ThreadPerSample())

    def thread_exit_now():
        threading.Thread(target=os._exit, args=(0,), daemon=True).start()
        time.sleep(0.5)
        return dl()

    def thread_sys_exit():
        threading.Thread(target=sys.exit, args=(0,)).start()
        return dl()

    def thread_raises():
        def boom():
            raise RuntimeError("in a thread of the user's")
        threading.Thread(target=boom).start()
        return dl()

    def thread_signal():
        threading.Thread(target=signal.signal, args=(signal.SIGTERM, signal.SIG_IGN)).start()
        return dl()

    # --- exits -----------------------------------------------------------------------
    def factory_sys_exit():
        sys.exit(0)

    def factory_os_exit():
        os._exit(0)

    class ItemExit(Small):
        def __getitem__(self, i):
            sys.exit(0)

    def item_sys_exit():
        return dl(ItemExit())

    class ItemOsExit(Small):
        def __getitem__(self, i):
            os._exit(0)

    def item_os_exit():
        return dl(ItemOsExit())

    class LenExit(Small):
        def __len__(self):
            sys.exit(0)

    def len_sys_exit():
        return LenExit()

    class LenOsExit(Small):
        calls = 0
        def __len__(self):
            LenOsExit.calls += 1
            if LenOsExit.calls > 1:
                os._exit(0)
            return 64

    def len_os_exit_later():
        return LenOsExit()

    class ShardsExit(Small):
        @property
        def num_shards(self):
            os._exit(0)

    def shards_os_exit():
        return ShardsExit()

    def collate_os_exit():
        return collate(lambda b: os._exit(0))

    def init_sys_exit():
        return dl(num_workers=1, worker_init_fn=lambda w: sys.exit(0))

    def init_os_exit():
        return dl(num_workers=1, worker_init_fn=lambda w: os._exit(0))

    class ExitSampler:
        def __iter__(self):
            sys.exit(0)
        def __len__(self):
            return 4

    def sampler_exit():
        return DataLoader(Small(), batch_sampler=ExitSampler())

    def atexit_os_exit():
        atexit.register(os._exit, 0)
        return dl()

    def atexit_hangs():
        atexit.register(time.sleep, 1e6)
        return dl()

    def atexit_raises():
        def boom():
            raise RuntimeError("an exit handler of the user's")
        atexit.register(boom)
        return dl()

    class LastWords:
        def __del__(self):
            os._exit(0)

    KEPT = []

    def del_at_shutdown():
        KEPT.append(LastWords())
        return dl()

    # --- signals -----------------------------------------------------------------------
    def ignores_sigterm():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return dl()

    def own_alarm():
        signal.signal(signal.SIGALRM, lambda *a: None)
        signal.alarm(1)
        return dl()

    def blocks_signals():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        return dl()

    def own_usr1():
        signal.signal(signal.SIGUSR1, lambda *a: None)
        os.kill(os.getpid(), signal.SIGUSR1)
        return dl()

    # --- batches -------------------------------------------------------------------------
    def sparse_coo():
        return collate(lambda b: (torch.eye(4).to_sparse(), torch.tensor(b)))

    def sparse_csr():
        return collate(lambda b: torch.eye(4).to_sparse_csr())

    def nested():
        return collate(lambda b: torch.nested.nested_tensor([torch.ones(i % 3 + 1) for i in b]))

    def conj():
        return collate(lambda b: torch.tensor(b, dtype=torch.complex64).conj())

    def neg_bit():
        return collate(lambda b: torch.tensor(b, dtype=torch.complex64).conj().imag)

    def quantized():
        return collate(lambda b: torch.quantize_per_tensor(
            torch.tensor(b, dtype=torch.float32), 0.1, 0, torch.quint8))

    def meta():
        return collate(lambda b: (torch.ones(len(b), 4, device="meta"), torch.tensor(b)))

    def odd_keys():
        return collate(lambda b: {1: torch.tensor(b), (2, 3): torch.tensor(b), None: b})

    def generator():
        return collate(lambda b: (x for x in b))

    def raw_bytes():
        return collate(lambda b: bytes(b))

    def huge_string():
        return collate(lambda b: "x" * (8 << 20))

    class Hostile:
        def __eq__(self, other):
            raise RuntimeError("eq")
        def __hash__(self):
            raise RuntimeError("hash")
        def __repr__(self):
            raise RuntimeError("repr")

    def hostile_items():
        return collate(lambda b: [Hostile() for _ in b])

    class NoLen(list):
        def __len__(self):
            raise RuntimeError("len")

    def raising_len():
        return collate(lambda b: NoLen(torch.tensor(b)))

    class NoIter:
        def __iter__(self):
            raise RuntimeError("iter")

    def raising_iter():
        return collate(lambda b: NoIter())

    class Shaped:
        shape = (4, 3)
        dtype = "float32"

    def custom_shape():
        return collate(lambda b: Shaped())

    def object_rows():
        def make(b):
            a = np.empty(len(b), dtype=object)
            a[:] = [Hostile() for _ in b]
            return a
        return collate(make)
    """
)

# (func, exit status, what stderr says; --workers)
CASES = {
    "threads": [
        ("nondaemon", 0, "left 1 thread(s) running ('user-prefetch'", "0"),
        ("pool", 0, "'user-pool_0', target concurrent.futures.thread._worker", "0"),
        ("daemon", 0, None, "0"),
        ("timer", 0, "left 1 thread(s) running", "0"),
        ("thread_per_sample", 0, "left 3 thread(s) running ('user-", "0"),
        ("thread_exit_now", 2, "called os._exit(0)", "0"),
        ("thread_sys_exit", 0, None, "0"),
        ("thread_raises", 0, "RuntimeError: in a thread of the user's", "0"),
        ("thread_signal", 0, "SIGTERM handler", "0"),
    ],
    "exits": [
        ("factory_sys_exit", 2, "raised SystemExit: 0", "0"),
        ("factory_os_exit", 2, "called os._exit(0)", "0"),
        ("item_sys_exit", 2, "SystemExit", "0"),
        ("item_os_exit", 2, "called os._exit(0)", "0"),
        ("len_sys_exit", 2, "raised SystemExit", "0"),
        ("len_os_exit_later", 2, "called os._exit(0)", "0,1"),
        ("shards_os_exit", 2, "called os._exit(0)", "0"),
        ("collate_os_exit", 2, "called os._exit(0)", "0"),
        ("init_sys_exit", 2, "exited unexpectedly", "1"),
        ("init_os_exit", 2, "exited unexpectedly", "1"),
        ("sampler_exit", 2, "SystemExit", "0"),
        ("atexit_os_exit", 2, "called os._exit(0)", "0"),
        ("atexit_hangs", 2, "exit handlers (atexit) did not return", "0"),
        ("atexit_raises", 0, "an exit handler of the user's", "0"),
        ("del_at_shutdown", 0, None, "0"),
    ],
    "signals": [
        ("ignores_sigterm", 0, "SIGTERM", "0"),
        ("own_alarm", 0, "timer", "0"),
        ("blocks_signals", 0, "signal mask", "0"),
        ("own_usr1", 0, None, "0"),
    ],
    "batches": [
        ("sparse_coo", 0, None, "0"),
        ("sparse_csr", 0, None, "0"),
        ("nested", 0, None, "0"),
        ("conj", 0, None, "0"),
        ("neg_bit", 0, None, "0"),
        ("quantized", 0, None, "0"),
        ("meta", 0, None, "0"),
        ("odd_keys", 0, None, "0"),
        ("generator", 0, None, "0"),
        ("raw_bytes", 0, None, "0"),
        ("huge_string", 0, None, "0"),
        ("hostile_items", 0, None, "0"),
        ("raising_len", 0, None, "0"),
        ("raising_iter", 0, None, "0"),
        ("custom_shape", 0, None, "0"),
        ("object_rows", 0, None, "0"),
    ],
}
ALL = [(area, *case) for area, cases in CASES.items() for case in cases]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hostile4") / "hostile4pipe.py"
    path.write_text(PIPE)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("area", "func", "status", "said", "workers"), ALL)
def test_hostile_factory(
    pipe: Path, tmp_path: Path, own_tmpdir: Path, area: str, func: str, status: int,
    said: str | None, workers: str,
) -> None:  # fmt: skip
    here = tmp_path / "cwd"
    here.mkdir()
    (here / "theirs.txt").write_text("the user's\n")
    marker = f"{pipe}:{func}"
    try:
        r = subprocess.run(
            [sys.executable, "-m", "starvecheck", "loader", "--factory", marker, "--quick",
             "--budget", "0.5", "--workers", workers, "--factory-timeout", "10",
             "--batch-timeout", "20", "--json", str(tmp_path / "r.json")],
            capture_output=True, text=True, timeout=90, cwd=here,
            env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"},
        )  # fmt: skip
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{area}/{func}: a hang ({e.stderr!r:.2000})")
    finally:
        stray = marked(marker)
        for pid in stray:
            os.kill(pid, 9)
    err = r.stderr
    assert "Traceback" not in err, err
    assert r.returncode == status, err
    assert r.returncode != 70, err
    errors = [x for x in err.splitlines() if x.startswith("starvecheck: error:")]
    if status == 2:
        assert len(errors) == 1, err
    else:
        assert errors == [], err
        assert (tmp_path / "r.json").exists()
    if said is not None:
        assert said in err, err
    assert sorted(os.listdir(here)) == ["theirs.txt"]
    assert (here / "theirs.txt").read_text() == "the user's\n"
    assert os.listdir(own_tmpdir) == [], os.listdir(own_tmpdir)
    assert stray == [], f"processes left: {stray}"


def test_the_sweep_is_at_least_35_cases() -> None:
    assert len(ALL) >= 35  # 44: threads 9, exits 15, signals 4, batches 16
    assert {area for area, *_ in ALL} == {"threads", "exits", "signals", "batches"}
