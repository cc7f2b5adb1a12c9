"""fused-auto: the table it picks from, the pick at the nearest measured shape, and a run that says what it
picked."""

from __future__ import annotations

import os
import random

import pytest

from taxes.run.auto import pick, shape_distance, table_entries


def _entry(workload, gpu, world, shape, e2e):
    return {"workload": workload, "gpu": gpu, "world": world, "shape": shape, "e2e_us": e2e,
            "pick": min(e2e, key=e2e.get), "document": f"doc-{world}-{shape}"}


def test_the_pick_is_the_fastest_at_the_nearest_measured_shape_of_that_gpu_and_world():
    rng = random.Random(4)
    entries = []
    for m in (512, 1024, 4096, 16384):
        fused_wins = m >= 4096  # planted: fusion pays only from M=4096 at world 2
        e2e = {"bsp-graph": 100.0 + m / 50, "fused-push-graph": (80.0 if fused_wins else 130.0) + m / 50}
        entries.append(_entry("ag-gemm", "h100", 2, {"M": m, "N": 8192, "K": 8192}, e2e))
    entries.append(_entry("ag-gemm", "h100", 4, {"M": 1024, "N": 8192, "K": 8192},
                          {"bsp-graph": 10.0, "fused-push-graph": 99.0}))
    rng.shuffle(entries)
    for m, want in ((600, "bsp-graph"), (1500, "bsp-graph"), (3000, "fused-push-graph"), (65536, "fused-push-graph")):
        got, why = pick("ag-gemm", {"M": m, "N": 8192, "K": 8192}, 2, "h100", entries)
        assert got == want, (m, why)
        assert why["picked"] == got and "on 2 x h100" in why["because"]
    assert pick("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 4, "h100", entries)[0] == "bsp-graph"
    got, why = pick("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 8, "h100", entries)  # never measured
    assert got == "bsp-graph" and "no measurement" in why["because"]
    assert pick("tp-mlp", {"M": 1}, 2, "h100", entries)[0] == "all-graph"


def test_shape_distance_is_symmetric_and_zero_only_for_the_same_sizes():
    a, b = {"M": 1024, "N": 8192}, {"M": 4096, "N": 8192}
    assert shape_distance(a, b) == shape_distance(b, a) == pytest.approx(2.0)
    assert shape_distance(a, dict(a)) == 0.0


def test_table_entries_take_correct_graph_and_fused_variants_only():
    doc = {"cases": [{"workload": "ag-gemm", "world": 2, "shape": {"M": 1024, "N": 8192, "K": 8192}, "variants": [
        {"variant": "bsp", "plain_e2e_us": 50.0, "correctness": {"passed": True}},  # eager: never picked
        {"variant": "bsp-graph", "plain_e2e_us": 178.5, "correctness": {"passed": True}},
        {"variant": "fused-push-graph", "plain_e2e_us": 145.4, "correctness": {"passed": True}},
        {"variant": "fused-pull", "plain_e2e_us": 10.0, "correctness": {"passed": False}},  # wrong: never picked
        {"variant": "torch-async-tp", "plain_e2e_us": 1.0, "correctness": {"passed": True}}]}]}
    (e,) = table_entries(doc, "d.json", "h100")
    assert e["pick"] == "fused-push-graph" and set(e["e2e_us"]) == {"bsp-graph", "fused-push-graph"}


def test_the_committed_table_picks_what_its_documents_measured_fastest():
    import json

    from taxes.run.auto import _entries
    from taxes.documents.results import load

    entries = _entries()
    assert entries
    for e in entries:
        doc = load(e["document"])
        case = next(c for c in doc["cases"] if c["shape"] == e["shape"])
        e2e = {v["variant"]: v["plain_e2e_us"] for v in case["variants"] if v["variant"] in e["e2e_us"]}
        assert min(e2e, key=e2e.get) == e["pick"]
        assert json.dumps(e)  # plain data


@pytest.mark.slow
def test_an_emulated_fused_auto_runs_the_graph_and_says_so():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from taxes.run.profile import profile

    doc = profile("ag-gemm", "M=64,N=64,K=32", 2, ["bsp", "bsp-graph", "fused-auto"], iters=3, warmup=1,
                  emulate=True, timeout_s=300, rounds=1,
                  config={"block_m": 16, "block_n": 16, "block_k": 16, "copiers": 1, "chunk_rows": 16}).document
    auto = next(v for v in doc["cases"][0]["variants"] if v["variant"] == "fused-auto")
    assert auto["correctness"]["passed"]
    assert auto["config"]["picked"] == "bsp-graph" and "no measurement" in auto["config"]["because"]
    assert auto["records"]["comm_phases"] == ["all-gather"]
