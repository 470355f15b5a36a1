"""The sample digest (inputs/fingerprints.py) never fails a valid pipeline (issue 48,
item 5): a batch it cannot read (sparse, nested, a conjugate or negative view, a
custom object with .shape and .dtype, items whose __repr__ raises) is left out of the
right-data checks with the field and why, never an error; what it reads of a sample is
bounded (no repr() of whole objects)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from starvecheck.inputs.fingerprints import FIRST_BYTES, Repeats, digest_batch, digests

torch = pytest.importorskip("torch")


class Loud:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no eq")

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


class Shaped:
    """A batch object of the user's own with .shape and .dtype, nothing else."""

    shape = (4, 3)
    dtype = "float32"


def _objects(items: list[object]) -> np.ndarray:
    a = np.empty(len(items), dtype=object)
    a[:] = items
    return a


def _odd() -> dict[str, object]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "coo": torch.eye(4).to_sparse(),
            "csr": torch.eye(4).to_sparse_csr(),
            "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
            "custom": Shaped(),
            "meta": torch.ones(4, 2, device="meta"),
        }


@pytest.mark.parametrize("name", ["coo", "csr", "nested", "custom", "meta"])
def test_a_field_the_digest_cannot_read_is_named_never_raised(name: str) -> None:
    odd = _odd()[name]
    alone = digest_batch(odd, 4)
    assert alone.values is None
    assert alone.skipped and alone.skipped[0].startswith("field 0 ("), alone.skipped
    beside = digest_batch((odd, torch.arange(4)), 4)  # the other field still tells
    assert beside.values is not None and len(set(beside.values)) == 4
    assert "field 0" in beside.skipped[0]


def test_conjugate_and_negative_views_are_read_as_their_memory() -> None:
    z = torch.arange(8.0).reshape(4, 2).to(torch.complex64)
    conj, neg = z.conj(), z.conj().imag
    assert conj.is_conj() and neg.is_neg()
    assert digests(conj, 4) == digests(conj.conj(), 4)  # the same memory, the same digest
    assert len(set(digests(conj, 4) or [])) == 4
    assert digests(neg, 4) is not None


def test_items_whose_code_raises_are_read_without_calling_it() -> None:
    """An object array whose items' __repr__, __eq__ and __hash__ raise: the digest
    reads their type, and a dict with keys of any kind."""
    batch = (_objects([Loud() for _ in range(4)]), [{1: Loud(), (2, 3): b"x"}] * 4)
    d = digest_batch(batch, 4)
    assert d.values is not None and d.skipped == []


def test_a_huge_string_is_read_only_as_far_as_first_bytes() -> None:
    """An object array of 1 MiB strings was repr()'d whole (2.56 s a batch against 0.64 s
    to make it): each item is read as far as FIRST_BYTES, never in full."""
    taken: list[int] = []

    class Huge(str):
        def __getitem__(self, key: object) -> str:
            if isinstance(key, slice):
                taken.append(len(range(*key.indices(len(self)))))
            return str.__getitem__(self, key)  # type: ignore[index]

        def __repr__(self) -> str:
            raise AssertionError("repr() of a whole sample")

    rows = [Huge(chr(65 + i) * (1 << 20)) for i in range(4)]
    d = digests(_objects(rows), 4)
    assert d is not None and len(set(d)) == 4
    assert taken and max(taken) <= FIRST_BYTES


def test_repeats_never_raise_and_keep_the_reasons() -> None:
    r = Repeats()
    for odd in _odd().values():
        r.add(odd, 4)
        r.add((odd, torch.arange(4)), 4)
    assert r.unreadable == len(_odd())
    assert r.read == 4 * len(_odd())
    assert any("nested" in why for why in r.skipped), r.skipped


HEAD = textwrap.dedent(
    """
    import warnings
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset
    warnings.simplefilter("ignore")

    class Loud:
        def __repr__(self):
            raise RuntimeError("no repr")

    class Small(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            return i

    def make(collate):
        return DataLoader(Small(), batch_size=4, collate_fn=collate)

    def sparse():
        return make(lambda b: (torch.eye(4).to_sparse(), torch.tensor(b)))

    def csr():
        return make(lambda b: torch.eye(4).to_sparse_csr())

    def nested():
        return make(lambda b: torch.nested.nested_tensor([torch.ones(i % 3 + 1) for i in b]))

    def conj():
        return make(lambda b: torch.tensor(b, dtype=torch.complex64).conj())

    def objects():
        def collate(b):
            a = np.empty(len(b), dtype=object)
            a[:] = [Loud() for _ in b]
            return a, torch.tensor(b)
        return make(collate)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("func", "said"),
    [
        ("sparse", "sparse_coo"),
        ("csr", "sparse_csr"),
        ("nested", "nested"),
        ("conj", None),
        ("objects", None),
    ],
)
def test_a_pipeline_of_odd_batches_is_measured_not_blamed(
    tmp_path: Path, func: str, said: str | None
) -> None:
    """Each was exit 2 (or 70) blaming the pipeline for an error in starvecheck's digest."""
    pipe = tmp_path / "oddpipe.py"
    pipe.write_text(HEAD)
    report = tmp_path / "r.json"
    r = subprocess.run(
        [sys.executable, "-m", "starvecheck", "loader", "--factory", f"{pipe}:{func}",
         "--quick", "--budget", "0.5", "--workers", "0", "--json", str(report)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    stage = json.loads(report.read_text())["stages"][0]
    texts = " ".join(json.dumps(c) for c in stage["caveats"])
    if said is None:
        assert "digest" not in texts, texts
    else:
        assert "digest could not read" in texts and said in texts, texts
