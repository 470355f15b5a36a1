"""The workload: defaults, the TOML file, options over the file, and one-line errors for
every bad value (property-tested: garbage never gives a traceback)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from starvecheck.core.status import UsageError
from starvecheck.inputs.workload import ASSUMED_STEP_MS, Workload, check, read_file, resolve
from tests.conftest import run


def test_defaults_describe_a_small_llm_fine_tune():
    w = Workload()
    assert (w.batch_size, w.context, w.sample_size, w.cpu_ms_per_sample) == (16, 2048, 8192, 2.0)
    assert (w.layout, w.current, w.step_ms) == ("shard", "dynamic", None)
    assert w.demand is None
    assert w.set("step_ms", ASSUMED_STEP_MS, "assumed").demand == 40.0  # 16 per 0.4 s
    assert w.wire_bytes_per_sample == 2048 * 8
    assert all(v["source"] == "default" for v in w.to_dict().values())


def test_file_then_options_with_sources(tmp_path):
    f = tmp_path / "w.toml"
    f.write_text(
        'batch_size = 32\nseq_len = 4096\nsample_size = "16KiB"\nstep_ms = 250\n'
        'layout = "small_files"\nfield = "instruction,output"\ndataset = "d.jsonl"\n'
    )
    values = read_file(str(f))
    assert values == {
        "batch_size": 32,
        "context": 4096,
        "sample_size": 16384,
        "step_ms": 250.0,
        "layout": "small_files",
        "field": ("instruction", "output"),
        "dataset": "d.jsonl",
    }
    w = resolve(values, {"batch_size": 8})
    assert (w.batch_size, w.source("batch_size")) == (8, "option")
    assert (w.context, w.source("context")) == (4096, "file")
    assert (w.cpu_ms_per_sample, w.source("cpu_ms_per_sample")) == (2.0, "default")
    assert w.demand == pytest.approx(8 / 0.25)
    assert Workload.from_dict(w.to_dict()) == w


@pytest.mark.parametrize(
    "text, needle",
    [
        ("batch = 3\n", "unknown key 'batch'"),
        ('batch_size = "16"\n', "batch_size = '16': expected a whole number"),
        ("batch_size = true\n", "batch_size = True: expected a whole number"),
        ("batch_size = 0\n", "batch_size = 0: expected 1 to 1,000,000"),
        ("step_ms = -1\n", "step_ms = -1: expected"),
        ("step_ms = nan\n", "step_ms = nan: expected"),
        ('sample_size = "lots"\n', "sample_size = 'lots': expected bytes"),
        ('sample_size = "2GiB"\n', "sample_size = '2GiB': expected 1 byte to 1 GiB"),
        ('layout = "tar"\n', "layout = 'tar': expected one of shard, small_files"),
        ('current = "magic"\n', "current = 'magic': expected one of pad_to_context"),
        ('field = ["a", ""]\n', "empty field name"),
        ("field = [1]\n", "expected a field name"),
        ('dataset = ""\n', "expected a non-empty string"),
        ("context = 4\nseq_len = 8\n", "seq_len repeats context"),
        ("batch_size = \n", "not valid TOML"),
        ("[section]\nx = 1\n", "unknown key 'section'"),
    ],
)
def test_bad_files_are_one_line_naming_the_key(tmp_path, text, needle):
    f = tmp_path / "w.toml"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        read_file(str(f))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith(f"--workload {f}")


def test_unreadable_files(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        read_file(str(tmp_path / "missing.toml"))
    with pytest.raises(UsageError, match="is a directory"):
        read_file(str(tmp_path))
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'dataset = "caf\xe9"\n')
    with pytest.raises(UsageError):
        read_file(str(bad))


def test_option_values_are_checked_the_same_way():
    assert check("sample_size", "8K", "--sample-size") == 8192
    with pytest.raises(UsageError, match=r"^--batch-size: batch_size = 0"):
        check("batch_size", 0, "--batch-size")


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=300))
def test_garbage_files_never_raise_anything_but_a_usage_error(tmp_path, data):
    f = tmp_path / "g.toml"
    f.write_bytes(data)
    try:
        values = read_file(str(f))
    except UsageError as e:
        assert "\n" not in str(e)
        return
    resolve(values, {})  # whatever parsed is usable


KEYS = ["batch_size", "context", "seq_len", "sample_size", "cpu_ms_per_sample", "step_ms"]
KEYS += ["layout", "current", "dataset", "field", "tokenizer", "token_bytes", "nonsense"]
VALUE = st.one_of(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=12).map(lambda s: f'"{s}"'.replace("\\", "")),
    st.lists(st.sampled_from(['"a"', '"b,c"', '""', "1"]), max_size=3).map(
        lambda xs: "[" + ", ".join(xs) + "]"
    ),
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(str(value), repr(value))
    return str(value)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(pairs=st.dictionaries(st.sampled_from(KEYS), VALUE, max_size=5))
def test_wellformed_toml_with_any_values_is_checked_or_refused(tmp_path, pairs):
    f = tmp_path / "v.toml"
    f.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in pairs.items()), encoding="utf-8")
    try:
        w = resolve(read_file(str(f)), {})
    except UsageError as e:
        assert "\n" not in str(e)
        return
    assert 1 <= w.batch_size <= 1_000_000 and 1 <= w.sample_size <= 1 << 30
    assert w.step_ms is None or w.step_ms > 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.one_of(st.binary(max_size=120), st.text(max_size=120).map(str.encode)))
def test_garbage_workload_through_the_cli_is_one_line_or_a_run(tmp_path, data):
    f = tmp_path / "g.toml"
    f.write_bytes(data)
    r = run("doctor", "--only", "pad", "--step-ms", "100", "--workload", str(f), "--json", "-")
    assert r.exit_code in (0, 2), r.stderr
    if r.exit_code == 2:
        assert r.stderr.startswith("starvecheck: error: --workload ") and r.stderr.count("\n") == 1
    else:
        assert r.json["command"] == "doctor"


DEEP = {
    "arrays": "a = " + "[" * 2000 + "]" * 2000 + "\n",
    "inline tables": "a = " + "{b = " * 2000 + "1" + "}" * 2000 + "\n",
    # tomllib walks a dotted key once per part for each part: 100,000 parts took hours.
    "a dotted key": "batch_size." + "a." * 100_000 + "b = 1\n",
    "a table header": "[batch_size." + "a." * 100_000 + "b]\n",
}


@pytest.mark.parametrize("kind", DEEP)
def test_a_deeply_nested_file_is_one_line_before_it_is_parsed(tmp_path, kind):
    import time

    f = tmp_path / "deep.toml"
    f.write_text(DEEP[kind])
    start = time.monotonic()
    r = run("doctor", "--only", "pad", "--step-ms", "100", "--workload", str(f))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr == (
        f"starvecheck: error: --workload {f}: nested deeper than 32 levels (arrays, tables, "
        "the parts of a dotted key): a workload file's keys are flat\n"
    )
    assert time.monotonic() - start < 10


def test_depth_counts_nesting_outside_strings_and_comments():
    from starvecheck.inputs.workload import depth

    assert depth('batch_size = 16\nfield = ["a", "b"]\nstep_ms = 12.5\n') == 1
    assert depth("a.b.c = 1") == 2 and depth("[a.b]\nc = 1") == 2
    assert depth("x = [[1], [2]]") == 2 and depth("x = {a = {b = 1}}") == 2
    brackets = "[[[[" * 20
    for quiet in (
        f'dataset = "{brackets}"',
        f"dataset = '{brackets}'",
        f'dataset = """\n{brackets}\n"""',
        f"dataset = '''\n{brackets}\n'''",
        f'dataset = "\\"{brackets}"',  # an escaped quote does not end the string
        f'dataset = """a""{brackets}"""',  # nor do two quotes in a tripled one
        f"# {brackets}\nbatch_size = 1",
    ):
        assert depth(quiet) == 0, quiet


def test_brackets_in_a_valid_files_strings_are_read(tmp_path):
    f = tmp_path / "w.toml"
    path = "/data/" + "[x]." * 40 + "jsonl"
    f.write_text(f'# a comment: {"[" * 64}\ndataset = "{path}"\nfield = ["text"]\n')
    assert read_file(str(f)) == {"dataset": path, "field": ("text",)}
