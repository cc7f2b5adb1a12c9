"""Broken, hostile and wrong files, and writing files: every load refuses in one line or succeeds, and no
write loses or clobbers a file.

Files: a committed corpus of broken documents (tests/data/broken/), a few generated here (too large to
commit), and hypothesis-made ones; writers are killed mid-write in a subprocess.
"""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _util import assert_one_line
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from taxes.model import hardware
from taxes.documents import results
from taxes.files import write_atomic
from taxes.cli.main import cli
from taxes.errors import TaxesError


BROKEN = Path(__file__).resolve().parent / "data" / "broken"


# ---- broken, hostile and wrong files ---------------------------------------------------------------------

# What the result-document loader must say about each corpus file (a word of its one-line message).
RESULT_WORDS = {
    "binary_garbage.bin": "not UTF-8", "empty.json": "not valid JSON", "whitespace.json": "not valid JSON",
    "nul_bytes.json": "not valid JSON", "null.json": "found null", "number.json": "found a number",
    "result_truncated.json": "not valid JSON", "result_wrong_version.json": "version 2 is not supported",
    "result_version_as_string.json": "version '1' is not supported", "result_not_a_result.json": "not a taxes result",
    "result_nan.json": "NaN", "result_infinity.json": "Infinity", "result_overflow_1e999.json": "finite number",
    "result_huge_int.json": "impossible here", "result_int_too_long.json": "digits",
    "result_huge_world.json": "world_size", "result_cases_not_a_list.json": "cases: expected a list",
    "result_samples_a_string.json": "samples_us: expected a list", "result_shape_bool.json": "shape.S",
    "result_shape_key_control_chars.json": "no dimension", "result_phase_ends_before_start.json": "ends before it starts",
    "result_kind_nested.json": "metadata.kind", "result_nested_2000.json": "nested too deeply",
    "result_top_level_list.json": "found a list", "result_utf16.json": "not UTF-8",
    "trace_chrome.json": "missing 'schema'", "trace_truncated.json": "not valid JSON", "trace_nan_timestamps.json": "NaN",
    "trace_events_list.json": "found a list", "trace_deep_args.json": "nested too deeply",
}
# What the hardware-profile loader must say about the profile files (every other file: any one line).
PROFILE_WORDS = {
    "profile_truncated.json": "not valid JSON", "profile_wrong_version.json": "version 2 is not supported",
    "profile_version_true.json": "version true is not supported", "profile_nan.json": "NaN",
    "profile_overflow_1e999.json": "hbm_gbps=Infinity", "profile_huge_int.json": "hbm_gbps=1000",
    "profile_tflops_huge_int.json": "matrix_tflops", "profile_string_numbers.json": "sm_count='132'",
    "profile_name_control_chars.json": "name must be printable", "profile_extra_nested.json": "extra",
    "profile_missing_fields.json": "lacks",
}
CORPUS = sorted(p.name for p in BROKEN.iterdir())


def test_the_corpus_is_whole_and_every_file_has_its_expected_message():
    assert set(CORPUS) == set(RESULT_WORDS) | set(PROFILE_WORDS), set(CORPUS) ^ (set(RESULT_WORDS) | set(PROFILE_WORDS))
    assert sum(p.stat().st_size for p in BROKEN.iterdir()) < 512 * 1024  # big cases are made at test time


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Broken files too large to commit: 10^5 levels of nesting, a file over the size limits, a long
    valid-looking document."""
    d = tmp_path_factory.mktemp("generated")
    (d / "deep_list.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "deep_object.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with open(d / "huge.json", "wb") as f:  # sparse: over both limits, costs no disk
        f.truncate(max(results.MAX_BYTES, hardware.MAX_PROFILE_BYTES) + 1)
    with open(d / "huge_profile.json", "w") as f:  # over the profile limit only, really written (17 MiB)
        f.write('{"extra": [' + "1.5," * (hardware.MAX_PROFILE_BYTES // 4 + 1) + "1.5]}")
    return d


GENERATED_WORDS = {"deep_list.json": "nested too deeply", "deep_object.json": "nested too deeply",
                   "huge.json": "larger than", "huge_profile.json": None}


@pytest.mark.parametrize("name", CORPUS + list(GENERATED_WORDS))
def test_broken_files_are_refused_with_one_line_by_both_loaders(name, generated):
    path = (generated if name in GENERATED_WORDS else BROKEN) / name
    for loader, words in ((results.load, RESULT_WORDS), (hardware.load_profile_file, PROFILE_WORDS)):
        with pytest.raises(TaxesError) as e:
            loader(path)
        msg = str(e.value)
        assert_one_line(msg)
        assert str(path) in msg and len(msg) < 600, msg
        assert "\x1b" not in msg  # a hostile key or name never reaches the terminal raw
        word = GENERATED_WORDS.get(name) if name in GENERATED_WORDS else words.get(name)
        if name == "huge_profile.json":
            word = "larger than" if loader is hardware.load_profile_file else None
        if word:
            assert word in msg, msg


def _cli(args):
    """The CLI in-process through click's runner (stdout and stderr apart)."""
    return CliRunner().invoke(cli, args, catch_exceptions=False)


@pytest.mark.parametrize("name", CORPUS + ["deep_list.json", "huge.json"])
def test_the_cli_refuses_broken_files_with_exit_2_and_one_line(name, generated):
    path = (generated if name in GENERATED_WORDS else BROKEN) / name
    for args in (["report", str(path)], ["hardware", "show", str(path)], ["model", "ag-gemm", "--hardware", str(path)]):
        res = _cli(args)
        assert res.exit_code == 2, (args, res.output)
        assert res.stdout == ""
        line = res.stderr.rstrip("\n")
        assert_one_line(line)
        assert line.startswith("taxes: error: ") and "Traceback" not in line and "\x1b" not in line


@pytest.mark.parametrize("name", ["binary_garbage.bin", "result_nested_2000.json", "profile_huge_int.json"])
def test_the_installed_command_refuses_broken_files_the_same_way(name):
    for args in (["report", str(BROKEN / name)], ["hardware", "show", str(BROKEN / name)]):
        p = subprocess.run([sys.executable, "-m", "taxes.cli.main", *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        assert p.stdout == "" and p.stderr.count("\n") == 1 and p.stderr.startswith("taxes: error: "), p.stderr


# ---- hypothesis: random and mutated inputs load or fail in one line -----------------------------------

def _scaled(n: int) -> int:
    """n examples under the suite's profile (100 examples a test); more under --hypothesis-profile=thorough."""
    return max(1, n * settings.default.max_examples // 100)


def _nested(depth: int) -> list:
    """A list nested `depth` deep (built without recursion: deeper than json can read or write)."""
    v: list = []
    for _ in range(depth):
        v = [v]
    return v


HOSTILE = st.one_of(
    st.none(), st.booleans(), st.integers(-(10 ** 30), 10 ** 30), st.sampled_from([10 ** 400, -(10 ** 400), 2 ** 63, 0]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, 1e16, -0.0, 5e-324]),
    st.text(max_size=30), st.sampled_from(["", "[/x]", "line\nbreak", "\x1b[2J", "\u2028", "%s%n", "ag-gemm", "bsp"]),
    st.builds(lambda depth: _nested(depth), st.integers(0, 3000)),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=20)


def _nodes(obj, path=()):
    """Every (path, container) in a JSON value, for mutation."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


def _mutate(doc, data):
    """Replace, delete or add one node of `doc` with a hostile value."""
    doc = copy.deepcopy(doc)
    spots = [(p, n) for p, n in _nodes(doc) if isinstance(n, (dict, list)) and n]
    path, node = data.draw(st.sampled_from(spots))
    key = data.draw(st.sampled_from(list(node) if isinstance(node, dict) else list(range(len(node)))))
    action = data.draw(st.sampled_from(["replace", "replace", "delete", "add"]))
    if action == "delete":
        del node[key]
    elif action == "add" and isinstance(node, dict):
        node[data.draw(st.text(max_size=8))] = data.draw(HOSTILE)
    else:
        node[key] = data.draw(HOSTILE)
    return doc


def _loads_or_one_line(text, load):
    try:
        load(text)
    except TaxesError as e:
        assert_one_line(str(e))
        assert "\x1b" not in str(e)
        return False
    return True


@pytest.fixture(scope="module")
def small_doc():
    return json.loads((BROKEN / "result_wrong_version.json").read_text()) | {"schema_version": results.SCHEMA_VERSION}


@settings(max_examples=_scaled(150))
@given(value=JSON_VALUES)
def test_random_json_is_refused_in_one_line(value):
    text = json.dumps(value)
    assert not _loads_or_one_line(text, results.loads)
    assert not _loads_or_one_line(text, lambda t: hardware.profile_from_dict(json.loads(t)))


@settings(max_examples=_scaled(200))
@given(data=st.data())
def test_hostile_mutations_of_a_result_document_load_or_fail_in_one_line(small_doc, data):
    assert results.validate(copy.deepcopy(small_doc))
    doc = _mutate(small_doc, data)
    try:
        text = json.dumps(doc)  # NaN and Infinity become literals JSON forbids; the loader must refuse them
    except (ValueError, RecursionError):
        text = None
    if text is not None:
        _loads_or_one_line(text, results.loads)
    _loads_or_one_line(doc, results.validate)


@settings(max_examples=_scaled(200))
@given(data=st.data())
def test_hostile_mutations_of_a_hardware_profile_load_or_fail_in_one_line(data):
    valid = hardware.profile_to_dict(hardware.BUILTIN["h200-sxm"])
    assert hardware.profile_from_dict(copy.deepcopy(valid)).name == "h200-sxm"
    _loads_or_one_line(_mutate(valid, data), hardware.profile_from_dict)


@settings(max_examples=_scaled(25))
@given(data=st.data())
def test_the_report_command_renders_or_refuses_mutated_documents(small_doc, data, tmp_path_factory):
    doc = _mutate(small_doc, data)
    path = tmp_path_factory.mktemp("mut") / "doc.json"
    try:
        path.write_text(json.dumps(doc))
    except (ValueError, RecursionError):
        return
    fmt = data.draw(st.sampled_from(["table", "md", "json"]))
    res = _cli(["report", str(path), "--format", fmt])
    assert res.exit_code in (0, 2), res.output
    assert "internal error" not in res.stderr, res.stderr  # a bug
    if res.exit_code == 2:
        assert_one_line(res.stderr.rstrip("\n"))
        assert res.stderr.startswith("taxes: error: ")


@settings(max_examples=_scaled(40))
@given(shape=st.one_of(st.text(max_size=30), st.builds(lambda d, v: f"{d}={v}", st.sampled_from("MNKQ"),
                                                       st.sampled_from(["0", "-8", "1e999", "nan", "8K", "9" * 30, "1M", "",
                                                                        "0x10", "8.5", "\x1b"]))),
       world=st.sampled_from(["0", "-1", "2", "3", "99999999999999999999", "x"]))
def test_cli_options_from_the_user_run_or_fail_in_one_line(shape, world):
    res = _cli(["model", "ag-gemm", "--shape", shape, "--world", world, "--format", "json"])
    assert res.exit_code in (0, 2), res.output
    assert "internal error" not in res.stderr, res.stderr
    if res.exit_code:
        assert_one_line(res.stderr.rstrip("\n"))
    else:
        results.loads(res.stdout)


def test_a_bug_in_taxes_is_still_one_line_with_the_way_to_see_more(monkeypatch):
    import taxes.model.hardware

    def broken(name):
        raise ZeroDivisionError("planted bug")

    monkeypatch.setattr(taxes.model.hardware, "get_profile", broken)
    res = _cli(["hardware", "show", "h200-sxm"])
    assert res.exit_code == 2  # never 1: that is a verdict (compare, check), a crash must not read as one
    assert res.stderr == "taxes: error: internal error: ZeroDivisionError: planted bug (set TAXES_DEBUG=1 for the traceback)\n"


def test_hostile_names_are_shown_as_text_not_markup(tmp_path):
    prof = hardware.profile_to_dict(hardware.BUILTIN["h200-sxm"]) | {"name": "[/x] [bold]h", "description": "[red]d"}
    (tmp_path / "p.json").write_text(json.dumps(prof))
    res = _cli(["hardware", "show", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert "[/x] [bold]h: [red]d" in res.stdout
    doc = json.loads((BROKEN / "result_wrong_version.json").read_text()) | {"schema_version": 1}
    doc["cases"][0]["variants"][0]["variant"] = "[/oops]"
    doc["metadata"]["tool_version"] = "[bold]9"
    (tmp_path / "d.json").write_text(json.dumps(doc))
    res = _cli(["report", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    assert "[/oops]" in res.stdout and "[bold]9" in res.stderr


# ---- writing files: atomic, never over an existing one unless asked ---------------------------------------

WRITER = """
import sys
import tempfile
from taxes.files import write_atomic
path, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
texts = [open(a).read(), open(b).read()]
print("ready", flush=True)
i = 0
while True:
    write_atomic(path, texts[i % 2])
    i += 1
"""


def test_a_run_killed_while_writing_leaves_the_old_or_the_whole_new_file(tmp_path):
    a = json.dumps({"version": "a", "pad": ["x" * 100] * 20000})  # 2 MB each: the kill lands mid-write
    b = json.dumps({"version": "b", "pad": ["y" * 100] * 20000})
    (tmp_path / "a").write_text(a)
    (tmp_path / "b").write_text(b)
    (tmp_path / "writer.py").write_text(WRITER)
    target = tmp_path / "doc.json"
    target.write_text(a)
    rng = random.Random(11)
    for _ in range(4):
        proc = subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), str(target), str(tmp_path / "a"),
                                 str(tmp_path / "b")], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        assert target.read_text() in (a, b)  # whole, one of the two
    stray = [p.name for p in tmp_path.iterdir() if p.name not in ("a", "b", "writer.py", "doc.json")]
    assert all(p.startswith(".taxes-") and p.endswith(".tmp") for p in stray), stray  # at most unfinished temporaries


def test_an_existing_result_is_not_replaced_unless_asked(tmp_path, small_doc):
    path = tmp_path / "r.json"
    results.save(small_doc, path)
    before = path.read_bytes()
    changed = copy.deepcopy(small_doc)
    changed["metadata"]["hardware_profile"] = "h100-sxm"
    with pytest.raises(TaxesError, match=r"r\.json: already exists; pass --force"):
        results.save(changed, path, overwrite=False)
    assert path.read_bytes() == before
    results.save(changed, path, overwrite=True)
    assert results.load(path)["metadata"]["hardware_profile"] == "h100-sxm"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_a_file_that_appears_while_writing_is_not_clobbered(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"
    real_fsync = os.fsync

    def someone_else_writes(fd):  # between our check and our publish, another run creates the file
        real_fsync(fd)
        if not path.exists():
            path.write_text("theirs")

    monkeypatch.setattr(os, "fsync", someone_else_writes)
    with pytest.raises(FileExistsError):
        write_atomic(path, "ours", overwrite=False)
    assert path.read_text() == "theirs"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # our temporary is gone


def test_runs_append_to_a_results_directory(tmp_path, small_doc):
    paths = []
    errors = []

    def add():
        try:
            paths.append(results.save_new(small_doc, tmp_path, "ag-gemm_w2"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=add) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    names = sorted(p.name for p in paths)
    assert len(set(names)) == 6 and "ag-gemm_w2.json" in names and "ag-gemm_w2-6.json" in names
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    for p in paths:
        assert results.load(p) == small_doc
    for bad in ("../x", "", ".hidden"):
        with pytest.raises(TaxesError):
            results.save_new(small_doc, tmp_path, bad)
    with pytest.raises(TaxesError, match="not a directory"):
        results.save_new(small_doc, tmp_path / "missing", "x")


@pytest.mark.parametrize("args,out_flag", [
    (["model", "gemm-rs", "--format", "json"], "-o"),
    (["model", "gemm-rs", "--format", "md"], "-o"),
    (["model", "gemm-rs"], "--plot"),
    (["report", "{doc}", "--format", "md"], "-o"),
    (["report", "{doc}", "--format", "html"], "-o"),
])
def test_cli_outputs_are_kept_unless_force(tmp_path, small_doc, args, out_flag):
    doc = tmp_path / "doc.json"
    results.save(small_doc, doc)
    target = tmp_path / ("out.png" if out_flag == "--plot" else "out.txt")
    target.write_text("keep me")
    args = [a.replace("{doc}", str(doc)) for a in args] + [out_flag, str(target)]
    res = _cli(args)
    assert res.exit_code == 2, res.output
    line = res.stderr.rstrip("\n")
    assert_one_line(line)
    flag = "--plot " if out_flag == "--plot" else ""
    assert line == f"taxes: error: {flag}{target}: already exists; pass --force to replace it (or choose another name)"
    assert target.read_text() == "keep me"
    res = _cli(args + ["--force"])
    assert res.exit_code == 0, res.output
    assert target.read_bytes() != b"keep me" and target.stat().st_size > 100


def test_cli_output_into_a_new_file_needs_no_force(tmp_path):
    target = tmp_path / "new.json"
    res = _cli(["model", "ag-gemm", "--format", "json", "-o", str(target)])
    assert res.exit_code == 0, res.output
    results.load(target)
    res = _cli(["model", "ag-gemm", "--format", "json", "-o", str(target), "--plot", str(target)])
    assert res.exit_code == 2
