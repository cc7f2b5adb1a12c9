"""Hostile input, fast: output paths (devices, FIFOs, directories, links, '-', long names), strings that
carry terminal escapes, HTML or Markdown into every output, impossible values in documents, traces that
would be attributed wrongly, and the one error path (full disk, memory, signals). Each test names the
defect it guards against."""

from __future__ import annotations

import copy
import csv
import gzip
import io
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from _util import assert_one_line
from click.testing import CliRunner

from taxes import files as tio
from taxes.documents import results
from taxes import sanitize
from taxes.cli.main import cli
from taxes.errors import TaxesError

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parent.parent
TAXES = str(Path(sys.executable).with_name("taxes"))  # this environment's command
ESCAPES = ("\x1b", "\x07", "\x9b", "\r", "\u202e")  # ESC, BEL, CSI (C1), carriage return, right-to-left override
HOSTILE_NAME = "\x1b]0;owned\x07\x1b[2Jbsp|<script>alert(1)</script>\n# [x](javascript:alert(2))\u202e$\\frac{$"


def _cli(args, **kw):
    """(exit code, stdout, stderr) of the CLI in-process."""
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False, **kw)
    return res.exit_code, res.stdout, res.stderr


def _subprocess(args, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("TAXES_DEBUG", "COLUMNS")} | kw.pop("env", {})
    return subprocess.run([sys.executable, "-m", "taxes", *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=env, **kw)


def _no_escapes(*texts):
    for t in texts:
        for e in ESCAPES:
            assert e not in t, (e, t[:300])


@pytest.fixture
def model_file(tmp_path, model_doc):
    path = tmp_path / "model.json"
    results.save(dict(model_doc, cases=model_doc["cases"][:1]), path)
    return path


@pytest.fixture
def hostile_doc():
    """The emulated profile document with every name a document can carry made hostile."""
    doc = results.loads(gzip.decompress((DATA / "documents" / "emulated_ag_gemm.json.gz").read_bytes()).decode())
    doc["metadata"]["gpu_names"] = [HOSTILE_NAME, "\x1b[31mred"]
    doc["metadata"]["tool_version"] = "\x1b[2J9"
    doc["metadata"]["hardware_profile"] = "<img src=x onerror=alert(3)>"
    doc["cases"][0]["dtype"] = "bf16\x1b[5m"
    for v in doc["cases"][0]["variants"]:
        v["correctness"]["reference"] = HOSTILE_NAME
        for ph in v["phases"]:
            ph["name"] = HOSTILE_NAME
    doc["cases"][0]["variants"][0]["variant"] = HOSTILE_NAME
    return results.validate(doc)


# ---- output paths ----------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["model", "ag-gemm", "--format", "json"], ["report", "{doc}", "--format", "md"],
                                  ["report", "{doc}", "--format", "html"], ["check", "{doc}"],
                                  ["compare", "{doc}", "{doc}", "--format", "md"]])
def test_force_never_replaces_a_device(args, model_file, tmp_path):
    """Defect: `-o /dev/full --force` renamed a regular file over the device node (as root)."""
    before = os.stat("/dev/full")
    args = [a.replace("{doc}", str(model_file)) for a in args]
    code, out, err = _cli(args + ["-o", "/dev/full", "--force"])
    assert code == 2 and err.startswith("taxes: error: /dev/full: a character device, not a regular file"), err
    assert_one_line(err.rstrip("\n"))
    after = os.stat("/dev/full")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino


def test_fifos_directories_and_links_to_them_are_refused(tmp_path, model_file):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link.json"
    link.symlink_to("/dev/null")
    d = tmp_path / "dir.json"
    d.mkdir()
    for target, what in ((fifo, "a FIFO"), (link, "a symbolic link to a character device"), (d, "a directory")):
        for force in ([], ["--force"]):
            code, out, err = _cli(["report", model_file, "--format", "md", "-o", target, *force])
            assert code == 2 and f"{target}: {what}, not a regular file" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.readlink(link) == "/dev/null" and d.is_dir()
    with pytest.raises(tio.NotARegularFile):  # the writer itself, whoever calls it
        tio.write_atomic(fifo, "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "link.json", "model.json", "pipe"]


def test_a_link_to_a_regular_file_is_replaced_by_a_file_not_written_through(tmp_path, model_file):
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    link = tmp_path / "out.md"
    link.symlink_to(target)
    code, out, err = _cli(["report", model_file, "--format", "md", "-o", link, "--force"])
    assert code == 0, err
    assert target.read_text() == "keep" and not link.is_symlink() and link.read_text().startswith("# ")


def test_dash_is_stdout_and_no_file_named_dash(tmp_path, model_file, monkeypatch):
    """Defect: `-o -` wrote a file named '-'."""
    monkeypatch.chdir(tmp_path)
    for args in (["model", "ag-gemm", "--format", "json", "-o", "-"], ["report", model_file, "--format", "md", "-o", "-"],
                 ["report", model_file, "--format", "html", "-o", "-"], ["compare", model_file, model_file, "-o", "-"]):
        code, out, err = _cli(args)
        assert code == 0, err
        assert out and "wrote" not in err
    assert not (tmp_path / "-").exists()
    assert results.loads(_cli(["model", "ag-gemm", "--format", "json", "-o", "-"])[1])


def test_a_name_as_long_as_the_file_system_allows_can_be_written(tmp_path):
    """Defect: a valid 250-character name failed: the temporary name added characters past NAME_MAX."""
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    for n in (250, name_max):
        out, plot = tmp_path / ("r" * (n - 5) + ".json"), tmp_path / ("p" * (n - 4) + ".svg")
        code, _, err = _cli(["model", "ag-gemm", "--format", "json", "-o", out, "--plot", plot])
        assert code == 0, err
        assert results.load(out) and plot.read_bytes().startswith(b"<?xml")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(tio.TMP_PREFIX)]


def test_paths_are_echoed_printable(tmp_path, model_file):
    """Defect: the "wrote PATH" line printed the path raw."""
    out = tmp_path / "a\x1b[2Jb\nc.md"
    code, _, err = _cli(["report", model_file, "--format", "md", "-o", out])
    assert code == 0 and out.exists()
    assert err == f"wrote {tmp_path}/a\\x1b[2Jb\\nc.md\n"
    code, _, err = _cli(["report", tmp_path / "no\x1b[2Jsuch.json"])
    assert code == 2 and "no\\x1b[2Jsuch.json" in err
    _no_escapes(err)


# ---- one sanitiser: terminal, stderr, Markdown, HTML, CSV, JUnit ------------------------------------


@pytest.mark.parametrize("fmt", ["table", "md"])
def test_document_strings_never_reach_the_terminal_raw(tmp_path, hostile_doc, fmt):
    """Defect: escape sequences in variant names, metadata and device names reached the terminal."""
    path = tmp_path / "hostile.json"
    results.save(hostile_doc, path)
    for args in (["report", path, "--format", fmt], ["check", path, "--all"], ["validate", "--from", path],
                 ["compare", path, path, "--format", "table" if fmt == "table" else "md"]):
        code, out, err = _cli(args)
        assert code in (0, 1) or (code == 2 and "internal error" not in err), (args, err)
        assert_one_line(err.rstrip("\n")) if code == 2 else None
        _no_escapes(out, err)
        assert "\\x1b" in out + err  # shown, escaped
    code, out, err = _cli(["report", path])
    assert "\\x1b]0;owned\\x07\\x1b[2Jbsp|<script>" in out  # the name is readable, as text


def test_markdown_cells_are_neutralised(tmp_path, hostile_doc):
    """Defect: Markdown output passed newlines, pipes, HTML and link syntax through (report, check, compare)."""
    path = tmp_path / "hostile.json"
    results.save(hostile_doc, path)
    for args in (["report", path, "--format", "md"], ["check", path, "--all"], ["compare", path, path, "--format", "md"]):
        code, out, err = _cli(args)
        assert code in (0, 1), err
        assert "<script" not in out and "<img" not in out and "](javascript" not in out
        for line in out.splitlines():
            if line.startswith("|"):  # every row of a table has its table's number of cells
                assert len(re.split(r"(?<!\\)\|", line)) == len(re.split(r"(?<!\\)\|", _header_of(out, line)))
        assert not any(line.startswith("# [x]") for line in out.splitlines())  # no heading smuggled in
        _no_escapes(out)


def _header_of(text: str, row: str) -> str:
    lines = text.splitlines()
    i = lines.index(row)
    while i > 0 and lines[i - 1].startswith("|"):
        i -= 1
    return lines[i]


def test_html_escapes_and_holds_no_control_characters(tmp_path, hostile_doc):
    from taxes.reports import render

    html = render.render_html(hostile_doc)
    assert "<script>" not in html and "<img src=x" not in html and "&lt;script&gt;" in html
    _no_escapes(html)


def test_junit_and_csv_stay_well_formed(tmp_path, hostile_doc, model_file):
    path = tmp_path / "hostile.json"
    results.save(hostile_doc, path)
    code, out, err = _cli(["compare", path, path, "--format", "junit"])
    assert code == 0, err
    ET.fromstring(out.split("\n", 1)[1])  # parses: no control character XML 1.0 forbids
    _no_escapes(out)
    assert sanitize.csv_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)" and sanitize.csv_cell(-1.5) == -1.5
    code, out, err = _cli(["model", "ag-gemm", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows and all(not str(v).startswith(("=", "+", "@")) for r in rows for v in r.values())


def test_stderr_errors_are_one_printable_line(tmp_path):
    bad = tmp_path / "x\x1b[2J\ny.json"
    bad.write_text('{"schema": "taxes.result", "schema_version": 1, "metadata": {"kind": "\\u001b[2J"}, "cases": []}')
    code, out, err = _cli(["report", bad])
    assert code == 2 and out == ""
    assert_one_line(err.rstrip("\n"))
    _no_escapes(err)


# ---- documents: impossible values refused with the field's path ------------------------------------


def _mutated(model_doc, path, value):
    doc = copy.deepcopy(model_doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("path,value,words", [
    (("cases", 0, "variants", 0, "samples_us"), [[100.0, 101.0, -1.0, 99.0]],
     "cases[0].variants[0].samples_us[0][2]: -1.0 is impossible here (must be at least 0)"),
    (("cases", 0, "variants", 0, "attribution"), {"available": True, "unattributed_share": -1e300},
     "cases[0].variants[0].attribution.unattributed_share: -1e+300 is impossible here (must be at least -100)"),
    (("cases", 0, "variants", 0, "e2e_us", "n"), True, "cases[0].variants[0].e2e_us.n: expected a whole number, found true"),
    (("cases", 0, "world"), 2.0, "cases[0].world: expected a whole number, found 2.0"),
    (("cases", 0, "variants", 0, "e2e_us", "median"), 1e13, "e2e_us.median: 1e+13 is impossible here"),
    (("cases", 0, "variants", 0, "e2e_us"), {"median": 100.0, "p10": 1e6, "p90": 2e6, "n": 0, "label": "predicted"},
     "cases[0].variants[0].e2e_us: p10 1e+06 <= median 100 <= p90 2e+06 does not hold"),
    (("cases", 0, "variants", 0, "samples_us"), [[1.0, 2.0], [1.0]], "ranks hold different numbers of samples"),
    (("cases", 0, "variants", 0, "attributed_e2e_us"), -5.0, "attributed_e2e_us: -5.0 is impossible here"),
    (("cases", 0, "variants", 0, "components", 0, "rank"), False, "components[0].rank: expected a whole number or null"),
    (("metadata", "world_size"), 10 ** 40, "metadata.world_size: 1e40 or so (a number of 41 digits) is impossible"),
])
def test_impossible_values_are_refused_with_the_field_path(model_doc, tmp_path, path, value, words):
    """Defects: negative samples rendered as '-1.0 [237,994-256,486]'; an unattributed_share of -1e300 printed
    300 digits; a bool where a count belongs was accepted."""
    doc = _mutated(model_doc, path, value)
    with pytest.raises(TaxesError) as e:
        results.loads(json.dumps(doc), "doc.json")
    assert_one_line(str(e.value))
    assert str(e.value).startswith("doc.json: ") and words in str(e.value), str(e.value)


def test_the_published_schema_is_shipped_and_versioned():
    from importlib import resources

    text = resources.files("taxes.schema").joinpath("result-v1.json").read_text()
    schema = json.loads(text)
    assert schema["properties"]["schema_version"] == {"const": results.SCHEMA_VERSION}
    import jsonschema

    jsonschema.Draft202012Validator.check_schema(schema)  # a valid JSON Schema


def test_report_json_round_trips(model_file, tmp_path, hostile_doc):
    for doc_path in (model_file, tmp_path / "h.json"):
        if doc_path.name == "h.json":
            results.save(hostile_doc, doc_path)
        code, out, err = _cli(["report", doc_path, "--format", "json"])
        assert code == 0, err
        back = results.loads(out)  # validates against the schema and loads
        assert {k: v for k, v in back.items() if k != "report"} == results.load(doc_path)
        again = tmp_path / "again.json"
        again.write_text(out)
        assert _cli(["report", again, "--format", "json"])[1] == out


# ---- traces ----------------------------------------------------------------------------------------


def _trace_events() -> list[dict]:
    """Three profiled steps of a small program, as Kineto writes them: per step an op launching a GEMM
    (runtime call, kernel, ac2g flow) and a CUDA graph replaying two kernels (one call, one flow start,
    a flow end per kernel)."""
    ev, corr = [], 100
    for step in range(3):
        t = 1000.0 * step
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1, "ts": t,
                   "dur": 900.0})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t + 1, "dur": 20.0})
        for api, kernels in (("cudaLaunchKernel", [("gemm_kernel", 50.0, 300.0)]),
                             ("cudaGraphLaunch", [("gemm_kernel", 310.0, 500.0), ("add_kernel", 505.0, 520.0)])):
            corr += 1
            call_ts = t + (2.0 if api == "cudaLaunchKernel" else 30.0)
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": api, "pid": 1, "tid": 1, "ts": call_ts, "dur": 5.0,
                       "args": {"correlation": corr}})
            ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 1, "tid": 1, "ts": call_ts})
            for name, a, b in kernels:
                ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + a, "dur": b - a,
                           "args": {"correlation": corr, "stream": 7, "device": 0}})
                ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": 0, "tid": 7, "ts": t + a, "bp": "e"})
    return ev


def _tp_trace(tmp_path, mutate=None):
    events = _trace_events()
    if mutate:
        mutate(events)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize("text", ['{"traceEvents": []}', "[]", '{"traceEvents": [{"ph": "M", "name": "process_name"}]}',
                                  '{"deviceProperties": [], "traceEvents": []}'])
def test_empty_traces_are_refused_in_one_line(tmp_path, text):
    """Defect: an empty trace crashed analyze with an internal error (the check, for analyze to call)."""
    from taxes.traces.kineto import load_trace
    from taxes.traces.checks import check_events

    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(TaxesError) as e:
        check_events(load_trace(path), path)
    assert_one_line(str(e.value))
    assert str(e.value).startswith(f"{path}: ") and "nothing to attribute" in str(e.value)


def test_the_real_traces_need_no_repair():
    from taxes.traces.kineto import load_trace
    from taxes.traces.checks import repair_events

    for p in sorted((DATA / "traces" / "real").glob("*.json.gz")):
        ev = load_trace(p)
        out, graphs, note = repair_events(ev, p)
        assert note is None and not graphs and len(out) == len(ev), note


# ---- one error path --------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_on_stdout_is_one_line_and_exit_2(tmp_path):
    """Defect: stdout on a full disk was an 'internal error' with exit 1."""
    with open("/dev/full", "w") as full:
        for args in (["model", "ag-gemm", "--format", "json"], ["model", "ag-gemm"], ["hardware", "list"]):
            p = subprocess.run([sys.executable, "-m", "taxes", *args], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=120)
            assert p.returncode == 2, (args, p.stderr)
            assert p.stderr.endswith("taxes: error: cannot write the output: No space left on device\n"), p.stderr
            assert p.stderr.count("taxes: error") == 1 and "Traceback" not in p.stderr


def test_out_of_memory_is_one_line_and_exit_2(monkeypatch, model_file):
    """Defect: a MemoryError was an 'internal error' with exit 1."""
    def no_memory(path):
        raise MemoryError()

    monkeypatch.setattr(results, "load", no_memory)
    code, out, err = _cli(["report", model_file])
    assert code == 2 and err == "taxes: error: out of memory: the input is too large for this machine's memory\n"


def test_sigterm_while_writing_is_one_line_exit_2_and_leaves_nothing(monkeypatch, tmp_path, model_file):
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    real_fsync = os.fsync

    def killed_mid_write(fd):
        real_fsync(fd)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "fsync", killed_mid_write)
    try:
        code, out, err = _cli(["report", model_file, "--format", "md", "-o", tmp_path / "r.md"])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert code == 2 and err == "taxes: error: stopped by SIGTERM\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]  # no report, no temporary


def test_sigterm_to_a_running_command_is_one_line(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "import time, taxes.cli.main as m, taxes.reports.render as r; "
                          "r.render_markdown = lambda d: time.sleep(60); m.cli.main(['model', 'ag-gemm', '--format', 'md'])"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    import time

    time.sleep(3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 2 and err == "taxes: error: stopped by SIGTERM\n", (p.returncode, err)


# ---- first use -------------------------------------------------------------------------------------


def test_python_dash_m_taxes_and_shell_completion():
    p = _subprocess(["--version"])
    assert p.returncode == 0 and "taxes, version" in p.stdout
    p = subprocess.run([TAXES], env=os.environ | {"_TAXES_COMPLETE": "bash_source"}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "complete -o nosort -F _taxes_completion taxes" in p.stdout
    p = subprocess.run([TAXES], env=os.environ | {"_TAXES_COMPLETE": "bash_complete", "COMP_WORDS": "taxes model ag",
                                                      "COMP_CWORD": "2"}, capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["plain,ag-gemm"]


def test_calibrated_profiles_are_found_by_name_from_anywhere(tmp_path):
    p = _subprocess(["model", "ag-gemm", "--hardware", "h200-x2-calibrated", "--format", "json"], cwd=tmp_path,
                    env={"HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["metadata"]["hardware_profile"] == "h200-x2-calibrated"


def test_no_gpu_is_refused_in_under_a_second(tmp_path):
    from taxes.run.preflight import no_gpu_here

    if not no_gpu_here():
        pytest.skip("this machine has a GPU driver")
    import time

    for args in (["profile", "ag-gemm"], ["calibrate"], ["validate"]):
        t = time.monotonic()
        p = subprocess.run([TAXES, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        took = time.monotonic() - t
        assert p.returncode == 2 and "no" in p.stderr and "GPU" in p.stderr, p.stderr
        assert took < 1.0, (args, took)
