"""`starvecheck pad`: each strategy against hand-computed cases, the inputs it reads,
its advice, and the command end to end."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from starvecheck.advice.pad import rules
from starvecheck.advice.results import Results
from starvecheck.core.model import StageResult
from starvecheck.core.report import Report
from starvecheck.core.schema.pad import PadFigures, Strategy
from starvecheck.core.status import UsageError
from starvecheck.core.strategies import STRATEGIES
from starvecheck.inputs import dataset, embedded, records, streams, tokenizers
from starvecheck.inputs import lengths as lengthsfile
from starvecheck.render import pad as pad_table
from starvecheck.stages.pad import packing
from starvecheck.stages.pad import stage as pad
from tests.conftest import run, tiny_tokenizer

L = np.array([1, 2, 3, 4])  # 10 tokens; sum of squares 30


def fig(name, lengths=L, context=8, batch=2, seed=0):
    return packing.figures(packing.layout(name, lengths, context, batch, seed), lengths)


# --- strategies against hand-computed cases ------------------------------------


def test_pad_to_context():
    f = fig("pad_to_context")
    assert (f.positions, f.batches, f.max_batch_positions) == (32, 2, 16)
    assert f.efficiency == 10 / 32 and f.padding == 22
    assert f.attention == 4 * 8**2 and f.attention_unmasked is None


@pytest.mark.parametrize(
    ("name", "width"), [("dynamic", 4), ("dynamic_mult8", 8), ("dynamic_mult64", 64)]
)
def test_dynamic_padding_in_one_batch_pads_to_the_longest(name, width):
    f = fig(name, batch=4)  # one batch: the shuffle cannot matter
    assert f.positions == 4 * width and f.efficiency == 10 / (4 * width)
    assert f.attention == 4 * width**2


def test_dynamic_padding_pads_each_batch_to_its_own_longest():
    lay = packing._padded_rows("dynamic", np.array([1, 9, 2, 3, 8, 1]), np.arange(6), 2)
    assert lay.row_len.tolist() == [9, 9, 3, 3, 8, 8]
    assert lay.batch_positions().tolist() == [18, 6, 16]


def test_pad_to_multiple_may_pass_the_context_as_transformers_does():
    assert fig("dynamic_mult64", np.array([5, 70]), context=100, batch=2).positions == 2 * 128


def test_padding_free_has_no_padding_and_spans_the_batch_without_a_mask():
    f = fig("padding_free", batch=4)
    assert f.efficiency == 1.0 and f.positions == 10
    assert f.attention == 30 and f.attention_unmasked == 10**2  # one flat sequence of 10


def test_greedy_packing_fills_rows_in_arrival_order():
    lengths = np.array([5, 4, 3, 2, 6])
    lay = packing.layout("greedy_pack", lengths, 8, 2, 0)
    assert lay.row.tolist() == [0, 1, 1, 2, 2]  # 5 | 4 3 | 2 6
    f = packing.figures(lay, lengths)
    assert f.positions == 24 and f.efficiency == 20 / 24 and f.batches == 2
    assert f.attention == 25 + 16 + 9 + 4 + 36 and f.attention_unmasked == 3 * 64


def test_first_fit_decreasing_packs_longest_first():
    lengths = np.array([5, 4, 3, 2, 6])
    lay = packing.layout("ffd_pack", lengths, 8, 2, 0)
    rows = [sorted(lengths[lay.order[lay.row == r]].tolist()) for r in range(lay.rows)]
    assert rows == [[2, 6], [3, 5], [4]]


def test_best_fit_goes_to_the_fullest_row_first_fit_to_the_first():
    # Longest first (context 10): 7 opens row 0 (room 3), 5 opens row 1 (room 5), 4
    # joins row 1 (room 1). The 1 fits both: first-fit takes row 0, best-fit row 1.
    lengths = np.array([5, 7, 4, 1])
    for best, last in ((False, 0), (True, 1)):
        order, row = packing.fit_decreasing(lengths, 10, best)
        assert dict(zip(order.tolist(), row.tolist(), strict=True)) == {1: 0, 0: 1, 2: 1, 3: last}


def test_length_grouped_is_transformers_group_by_length(monkeypatch):
    torch = pytest.importorskip("torch")
    trainer_pt_utils = pytest.importorskip("transformers.trainer_pt_utils")
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 500, 1000)
    ours = packing.length_grouped_order(lengths, 8, seed=11)
    perm = np.random.RandomState(11).permutation(lengths.size)
    monkeypatch.setattr(torch, "randperm", lambda n, generator=None: torch.tensor(perm))
    theirs = trainer_pt_utils.get_length_grouped_indices(lengths.tolist(), 8)
    # Equal lengths may sit in either order; the batches' lengths are what count.
    assert lengths[ours].tolist() == lengths[theirs].tolist()


def test_length_grouping_beats_random_batches_on_varied_lengths():
    lengths = embedded.alpaca_like(4000)
    grouped = fig("length_grouped", lengths, context=4096, batch=32).efficiency
    assert grouped > 1.5 * fig("dynamic", lengths, context=4096, batch=32).efficiency


def test_lengths_outside_the_context_are_refused():
    with pytest.raises(ValueError):
        packing.layout("greedy_pack", np.array([3, 9]), 8, 2, 0)
    with pytest.raises(ValueError):
        packing.layout("dynamic", np.array([0, 2]), 8, 2, 0)


# --- the embedded default ----------------------------------------------------------


def test_the_default_matches_the_published_alpaca_figures():
    lengths = embedded.alpaca_like()
    assert lengths.size == 2000
    assert (lengths.min(), lengths.max(), float(np.median(lengths))) == (13, 307, 83.0)
    assert abs(lengths.mean() - 95) < 0.1
    assert np.array_equal(lengths, embedded.alpaca_like())  # the same every run
    assert not np.array_equal(lengths, np.sort(lengths))  # shuffled: arrival order is random
    assert embedded.alpaca_like(10**5).max() == 307


# --- reading datasets ---------------------------------------------------------------


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_fields_are_joined_with_a_newline(tmp_path):
    p = write_jsonl(
        tmp_path / "a.jsonl",
        [{"instruction": "fix", "input": "", "output": "ok"}, {"instruction": "go", "output": "x"}],
    )
    s = dataset.read_samples(str(p), "jsonl", ("instruction", "input", "output"))
    assert s.items == ["fix\n\nok", "go\nx"]
    assert s.missing == {"input": 1}


@pytest.mark.parametrize("fmt", ["json", "csv", "tsv", "text", "jsonl.gz"])
def test_every_format_gives_the_same_samples(tmp_path, fmt):
    texts = ["the quick fox", 'a "quoted", comma', "lazy dog"]
    if fmt == "json":
        p = tmp_path / "d.json"
        p.write_text(json.dumps([{"text": t} for t in texts], indent=1))
    elif fmt in ("csv", "tsv"):
        import csv

        p = tmp_path / f"d.{fmt}"
        with p.open("w", newline="") as f:
            w = csv.writer(f, delimiter="," if fmt == "csv" else "\t")
            w.writerow(["id", "text"])
            w.writerows([i, t] for i, t in enumerate(texts))
    elif fmt == "text":
        p = tmp_path / "d.txt"
        p.write_text("\n".join([*texts[:1], "", *texts[1:]]) + "\n")  # blank lines skipped
    else:
        p = tmp_path / "d.jsonl.gz"
        with gzip.open(p, "wt") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    detected = records.detect_format(str(p))
    assert dataset.read_samples(str(p), detected, ()).items == texts


def test_parquet_reads_only_the_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["a b", "c"], "input_ids": [[1, 2], [3]]}), p)
    assert dataset.read_samples(str(p), "parquet", ()).items == ["a b", "c"]
    ids = dataset.read_samples(str(p), "parquet", ("input_ids",))
    assert ids.items == [2, 1] and ids.pretokenized


def test_token_ids_and_chat_messages(tmp_path):
    p = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"input_ids": [5, 6, 7], "messages": [{"role": "user", "content": "hi"}]},
            {"input_ids": [1], "messages": [{"role": "user", "content": "a b"}]},
        ],
    )
    assert dataset.read_samples(str(p), "jsonl", ()).items == [3, 1]  # input_ids by default
    chats = dataset.read_samples(str(p), "jsonl", ("messages",)).items
    assert chats[1] == [{"role": "user", "content": "a b"}]


@pytest.mark.parametrize(
    ("content", "fields", "message"),
    [
        ('{"text": "a"}\nnot json\n', (), "line 2: not JSON"),
        ("[1, 2]\n", (), "line 1: expected an object"),
        ('{"body": "a"}\n', (), "no 'text' field; name the field(s) to measure with --field"),
        ('{"body": "a"}\n', ("title",), "--field title: not in"),
        ('{"text": {"a": 1}}\n', (), "holds an object"),
        ('{"a": "x", "b": [1, 2]}\n', ("a", "b"), "only text fields can be joined"),
        ("\n\n", (), "no records"),
    ],
)
def test_bad_datasets_are_one_usage_line(tmp_path, content, fields, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(UsageError) as e:
        dataset.read_samples(str(p), "jsonl", fields)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_undecodable_and_missing_files(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes(b"caf\xe9\n")
    with pytest.raises(UsageError, match="not UTF-8"):
        dataset.read_samples(str(p), "text", ())
    with pytest.raises(UsageError, match="no such file"):
        dataset.read_samples(str(tmp_path / "nope.jsonl"), "jsonl", ())
    with pytest.raises(UsageError, match="is a directory"):
        dataset.read_samples(str(tmp_path), "jsonl", ())
    bad_gz = tmp_path / "x.jsonl.gz"
    bad_gz.write_bytes(b"not gzip at all")
    with pytest.raises(UsageError, match="cannot read"):
        dataset.read_samples(str(bad_gz), "jsonl", ())


def test_lengths_file_parsing(tmp_path):
    assert lengthsfile.parse_lengths(["# n", "3", " 7 ", "", "0"], "f").tolist() == [3, 7, 0]
    assert lengthsfile.parse_lengths(["1", "2", "3"], "f", limit=2).tolist() == [1, 2]
    for bad, line in (("-3", 1), ("4.5", 1), ("x", 1), ("1e3", 1)):
        with pytest.raises(UsageError, match=f"line {line}: "):
            lengthsfile.parse_lengths([bad], "f")


# --- reading --lengths a block at a time ---------------------------------------------


def per_line(path) -> np.ndarray | str:
    """What --lengths gave when every line was read and parsed on its own: the
    reference the block reader must match."""
    f = streams.open_text(str(path), "--lengths")
    try:
        lines = (line for _, line, _ in streams.bounded_lines(f, lengthsfile.LINE_CHARS))
        return lengthsfile.parse_lengths(lines, str(path))
    except UsageError as e:
        return str(e)
    finally:
        f.close()


def read(path, limit=None) -> np.ndarray | str:
    try:
        return lengthsfile.read_lengths(str(path), limit=limit)
    except UsageError as e:
        return str(e)


@pytest.fixture
def tiny_blocks(monkeypatch):
    """64 bytes a read and blocks halved down to 8 characters, so that a file of 40
    short lines crosses every kind of boundary."""
    monkeypatch.setattr(lengthsfile, "READ_SIZE", 64)
    monkeypatch.setattr(lengthsfile, "SMALL_CHARS", 8)
    monkeypatch.setattr(lengthsfile, "LONG_CHARS", 64)


@pytest.mark.parametrize(
    ("content", "want"),
    [
        (b"3\n7\n0\n", [3, 7, 0]),
        (b"3\r\n7\r\n", [3, 7]),  # Windows line ends
        (b"3\n7", [3, 7]),  # no "\n" at the end
        (b"\n\n3\n\n \t\n7\n\n", [3, 7]),  # blank lines are skipped
        (b"# lengths\n3\n  # a comment\n7\n", [3, 7]),
        (b" 3 \n\t7\t\n0007\n", [3, 7, 7]),  # blanks around a number; leading zeros
        (b"\xef\xbb\xbf3\n7\n", [3, 7]),  # a byte-order mark (Excel) is skipped
        (b"1\r2\r3\r", [1, 2, 3]),  # "\r" alone ends a line, as it did
        (b"1099511627776\n", [lengthsfile.MAX_LENGTH]),
        (b"", []),
    ],
)
def test_a_lengths_file_reads_as_it_did_line_by_line(tmp_path, tiny_blocks, content, want):
    path = tmp_path / "lengths.txt"
    path.write_bytes(content)
    assert read(path).tolist() == per_line(path).tolist() == want
    gz = tmp_path / "lengths.txt.gz"
    gz.write_bytes(gzip.compress(content))
    assert read(gz).tolist() == want


BAD_TAIL = "is not a token count (one whole number per line)"
BAD_LINES = [
    ("-3", "'-3' is not a token count"),
    ("4.5", "'4.5' is not a token count"),
    ("1e3", "'1e3' is not a token count"),
    ("nan", "'nan' is not a token count"),
    ("x", "'x' is not a token count"),
    ("1 2", "'1 2' is not a token count"),
    ("\x1b[31m5", "'\\x1b[31m5' is not a token count"),  # shown escaped
    ("\ufeff5", "'\\ufeff5' is not a token count"),  # a byte-order mark mid-file
    ("9" * 30, "99999999999999999999 tokens is too many"),
    ("1099511627777", "1099511627777 tokens is too many"),  # MAX_LENGTH + 1
]


@pytest.mark.parametrize("end", ["\n", "\r\n"])
@pytest.mark.parametrize(("bad", "message"), BAD_LINES)
def test_a_bad_line_is_named_wherever_it_falls_in_the_blocks(
    tmp_path, tiny_blocks, bad, message, end
):
    # 40 lines, 64 bytes a read: the bad line at each of them is at the start of the
    # file, in the middle or at the end of a block, across a block boundary, or last
    # without its line end.
    for where in range(1, 41):
        lines = [str(100 + i) for i in range(1, 41)]
        lines[where - 1] = bad
        path = tmp_path / f"l{where}.txt"
        path.write_bytes((end.join(lines) + (end if where < 40 else "")).encode())
        if where == 1 and bad.startswith("\ufeff"):  # a mark that opens the file is skipped
            assert read(path).tolist() == per_line(path).tolist() == [5, *range(102, 141)]
            continue
        tail = " (one whole number per line)" if "token count" in message else ""
        want = f"--lengths {path}: line {where}: {message}{tail}"
        assert read(path) == per_line(path) == want


def test_a_huge_line_is_cut_and_named_as_the_per_line_reader_did(tmp_path, tiny_blocks):
    path = tmp_path / "l.txt"
    path.write_bytes(b"12\n" + b"9" * 100_000 + b"\n7\n")
    assert (
        read(path) == per_line(path) == f"--lengths {path}: line 2: {'9' * 20} tokens is too many"
    )
    # cut while read: blanks past the cut are never seen (as before)
    path.write_bytes(b"12\n" + b" " * 5000 + b"5\n7\n")
    assert read(path).tolist() == per_line(path).tolist() == [12, 7]
    # a file of lines ended by "\r" alone has no "\n": cut into blocks after a "\r"
    path.write_bytes(b"3\r" * 1000)
    assert read(path).tolist() == [3] * 1000
    path.write_bytes(b"3\r" * 1000 + b"x\r")
    assert read(path) == per_line(path) == f"--lengths {path}: line 1001: 'x' {BAD_TAIL}"


def test_limit_stops_reading_where_the_per_line_reader_stopped(tmp_path, tiny_blocks):
    path = tmp_path / "l.txt"
    path.write_bytes(b"".join(b"%d\n" % i for i in range(1, 41)) + b"x\n\xff\n")
    assert read(path, limit=40).tolist() == list(range(1, 41))  # nothing bad before it
    assert read(path, limit=3).tolist() == [1, 2, 3]
    assert read(path) == f"--lengths {path}: line 41: 'x' {BAD_TAIL}"  # the first problem
    path.write_bytes(b"1\n2\n\xff\n")
    assert read(path) == f"--lengths {path}: not UTF-8 text (invalid start byte)"
    assert read(path, limit=2).tolist() == [1, 2]
    path.write_bytes(gzip.compress(b"1\n2\n" * 1000)[:-20])  # a gzip file cut short
    gz = path.rename(tmp_path / "l.txt.gz")
    assert read(gz).startswith(f"--lengths {gz}: cannot read: ")


def test_lengths_from_stdin_are_read_as_they_come(tmp_path):
    import subprocess
    import sys

    argv = [sys.executable, "-m", "starvecheck", "pad", "--lengths", "-", "--limit", "3"]
    proc = subprocess.Popen([*argv, "--json", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        proc.stdin.write(b"12\n40\n7\n")  # and the pipe stays open: three are enough
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    metrics = {m["name"]: m["value"] for m in json.loads(out)["stages"][0]["metrics"]}
    assert metrics["samples"] == 3 and metrics["tokens"] == 59
    # standard input closed (`<&-`): one line
    r = subprocess.run(
        ["sh", "-c", 'exec "$0" "$@" <&-', *argv], capture_output=True, text=True, timeout=60
    )
    assert (
        r.returncode == 2
        and r.stderr == "starvecheck: error: --lengths -: standard input is closed\n"
    )


def test_tokenized_lengths_count_special_tokens_as_training_does(tmp_path):
    tiny_tokenizer(tmp_path / "tok")
    tok = tokenizers.load_tokenizer(str(tmp_path / "tok"))
    samples = ["the quick fox", "lazy dog jumps over the dog", 17]
    got = tokenizers.token_lengths(samples, tok, batch=2).tolist()
    want = [len(tok(t)["input_ids"]) for t in samples[:2]] + [17]
    assert got == want == [3, 6, 17]


# --- advice -------------------------------------------------------------------------


def judged(result: StageResult) -> list:
    """pad's rules over one result, as judging runs them once per report."""
    return rules(Results({"pad": result}))


def advise_on(lengths, **plan):
    return {f.id: f for f in judged(pad_run(lengths, **plan).result)}


def pad_run(lengths, **plan):
    path = plan.pop("path")
    path.write_text("\n".join(map(str, lengths)) + "\n")
    return pad.run(pad.Plan(lengths=str(path), **plan))


def test_padding_to_the_context_on_short_samples_is_critical(tmp_path):
    f = advise_on(embedded.alpaca_like(), path=tmp_path / "l", current="pad_to_context")
    waste = f["pad.waste"]
    assert waste.severity.value == "critical"
    assert waste.gain.value == pytest.approx(1 / 0.0232, rel=0.02)  # 100% over 2.3%
    assert "DataCollatorWithFlattening" in waste.recommendation
    assert "group_by_length=True" in waste.recommendation  # the fallback without varlen
    assert "pad.truncated" not in f


def test_packing_already_is_passed(tmp_path):
    f = advise_on(embedded.alpaca_like(), path=tmp_path / "l", current="bfd_pack")
    assert f["pad.waste"].severity.value == "ok"


def test_equal_lengths_need_no_change(tmp_path):
    f = advise_on([64] * 100, path=tmp_path / "l", current="pad_to_context", context=64)
    assert f["pad.waste"].severity.value == "ok"


def test_samples_past_the_context_are_counted_and_cut(tmp_path):
    r = pad_run([10, 20, 300, 500], path=tmp_path / "l", context=100, batch_size=2)
    m = {x.name: x.value for x in r.result.metrics}
    assert m["truncated_samples"] == 2 and m["truncated_tokens"] == 200 + 400
    assert m["tokens"] == 10 + 20 + 100 + 100 and m["length.max"] == 500
    f = {x.id: x for x in judged(r.result)}["pad.truncated"]
    assert f.severity.value == "warning" and "2 samples (50.0%)" in f.title
    assert r.lengths.max() == 100


def test_stored_reports_are_judged_as_fresh_ones(tmp_path):
    r = pad_run(embedded.alpaca_like(), path=tmp_path / "l")
    assert r.result.findings == ()  # the stage measures; judging comes after
    stored = StageResult.from_dict(json.loads(json.dumps(r.result.to_dict())))
    fresh = judged(r.result)
    assert fresh and [f.to_dict() for f in judged(stored)] == [f.to_dict() for f in fresh]
    # by labels: the same figures under other names are judged the same
    renamed = replace(r.result, metrics=tuple(replace(m, name="?") for m in r.result.metrics))
    assert [f.to_dict() for f in judged(renamed)] == [f.to_dict() for f in fresh]


def test_the_table_selects_by_labels_not_names(tmp_path):
    """A metric renamed but labelled the same lands in the same row and cell; one
    without labels is no strategy's, so it is left for the plain list."""
    r = pad_run([10, 20, 300, 500], path=tmp_path / "l", context=100, batch_size=2)
    metrics = r.result.metrics

    def table(metrics):
        result = replace(r.result, metrics=metrics)
        shown, rest = pad_table.sections(result, metrics)
        return [(s.rows, s.notes) for s in shown], rest

    (rows, notes), rest = table(metrics)[0][0], table(metrics)[1]
    assert len(rows) == len(STRATEGIES) and rest == [] and len(notes) == 2
    renamed = tuple(replace(m, name=f"x{i}") for i, m in enumerate(metrics))
    assert table(renamed) == ([(rows, notes)], [])
    unlabelled = tuple(replace(m, labels={}) for m in metrics)
    assert table(unlabelled) == ([], list(unlabelled))
    assert judged(replace(r.result, metrics=unlabelled)) == []


def test_caveats_carry_stable_ids(tmp_path):
    r = pad_run([0, 10, 20, 300], path=tmp_path / "l", context=100)
    assert r.result.has_caveat("pad.empty-samples") and r.result.has_caveat("pad.shared-rows")
    default = pad.run(pad.Plan(limit=100)).result
    assert default.has_caveat("pad.default-lengths")
    # The JSON keeps the sentence alone.
    assert default.to_dict()["caveats"][0].startswith("no --dataset or --lengths: 100 ")


# --- end to end ---------------------------------------------------------------------


def metrics(r):
    return {m["name"]: m for m in r.json["stages"][0]["metrics"]}


def test_default_run_reports_every_strategy():
    r = run("pad", "--json", "-")
    assert r.exit_code == 0, r.stderr
    assert r.json["schema_version"] == 3
    stage = r.json["stages"][0]
    assert stage["metrics"] and all(m["labels"].get("quantity") for m in stage["metrics"])
    assert {m["labels"].get("strategy") for m in stage["metrics"]} >= {*STRATEGIES, "ideal"}
    m = metrics(r)
    for s in STRATEGIES:
        for what in ("efficiency", "batches", "attention_cost"):
            assert m[f"{what}.{s}"]["value"] is not None, (what, s)
    assert 0.021 < m["efficiency.pad_to_context"]["value"] < 0.025  # published: 2.3%
    for s in ("greedy_pack", "ffd_pack", "bfd_pack", "padding_free"):
        assert m[f"efficiency.{s}"]["value"] > 0.95
    assert m["efficiency.dynamic"]["n"] == 5  # five shuffles, median and spread
    assert m["batches.bfd_pack"]["value"] < m["batches.dynamic"]["value"]
    assert r.json["stages"][0]["parameters"]["source"] == "default"


def test_terminal_output_is_a_table_and_a_checklist():
    r = run("pad", "--current", "pad_to_context")
    assert r.exit_code == 0, r.stderr
    assert "pad_to_context (current)" in r.stdout and "bfd_pack" in r.stdout
    assert "2,000 samples, 189,998 tokens" in r.stdout
    # The embedded lengths are nobody's data: a hint, said so, never CRITICAL.
    assert "[pad.waste]" in r.stdout and "WARNING" in r.stdout and "CRITICAL" not in r.stdout
    assert "(on the embedded Alpaca-like lengths, not your data)" in r.stdout


def test_markdown_has_the_strategy_table():
    r = run("pad", "--markdown", "-")
    assert "| strategy | real |" in r.stdout and "| dynamic (current) |" in r.stdout


def test_fail_on_critical_gates_ci(tmp_path):
    # Defaults (the embedded lengths) never fail a CI job on critical...
    assert run("pad", "--json", "/dev/null", "--fail-on", "critical").exit_code == 0
    # ... the user's own lengths do, and packing them already passes.
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(map(str, embedded.alpaca_like())) + "\n")
    mine = ("--lengths", str(lengths), "--json", "/dev/null", "--fail-on", "critical")
    assert run("pad", *mine, "--current", "pad_to_context").exit_code == 1
    assert run("pad", *mine, "--current", "bfd_pack").exit_code == 0


def test_a_real_dataset_with_a_local_tokenizer(tmp_path):
    tok_dir = tiny_tokenizer(tmp_path / "tok")
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    rng = np.random.default_rng(0)
    records = [
        {"instruction": " ".join(rng.choice(words, rng.integers(1, 30))), "output": "dog"}
        for _ in range(300)
    ]
    data = write_jsonl(tmp_path / "train.jsonl", records)
    r = run(
        "pad",
        "--dataset", str(data),
        "--field", "instruction,output",
        "--tokenizer", str(tok_dir),
        "--context", "32",
        "--batch-size", "8",
        "--json", "-",
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    m = metrics(r)
    want = sum(len(rec["instruction"].split()) + 1 for rec in records)  # one token a word
    assert m["samples"]["value"] == 300 and m["tokens"]["value"] == want
    stage = r.json["stages"][0]
    assert stage["parameters"]["fields"] == ["instruction", "output"]
    assert stage["parameters"]["format"] == "jsonl"
    # --limit reads the first N records only
    r = run("pad", "--dataset", str(data), "--field", "instruction", "--tokenizer",
            str(tok_dir), "--limit", "10", "--json", "-")  # fmt: skip
    assert metrics(r)["samples"]["value"] == 10


def test_pretokenized_data_needs_no_tokenizer(tmp_path):
    data = write_jsonl(tmp_path / "t.jsonl", [{"input_ids": list(range(n))} for n in (3, 5, 8)])
    r = run("pad", "--dataset", str(data), "--context", "8", "--json", "-")
    assert r.exit_code == 0, r.stderr
    assert metrics(r)["tokens"]["value"] == 16


def test_lengths_from_stdin():
    r = run("pad", "--lengths", "-", "--context", "10", "--json", "-", stdin="4\n6\n10\n")
    assert r.exit_code == 0, r.stderr
    assert metrics(r)["efficiency.greedy_pack"]["value"] == 1.0  # 4+6 | 10


def test_plot_shows_padding_at_a_glance(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    png = tmp_path / "pad.png"
    r = run("pad", "--plot", str(png), "--json", "/dev/null")
    assert r.exit_code == 0, r.stderr
    image = matplotlib.image.imread(str(png))[..., :3]
    orange = np.all(np.abs(image - np.array([0xE4, 0x57, 0x2E]) / 255) < 0.02, axis=-1)
    blue = np.all(np.abs(image - np.array([0x1F, 0x5F, 0x8B]) / 255) < 0.02, axis=-1)
    height = image.shape[0]
    # pad_to_context's panel (top) is mostly padding; the packing panels (bottom) mostly tokens.
    assert orange[: height // 6].sum() > 5 * blue[: height // 6].sum()
    assert blue[-height // 4 :].sum() > 5 * orange[-height // 4 :].sum()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dataset", "a.jsonl", "--lengths", "b"], "choose one source"),
        (["--tokenizer", "t"], "--tokenizer applies to --dataset"),
        (["--field", "text"], "--field applies to --dataset"),
        (["--format", "csv"], "--format applies to --dataset"),
        (["--lengths", "/nonexistent/l"], "no such file"),
        (["--dataset", "/nonexistent/d.jsonl"], "no such file"),
        (["--context", "0"], "--context"),
        (["--current", "sorted"], "--current"),
        (["--dataset", "x.jsonl", "--field", ","], "empty field name"),
        (["--plot", "/nonexistent/dir/p.png"], "--plot"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message):
    r = run("pad", *argv)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert message in r.stderr and r.stderr.count("\n") == 1 and not r.stdout


def test_text_without_a_tokenizer_says_what_to_pass(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    r = run("pad", "--dataset", str(data))
    assert r.exit_code == 2 and "--tokenizer" in r.stderr and r.stderr.count("\n") == 1


def test_tokenizer_that_is_not_local_is_refused_without_network(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "a b"}])
    r = run("pad", "--dataset", str(data), "--tokenizer", "no-such-org/no-such-model")
    assert r.exit_code == 2 and "never downloads" in r.stderr


def test_ctrl_c_while_reading_lengths_is_one_line_and_leaves_no_plot(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    png = tmp_path / "pad.png"
    proc = subprocess.Popen(
        [sys.executable, "-m", "starvecheck", "pad", "--lengths", "-", "--plot", str(png)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdin.write("12\n40\n")  # and the pipe stays open: pad waits for more
        proc.stdin.flush()
        time.sleep(2.0)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == "starvecheck: error: interrupted\n" and out == ""
    assert list(tmp_path.iterdir()) == []


def test_deeply_nested_json_is_a_usage_error(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(UsageError, match="nested too deeply"):
        dataset.read_samples(str(p), "jsonl", ())
    q = tmp_path / "deep.json"
    q.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="nested too deeply"):
        dataset.read_samples(str(q), "json", ())


def test_the_figures_are_a_record_written_and_read_back_as_the_metrics(tmp_path):
    """The stage's metrics are its record's serialisation: read back, the record
    writes them again (names, labels, units, order); so do the golden report's."""
    r = pad_run([10, 20, 300, 500, 0], path=tmp_path / "l", context=100, batch_size=2)
    golden = Path(__file__).parent / "golden" / "pad-default.json"
    stored = Report.from_dict(json.loads(golden.read_text())).stages[0]
    for result in (r.result, stored):
        figures = result.records(PadFigures)
        assert figures.to_metrics() == result.metrics
        assert [c.strategy for c in figures.costs] == list(Strategy)
    figures = r.result.records(PadFigures)
    assert figures.lengths.empty_samples is not None and figures.lengths.max.value == 500
    assert figures.cost("padding_free").attention_unmasked_vs_ideal is not None
    assert figures.cost("dynamic").attention_unmasked_vs_ideal is None
    assert PadFigures.from_metrics([]) == PadFigures()
