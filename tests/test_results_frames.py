"""Result documents seen as numbers: per-iteration summaries, the pandas views, and checking large documents."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pandas as pd
import pytest
from _util import profile_doc as _profile_doc
from hypothesis import given
from hypothesis import strategies as st

from taxes.documents import results
from taxes.errors import TaxesError
from taxes.attribution.attribute import ROWS as COMPONENTS
from taxes.model.predict import COMPONENTS as MODEL_COMPONENTS


# ---- samples and the pandas views ----------------------------------------------------------------


@given(st.integers(1, 8).flatmap(lambda ranks: st.integers(1, 40).flatmap(
    lambda iters: st.lists(st.lists(st.floats(0.01, 1e6), min_size=iters, max_size=iters), min_size=ranks, max_size=ranks))))
def test_summarize_samples_is_the_slowest_rank_per_iteration(samples):
    s = results.summarize_samples(samples, label="measured")
    per_iter = [max(r[i] for r in samples) for i in range(len(samples[0]))]
    assert s["n"] == len(per_iter) and s["label"] == "measured"
    assert s["median"] == pytest.approx(statistics.median(per_iter), rel=1e-12)
    assert s["p10"] == pytest.approx(float(np.percentile(per_iter, 10)), rel=1e-9)
    assert s["p90"] == pytest.approx(float(np.percentile(per_iter, 90)), rel=1e-9)
    eps = 1e-9 * max(per_iter)
    assert min(per_iter) - eps <= s["p10"] <= s["median"] + eps <= s["p90"] + 2 * eps <= max(per_iter) + 3 * eps


def test_summarize_samples_by_hand():
    s = results.summarize_samples([[1.0, 5.0, 3.0], [2.0, 4.0, 9.0]])
    assert s["median"] == 5.0 and s["n"] == 3  # per iteration: 2, 5, 9
    assert s["iqm"] == pytest.approx((2 + 5 + 9) / 3)  # three iterations: none trimmed
    s8 = results.summarize_samples([[10.0, 1.0, 7.0, 3.0, 100.0, 5.0, 2.0, 4.0]])
    assert s8["iqm"] == pytest.approx((3 + 4 + 5 + 7) / 4)  # 1, 2 and 10, 100 trimmed
    assert results.summarize_samples([]) == {"iqm": None, "median": None, "p10": None, "p90": None, "n": 0,
                                             "label": "measured"}


def test_samples_frame(tmp_path):
    rng = random.Random(7)
    doc = _profile_doc(rng, n_iter=21)
    results.save(doc, tmp_path / "p.json")
    doc = results.load(tmp_path / "p.json")
    df = results.samples_frame(doc)
    assert list(df.columns) == ["workload", "shape", "world", "dtype", "variant", "rank", "iteration", "time_us"]
    assert len(df) == 2 * 2 * 2 * 21  # cases x variants x ranks x iterations
    assert set(df["rank"]) == {0, 1} and df["iteration"].max() == 20
    for case in doc["cases"]:
        for var in case["variants"]:
            sub = df[(df.workload == case["workload"]) & (df.variant == var["variant"])]
            per_iter = sub.groupby("iteration")["time_us"].max()
            assert per_iter.median() == pytest.approx(var["e2e_us"]["median"], rel=1e-12)
            assert per_iter.median() == pytest.approx(
                statistics.median(max(a, b) for a, b in zip(*var["samples_us"])), rel=1e-12)
            r1 = sub[sub["rank"] == 1].sort_values("iteration")["time_us"].tolist()
            assert r1 == var["samples_us"][1]


def test_components_and_summary_frames_of_a_profile_document():
    doc = _profile_doc(random.Random(3), n_iter=5)
    cf = results.components_frame(doc)
    assert len(cf) == 2 * 2 * 3 * len(COMPONENTS)  # cases x variants x (2 ranks + overall) x components
    assert cf["rank"].isna().sum() == 2 * 2 * len(COMPONENTS)
    sf = results.summary_frame(doc)
    assert len(sf) == 4
    # the summary shows the overall (rank None) components, not a rank's
    var = doc["cases"][1]["variants"][1]
    overall = {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}
    row = sf[(sf.workload == "flash-decode") & (sf.variant == "fused-pull")].iloc[0]
    for c in COMPONENTS:
        assert row[c] == overall[c]
    assert row["correct"] == True and row["n"] == 5  # noqa: E712


def test_frames_of_a_model_document(model_doc, model_predictions):
    n_rows = sum(len(c["variants"]) for c in model_doc["cases"])  # flash decode's model has eager bsp-sdpa too
    cf = results.components_frame(model_doc)
    assert list(cf.columns) == ["workload", "shape", "world", "dtype", "variant", "rank", "component", "value_us", "label"]
    assert len(cf) == n_rows * len(MODEL_COMPONENTS)
    assert set(cf["label"]) == {"predicted"} and set(cf["component"]) == set(MODEL_COMPONENTS)
    sums = cf.groupby(["workload", "variant"])["value_us"].apply(lambda s: math.fsum(s))

    pf = results.phases_frame(model_doc)
    assert len(pf) == sum(len(p.phases) for preds in model_predictions for p in preds)
    assert (pf["end_us"] >= pf["start_us"]).all()
    assert set(pf["role"]) <= {"compute", "communication"}

    sf = results.summary_frame(model_doc)
    assert len(sf) == n_rows
    assert {"e2e_us", "p10_us", "p90_us", "n", "label", "correct", "rel_error", *COMPONENTS} <= set(sf.columns)
    for preds in model_predictions:
        for p in preds:
            row = sf[(sf.workload == p.workload.name) & (sf.variant == p.variant)]
            assert len(row) == 1
            assert row["e2e_us"].iloc[0] == p.e2e_us
            assert sums[(p.workload.name, p.variant)] == p.e2e_us
            assert row["shape"].iloc[0] == ",".join(f"{d}={getattr(p.workload, d)}" for d in p.workload.dims)
    assert results.samples_frame(model_doc).empty
    assert isinstance(sf, pd.DataFrame)


def test_empty_document_frames():
    doc = results.new_document({"kind": "model", "tool_version": "x", "world_size": 1, "hardware_profile": "h"})
    results.validate(doc)
    assert results.components_frame(doc).empty and results.phases_frame(doc).empty
    assert len(results.samples_frame(doc).columns) == 8


# ---- large documents: checked and summarised in passes over arrays, not per item -------------------


def test_summaries_of_many_samples_match_the_definitions():
    """summarize_samples (numpy) against taxes.attribution.attribute.iqm and pandas' quantiles, on random ragged-free
    samples with ties."""
    import numpy as np
    import pandas as pd

    from taxes.attribution.attribute import iqm

    rng = np.random.default_rng(8)
    for n in (1, 2, 3, 7, 30, 1001):
        samples = [rng.integers(90, 110, n).astype(float).tolist() for _ in range(3)]
        per_iter = [max(v) for v in zip(*samples)]
        s = results.summarize_samples(samples)
        assert s["iqm"] == iqm(per_iter)  # the same iterations kept, the same computation
        q = pd.Series(per_iter).quantile([0.1, 0.5, 0.9]).tolist()
        assert [s["p10"], s["median"], s["p90"]] == pytest.approx(q, rel=1e-12) and s["n"] == n


def test_a_large_document_is_checked_without_visiting_each_number(monkeypatch):
    """Defect: a 200 MB document took minutes to render: every sample went through per-item validation and
    a Python sort. Long arrays of plain numbers now take one pass; the per-item validator is not called."""
    import numpy as np

    from taxes import schema

    calls = []
    real = schema._fast_ok

    def spy(items, instance):
        ok = real(items, instance)
        calls.append((len(instance), ok))
        return ok

    monkeypatch.setattr(schema, "_fast_ok", spy)
    rng = np.random.default_rng(1)
    samples = [(100 + rng.random(200_000)).tolist() for _ in range(2)]
    doc = results.new_document({"kind": "profile", "tool_version": "0", "world_size": 2, "hardware_profile": "x"})
    doc["cases"].append({"workload": "ag-gemm", "shape": {"M": 1024}, "world": 2, "dtype": "bf16", "variants": [
        {"variant": "bsp", "config": {}, "samples_us": samples, "e2e_us": results.summarize_samples(samples),
         "phases": [], "components": [], "correctness": {"checked": False}}]})
    results.validate(doc)
    assert (200_000, True) in calls  # the samples: one pass
    samples[1][123_456] = -1.0
    with pytest.raises(TaxesError, match=r"samples_us\[1\]\[123456\]: -1.0 is impossible"):
        results.validate(doc)  # a failing pass falls back to the item-by-item check, which names the item
