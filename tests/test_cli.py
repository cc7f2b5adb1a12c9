"""The command line: in-process through its own main() for most cases, a few end-to-end subprocesses."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
from pathlib import Path
import sys

import pandas as pd
import pytest
from _util import PNG_SIGNATURE, assert_one_line, assert_self_contained_html, assert_valid_png, run_cli

import taxes
from committed import committed
from taxes.documents import results
from taxes.model.hardware import BUILTIN, profile_from_dict, profile_to_dict
from taxes.model.predict import COMPONENT_TITLES, COMPONENTS, predict
from taxes.variants import model_names
from taxes.workloads import WORKLOADS, make_workload, model_variants

MODEL_VARIANTS = model_names("ag-gemm")


def _table_row(out: str, label: str) -> list[str]:
    """Cells of the rich table row whose first cell is label."""
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│|┃]", line)]
        cells = [c for c in cells[1:-1]] if len(cells) > 2 else []
        if cells and cells[0] == label:
            return cells[1:]
    raise AssertionError(f"no row {label!r} in:\n{out}")


def _num(cell: str) -> float:
    return float(cell.split()[0].replace(",", ""))


# ---- taxes model -----------------------------------------------------------------------------------


@pytest.mark.parametrize("hw", list(BUILTIN))
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_model_table_every_workload_and_profile(capsys, name, hw):
    code, out, err = run_cli(["model", name, "--hardware", hw], capsys)
    assert code == 0, err
    assert name in out
    header = _table_row(out, "us per iteration")
    assert header == list(model_variants(name))
    w = make_workload(name, {}, 2)
    e2e = [_num(c) for c in _table_row(out, "E2E: predicted")]
    assert e2e == pytest.approx([predict(w, v, BUILTIN[hw]).e2e_us for v in model_variants(name)], abs=0.051)
    for title in COMPONENT_TITLES.values():
        assert len(_table_row(out, title)) == len(model_variants(name))
    assert "Traceback" not in err and hw in err  # the title line names the profile


def test_model_json_is_a_result_document_and_nothing_else(capsys):
    args = ["model", "gemm-rs", "--shape", "M=4K,N=2K,K=8K", "--world", "4", "--dtype", "fp16", "--format", "json"]
    code, out, err = run_cli(args, capsys)
    assert code == 0 and err == ""
    doc = results.loads(out)  # all of stdout is one JSON document that validates
    assert json.loads(out) == doc
    (case,) = doc["cases"]
    assert case["shape"] == {"M": 4096, "N": 2048, "K": 8192} and case["world"] == 4 and case["dtype"] == "fp16"
    w = make_workload("gemm-rs", {"M": 4096, "N": 2048, "K": 8192}, 4, "fp16")
    for var in case["variants"]:
        assert var["e2e_us"]["median"] == predict(w, var["variant"], BUILTIN["h200-sxm"]).e2e_us


def test_model_csv_parses(capsys):
    code, out, err = run_cli(["model", "flash-decode", "--hardware", "mi300x", "--format", "csv", "--world", "8"], capsys)
    assert code == 0 and err == ""
    df = pd.read_csv(io.StringIO(out))
    assert list(df["variant"]) == list(model_names("flash-decode"))  # ag-gemm's and eager bsp-sdpa
    assert {"workload", "shape", "world", "dtype", "e2e_us", *COMPONENTS} <= set(df.columns)
    assert (df["world"] == 8).all() and (df["workload"] == "flash-decode").all()
    assert (df[list(COMPONENTS)].sum(axis=1) - df["e2e_us"]).abs().max() <= 1e-9 * df["e2e_us"].max()


def test_model_markdown_and_selected_variants(capsys):
    code, out, err = run_cli(["model", "ag-gemm", "--format", "md", "--variant", "fused-push", "--variant", "bsp",
                              "--variant", "bsp"], capsys)
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("| us per iteration"))
    assert header == "| us per iteration | fused-push | bsp |"


def test_model_plot_writes_png(capsys, tmp_path):
    png = tmp_path / "x.png"
    code, out, err = run_cli(["model", "ag-gemm", "--plot", str(png), "--format", "json"], capsys)
    assert code == 0
    assert_valid_png(png.read_bytes())
    results.loads(out)  # the plot's message went to stderr, not into the JSON
    assert str(png) in err
    assert sorted(os.listdir(tmp_path)) == ["x.png"]


def test_model_sweep(capsys, tmp_path):
    png = tmp_path / "s.PNG"
    code, out, err = run_cli(["model", "ag-gemm", "--sweep", "M=1K:8K", "--format", "json", "--plot", str(png)], capsys)
    assert code == 0
    doc = results.loads(out)
    assert [c["shape"]["M"] for c in doc["cases"]] == [1024, 2048, 4096, 8192]
    assert_valid_png(png.read_bytes())
    code, out, err = run_cli(["model", "gemm-rs", "--sweep", "K=2K:16K", "--format", "md"], capsys)
    assert code == 0
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(r.split("|")[1]) for r in rows] == [2048, 4096, 8192, 16384]
    code, out, err = run_cli(["model", "flash-decode", "--sweep", "S=1K:4K"], capsys)
    assert code == 0 and "sweep of S" in out


def test_tp_mlp_sweep_names_its_bulk_synchronous_and_fused_variants(capsys):
    """tp-mlp's variants are all-bsp / all-fused: the sweep finds them by kind, not by a name prefix."""
    code, out, err = run_cli(["model", "tp-mlp", "--sweep", "M=1K:4K", "--format", "md"], capsys)
    assert code == 0, err
    header = next(line for line in out.splitlines() if line.startswith("| M |"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert "all-bsp / best fused" in cols and "best fused" in cols and "all-bsp kernel-launch" in cols
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert len(rows) == 3
    for r in rows:
        by = dict(zip(cols, r))
        assert by["best fused"] in ("all-fused", "all-fused-eager")
        e2e = {v: float(by[f"{v} E2E"].replace(",", "")) for v in ("all-bsp", "all-fused", "all-fused-eager")}
        ratio = float(by["all-bsp / best fused"].rstrip("x"))
        assert ratio == pytest.approx(e2e["all-bsp"] / min(e2e["all-fused"], e2e["all-fused-eager"]), abs=0.006)


def test_model_output_file(capsys, tmp_path):
    path = tmp_path / "doc.json"
    code, out, err = run_cli(["model", "ag-gemm", "--format", "json", "-o", str(path)], capsys)
    assert code == 0 and out == ""
    assert results.load(path)["cases"][0]["workload"] == "ag-gemm"
    table = tmp_path / "t.txt"
    code, out, err = run_cli(["model", "ag-gemm", "-o", str(table)], capsys)
    assert code == 0 and out == "" and "E2E" in table.read_text()


def test_model_with_profile_file(capsys, tmp_path):
    import dataclasses

    slow = dataclasses.replace(BUILTIN["h200-sxm"], name="slow-link", peer_link_gbps=45.0, injection_gbps=45.0)
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(profile_to_dict(slow)))
    code, out, err = run_cli(["model", "ag-gemm", "--hardware", str(path), "--format", "json"], capsys)
    assert code == 0
    doc = results.loads(out)
    assert doc["metadata"]["hardware_profile"] == "slow-link"
    w = make_workload("ag-gemm", {}, 2)
    assert doc["cases"][0]["variants"][0]["e2e_us"]["median"] == predict(w, "bsp", slow).e2e_us


# ---- taxes report / hardware / misc ----------------------------------------------------------------


@pytest.fixture
def doc_file(model_doc, tmp_path):
    path = tmp_path / "doc.json"
    results.save(dict(model_doc, cases=model_doc["cases"][:1]), path)
    return path


def test_report_html(capsys, doc_file, tmp_path):
    out_path = tmp_path / "r.html"
    code, out, err = run_cli(["report", str(doc_file), "--format", "html", "-o", str(out_path)], capsys)
    assert code == 0 and out == ""
    assert_self_contained_html(out_path.read_text(), n_images=2)


def test_report_md_json_table(capsys, doc_file):
    doc = results.load(doc_file)
    code, out, err = run_cli(["report", str(doc_file), "--format", "md"], capsys)
    assert code == 0 and out.startswith(f"# {doc['cases'][0]['workload']} on h200-sxm (model), world 2")
    code, out, err = run_cli(["report", str(doc_file), "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["cases"][0]["workload"] == doc["cases"][0]["workload"]
    code, out, err = run_cli(["report", str(doc_file)], capsys)
    assert code == 0
    e2e = [_num(c) for c in _table_row(out, "E2E: predicted")]
    assert e2e == pytest.approx([v["e2e_us"]["median"] for v in doc["cases"][0]["variants"]], abs=0.051)


def test_hardware_list_and_show(capsys, tmp_path):
    code, out, err = run_cli(["hardware", "list"], capsys)
    assert code == 0 and all(n in out for n in BUILTIN)
    for name in BUILTIN:
        code, out, err = run_cli(["hardware", "show", name, "--format", "json"], capsys)
        assert code == 0
        assert profile_from_dict(json.loads(out)) == BUILTIN[name]
    code, out, err = run_cli(["hardware", "show", "mi300x"], capsys)
    assert code == 0 and "peer_link_gbps" in out


def test_version_and_help(capsys):
    code, out, err = run_cli(["--version"], capsys)
    assert code == 0 and taxes.__version__ in out
    code, out, err = run_cli([], capsys)
    assert code == 0 and "model" in out and "report" in out
    code, out, err = run_cli(["model", "--help"], capsys)
    assert code == 0 and "--sweep" in out


# ---- bad input: exit 2, one line on stderr ---------------------------------------------------------


def _files(tmp_path, model_doc):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "taxes.result", "cases": [')
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\x00\xff\xfe" * 100)
    empty = tmp_path / "empty.json"
    results.save(dict(model_doc, cases=[]), empty)
    good = tmp_path / "good.json"
    results.save(model_doc, good)
    return {"bad": bad, "bin": binary, "empty": empty, "good": good, "dir": tmp_path, "missing": tmp_path / "nope.json",
            "nodir": tmp_path / "no" / "x.json"}


BAD_INPUT = {
    "unknown workload": ["model", "all-reduce"],
    "bad shape text": ["model", "ag-gemm", "--shape", "M=lots"],
    "shape without =": ["model", "ag-gemm", "--shape", "M"],
    "unknown dimension": ["model", "flash-decode", "--shape", "M=8"],
    "non-divisible shape": ["model", "ag-gemm", "--shape", "M=8191"],
    "non-divisible gemm-rs K": ["model", "gemm-rs", "--world", "8", "--shape", "K=100"],
    "GQA mismatch": ["model", "flash-decode", "--shape", "Hq=12,Hkv=8"],
    "zero dimension": ["model", "gemm-rs", "--shape", "N=0"],
    "unknown variant": ["model", "ag-gemm", "--variant", "bsp-eager"],
    "unknown hardware": ["model", "ag-gemm", "--hardware", "a100"],
    "missing hardware file": ["model", "ag-gemm", "--hardware", "{missing}"],
    "unknown dtype": ["model", "ag-gemm", "--dtype", "fp8"],
    "world zero": ["model", "ag-gemm", "--world", "0"],
    "world not a number": ["model", "ag-gemm", "--world", "two"],
    "bad format": ["model", "ag-gemm", "--format", "xml"],
    "plot not png": ["model", "ag-gemm", "--plot", "{dir}/x.jpg"],
    "sweep without range": ["model", "ag-gemm", "--sweep", "M"],
    "sweep unknown dimension": ["model", "ag-gemm", "--sweep", "Q=1:4"],
    "sweep decreasing": ["model", "ag-gemm", "--sweep", "M=4K:1K"],
    "sweep non-divisible": ["model", "ag-gemm", "--sweep", "M=1:4"],
    "unknown option": ["model", "ag-gemm", "--bogus"],
    "unknown top-level option": ["--frobnicate"],
    "unknown command": ["profiel"],
    "missing argument": ["model"],
    "output into missing directory": ["model", "ag-gemm", "--format", "json", "-o", "{nodir}"],
    "unreadable result file": ["report", "{missing}"],
    "result path is a directory": ["report", "{dir}"],
    "malformed result file": ["report", "{bad}"],
    "binary result file": ["report", "{bin}"],
    "result without cases": ["report", "{empty}"],
    "html without -o": ["report", "{good}", "--format", "html"],
    "unknown hardware to show": ["hardware", "show", "a100"],
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, model_doc, case):
    files = _files(tmp_path, model_doc)
    before = sorted(os.listdir(tmp_path))
    args = [a.format(**files) for a in BAD_INPUT[case]]
    code, out, err = run_cli(args, capsys)
    assert code == 2, (code, err)
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("taxes: error: ") and len(err.strip()) > len("taxes: error: ") + 5
    assert "Traceback" not in err and "internal error" not in err
    assert out == ""
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temp file left


def test_plot_into_missing_directory_is_a_user_error(capsys, tmp_path):
    code, out, err = run_cli(["model", "ag-gemm", "--format", "json", "--plot", str(tmp_path / "no" / "x.png")], capsys)
    assert code == 2 and "internal error" not in err


def test_binary_hardware_file_is_a_user_error(capsys, tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00\x01")
    code, out, err = run_cli(["model", "ag-gemm", "--hardware", str(path)], capsys)
    assert code == 2 and "internal error" not in err


def test_hardware_list_survives_binary_saved_profile(capsys, tmp_path, monkeypatch):
    (tmp_path / "junk.json").write_bytes(b"\xff\xfe\x00\x01")
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    code, out, err = run_cli(["hardware", "list"], capsys)
    assert code == 0 and "junk" in out


# ---- end to end: a real process ------------------------------------------------------------------


def _run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TAXES_DEBUG", "TAXES_PROFILE_DIR")}
    env["HOME"] = str(tmp_path)
    return subprocess.run([sys.executable, "-m", "taxes.cli.main", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=120)


def test_subprocess_json_run(tmp_path):
    p = _run(["model", "ag-gemm", "--format", "json", "--plot", "x.png"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    assert results.loads(p.stdout)["metadata"]["kind"] == "model"
    assert (tmp_path / "x.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("args", [["model", "ag-gemm", "--shape", "M=8191"], ["--frobnicate"]])
def test_subprocess_errors_are_one_line(tmp_path, args):
    p = _run(args, tmp_path)
    assert p.returncode == 2
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("taxes: error: "), p.stderr
    assert "Traceback" not in p.stderr


# ---- one console: numbers are never cut ------------------------------------------------------------


def _taxes(args, columns=None, cwd=None):
    """The installed command, stdout piped (not a terminal), COLUMNS as given."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TAXES_DEBUG")}
    if columns:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "taxes", *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=cwd)


REAL_DOC = str(committed("reports/profile/gemm_rs-h100-x2.json.gz"))  # a real document with rows; its summary names every failed check


@pytest.mark.parametrize("args", [["model", "ag-gemm", "--sweep", "M=1024:16384"], ["model", "tp-mlp"],
                                  ["report", REAL_DOC], ["compare", REAL_DOC, REAL_DOC], ["hardware", "list"]],
                         ids=["sweep", "model", "report", "compare", "hardware"])
def test_no_number_is_cut_at_80_columns_or_piped(args):
    folded = _taxes(args, columns=80)
    whole = _taxes(args)
    for p in (folded, whole):
        assert p.returncode == 0, p.stderr
        assert "…" not in p.stdout and "..." not in p.stdout
    assert max(len(line) for line in folded.stdout.splitlines()) <= 80  # folded to the width
    numbers = lambda text: sorted(re.findall(r"(?<![\w.,])[-+]?\d[\d,]*\.\d+(?:x|%)?", text))  # noqa: E731
    assert numbers(folded.stdout) == numbers(whole.stdout)  # the same cells, whole, in both


def test_sweep_cells_hold_the_models_numbers_at_80_columns():
    from taxes.model.hardware import BUILTIN
    from taxes.model.predict import sweep

    p = _taxes(["model", "ag-gemm", "--sweep", "M=1024:16384"], columns=80)
    preds = sweep(make_workload("ag-gemm", {}, 2), "M", [1024, 2048, 4096, 8192, 16384], BUILTIN["h200-sxm"])
    for ps in preds:
        for pr in ps:
            assert f"{pr.e2e_us:,.1f}" in p.stdout


def test_profile_table_to_a_file_is_not_cut(capsys, monkeypatch):
    """Defect: `taxes profile` printed its table through a console of the default 80 columns when stdout
    was a file."""
    import gzip

    from taxes.cli.profile_cmd import render_report as _render

    monkeypatch.delenv("COLUMNS", raising=False)
    doc = results.loads(gzip.decompress((Path(__file__).parent / "data" / "documents" /
                                         "emulated_ag_gemm.json.gz").read_bytes()).decode())
    _render(doc, "table")
    out = capsys.readouterr().out
    assert "…" not in out and max(map(len, out.splitlines())) > 80
    for v in doc["cases"][0]["variants"]:
        assert f"{v['plain_e2e_us']:,.1f}" in out


def test_check_exits_1_when_a_check_fails(tmp_path):
    """Defect: `taxes check` found failures and exited 0."""
    import gzip

    doc = results.loads(gzip.decompress((Path(__file__).parent / "data" / "documents" /
                                         "emulated_ag_gemm.json.gz").read_bytes()).decode())
    path = tmp_path / "run.json"
    results.save(doc, path)
    p = _taxes(["check", str(path)])
    assert p.returncode == 1, p.stderr
    assert "FAIL" in p.stdout and re.search(r"taxes check: \d+ failing check rows", p.stderr)
    out = tmp_path / "checks.md"
    p = _taxes(["check", str(path), "--all", "-o", str(out)])
    assert p.returncode == 1 and p.stdout == "" and out.read_text().startswith("| check |")


def test_report_takes_several_documents(capsys, tmp_path, model_doc):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    results.save(dict(model_doc, cases=model_doc["cases"][:1]), a)
    results.save(dict(model_doc, cases=model_doc["cases"][1:2]), b)
    code, out, err = run_cli(["report", str(a), str(b)], capsys)
    assert code == 0, err
    first, second = (f"{model_doc['cases'][i]['workload']} on h200-sxm (model), world 2" for i in (0, 1))
    assert out.index(first) < out.index(second)
    code, out, err = run_cli(["report", str(a), str(b), "--format", "md"], capsys)
    assert code == 0 and out.count("## Summary") == 2
    code, out, err = run_cli(["report", str(a), str(b), "--format", "html", "-o", str(tmp_path / "r.html")], capsys)
    assert code == 0 and (tmp_path / "r.html").read_text().count('<section class="document">') == 2
    code, out, err = run_cli(["report", str(a), str(b), "--format", "json"], capsys)
    assert code == 2 and "give one file" in err


def test_a_missing_dependency_is_one_line_before_any_work(capsys, monkeypatch):
    """An install with --no-deps lacks jsonschema: every command says so at once (exit 2), not after a run."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "jsonschema" else real(name, *a))
    code, out, err = run_cli(["model", "ag-gemm"], capsys)
    assert code == 2 and out == ""
    assert_one_line(err.rstrip("\n"))
    assert "missing dependencies: jsonschema" in err and "pip install jsonschema" in err
    code, out, err = run_cli(["model", "--help"], capsys)  # help needs none of them
    assert code == 0 and "Usage" in out


def test_the_readme_says_how_a_plain_machine_gets_the_cpu_build_of_torch():
    """Defect: the README's `pip install torch==2.13.0` gets the CPU build only where a CPU wheel is staged;
    on a plain machine it pulls the CUDA build. Beside the command CI runs (.ci/run), the set-up section
    names PyTorch's CPU wheel index, for the same version."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = root.joinpath("README.md").read_text()
    setup = readme[readme.index("## Set up and test"):readme.index("\n## ", readme.index("## Set up and test") + 1)]
    pinned = re.search(r"pip install -q (torch==[\d.]+)", root.joinpath(".ci", "run").read_text()).group(1)
    assert f"pip install {pinned} && pip install -e '.[test]'" in setup  # what CI runs
    assert f"pip install {pinned} --index-url https://download.pytorch.org/whl/cpu" in setup
