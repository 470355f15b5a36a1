"""py-spy's speedscope output (stages/attach/spyout.parse_speedscope): each thread's
samples in the order taken, py-spy's own process and thread frames off the root, read
bounded; raw text still read as raw; and anything at all never raised."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from starvecheck.stages.attach import spy

DOC = {
    "shared": {
        "frames": [
            {"name": 'process 77:"python train.py"', "file": "", "line": 0},
            {"name": "thread (77): MainThread", "file": "", "line": 0},
            {"name": "<module>", "file": "/x/train.py", "line": 9},
            {"name": "_next_data", "file": "/t/torch/utils/data/dataloader.py", "line": 700},
            {"name": "step", "file": "/x/train.py", "line": 20},
        ]
    },
    "profiles": [
        {
            "type": "sampled",
            "name": 'Process 77 Thread 77 "MainThread"',
            "samples": [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 4], [0, 1, 2, 3], [0, 1, 2, 4]],
            "weights": [0.05] * 5,
        },
        {"type": "sampled", "name": "not a thread", "samples": [[2]]},
        {"type": "sampled", "name": "Thread 78", "samples": [[2, 99], [2], "x"]},
    ],
}


def test_each_threads_samples_keep_their_order_and_lose_py_spys_own_frames():
    s = spy.parse_speedscope(json.dumps(DOC))
    stacks = s.by_thread[(77, 77)]
    assert [n for _, n in stacks] == [3, 2] and s.samples == 5
    assert [f.function for f in stacks[0][0]] == ["<module>", "_next_data"]
    assert s.order[(77, 77)] == [0, 0, 1, 0, 1]
    assert s.thread_names[(77, 77)] == "MainThread"
    assert s.commands[77] == "python train.py"
    # "Thread 78" names no process: only where one was sampled alone, as the raw output
    assert (78, 78) not in s.by_thread
    alone = spy.parse_speedscope(json.dumps(DOC), pid=5)
    assert [n for _, n in alone.by_thread[(5, 78)]] == [1]  # an index past the table skipped


def test_raw_text_is_read_as_raw():
    raw = "thread (5500): MainThread;<module> (/x/train.py:3) 9\n"
    s = spy.parse_speedscope(raw, 5500)
    assert s.count((5500, 5500)) == 9 and not s.order


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=40,
)


@given(json_values)
def test_property_any_json_is_read_without_raising(doc):
    s = spy.parse_speedscope(json.dumps(doc))
    assert s.samples >= 0
    for key, order in s.order.items():
        assert all(0 <= i < len(s.by_thread[key]) for i in order)


@given(st.text(max_size=300))
def test_property_any_text_is_read_without_raising(text):
    assert spy.parse_speedscope(text, 1).samples >= 0
