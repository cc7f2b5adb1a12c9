"""The measurement's checks (taxes/documents/checks.py, `taxes check`) on a profiled document and on edited copies of
it, so each check is seen recomputed from the document and seen to fail when its quantity leaves its limit."""

from __future__ import annotations

import copy
import json
import math
import os

import re

import pytest
from _util import run_cli

from taxes.documents.checks import checks_frame, checks_summary, limits, provenance_problems
from taxes.documents.results import save


@pytest.fixture(scope="module")
def doc():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from taxes.run.profile import profile

    return profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=24", 2, ["bsp", "bsp-graph", "fused-push"], iters=4,
                   warmup=1, emulate=True, config={"block_n": 16}, timeout_s=300).document


def _overall(var):
    return {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}


@pytest.mark.slow
def test_every_row_is_recomputed_from_the_document(doc):
    frame = checks_frame(doc)
    case = doc["cases"][0]
    for v in case["variants"]:
        rows = frame[frame.variant == v["variant"]].set_index("check")
        oc = _overall(v)
        assert rows.loc["closure", "error"] == pytest.approx(math.fsum(oc.values()) / v["attributed_e2e_us"] - 1, abs=1e-12)
        assert rows.loc["measurement", "error"] == pytest.approx(v["measurement_cost_us"] / v["plain_e2e_us"])
        assert rows.loc["unattributed", "error"] == pytest.approx(oc["unattributed"] / v["attributed_e2e_us"])
    pair = case["extra"]["ladder"]["pairs"][0]
    ladder = frame[frame.check == "ladder"].iloc[0]
    b, g = (_overall(v) for v in case["variants"][:2])
    assert ladder.value == pytest.approx((b["launch"] + b["host_bound"]) - (g["launch"] + g["host_bound"]))
    assert ladder.reference == pytest.approx(case["variants"][0]["plain_e2e_us"] - case["variants"][1]["plain_e2e_us"])
    assert pair["plain_us"] == pytest.approx(ladder.reference)
    summary = checks_summary(frame)
    assert set(summary.check) == {"closure", "measurement", "unattributed", "ladder"}


@pytest.mark.slow
def test_each_check_fails_once_its_quantity_leaves_its_limit(doc, tmp_path, capsys):
    bad = copy.deepcopy(doc)
    v = bad["cases"][0]["variants"][2]
    rows = [c for c in v["components"] if c["rank"] is None]
    rows[0]["value_us"] += 0.01 * v["attributed_e2e_us"]  # the rows no longer add up
    v["measurement_cost_us"] = 0.05 * v["plain_e2e_us"]
    next(c for c in rows if c["name"] == "unattributed")["value_us"] = -0.2 * v["attributed_e2e_us"]
    f = checks_frame(bad).set_index(["variant", "check"])
    for check in ("closure", "measurement", "unattributed"):
        assert not f.loc[(v["variant"], check), "ok"], check
        assert abs(f.loc[(v["variant"], check), "error"]) > limits()[check]
    path = tmp_path / "bad.json"
    save(bad, path)
    code, out, _ = run_cli(["check", str(path)], capsys)
    assert code == 1 and "| closure |" in out and "Failing:" in out


@pytest.mark.slow
def test_strict_refuses_a_dirty_checkout_and_variants_without_rows(doc, tmp_path, capsys):
    d = copy.deepcopy(doc)
    d["metadata"]["git_dirty"] = True
    assert any("uncommitted" in p for p in provenance_problems(d))
    d["metadata"]["git_dirty"] = False
    d["cases"][0]["variants"][0]["attribution"] = {"available": False, "why": "older rules"}
    d["cases"][0]["variants"][0]["components"] = []
    assert any("without rows" in p for p in provenance_problems(d))
    path = tmp_path / "d.json"
    save(d, path)
    code, out, _ = run_cli(["check", str(path), "--strict"], capsys)
    assert code == 1 and "without rows" in out


def test_check_refuses_a_model_document_in_one_line(tmp_path, capsys):
    code, out, _ = run_cli(["model", "ag-gemm", "--format", "json", "-o", str(tmp_path / "m.json")], capsys)
    assert code == 0
    code, out, err = run_cli(["check", str(tmp_path / "m.json")], capsys)
    assert code == 2 and "measured document" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "x.json").write_text(json.dumps({"nope": 1}))
    code, out, err = run_cli(["check", str(tmp_path / "x.json")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1


def _two_rank_variant(rng, plain_quick, plain_spread, inst_quick, inst_spread, n=12):
    """A variant of 2 ranks whose per-rank E2E are planted: per iteration the quickest rank takes about
    *_quick us and the other *_spread us more (plain samples, and the instrumented iterations' events)."""
    def per_rank(quick, spread):
        a = [quick + rng.uniform(-0.5, 0.5) for _ in range(n)]
        return [a, [x + spread + rng.uniform(-0.5, 0.5) for x in a]]

    plain, inst = per_rank(plain_quick, plain_spread), per_rank(inst_quick, inst_spread)
    return {"variant": "fused-push", "samples_us": plain,
            "records": {"ranks": [{"iterations": [{"step": i, "e2e_us": e, "warmup": False} for i, e in enumerate(r)]}
                                  for r in inst]}}


def test_measuring_cost_is_split_into_the_quickest_ranks_change_and_the_spreads():
    import random

    from taxes.documents.checks import measurement_cause

    rng = random.Random(5)
    from taxes.documents.checks import measurement_split

    cause = measurement_split(_two_rank_variant(rng, 100.0, 8.0, 104.0, 50.0))
    nums = [float(x) for x in __import__("re").findall(r"[-+]?\d+\.\d", cause)]
    assert nums[0] == pytest.approx(4.0, abs=0.6) and nums[1] == pytest.approx(8.0, abs=0.6)
    assert nums[2] == pytest.approx(50.0, abs=0.6)
    assert measurement_cause({"samples_us": [[1.0, 2.0]], "records": {"ranks": [{"iterations": []}]}}) == ""
    # a document that left its records out keeps the instrumented iterations' E2E beside the plain ones
    var = _two_rank_variant(rng, 100.0, 8.0, 104.0, 50.0)
    inst = [[it["e2e_us"] for it in r["iterations"]] for r in var.pop("records")["ranks"]]
    assert measurement_split(var) == ""
    nums = [float(x) for x in re.findall(r"[-+]?\d+\.\d", measurement_split(dict(var, instrumented_samples_us=inst)))]
    assert nums[0] == pytest.approx(4.0, abs=0.6) and nums[-1] == pytest.approx(50.0, abs=0.6)


@pytest.mark.parametrize("traced_quick", [100.0, 103.0, 106.5])
def test_a_fused_kernels_measuring_cost_splits_into_its_traced_build_and_the_clock(traced_quick):
    import random

    from taxes.documents.checks import measurement_split

    rng = random.Random(int(traced_quick))
    # the quickest rank: 100 us plain, traced_quick us with the traced build and no clock, 107 us under the clock
    var = _two_rank_variant(rng, 100.0, 8.0, 107.0, 9.0)
    var["traced_samples_us"] = _two_rank_variant(rng, traced_quick, 8.0, 0.0, 0.0)["samples_us"]
    cause = measurement_split(var)
    build = float(re.search(r"the traced build alone, without the clock, ([-+]\d+\.\d) us", cause).group(1))
    clock = float(re.search(r"; the clock ([-+]\d+\.\d) us\)", cause).group(1))
    assert build == pytest.approx(traced_quick - 100.0, abs=0.6)
    assert clock == pytest.approx(107.0 - traced_quick, abs=0.6)
    var["traced_samples_us"] = var["traced_samples_us"][:1]  # not every rank's: no split
    assert "traced build" not in measurement_split(var)


def test_a_cost_inside_the_spread_of_the_plain_rounds_is_named_the_runs_noise():
    import random

    from taxes.documents.checks import measurement_cause

    rng = random.Random(9)
    # two ranks, 3 rounds of 20 plain iterations whose levels differ (110, 150, 128 us): a +12 us cost lies inside
    levels = [110.0, 150.0, 128.0]
    rank0 = [lv + rng.uniform(-1, 1) for lv in levels for _ in range(20)]
    var = {"samples_us": [rank0, [x - 3 + rng.uniform(-1, 1) for x in rank0]], "measurement_cost_us": 12.0}
    cause = measurement_cause(var, rounds=3)
    width = float(re.search(r"rounds lie (\d+\.\d) us apart", cause).group(1))
    assert width == pytest.approx(40.0, abs=2.0)
    assert "within the run's own noise" in cause
    # one level for every round: the same cost is not noise
    flat = {"samples_us": [[120 + rng.uniform(-1, 1) for _ in range(60)]] * 2, "measurement_cost_us": 12.0}
    assert "within the run's own noise" not in measurement_cause(flat, rounds=3)
    assert measurement_cause(flat, rounds=1) == ""


def test_negative_unattributed_as_large_as_locality_is_named():
    from taxes.documents.checks import unattributed_cause

    assert "locality" in unattributed_cause({"unattributed": -87.2, "locality": 87.2}, 1125.0)
    assert "+95.4 us beyond it" in unattributed_cause({"unattributed": -100.8, "locality": 196.2}, 1403.0)
    assert unattributed_cause({"unattributed": -80.0, "locality": 0.0}, 1000.0) == "unexplained"


def test_check_over_every_committed_document_at_once(capsys, tmp_path):
    """Defect: `taxes check` over all committed profile documents at once was 'internal error: KeyError'
    (a document without check rows turned the frames' ok column into integers); each alone was fine. Over
    every committed result document and a model one (skipped with a note) it gives a verdict."""
    from committed import result_documents

    from taxes.model import predict as model
    from taxes.documents import results
    from taxes.model.hardware import BUILTIN
    from taxes.workloads import make_workload

    model_doc, hw = tmp_path / "model.json", BUILTIN["h100-sxm"]
    results.save(results.model_document([model.predict_all(make_workload("ag-gemm", {"M": 1024}, 2), hw)], hw.name, 2),
                 model_doc)
    paths = [str(p) for p in result_documents()] + [str(model_doc)]
    code, out, err = run_cli(["check", *paths], capsys)
    assert code in (0, 1), err
    assert "| closure |" in out and "internal error" not in err
    assert "document(s) that hold no measurement" in err  # the model documents


def test_a_ladder_that_disagrees_is_split_into_the_rows_the_graph_moved_and_the_measurement_costs():
    from taxes.documents.checks import ladder_cause

    def variant(name, rows, plain):
        att = math.fsum(rows.values())
        return {"variant": name, "attributed_e2e_us": att, "plain_e2e_us": plain, "measurement_cost_us": att - plain,
                "components": [{"name": k, "value_us": v, "rank": None} for k, v in rows.items()]}

    # the graph removes 60 us of launch and host-bound time but its collective waits 30 us longer; measuring
    # costs bsp +10 us and the graph -5 us: plain ladder 15, instrumented 30, timeline 60
    b = variant("bsp", {"launch": 50.0, "host_bound": 20.0, "sync_wait": 10.0, "compute": 100.0}, 170.0)
    g = variant("bsp-graph", {"launch": 2.0, "host_bound": 8.0, "sync_wait": 40.0, "compute": 100.0}, 155.0)
    pair = {"bsp": "bsp", "graph": "bsp-graph", "plain_us": 15.0, "timeline_us": 60.0, "instrumented_us": 30.0,
            "plain_spread_us": [5.0, 5.0]}
    cause = ladder_cause(pair, {"variants": [b, g]})
    assert "sync_wait -30.0 us" in cause and "compute" not in cause  # only what moved
    assert "instrumented runs' ladder (30.0 us)" in cause
    assert "bsp +10.0 us, bsp-graph -5.0 us" in cause and "-15.0 us from it" in cause
    # 60 (timeline) - 30 (the wait the graph added) = 30 (instrumented); 30 - (10 - (-5)) = 15 (plain)
    assert ladder_cause(pair).startswith("unexplained")  # without the variants' rows nothing is named


def test_phase_floors_beyond_the_steps_floor_are_named_beside_the_locality_estimate():
    # tp-mlp: an HBM-bound SwiGLU between two GEMMs. The step's floor takes the larger of its compute and HBM
    # totals (as if the SwiGLU overlapped the GEMMs); each phase's own floor prices the SwiGLU on its own, so
    # the kernels' time beyond the step's floor (95.4 us) is in no row, while the locality estimate (196.2 us)
    # is counted twice: unattributed = 95.4 - 196.2
    from taxes.documents.checks import floors_beyond_step, unattributed_cause

    var = {"attribution": {"phase_floors_us": {"matmul1": 597.4, "swiglu": 95.4, "matmul2": 298.7}},
           "floor": {"ideal_us": 896.1}}
    extra = floors_beyond_step(var)
    assert extra == pytest.approx(95.4)
    cause = unattributed_cause({"unattributed": 95.4 - 196.2, "locality": 196.2}, 1403.0, extra)
    assert "95.4 us more than the step's floor" in cause and "to +0.0 us" in cause
    # a remainder the two do not explain stays unexplained, with its size
    assert "+20.0 us beyond them unexplained" in unattributed_cause({"unattributed": 115.4 - 196.2, "locality": 196.2},
                                                                    1403.0, extra)
    assert floors_beyond_step({"attribution": {}, "floor": {"ideal_us": 1.0}}) == 0.0


def test_a_graph_no_faster_than_its_eager_twin_is_named_not_unexplained():
    from taxes.documents.checks import ladder_cause

    def var(name, rows):
        return {"variant": name, "components": [{"name": k, "rank": None, "value_us": v} for k, v in rows.items()]}

    case = {"variants": [var("bsp", {"launch": 5.0, "host_bound": 2.0, "queued": 0.5}),
                         var("bsp-graph", {"launch": 0.0, "host_bound": 0.0, "queued": 7.1})]}
    pair = {"bsp": "bsp", "graph": "bsp-graph", "plain_us": -2.4, "timeline_us": 7.0, "instrumented_us": -2.8}
    cause = ladder_cause(pair, case)
    assert cause.startswith("the graph is no faster than bsp here (plain ladder -2.4 us, instrumented -2.8 us)")
    assert "queued -6.6 us" in cause
    # a graph that is faster in plain iterations but not in the instrumented ones stays unexplained
    assert ladder_cause(dict(pair, plain_us=3.0), case) == "unexplained"
