"""`taxes analyze`: what a trace says about itself, steps, the document and the command.

Synthetic traces are built event by event (tests/kineto_build.py), so every expected number follows from
the construction; tests/test_analyze_reading.py reads the files, tests/test_analyze_planted.py recovers
planted taxes. Real traces (tests/data/traces) must still analyse.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from _analyze_data import BAD_TRACES, REAL_PATHS, assert_closure, needs_real, row, tp_rank_trace, write_tp
from _util import assert_one_line
from hypothesis import given
from kineto_build import MM, TRITON, Op, Program, add_launch, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D


# ---- the trace describes itself ----------------------------------------------------------------------


def test_gpu_name_selects_the_hardware_profile_and_versions_come_from_the_trace(tmp_path):
    tr = tp_rank_trace(0, world=1, gpu="NVIDIA B200")
    tr["doc"]["torch_version"] = "2.11.0+cu130"
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    assert an.hardware == "b200" and "NVIDIA B200" in an.hardware_source
    doc = D.analysis_document(an)
    assert doc["metadata"]["hardware_profile"] == "b200" and doc["metadata"]["torch_version"] == "2.11.0+cu130"
    assert doc["metadata"]["cuda_version"] == "12.8" and doc["metadata"]["gpu_names"] == ["NVIDIA B200"]
    given = A.analyze([write_trace(tr, tmp_path / "g" / "rank0.json")], hardware="h100-sxm")
    assert given.hardware == "h100-sxm"
    unknown = A.analyze([write_trace(tp_rank_trace(0, world=1, gpu="Tesla V100-SXM2-16GB"), tmp_path / "v" / "rank0.json")])
    assert unknown.hardware is None and any("unknown GPU" in w and "--hardware" in w for w in unknown.warnings)
    assert unknown.decomposition["locality"].isna().all() and "--hardware" in unknown.not_measured["locality"]
    assert D.analysis_document(unknown)["metadata"]["hardware_profile"] == "none"


def test_activities_launched_before_profiling_are_not_charged_to_the_first_step(tmp_path):
    tr = new_trace(0, 1)
    add_step(tr, 1, 0.0, 40.0)
    add_launch(tr, 0.0, [(MM, 7, 0.0, 30.0)], record_call=False)  # launched before the trace began
    add_launch(tr, 2.0, [(MM, 7, 30.0, 40.0)])
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    r = row(an, 0, 1)
    assert r["compute"] == pytest.approx(10.0)  # only the kernel launched in the step
    assert r["unattributed"] == pytest.approx(30.0)  # busy with no step's work: not idle, not this step's
    assert r["launch"] == pytest.approx(0.0) and r["queued"] == pytest.approx(0.0)
    assert any("no launch call" in w for w in an.warnings)
    assert_closure(an)


def test_warm_up_and_outlier_steps_are_flagged_and_left_out(tmp_path):
    tr = new_trace(0, 1)
    p = Program(tr)
    durs = [700.0] + [10.0] * 6 + [200.0] + [10.0] * 4
    for i, d in enumerate(durs):
        p.step(i, [Op(dur_us=d)])
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    assert an.flags == {0: "warm-up", 7: "outlier"}
    assert 0 not in an.kept_steps and 7 not in an.kept_steps
    doc = D.analysis_document(an)
    var = doc["cases"][0]["variants"][0]
    assert var["e2e_us"]["p90"] < 100.0  # the 0.7 ms warm-up no longer spreads the E2E
    assert var["config"]["flagged_steps"] == {"0": "warm-up", "7": "outlier"}


def test_without_step_marks_repeating_iterations_are_found(tmp_path):
    tr = new_trace(0, 1)
    p = Program(tr)
    for _ in range(6):
        for k in ("embed", "attn", "mlp", "head"):
            p.run(Op(name=f"aten::{k}", kernel=f"{k}_kernel", dur_us=5.0, pre_us=3.0))
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    assert sorted(an.decomposition["step"]) == list(range(6))
    assert "repeating iterations of 4 launches" in an.windows_how[0]
    acts = an.timelines[0].activities
    assert (acts.groupby("step")["name"].apply(list).apply(len) == 4).all()
    assert_closure(an)


def test_without_step_marks_or_repetition_the_window_is_the_gpu_span(tmp_path):
    tr = new_trace(0, 1)
    add_launch(tr, 0.0, [(MM, 7, 400.0, 410.0)])  # launched long before it ran
    add_launch(tr, 20.0, [(TRITON, 7, 412.0, 430.0)])
    an = A.analyze([write_trace(tr, tmp_path / "rank0.json")])
    assert list(an.decomposition["step"]) == [0]
    assert row(an, 0, 0)["span_us"] == pytest.approx(30.0)  # the GPU activity's span, not from the first launch
    assert any("the window is the whole trace" in w for w in an.warnings)


# ---- the document and the command --------------------------------------------------------------------


def test_document_json_contract(tmp_path):
    from taxes.documents import results

    an = A.analyze(write_tp(tmp_path), plain_steps={0: [250.0] * 3, 1: [251.0] * 3})
    doc = json.loads(results.dumps(D.analysis_document(an)))
    results.validate(doc)
    assert doc["metadata"]["hardware_profile"] == "h100-sxm"
    var = doc["cases"][0]["variants"][0]
    overall = {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}
    assert {"launch", "host_bound", "sync_wait", "exposed_transfer", "locality"} <= set(overall)
    assert math.fsum(overall.values()) == pytest.approx(var["attributed_e2e_us"])
    assert var["plain_e2e_us"] == pytest.approx(251.0)
    assert var["measurement_cost_us"] == pytest.approx(var["attributed_e2e_us"] - 251.0)
    ta = doc["trace_analysis"]
    for r in ta["decomposition"]:
        assert {"rank", "step", "span_us", "comm_us"} <= set(r)
    assert {w["change"] for w in ta["what_if"]} == {"graphs", "overlap", "fusion"}
    assert all({"rank", "step", "change", "projected_us"} <= set(w) and w["label"] == "predicted" for w in ta["what_if"])
    assert ta["instances"] and ta["stragglers"]


def _run(args, capsys):
    from taxes.cli.analyze_cmd import analyze
    from taxes.cli.main import TaxesGroup

    group = TaxesGroup(name="taxes", commands={"analyze": analyze})
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        group.main(["analyze"] + [str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def test_cli_formats_and_the_perfetto_trace(tmp_path, capsys):
    from _util import assert_self_contained_html

    paths = write_tp(tmp_path)
    code, out, err = _run(paths, capsys)
    assert code == 0, err
    assert "kernel-launch tax" in out and "what if" in out and "stragglers" in out
    code, out, _ = _run(paths + ["--format", "md"], capsys)
    assert code == 0 and "### collective instances" in out
    code, out, _ = _run(paths + ["--format", "json"], capsys)
    assert code == 0 and json.loads(out)["cases"][0]["workload"] == "trace"
    html = tmp_path / "r.html"
    code, _, err = _run(paths + ["--format", "html", "-o", html], capsys)
    assert code == 0 and "wrote" in err
    assert_self_contained_html(html.read_text(), 2)  # the components and the timeline of the middle step
    code, _, err = _run(paths + ["--format", "html", "-o", html], capsys)
    assert code == 2 and "already exists" in err
    pf = tmp_path / "t.perfetto.json"
    code, _, err = _run(paths + ["--format", "json", "--perfetto", pf], capsys)
    assert code == 0
    trace = json.loads(pf.read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"idle by cause (taxes)", "sync wait (taxes)", "steps (taxes)", "stream 7"} <= names
    idle = [e for e in trace["traceEvents"] if e.get("tid") == 2 and e["ph"] == "X"]
    an = A.analyze(paths)
    assert sum(e["dur"] for e in idle) == pytest.approx(float(an.gaps["dur_us"].sum()), abs=1e-2)


def test_plain_file_and_comm_patterns_through_the_command(tmp_path, capsys):
    paths = write_tp(tmp_path)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"0": [280.0, 281.0, 282.0], "1": [280.0, 281.0, 282.0]}))
    pats = tmp_path / "pats.txt"
    pats.write_text("# kernels of our own all-to-all\nsilu_kernel\n")
    code, out, err = _run(paths + ["--format", "json", "--plain", plain, "--comm-patterns", pats], capsys)
    assert code == 0, err
    doc = json.loads(out)
    var = doc["cases"][0]["variants"][0]
    assert var["plain_e2e_us"] == pytest.approx(281.0)
    rules = {x["rule"] for x in doc["trace_analysis"]["communication_by_rule"]}
    assert rules == {"nccl", "pattern:silu_kernel"}


@pytest.mark.parametrize("args, words", [
    (["{dir}/nope.json"], "no such file"),
    (["{dir}/rank0.json.gz", "--hardware", "no-such-gpu"], "no-such-gpu"),
    (["{dir}/rank0.json.gz", "--format", "html"], "give -o"),
    (["{dir}/rank0.json.gz", "{dir}/rank0.json.gz"], "given twice"),
    (["{dir}/rank0.json.gz", "-o", "{dir}/no/such/dir/out.md"], "does not exist"),
    (["{dir}/rank0.json.gz", "--comm-pattern", "(unclosed"], "not a regular expression"),
    (["{dir}/rank0.json.gz", "--plain", "{dir}/rank0.json.gz"], "plain step times"),
    (["{dir}/rank0.json.gz", "--et", "{dir}/missing.et.json"], "execution trace"),
])
def test_cli_errors_are_one_line(tmp_path, capsys, args, words):
    write_tp(tmp_path)
    code, out, err = _run([a.format(dir=tmp_path) for a in args], capsys)
    assert code == 2 and words in err, err
    assert_one_line(err.strip())


@pytest.mark.parametrize("name", ["cut.json", "nan.json", "deep_event.json", "bad.json.gz", "line\nbreak.json"])
def test_hostile_traces_through_the_command_are_one_line_and_exit_2(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_bytes(BAD_TRACES[name])
    code, out, err = _run([path], capsys)
    assert code == 2 and out == ""
    assert_one_line(err.strip())


def test_json_output_imports_no_plotting(tmp_path):
    paths = write_tp(tmp_path)
    code = ("import sys, taxes.cli.main as m\n"
            "sys.argv = ['taxes', 'analyze', '--format', 'json', '-o', sys.argv[1]] + sys.argv[2:]\n"
            "try:\n    m.main()\nexcept SystemExit:\n    pass\n"
            "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "o.json"), *map(str, paths)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "o.json").read_text())["schema"] == "taxes.result"


@needs_real
def test_real_traces_analyse_with_the_planted_skew():
    """Rank 1 slept 5 ms inside `skew_sleep` before its all-reduce in odd steps: its device waited on the
    host (host-bound, the frame named), and rank 0 waited inside the all-reduce (sync wait)."""
    an = A.analyze(REAL_PATHS)
    assert an.hardware == "h200-sxm" and sorted(an.ranks) == [0, 1]
    assert an.instances["matched"].all()
    assert set(an.instances["source"]) == {"group-order", "graph-order"}
    frames = an.host_frames[(an.host_frames["rank"] == 1) & (an.host_frames["frame"] == "skew_sleep")]
    slept = set(frames["step"])
    assert len(slept) == 2
    for s in slept:
        assert row(an, 0, s)["sync_wait"] > 4500.0
        assert row(an, 1, s)["host_bound"] > 4500.0
    for s in set(an.kept_steps) - slept:
        assert row(an, 0, s)["sync_wait"] < 1000.0
    d = an.decomposition
    assert (d["unattributed"] <= 0.1 * d["span_us"]).all()
    assert_closure(an)
