"""attach's rules for what a sampled stack is doing (stages/attach/classify.py) and the
parser of py-spy's raw output (stages/attach/spy.py): known stacks, and garbage."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from starvecheck.stages.attach import classify as c
from starvecheck.stages.attach.spy import parse_raw

SITE = "/venv/lib/python3.11/site-packages/"
LOOP = "<module> (/home/me/train.py:40)"


def frames(*texts: str) -> list[c.Frame]:
    return [c.parse_frame(t) for t in texts]


def source(lines: dict[int, str]) -> c.Source:
    return lambda file, line: lines.get(line) if file.endswith("train.py") else None


def test_the_main_thread_waiting_on_its_workers_is_data():
    stack = frames(
        LOOP,
        f"_BaseDataLoaderIter.__next__ ({SITE}torch/utils/data/dataloader.py:733)",
        f"_MultiProcessingDataLoaderIter._next_data ({SITE}torch/utils/data/dataloader.py:1482)",
        f"_MultiProcessingDataLoaderIter._get_data ({SITE}torch/utils/data/dataloader.py:1434)",
        "Queue.get (/usr/lib/python3.11/multiprocessing/queues.py:113)",
        "Connection.poll (/usr/lib/python3.11/multiprocessing/connection.py:257)",
        "wait (/usr/lib/python3.11/multiprocessing/connection.py:948)",
        "BaseSelector.select (/usr/lib/python3.11/selectors.py:415)",
    )
    assert c.main_kind(stack) == "data"
    assert c.loading_kind(c.loading_frames(stack)) == "idle"  # waiting, nothing to move


def test_receiving_a_batch_is_handover():
    stack = frames(
        LOOP,
        f"_BaseDataLoaderIter.__next__ ({SITE}torch/utils/data/dataloader.py:733)",
        f"_MultiProcessingDataLoaderIter._next_data ({SITE}torch/utils/data/dataloader.py:1482)",
        "Queue.get (/usr/lib/python3.11/multiprocessing/queues.py:122)",
        "Connection.recv_bytes (/usr/lib/python3.11/multiprocessing/connection.py:216)",
    )
    assert c.loading_kind(c.loading_frames(stack)) == "handover"


def test_loading_in_the_main_thread_names_its_work():
    stack = frames(
        LOOP,
        f"_BaseDataLoaderIter.__next__ ({SITE}torch/utils/data/dataloader.py:733)",
        f"_SingleProcessDataLoaderIter._next_data ({SITE}torch/utils/data/dataloader.py:789)",
        f"_MapDatasetFetcher.fetch ({SITE}torch/utils/data/_utils/fetch.py:52)",
        f"DatasetFolder.__getitem__ ({SITE}torchvision/datasets/folder.py:245)",
        f"ImageFile.load ({SITE}PIL/ImageFile.py:300)",
    )
    assert c.main_kind(stack) == "data"
    assert c.loading_kind(c.loading_frames(stack)) == "decode"


def test_the_step_the_gpu_and_the_copy():
    step = frames(LOOP, f"Module._call_impl ({SITE}torch/nn/modules/module.py:1747)")
    assert c.main_kind(step) == "step"
    assert c.main_kind(frames(LOOP, f"backward ({SITE}torch/_tensor.py:626)")) == "step"
    sync = frames(LOOP, f"synchronize ({SITE}torch/cuda/__init__.py:985)")
    assert c.main_kind(sync) == "gpu-wait"
    lines = {40: "    loss_value = loss.item()", 41: "    x = x.to(device, non_blocking=True)"}
    assert c.main_kind(frames("<module> (/home/me/train.py:40)"), source(lines)) == "gpu-wait"
    assert c.main_kind(frames("<module> (/home/me/train.py:41)"), source(lines)) == "copy"
    # Without the source line, never a guess.
    assert c.main_kind(frames("<module> (/home/me/train.py:41)")) == "other"
    ddp = frames(LOOP, f"all_reduce ({SITE}torch/distributed/distributed_c10d.py:2501)")
    assert c.main_kind(ddp) == "collective"


def test_a_forked_worker_is_read_after_its_worker_loop():
    fork = (
        LOOP,
        f"DataLoader.__iter__ ({SITE}torch/utils/data/dataloader.py:491)",
        "Process.start (/usr/lib/python3.11/multiprocessing/process.py:121)",
        "Popen._launch (/usr/lib/python3.11/multiprocessing/popen_fork.py:71)",
        "BaseProcess._bootstrap (/usr/lib/python3.11/multiprocessing/process.py:314)",
        f"_worker_loop ({SITE}torch/utils/data/_utils/worker.py:309)",
    )
    idle = frames(*fork, "Queue.get (/usr/lib/python3.11/multiprocessing/queues.py:113)")
    after = c.worker_frames(idle)
    assert after is not None and c.loading_kind(after) == "idle"
    tok = frames(
        *fork,
        f"_MapDatasetFetcher.fetch ({SITE}torch/utils/data/_utils/fetch.py:52)",
        "Tokenized.__getitem__ (/home/me/data.py:20)",
        f"PreTrainedTokenizerFast.__call__ ({SITE}transformers/tokenization_utils_base.py:2887)",
    )
    assert c.loading_kind(c.worker_frames(tok) or []) == "tokenize"
    coll = frames(*fork, f"default_collate ({SITE}torch/utils/data/_utils/collate.py:398)")
    assert c.loading_kind(c.worker_frames(coll) or []) == "collate"
    tar = frames(*fork, f"tar_file_iterator ({SITE}webdataset/tariterators.py:160)")
    assert c.loading_kind(c.worker_frames(tar) or []) == "read"
    odd = frames(*fork, "mystery (/home/me/data.py:7)")
    assert c.loading_kind(c.worker_frames(odd) or []) == "other"
    assert c.named(odd) == "mystery (data.py) < _worker_loop (worker.py)"
    assert c.worker_frames(frames(LOOP)) is None


def test_a_feeder_thread_busy_sending_or_waiting():
    base = "Queue._feed (/usr/lib/python3.11/multiprocessing/queues.py:239)"
    send = frames(
        base, "ForkingPickler.dumps (/usr/lib/python3.11/multiprocessing/reduction.py:51)"
    )
    wait = frames(base, "Condition.wait (/usr/lib/python3.11/threading.py:327)")
    assert c.feeder_busy(send) is True and c.feeder_busy(wait) is False
    assert c.feeder_busy(frames(LOOP)) is None


RAW = (
    'process 7:"python train.py";thread (7): MainThread;<module> (/a/train.py:9);'
    f"_BaseDataLoaderIter.__next__ ({SITE}torch/utils/data/dataloader.py:733) 41\n"
    'process 7:"python train.py";thread (7): MainThread;<module> (/a/train.py:10) 9\n'
    'process 9:"python train.py";thread (9): MainThread;<module> (/a/train.py:9) 50\n'
    'process 7:"python train.py";process 8:"python train.py";thread (8): MainThread;'
    f"_worker_loop ({SITE}torch/utils/data/_utils/worker.py:309) 5\n"
    "garbage line\n"
    'process x:"?";thread (1): T;f (a:1) 3\n'
)


def test_py_spys_raw_output_by_process_and_thread():
    s = parse_raw(RAW)
    assert s.samples == 105 and s.count((7, 7)) == 50 and s.count((9, 9)) == 50
    # A worker's line names its parent first: it is filed under itself.
    assert s.count((8, 8)) == 5 and s.by_thread[(8, 8)][0][0][0].name == "_worker_loop"
    assert s.thread_names[(7, 7)] == "MainThread" and s.commands[7] == "python train.py"
    (first, n), _ = s.by_thread[(7, 7)]
    assert n == 41 and first[-1].name == "__next__" and first[-1].line == 733


@given(st.text(max_size=400))
def test_property_garbage_never_raises(text):
    s = parse_raw(text)
    assert s.samples >= 0
    c.parse_frame(text)
