"""`taxes analyze`: reading Kineto traces, what a trace says about itself, steps, the document and the command.

Synthetic traces are built event by event (tests/kineto_build.py), so every expected number follows from
the construction; tests/test_analyze_planted.py recovers planted taxes. Real traces (tests/data/traces)
must still analyse.
"""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _util import assert_one_line
from hypothesis import given, settings
from hypothesis import strategies as st
from kineto_build import AG, AR, MM, T0, TRITON, Op, Program, add_launch, add_op, add_step, new_trace, write_trace

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.traces import kineto
from taxes.attribution.attribute import ROWS
from taxes.errors import TaxesError

DATA = Path(__file__).parent / "data" / "traces"
REAL_PATHS = sorted((DATA / "real").glob("rank*.json.gz"))


def tp_rank_trace(rank: int, world: int = 2, steps: int = 3, late_s: float = 40.0, **kw) -> dict:
    """A tensor-parallel step per 300 us: all-gather -> matmul -> Triton kernel (outside any op) -> matmul ->
    all-reduce on stream 7 while a matmul runs on stream 20 -> graph replay (matmul + all-reduce). In odd
    steps the last rank launches its all-reduce late_s us late (a host sleep inside `skew_sleep`)."""
    tr = new_trace(rank, world, **kw)
    for i in range(steps):
        t = 300.0 * i
        add_step(tr, 10 + i, t, t + 290.0)
        late = late_s if i % 2 == 1 else 0.0
        mine = late if rank == world - 1 else 0.0
        wait = late if rank != world - 1 else 0.0
        add_op(tr, "c10d::_allgather_base_", t + 1, t + 8, [[256, 128], [128, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_op(tr, "record_param_comms", t + 1.5, t + 7, args={"Collective name": "_allgather_base",
                                                               "Process Group Name": "0", "Seq": 2 * i})
        add_launch(tr, t + 2.125, [(AG, 7, t + 10.5, t + 30.25)], api="cudaLaunchKernelExC")
        add_op(tr, "aten::mm", t + 9, t + 14, [[256, 128], [128, 256]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, t + 10, [(MM, 7, t + 30.25, t + 60.0)])
        add_launch(tr, t + 70.0, [(TRITON, 7, t + 75.0, t + 85.0)], api="cuLaunchKernel")
        add_op(tr, "aten::mm", t + 86, t + 90, [[256, 256], [256, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, t + 87, [(MM, 7, t + 92.0, t + 120.0)])
        if mine:
            add_op(tr, "skew_sleep", t + 91, t + 91 + mine)
        ar0 = t + 121.0 + mine
        add_op(tr, "c10d::allreduce_", ar0 - 1, ar0 + 3, [[[256, 128]]], ["TensorList"])
        add_op(tr, "record_param_comms", ar0 - 0.75, ar0 + 2, args={"Collective name": "allreduce",
                                                                    "Process Group Name": "0", "Seq": 2 * i + 1})
        add_launch(tr, ar0 - 0.5, [(AR, 7, ar0 + 0.5, ar0 + 20.5 + wait)], api="cudaLaunchKernelExC")
        add_op(tr, "aten::mm", ar0 + 4, ar0 + 8, [[128, 128], [128, 128]], ["c10::BFloat16", "c10::BFloat16"])
        add_launch(tr, ar0 + 5, [(MM, 20, ar0 + 6.0, ar0 + 16.0)])
        g0 = ar0 + 21.0 + wait
        add_launch(tr, ar0 + 9, [(MM, 7, g0, g0 + 15.0), (AR, 7, g0 + 15.75, g0 + 30.75)], api="cudaGraphLaunch")
    return tr


def write_tp(tmp_path: Path, world: int = 2, **kw) -> list[Path]:
    return [write_trace(tp_rank_trace(r, world, **kw), tmp_path / f"rank{r}.json.gz") for r in range(world)]


def row(an, rank, step):
    d = an.decomposition
    return d[(d["rank"] == rank) & (d["step"] == step)].iloc[0]


def assert_closure(an) -> None:
    d = an.decomposition
    np.testing.assert_allclose(d[list(ROWS)].sum(axis=1), d["span_us"], rtol=1e-9, atol=1e-6)


# ---- reading traces ---------------------------------------------------------------------------------


def test_plain_and_gzip_traces_load_the_same(tmp_path):
    import pandas as pd

    tr = tp_rank_trace(0)
    plain = kineto.load_trace(write_trace(tr, tmp_path / "a.json"))
    gz = kineto.load_trace(write_trace(tr, tmp_path / "b.json.gz"))
    odd_name = kineto.load_trace(write_trace(tr, tmp_path / "c.trace", gz=True))  # gzip told by content, not name
    pd.testing.assert_frame_equal(plain, gz)
    pd.testing.assert_frame_equal(plain, odd_name)
    assert plain.attrs["trace"]["rank"] == 0 and plain.attrs["trace"]["world_size"] == 2
    assert plain.attrs["trace"]["nccl_version"] == "2.21.5" and plain.attrs["trace"]["cuda_version"] == "12.8"


def test_streaming_reads_what_json_reads(tmp_path, monkeypatch):
    """Chunks far smaller than an event: the reader refills mid-value and mid-number and still agrees
    with json.loads on every kept event; keys after traceEvents are read too."""
    from taxes.traces import stream as tracestream

    tr = tp_rank_trace(1, steps=2)
    tr["doc"]["traceName"] = "after the events"
    path = write_trace(tr, tmp_path / "r.json")
    whole = kineto.load_trace(path)
    monkeypatch.setattr(tracestream, "CHUNK_BYTES", 7)
    small = kineto.load_trace(path)
    import pandas as pd

    pd.testing.assert_frame_equal(whole, small)
    kept = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") in ("X", "s", "f") and e.get("cat")]
    assert len(whole) == len(kept)
    s = tracestream.TraceStream(path, 1 << 30)
    list(s.events())
    assert s.meta["traceName"] == "after the events" and s.meta["distributedInfo"]["rank"] == 1


def test_sub_microsecond_times_are_kept(tmp_path):
    an = A.analyze([write_trace(tp_rank_trace(0, world=1, steps=1), tmp_path / "rank0.json")])
    acts = an.timelines[0].activities
    ag = acts[acts["name"] == AG].iloc[0]
    assert ag["start_us"] - T0 == pytest.approx(10.5, abs=1e-6)
    assert ag["end_us"] - ag["start_us"] == pytest.approx(19.75, abs=1e-9)


def _absolute(doc: dict, origin: str) -> bytes:
    """The same trace with absolute epoch timestamps written with ns digits (old Kineto's form)."""
    import copy
    from decimal import Decimal

    doc = copy.deepcopy(doc)
    doc.pop("baseTimeNanoseconds")
    for e in doc["traceEvents"]:
        e["ts"] = f"@{Decimal(origin) + Decimal(repr(e['ts'])) - Decimal(repr(T0)):.3f}@"
    return json.dumps(doc).replace('"@', "").replace('@"', "").encode()


def test_absolute_timestamps_keep_their_nanoseconds(tmp_path):
    tr = tp_rank_trace(0, world=1, steps=2)
    rel = A.analyze([write_trace(tr, tmp_path / "rel" / "rank0.json")])
    path = tmp_path / "abs" / "rank0.json"
    path.parent.mkdir()
    path.write_bytes(_absolute(tr["doc"], "1790857026123456.789"))
    ab = A.analyze([path])
    assert ab.info[0]["origin_us"] > 0
    cols = ["span_us"] + list(ROWS)
    np.testing.assert_allclose(ab.decomposition[cols], rel.decomposition[cols], atol=2e-6)


BAD_TRACES = {
    "empty.json": b"",
    "text.json": b"this is not json",
    "cut.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel"',
    "no_events.json": b'{"schemaVersion": 1}',
    "events_not_list.json": b'{"traceEvents": 5}',
    "scalar.json": b"42",
    "event_not_object.json": b"[1, 2]",
    "ts_string.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "1.5", "dur": 1}]}',
    "no_dur.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5}]}',
    "negative_dur.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": -2}]}',
    "bool_ts.json": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "k", "ts": true, "dur": 1}]}',
    "nan.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": NaN, "dur": 1}]}',
    "args_list.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "args": []}]}',
    "name_number.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": 7, "ts": 1, "dur": 1}]}',
    "latin1.json": '{"traceEvents": [{"name": "\u00e9"}]}'.encode("latin-1"),
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "deep_event.json": b'{"traceEvents": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
    "bad.json.gz": b"\x1f\x8b\x08\x00 definitely not deflate data",
    "huge_int.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1' + b"0" * 400 + b', "dur": 1}]}',
    "giant_int.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1' + b"0" * 5000 + b', "dur": 1}]}',
    "devices_number.json": b'{"deviceProperties": 3, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": -1e400, "dur": 1}]}',
    "line\nbreak.json": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\\nx\\u0007", "ts": null, "dur": 1}]}',
    "trailing.json": b'{"traceEvents": []} {"more": 1}',
}


@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_malformed_traces_are_one_line_errors(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(BAD_TRACES[name])
    with pytest.raises(TaxesError) as e:
        A.analyze([path])
    assert_one_line(str(e.value))


def test_odd_pid_and_tid_values_are_names(tmp_path):
    path = tmp_path / "odd.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, "pid": [1], "tid": {}}]}')
    an = A.analyze([path])
    assert row(an, 0, 0)["span_us"] == pytest.approx(1.0)


@settings(max_examples=30, deadline=None)
@given(cut=st.floats(0.0, 0.999))
def test_truncated_files_are_one_line_errors(tmp_path_factory, cut):
    tmp = tmp_path_factory.mktemp("cut")
    data = json.dumps(tp_rank_trace(0, steps=1)["doc"]).encode()
    for name, blob in (("t.json", data), ("t.json.gz", gzip.compress(data))):
        path = tmp / name
        path.write_bytes(blob[: int(len(blob) * cut)])
        with pytest.raises(TaxesError) as e:
            kineto.load_trace(path)
        assert_one_line(str(e.value))


def test_unreadable_paths_and_the_size_limit(tmp_path, monkeypatch):
    for path, words in ((tmp_path / "missing.json", "no such file"), (tmp_path, "a directory")):
        with pytest.raises(TaxesError, match=words) as e:
            kineto.load_trace(path)
        assert_one_line(str(e.value))
    big = write_trace(tp_rank_trace(0), tmp_path / "big.json.gz")
    monkeypatch.setattr(kineto, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TaxesError, match="larger than"):
        kineto.load_trace(big)


# ---- ranks and jobs ----------------------------------------------------------------------------------


def test_rank_comes_from_distributed_info_then_the_file_name(tmp_path):
    named = write_trace(tp_rank_trace(1), tmp_path / "rank5.json")
    assert kineto.load_trace(named).attrs["trace"]["rank"] == 1
    for fname, rank in (("rank3.json", 3), ("trainer_Rank-7.pt.trace.json.gz", 7), ("trace.json", None)):
        tr = tp_rank_trace(0)
        del tr["doc"]["distributedInfo"]
        assert kineto.load_trace(write_trace(tr, tmp_path / fname)).attrs["trace"]["rank"] == rank


def test_rank_conflicts_are_one_line_errors(tmp_path):
    a = write_trace(tp_rank_trace(0), tmp_path / "a" / "rank0.json")
    b = write_trace(tp_rank_trace(0), tmp_path / "b" / "rank0.json")
    with pytest.raises(TaxesError, match="rank 0 again"):
        A.analyze([a, b])
    anon = []
    for name in ("x.json", "y.json"):
        tr = tp_rank_trace(0)
        del tr["doc"]["distributedInfo"]
        anon.append(write_trace(tr, tmp_path / name))
    with pytest.raises(TaxesError, match="cannot tell its rank") as e:
        A.analyze(anon)
    assert_one_line(str(e.value))
    assert A.analyze(anon[:1]).ranks == {0: str(anon[0])}


def test_traces_of_different_jobs_are_refused(tmp_path):
    ok = write_tp(tmp_path / "ok")
    other_world = write_trace(tp_rank_trace(1, world=8), tmp_path / "w8" / "rank1.json")
    with pytest.raises(TaxesError, match="different world sizes") as e:
        A.analyze([ok[0], other_world])
    assert_one_line(str(e.value))
    other_gpu = write_trace(tp_rank_trace(1, gpu="NVIDIA A100-SXM4-80GB"), tmp_path / "a100" / "rank1.json")
    with pytest.raises(TaxesError, match="different GPUs"):
        A.analyze([ok[0], other_gpu])
    later = write_trace(tp_rank_trace(1, base_ns=new_trace()["doc"]["baseTimeNanoseconds"] + 3_600 * 10**9),
                        tmp_path / "later" / "rank1.json")
    with pytest.raises(TaxesError, match="never overlaps"):
        A.analyze([ok[0], later])


@pytest.mark.parametrize("given_rank", [0, 1])
def test_a_missing_rank_is_a_warning_not_a_crash(tmp_path, given_rank):
    path = write_trace(tp_rank_trace(given_rank), tmp_path / f"rank{given_rank}.json")
    an = A.analyze([path])
    assert list(an.ranks) == [given_rank] and an.world_size == 2
    assert any(f"rank(s) {1 - given_rank} of world 2 are missing" in w for w in an.warnings)
    assert (an.collectives["wait_us"] == 0).all()
    assert_closure(an)


def test_clock_offsets_put_ranks_on_one_clock(tmp_path):
    shift_us = 1234.5
    t0 = tp_rank_trace(0, late_s=0.0)
    t1 = tp_rank_trace(1, late_s=0.0, base_ns=new_trace()["doc"]["baseTimeNanoseconds"] - int(shift_us * 1000))
    for e in t1["doc"]["traceEvents"]:
        e["ts"] = e["ts"] + shift_us
    an = A.analyze([write_trace(t0, tmp_path / "rank0.json"), write_trace(t1, tmp_path / "rank1.json")])
    assert an.instances["matched"].all()
    assert an.instances["skew_us"].abs().max() < 1e-6
    assert an.collectives["wait_us"].abs().max() < 1e-9


def test_parallel_and_serial_parsing_agree(tmp_path):
    paths = write_tp(tmp_path)
    a, b = A.analyze(paths, jobs=1), A.analyze(paths, jobs=2)
    import pandas as pd

    pd.testing.assert_frame_equal(a.decomposition, b.decomposition)


def test_cpu_only_traces_are_refused_in_one_line():
    paths = sorted((DATA / "cpu").glob("rank*.json.gz"))
    assert len(paths) == 2
    ev = kineto.load_trace(paths[0])
    assert ev.attrs["trace"]["backend"] == "gloo" and list(kineto.profiler_steps(ev)["step"]) == [2, 3, 4, 5]
    with pytest.raises(TaxesError, match="no GPU activity") as e:
        A.analyze(paths)
    assert_one_line(str(e.value))


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


# ---- real traces (docs/record_traces.py on 2 x H200) -------------------------------------------------


needs_real = pytest.mark.skipif(len(REAL_PATHS) < 2, reason="no real traces in tests/data/traces/real")


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
