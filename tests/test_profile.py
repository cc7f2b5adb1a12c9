"""`taxes profile`: the attribution arithmetic, on random timelines and on committed GPU result documents,
the emulated end-to-end run (world 2, both workloads), re-attribution, the profiler cross-check, and
the reports of real documents. No GPU needed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taxes import attribution
from taxes.hardware import get_profile
from taxes.model import COMPONENTS, Floor
from taxes.results import load, validate

ROOT = Path(__file__).resolve().parent.parent
REAL = sorted((ROOT / "reports" / "profile").glob("*.json"))
# The calibration the committed reports/profile documents were attributed with (session 4); the current
# reports/calibration/h200-x2-calibrated.json is a later re-calibration (per-launcher host costs), with
# which the later documents (variants timed interleaved in rounds) were attributed.
CALIBRATED = ROOT / "reports" / "calibration" / "h200-x2-calibrated-session4.json"
CURRENT = ROOT / "reports" / "calibration" / "h200-x2-calibrated.json"
LATER = sorted([*(ROOT / "reports" / "ag_gemm").glob("profile_*.json"), ROOT / "reports" / "gemm_rs" / "gemm_rs_interleaved.json",
                ROOT / "reports" / "tp_mlp" / "tp_mlp_interleaved.json"])
# Session 7: calibrations with the matrix peak over four shapes and the HBM peak the best of copy and
# read, and documents whose eager phases carry host stamps (issued_us), each run with its own calibration
# (shared: eager phases sharing their boundary events; combine: and the combine kernel calibrated).
SESSION7_RUNS = [(ROOT / "reports" / "profile" / "session7" / sub, ROOT / "reports" / "calibration" / f"h200-x2-calibrated-{cal}.json")
                 for sub, cal in (("", "session7"), ("repeat", "session7-repeat"), ("shared", "session7-shared"),
                                  ("combine", "session7-combine"))]
NEWEST = [(p, cal) for d, cal in SESSION7_RUNS for p in sorted(d.glob("*.json.gz"))]


# ---- attribution arithmetic on random timelines ------------------------------------------------------


@st.composite
def bsp_iteration(draw, stamped: bool = False):
    """Per rank: phases in issue order with random gaps; the same phase sequence on every rank. stamped:
    each phase also has the host time its call returned (anywhere from before its start to after its end)."""
    ranks = draw(st.integers(1, 4))
    roles = draw(st.lists(st.sampled_from(["compute", "communication"]), min_size=1, max_size=5))
    out = []
    for _ in range(ranks):
        t, phases = 0.0, []
        for j, role in enumerate(roles):
            t += draw(st.floats(0, 50))
            d = draw(st.floats(0, 500))
            phases.append({"name": f"p{j}", "role": role, "start_us": t, "end_us": t + d})
            if stamped:
                phases[-1]["issued_us"] = t + draw(st.floats(-20, 600))
            t += d
        out.append({"e2e_us": t + draw(st.floats(0, 10)), "phases": phases})
    return out


floors = st.builds(Floor, st.floats(0, 400), st.floats(0, 400), st.floats(0, 400))


@settings(max_examples=200, deadline=None)
@given(bsp_iteration(), floors, st.floats(0, 100))
def test_bsp_components_close_exactly_and_taxes_are_never_negative(ranks, floor, locality):
    for r, comp in zip(ranks, attribution.bsp_iteration(ranks, floor, locality)):
        assert set(comp) == set(COMPONENTS)
        assert math.fsum(comp.values()) == pytest.approx(r["e2e_us"], abs=1e-6)
        assert all(comp[c] >= -1e-9 for c in COMPONENTS if c != "unattributed")
        # launch is the idle before, between and after the phases, computed here the plain way
        ends = [0.0] + [p["end_us"] for p in r["phases"]]
        idle = sum(max(0.0, p["start_us"] - e) for p, e in zip(r["phases"], ends)) + r["e2e_us"] - ends[-1]
        assert comp["launch"] == pytest.approx(idle, abs=1e-6)


@settings(max_examples=200, deadline=None)
@given(bsp_iteration(stamped=True), floors, st.floats(0, 100))
def test_host_bound_parts_of_phases_are_launch_tax_and_everything_still_closes(ranks, floor, locality):
    plain = [{**r, "phases": [{k: v for k, v in ph.items() if k != "issued_us"} for ph in r["phases"]]} for r in ranks]
    for r, comp, comp0 in zip(ranks, attribution.bsp_iteration(ranks, floor, locality),
                              attribution.bsp_iteration(plain, floor, locality)):
        assert math.fsum(comp.values()) == pytest.approx(r["e2e_us"], abs=1e-6)
        assert all(comp[c] >= -1e-9 for c in COMPONENTS if c != "unattributed")
        # the host-bound part of each phase, computed here: from its start to its call's return, within it
        host = sum(min(max(0.0, ph["issued_us"] - ph["start_us"]), ph["end_us"] - ph["start_us"]) for ph in r["phases"])
        assert comp["launch"] == pytest.approx(comp0["launch"] + host, abs=1e-6)
        # it moves time out of the phases, never out of the floor
        assert comp["ideal"] == comp0["ideal"]


def test_an_nccl_host_path_inside_a_phase_is_launch_tax_not_transfer_or_sync_wait():
    # both ranks' all-gathers start at 0; rank 1's call returns 40 us later (its host path), so its kernel
    # ran 40..60 while rank 0's ran 0..60 waiting for it: rank 0 waited, rank 1 was launch-bound
    ph = lambda end, issued: [{"name": "ag", "role": "communication", "start_us": 0.0, "end_us": end,  # noqa: E731
                               "issued_us": issued},
                              {"name": "mm", "role": "compute", "start_us": end, "end_us": end + 100.0,
                               "issued_us": end - 5.0}]
    ranks = [{"e2e_us": 160.0, "phases": ph(60.0, 2.0)}, {"e2e_us": 160.0, "phases": ph(60.0, 40.0)}]
    a, b = attribution.bsp_iteration(ranks, Floor(80.0, 10.0, 20.0), 0.0)
    assert b["launch"] == pytest.approx(40.0) and a["launch"] == pytest.approx(2.0)
    assert a["sync_wait"] == pytest.approx(38.0) and b["sync_wait"] == 0.0
    assert a["exposed_transfer"] == b["exposed_transfer"] == pytest.approx(20.0)


@settings(max_examples=200, deadline=None)
@given(st.floats(1, 1000), st.floats(0, 1000), floors, st.floats(0, 300))
def test_locality_is_charged_only_to_compute_time_above_the_local_floor(compute, comm, floor, loc):
    ranks = [{"e2e_us": compute + comm, "phases": [
        {"name": "ag", "role": "communication", "start_us": 0.0, "end_us": comm},
        {"name": "mm", "role": "compute", "start_us": comm, "end_us": comm + compute}]}]
    comp = attribution.bsp_iteration(ranks, floor, loc)[0]
    assert comp["locality"] == pytest.approx(min(loc, max(0.0, compute - floor.work_us)), abs=1e-9)
    assert math.fsum(comp.values()) == pytest.approx(compute + comm, abs=1e-6)
    # a compute phase at or below its floor hides the traffic: no locality tax, and no negative inefficiency
    if compute <= floor.work_us:
        assert comp["locality"] == pytest.approx(0.0, abs=1e-9) and comp["inefficiency"] >= 0.0


def test_sync_wait_is_the_excess_over_the_fastest_rank():
    ph = lambda d: [{"name": "ag", "role": "communication", "start_us": 0.0, "end_us": d},  # noqa: E731
                    {"name": "mm", "role": "compute", "start_us": d, "end_us": d + 100.0}]
    ranks = [{"e2e_us": 150.0, "phases": ph(50.0)}, {"e2e_us": 130.0, "phases": ph(30.0)}]
    a, b = attribution.bsp_iteration(ranks, Floor(80.0, 10.0, 20.0), 0.0)
    assert a["sync_wait"] == pytest.approx(20.0) and b["sync_wait"] == 0.0
    assert b["exposed_transfer"] == pytest.approx(30.0)  # link 20 < work 80: nothing is unhideable


@settings(max_examples=200, deadline=None)
@given(st.floats(1, 1000), st.floats(0, 1), st.floats(0, 1), floors, st.floats(0, 50), st.floats(0, 20))
def test_fused_components_close_and_waiting_is_the_bulk_synchronous_tax(dur, span_frac, wait_frac, floor, loc, lead):
    span = dur * span_frac
    rank = {"e2e_us": lead + dur + 1.0, "phases": [{"name": "fused", "role": "compute", "start_us": lead,
                                                     "end_us": lead + dur}],
            "traced": {"fused": {"span_us": span, "wait_us": span * wait_frac}}}
    comp = attribution.fused_iteration(rank, floor, loc)
    assert math.fsum(comp.values()) == pytest.approx(rank["e2e_us"], abs=1e-6)
    assert comp["launch"] == pytest.approx(lead + dur - span + 1.0, abs=1e-6)  # + the 1 us after the phase
    assert comp["sync_wait"] == pytest.approx(max(0.0, span * wait_frac - floor.unhideable_link_us), abs=1e-6)


def test_trimmed_mean_keeps_the_middle_iterations():
    e2e = [100.0] * 8 + [1000.0, 1.0]
    keep = attribution.trimmed_iterations(e2e)
    assert 8 in keep or 9 in keep or len(keep) == 8  # an outlier at either end may be dropped
    assert all(e2e[i] == 100.0 for i in keep if i < 8)


# ---- committed GPU result documents -----------------------------------------------------------------


needs_real = pytest.mark.skipif(not REAL, reason="no committed result documents under reports/profile/")


@needs_real
@pytest.mark.parametrize("path,calibration", [(p, CALIBRATED) for p in REAL] + [(p, CURRENT) for p in LATER if p.exists()]
                         + NEWEST,
                         ids=[p.name for p in REAL] + [p.name for p in LATER if p.exists()]
                         + [f"{p.parent.name}/{p.name}" for p, _ in NEWEST])
def test_real_documents_validate_and_their_components_redo_exactly(path, calibration):
    from taxes.cases import MODEL_OF
    from taxes.model import floor_of
    from taxes.profiling import _attribute_variant
    from taxes.workloads import make_workload

    doc = load(path)
    hw = get_profile(str(calibration))
    assert doc["metadata"]["gpu_names"] and all("H200" in g for g in doc["metadata"]["gpu_names"])
    checked = 0
    for case in doc["cases"]:
        w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
        for v in case["variants"]:
            if not v.get("phased_us"):
                continue
            redo = _attribute_variant(v["variant"], v["phased_us"], w, floor_of(w, hw), hw, MODEL_OF)
            stored = {(c["name"], c["rank"]): c["value_us"] for c in v["components"]}
            for c in redo["components"]:
                assert stored[(c["name"], c["rank"])] == pytest.approx(c["value_us"], rel=1e-9, abs=1e-9)
            # closure per rank against the kept iterations' mean instrumented E2E, computed here
            n = min(len(x) for x in v["phased_us"])
            per_iter = [max(v["phased_us"][r][i]["e2e_us"] for r in range(len(v["phased_us"]))) for i in range(n)]
            keep = attribution.trimmed_iterations(per_iter)
            for r, per_rank in enumerate(v["phased_us"]):
                mean_e2e = math.fsum(per_rank[i]["e2e_us"] for i in keep) / len(keep)
                total = math.fsum(val for (name, rank), val in stored.items() if rank == r)
                assert total == pytest.approx(mean_e2e, rel=1e-9)
            checked += 1
    assert checked


@needs_real
def test_reattribution_moves_the_floor_but_not_the_measurements():
    from taxes.profiling import reattribute

    doc = load(ROOT / "reports" / "profile" / "ag_gemm_N8192.json")
    other = reattribute(doc, get_profile("h200-sxm"))
    validate(other)
    a, b = doc["cases"][0]["variants"][0], other["cases"][0]["variants"][0]
    assert a["samples_us"] == b["samples_us"] and a["e2e_us"] == b["e2e_us"]
    ideal = lambda v: next(c["value_us"] for c in v["components"] if c["name"] == "ideal" and c["rank"] is None)  # noqa: E731
    assert ideal(a) != pytest.approx(ideal(b))  # calibrated peaks differ from the datasheet's
    assert other["metadata"]["attributed_with"]["profile"] == "h200-sxm"


@needs_real
def test_reports_of_a_real_document_show_every_view(tmp_path):
    from taxes.reports.render import render_html, render_markdown

    doc = load(ROOT / "reports" / "profile" / "ag_gemm_N8192.json")
    md = render_markdown(doc)
    for text in ("model E2E (error)", "instrumented E2E (vs plain)", "CTA time waiting", "ablation ladder"):
        assert text in md
    page = render_html(doc)
    assert page.count("<img") >= 4 * len(doc["cases"])  # bars, predicted vs measured, timeline, CTAs
    for alt in ("predicted against measured", "per-rank timeline", "fused kernels, per CTA"):
        assert alt in page


def test_profiler_check_matches_phases_to_their_kernels():
    from taxes.profiling import profiler_check

    def launch(ts, corr):
        return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": ts, "dur": 2.0,
                "args": {"correlation": corr}}

    trace = {"traceEvents": [
        {"cat": "user_annotation", "name": "taxes:bsp:matmul:0", "tid": 1, "ts": 100.0, "dur": 10.0},
        launch(101.0, 7), launch(104.0, 8),
        {"cat": "kernel", "name": "gemm", "ts": 120.0, "dur": 30.0, "args": {"correlation": 7}},
        {"cat": "kernel", "name": "epilogue", "ts": 151.0, "dur": 4.5, "args": {"correlation": 8}},
        {"cat": "user_annotation", "name": "taxes:bsp:iter0", "tid": 1, "ts": 90.0, "dur": 80.0},  # not a phase
    ]}
    events = {"bsp": [{"phases": [{"name": "matmul", "start_us": 3.0, "end_us": 40.0}]}]}
    out = profiler_check(trace, events)
    assert out["bsp"]["matmul"]["cupti_us"] == pytest.approx(35.5)
    assert out["bsp"]["matmul"]["events_us"] == pytest.approx(37.0)


# ---- the emulated end-to-end run --------------------------------------------------------------------


TINY_AG = dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=2, chunk_rows=8,
               copy_block=256, grid=4)


@pytest.mark.slow
def test_emulated_profile_of_both_workloads_checks_every_variant_and_closes():
    from taxes.profiling import profile

    ag = profile("ag-gemm", ["M=64,N=48,K=32", "M=32,N=32,K=16"], 2, iters=3, warmup=1, emulate=True,
                 config=TINY_AG, timeout_s=300)
    fd = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=40", 2, iters=3, warmup=1, emulate=True,
                 config={"block_n": 16}, timeout_s=300)
    for doc, n_cases, names in ((ag.document, 2, {"bsp", "bsp-graph", "fused-pull", "fused-push", "fused-push-graph"}),
                                (fd.document, 1, {"bsp", "bsp-graph", "fused-push", "fused-push-graph", "bsp-sdpa",
                                                  "bsp-sdpa-graph"})):
        validate(doc)
        assert doc["metadata"]["emulated"] is True and len(doc["cases"]) == n_cases
        for case in doc["cases"]:
            assert {v["variant"] for v in case["variants"]} == names
            for v in case["variants"]:
                assert v["correctness"]["passed"], (v["variant"], v["config"])
                assert len(v["samples_us"]) == 2 and all(len(s) == 3 for s in v["samples_us"])
                assert {c["rank"] for c in v["components"]} == {0, 1, None}
                assert v["prediction"]["label"] == "predicted"
    assert set(ag.components["component"]) == set(COMPONENTS)
    assert not fd.phases.empty


_CALLS = []  # the order in which the fake plain timing below was called (one list per forked rank)


def _numbered_timing(ctx, run, input_sets, iters, warmup, label=""):
    """Stands in for harness.time_iterations: runs the variant once, returns the call's number per sample."""
    run(*input_sets[0])
    _CALLS.append(label)
    return [float(len(_CALLS) - 1)] * iters


@pytest.mark.slow
def test_emulated_profile_interleaves_the_variants_in_rounds(monkeypatch):
    from taxes import harness
    from taxes.profiling import profile

    monkeypatch.setattr(harness, "time_iterations", _numbered_timing)  # the forked ranks inherit it
    doc = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=24", 2, ["bsp", "fused-push"], iters=5, warmup=0,
                  emulate=True, config={"block_n": 16}, timeout_s=300, rounds=2).document
    validate(doc)
    assert doc["metadata"]["rounds"] == 2
    samples = {v["variant"]: v["samples_us"] for v in doc["cases"][0]["variants"]}
    # round 1 times 3 iterations of bsp, then of fused-push; round 2 two of each: calls 0 and 2 are bsp's
    for rank in (0, 1):
        assert samples["bsp"][rank] == [0.0] * 3 + [2.0] * 2
        assert samples["fused-push"][rank] == [1.0] * 3 + [3.0] * 2
    for v in doc["cases"][0]["variants"]:
        assert v["correctness"]["passed"]
        assert [len(r) for r in v["phased_us"]] == [5, 5]  # the instrumented iterations, per rank, too


@pytest.mark.slow
def test_cli_profile_writes_once_refuses_to_overwrite_and_appends_to_a_directory(tmp_path):
    args = [sys.executable, "-m", "taxes.cli.main", "profile", "flash-decode", "--emulate", "--gpus", "2",
            "--shape", "B=1,Hq=8,Hkv=2,D=64,S=24", "--iters", "2", "--warmup", "0", "--config", "block_n=16",
            "--variants", "bsp,fused-push", "--format", "json"]
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = tmp_path / "run.json"
    first = subprocess.run(args + ["-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["cases"][0]["variants"][0]["variant"] == "bsp"
    validate(json.loads(out.read_text()))
    again = subprocess.run(args + ["-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 2 and "--force" in again.stderr and len(again.stderr.strip().splitlines()) == 1
    for _ in range(2):
        r = subprocess.run(args + ["-o", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
    assert len(list(tmp_path.glob("flash-decode_*.json"))) == 2


def test_profile_without_a_gpu_says_what_to_do_instead():
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "profile", "ag-gemm", "--gpus", "2"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 2
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "taxes model" in line and "--emulate" in line


@pytest.mark.parametrize("argv,needle", [
    (["profile", "all-reduce", "--emulate"], "no kernels for workload"),
    (["profile", "ag-gemm", "--emulate", "--variants", "fused-magic"], "unknown ag-gemm variant"),
    (["profile", "ag-gemm", "--emulate", "--shape", "M=100,N=64,K=32", "--gpus", "3"], "divisible"),
    (["profile", "ag-gemm", "--emulate", "--config", "block_m"], "not key=value"),
    (["profile", "ag-gemm", "--emulate", "--iters", "0"], "--iters"),
    (["profile", "ag-gemm", "--emulate", "--rounds", "0"], "--rounds"),
])
def test_bad_profile_input_is_one_line_and_exit_2(argv, needle):
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main"] + argv, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


@pytest.mark.slow
def test_emulated_profile_of_gemm_rs():
    from taxes.profiling import profile

    res = profile("gemm-rs", "M=64,N=40,K=48", 2, iters=2, warmup=0, emulate=True,
                  config=dict(block_m=16, block_n=16, block_k=16, grid=4), timeout_s=300)
    validate(res.document)
    variants = res.document["cases"][0]["variants"]
    assert {v["variant"] for v in variants} == {"bsp", "bsp-graph", "fused-push", "fused-push-graph"}
    assert all(v["correctness"]["passed"] for v in variants)
    for v in variants:
        for r in (0, 1):
            total = math.fsum(c["value_us"] for c in v["components"] if c["rank"] == r)
            assert total > 0 and all(math.isfinite(c["value_us"]) for c in v["components"])


@needs_real
def test_report_can_reattribute_a_measured_document_with_another_profile():
    path = ROOT / "reports" / "profile" / "ag_gemm_N8192.json"
    base = [sys.executable, "-m", "taxes.cli.main", "report", str(path), "--format", "json"]
    calibrated = json.loads(subprocess.run(base, capture_output=True, text=True, timeout=120, check=True).stdout)
    datasheet = json.loads(subprocess.run(base + ["--hardware", "h200-sxm"], capture_output=True, text=True,
                                          timeout=120, check=True).stdout)
    a, b = calibrated["cases"][0]["variants"][0], datasheet["cases"][0]["variants"][0]
    assert a["e2e_us"] == b["e2e_us"]
    assert a["components_us"]["ideal"] != pytest.approx(b["components_us"]["ideal"])
    model = subprocess.run([sys.executable, "-m", "taxes.cli.main", "report",
                            str(ROOT / "reports" / "scaling" / "model_w2.json"), "--hardware", "h200-sxm"],
                           capture_output=True, text=True, timeout=120)
    assert model.returncode == 2 and "re-attributes measured documents" in model.stderr


def test_memory_check_counts_every_variant_kept_alive_across_rounds():
    from taxes import preflight
    from taxes.profiling import bytes_for_case
    from taxes.workloads import make_workload

    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 2, "bf16")
    names = ["bsp", "bsp-graph", "fused-pull", "fused-push-graph"]
    alone = {v: preflight.bytes_needed(w, v.removesuffix("-graph") if v.startswith("fused") else v, 4) for v in names}
    need = bytes_for_case(w, names, 4)
    # bsp and bsp-graph each hold their own gathered A (M x K): one more than the largest variant alone
    assert need == pytest.approx(max(alone.values()) + 8192 * 8192 * 2)
    assert bytes_for_case(w, ["fused-pull"], 4) == pytest.approx(alone["fused-pull"])
