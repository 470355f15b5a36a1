"""The trainers' callbacks split the wait by stage as watch does (loop/steps.py,
loading/tap.py's `hold`): a real transformers.Trainer and a real lightning.Trainer on
the CPU, two DataLoader workers whose samples sleep (a read): the split names `read`,
covers the steps it can (Lightning's first epoch made its workers before any hook),
and the DataLoader has its own collate_fn back when training ends."""

from __future__ import annotations

import json

import pytest

from tests.test_integrations import LIGHTNING_RUN, TRANSFORMERS_RUN, need, train

pytestmark = pytest.mark.slow

REPORT = """
stage = callback.watch.result().to_dict()
print("RESULT", json.dumps(stage))
"""
OWN_COLLATE = """
print("OWN", LOADER.collate_fn is COLLATE)
"""


def shares(text: str) -> tuple[dict[str, float], float]:
    stage = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    got = {
        m["labels"]["load_stage"]: m["value"]
        for m in stage["metrics"]
        if m["labels"].get("quantity") == "exposed_share"
    }
    steps = next(m["value"] for m in stage["metrics"] if m["labels"] == {"quantity": "split_steps"})
    return got, steps


def test_the_transformers_callback_splits_the_wait_with_workers(tmp_path):
    need("accelerate", "transformers")
    run = TRANSFORMERS_RUN.replace("dataloader_num_workers=0", "dataloader_num_workers=2")
    run = run.replace('eval_strategy="steps"', 'eval_strategy="no"')
    # Reads of 80 ms a batch: at 20 ms a loaded machine's scheduling of the hand-over
    # (the CI's slow lane beside it) took up to half the exposed wait, read 0.48; at 80
    # ms read held 0.94 beside a CPU burner, the hand-over 0.04.
    run = run.replace("Slow(16 * BATCH, SAMPLE_MS, True)", "Slow(16 * BATCH, 4 * SAMPLE_MS, True)")
    got, steps = shares(train(tmp_path, run, REPORT))
    assert max(got, key=got.get) == "read"
    assert got["read"] > 0.5
    assert steps >= 12  # of the 15 measured: the first waits hold a batch ahead


def test_the_lightning_callback_splits_the_later_epochs_and_puts_collate_back(tmp_path):
    need("lightning")
    run = LIGHTNING_RUN.replace(
        "loader = torch.utils.data.DataLoader(Slow(16 * BATCH, SAMPLE_MS), batch_size=BATCH)",
        "COLLATE = torch.utils.data.default_collate\n"
        "loader = LOADER = torch.utils.data.DataLoader(Slow(6 * BATCH, 4 * SAMPLE_MS), "
        "batch_size=BATCH, num_workers=2, collate_fn=COLLATE)",
    ).replace("max_steps=16", "max_steps=18")
    # Reads of 80 ms a batch: each epoch restarts its 2 workers (start-up, which a
    # loaded machine stretches to a share of a 6-batch epoch of 20 ms batches)
    text = train(tmp_path, run, REPORT + OWN_COLLATE)
    got, steps = shares(text)
    assert max(got, key=got.get) == "read", got
    assert 8 <= steps <= 12  # epochs 2 and 3 (the first's workers carry no record)
    assert "OWN True" in text
