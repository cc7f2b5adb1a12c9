"""`taxes compare` statistics: the rank test against exact and normal p-values, verdicts that call noise
no regression and catch planted slowdowns, and the block bootstrap's interval.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _compare_data import independent_iqm, noisy_samples, run, save, two_docs, variant
from hypothesis import given
from hypothesis import strategies as st

from taxes.reports import compare as cmp
from taxes.reports import compare_stats as stats
from taxes.documents import results


def binomial_upper(n, p, tail=1e-3):
    """The smallest k with P(X > k) < tail for X ~ Binomial(n, p)."""
    cdf = 0.0
    for k in range(n + 1):
        cdf += math.comb(n, k) * p**k * (1 - p) ** (n - k)
        if 1 - cdf < tail:
            return k
    return n


# ---- the rank test ---------------------------------------------------------------------------------


def _exact_p(a, b) -> float:
    """The two-sided Mann-Whitney p by enumeration: every way to split the pooled ranks into groups of
    len(a) and len(b), P(|U - mean| >= |u - mean|) (no ties)."""
    from itertools import combinations

    pooled = sorted(a + b)
    ranks = {x: i + 1 for i, x in enumerate(pooled)}
    n1, n2 = len(a), len(b)
    u = sum(ranks[x] for x in a) - n1 * (n1 + 1) / 2
    centre = n1 * n2 / 2
    us = [sum(c) - n1 * (n1 + 1) / 2 for c in combinations(range(1, n1 + n2 + 1), n1)]
    return sum(abs(x - centre) >= abs(u - centre) - 1e-9 for x in us) / len(us)


def _normal_p(a, b) -> float:
    """The normal approximation with tie-corrected variance and continuity correction, written out."""
    n1, n2 = len(a), len(b)
    pooled = sorted(a + b)
    rank = {x: (pooled.index(x) + 1 + len(pooled) - pooled[::-1].index(x)) / 2 for x in pooled}
    u = sum(rank[x] for x in a) - n1 * (n1 + 1) / 2
    n = n1 + n2
    ties = sum(c ** 3 - c for c in (pooled.count(x) for x in set(pooled)))
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    z = max(0.0, abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(z / math.sqrt(2)))


@given(st.lists(st.integers(0, 6), min_size=1, max_size=25), st.lists(st.integers(0, 6), min_size=1, max_size=25))
def test_rank_test_with_ties_is_the_tie_corrected_normal_approximation(a, b):
    p = stats.rank_test_p(a, b)
    assert 0.0 <= p <= 1.0
    assert p == pytest.approx(stats.rank_test_p(b, a), abs=1e-12)  # two-sided: symmetric
    if len(set(a) | set(b)) == 1:
        assert p == 1.0
    elif len(set(a + b)) < len(a + b):  # ties: the normal approximation
        assert p == pytest.approx(_normal_p(a, b), rel=1e-9, abs=1e-12)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=6, unique=True), st.data())
def test_rank_test_of_small_samples_without_ties_is_exact(a, data):
    b = data.draw(st.lists(st.integers(0, 10**6).filter(lambda x: x not in a), min_size=1, max_size=6, unique=True))
    assert stats.rank_test_p(a, b) == pytest.approx(_exact_p(a, b), abs=1e-12)


@given(st.lists(st.integers(1, 10**6), min_size=2, max_size=30), st.lists(st.integers(1, 10**6), min_size=2, max_size=30))
def test_rank_test_depends_only_on_order(a, b):
    # ranks are all it reads: a strictly increasing transform of both samples leaves p unchanged (integer
    # inputs, so that rounding in the transforms can neither make nor break a tie)
    p = stats.rank_test_p(a, b)
    assert stats.rank_test_p(np.log(a), np.log(b)) == pytest.approx(p, abs=1e-12)
    assert stats.rank_test_p(np.asarray(a) * 3 + 7, np.asarray(b) * 3 + 7) == pytest.approx(p, abs=1e-12)


def test_rank_test_sees_a_clear_shift_and_not_an_equal_one():
    rng = np.random.default_rng(3)
    a = rng.normal(100, 1, 40)
    assert stats.rank_test_p(a, a + 5) < 1e-6
    assert stats.rank_test_p(a, a) == 1.0
    assert stats.rank_test_p(a, []) == 1.0


# ---- verdicts --------------------------------------------------------------------------------------


def test_noise_is_not_called_a_regression():
    """Two samples of one distribution: a verdict other than 'same' is a false positive. Its rate must stay
    within what the test's level allows (binomial tail 1e-3 at alpha = 5%); with a 5% threshold there are
    no more calls than without, and never one inside the threshold."""
    n_trials, confidence = 300, 0.95
    rng = np.random.default_rng(20240611)
    calls, calls_5 = 0, 0
    for trial in range(n_trials):
        base = variant("bsp", noisy_samples(rng, 200.0, 40))
        new = variant("bsp", noisy_samples(rng, 200.0, 40))
        row = stats.compare_pair(base, new, threshold=0.0, confidence=confidence, rng=np.random.default_rng(trial))
        verdict_5 = stats.verdict_of(row["ci_low"], row["ci_high"], row["significant"], 0.05)
        calls += row["verdict"] != "same"
        calls_5 += verdict_5 != "same"
        if verdict_5 != "same":
            assert row["verdict"] == verdict_5
            assert row["ci_low"] > 1.05 or row["ci_high"] < 1 / 1.05  # the whole interval beyond the threshold
        assert row["significant"] == (row["verdict"] != "same")
    limit = binomial_upper(n_trials, 1 - confidence)
    assert calls <= limit, (calls, limit)
    assert calls_5 <= calls


def test_twenty_percent_slowdown_is_slower_and_fails_the_run(tmp_path):
    base, new = two_docs(np.random.default_rng(7), 1.20)
    df = cmp.compare_documents(base, new, threshold=0.05)
    assert len(df) == 4 and set(df["verdict"]) == {"slower"}
    for i, r in df.iterrows():
        assert r["base_iqm_us"] == pytest.approx(independent_iqm(base, i // 2, r["variant"]))
        assert r["ratio"] == pytest.approx(independent_iqm(new, i // 2, r["variant"]) / r["base_iqm_us"])
        assert 1.05 < r["ci_low"] <= r["ratio"] <= r["ci_high"] and r["p_value"] < 0.05
    b, n = save(tmp_path, "base.json", base), save(tmp_path, "new.json", new)
    code, out, err = run([b, n, "--fail-above", "5%"])
    assert code == 1, err
    assert "4 significant slowdowns beyond +5.0%" in err and "slower" in out
    code, out, err = run([b, n])  # no --fail-above: report only
    assert code == 0
    code, out, err = run([n, b, "--fail-above", "5", "--format", "json"])  # the other way round it is faster: passes
    assert code == 0 and [r["verdict"] for r in json.loads(out)["rows"]] == ["faster"] * 4


def test_three_percent_slowdown_inside_five_percent_passes(tmp_path):
    # many iterations and modest noise: the 3% shift is real and detected, but it is inside the threshold
    base, new = two_docs(np.random.default_rng(11), 1.03, n_iter=200, spread=0.02)
    strict = cmp.compare_documents(base, new)
    assert set(strict["verdict"]) == {"slower"}  # significant: a threshold of 0 calls it
    assert ((strict["ratio"] > 1.01) & (strict["ratio"] < 1.05)).all()
    b, n = save(tmp_path, "base.json", base), save(tmp_path, "new.json", new)
    code, out, err = run([b, n, "--fail-above", "5%", "--format", "json"])
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["verdict"] for r in rows] == ["same"] * 4
    assert all(r["significant"] for r in rows)
    code, out, err = run([b, n, "--fail-above", "1%"])
    assert code == 1


RUNS = Path(__file__).parent / "data" / "documents"


def test_two_runs_of_the_same_commit_are_no_regression():
    """Back-to-back runs of one commit on 2 x H200 (tests/data/documents/README.md): they differ by up to
    -27% and +13% per row, with blocks that agree inside each run. No slowdown at 5%."""
    base, new = results.load(RUNS / "ag_gemm_N8192_run1.json"), results.load(RUNS / "ag_gemm_N8192_run2.json")
    assert base["metadata"]["git_commit"] == new["metadata"]["git_commit"]
    df = cmp.compare_documents(base, new, threshold=0.05)
    assert len(df) == 30 and (df["ratio"].max() > 1.10) and (df["ratio"].min() < 0.75)  # the noise is large
    assert cmp.regressions(df).empty, df[df["verdict"] == "slower"]
    code, out, err = run([RUNS / "ag_gemm_N8192_run1.json", RUNS / "ag_gemm_N8192_run2.json", "--fail-above", "5%"])
    assert code == 0, err


def _scaled(doc, factor, only=None):
    out = copy.deepcopy(doc)
    for case in out["cases"]:
        for v in case["variants"]:
            if only is None or (case["shape"]["M"], v["variant"]) == only:
                v["samples_us"] = [[x * factor for x in r] for r in v["samples_us"]]
                v["e2e_us"] = results.summarize_samples(v["samples_us"])
    return out


def test_a_planted_ten_percent_slowdown_is_caught(tmp_path):
    base, new = results.load(RUNS / "ag_gemm_N8192_run1.json"), results.load(RUNS / "ag_gemm_N8192_run2.json")
    # every row of a copy 10% slower: the gate fails, on the rows whose blocks are steady
    df = cmp.compare_documents(base, _scaled(base, 1.10), threshold=0.05)
    slower = cmp.regressions(df)
    assert len(slower) >= 10 and np.allclose(slower["ratio"], 1.10)
    assert set(df["verdict"]) <= {"slower", "same"}
    path = save(tmp_path, "slower.json", _scaled(new, 1.10))
    code, out, err = run([RUNS / "ag_gemm_N8192_run1.json", path, "--fail-above", "5%"])
    assert code == 1 and "significant slowdown" in err
    # one steady variant of the second run 10% slower: that row alone
    one = cmp.compare_documents(base, _scaled(new, 1.10, only=(8192, "fused-push-graph")), threshold=0.05)
    assert [(r.shape, r.variant) for r in cmp.regressions(one).itertuples()] == [("M=8192,N=8192,K=8192", "fused-push-graph")]


def test_blocks_follow_the_runs_rounds():
    assert stats.blocks_of(30, {"rounds": 5, "iterations": 30}) == [6] * 5
    assert stats.blocks_of(7, {"rounds": 3, "iterations": 7}) == [3, 2, 2]
    assert stats.blocks_of(30, {"rounds": 5, "iterations": 20}) == [30]  # not what the metadata says: one block
    assert stats.blocks_of(30, {}) == [30] and stats.blocks_of(30, {"rounds": True, "iterations": 30}) == [30]


def test_a_drifting_block_widens_the_interval():
    """Two documents whose iterations agree but whose blocks drift apart: the block-aware interval is
    wider than the iteration bootstrap's, and contains what a further run would show."""
    rng = np.random.default_rng(4)
    blocks = [100 * (1 + rng.normal(0, 0.05)) for _ in range(5)]
    x = np.concatenate([b * (1 + rng.normal(0, 0.005, 6)) for b in blocks])
    plain = stats.bootstrap_iqms(x, 4000, np.random.default_rng(1))
    two_level = stats.bootstrap_iqms(x, 4000, np.random.default_rng(1), [6] * 5)
    assert np.ptp(np.quantile(two_level, [0.025, 0.975])) > 1.5 * np.ptp(np.quantile(plain, [0.025, 0.975]))
    assert np.isfinite(two_level).all() and len(two_level) == 4000


def test_seed_makes_the_interval_reproducible():
    base, new = two_docs(np.random.default_rng(5), 1.0)
    a = cmp.compare_documents(base, new, seed=1)
    b = cmp.compare_documents(base, new, seed=1)
    c = cmp.compare_documents(base, new, seed=2)
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a["ci_low"], c["ci_low"])
    assert (a["p_value"] == c["p_value"]).all()  # the rank test does not resample
    wide = cmp.compare_documents(base, new, seed=1, confidence=0.99)
    assert ((wide["ci_low"] <= a["ci_low"]) & (wide["ci_high"] >= a["ci_high"])).all()
    assert ((a["ci_low"] <= a["ratio"]) & (a["ratio"] <= a["ci_high"])).all()


def test_variants_across_two_documents_pair_base_a_with_new_b():
    base, new = two_docs(np.random.default_rng(6), 1.0)
    df = cmp.compare_documents(base, new, variants=("bsp", "fused-push"))
    assert list(df["variant"]) == ["fused-push vs bsp"] * 2 and df.attrs["unmatched"] == []
    for i, r in df.iterrows():
        assert r["base_iqm_us"] == pytest.approx(independent_iqm(base, i, "bsp"))
        assert r["new_iqm_us"] == pytest.approx(independent_iqm(new, i, "fused-push"))
    # fused-push's 250 us against bsp's 300 us: a 17% speed-up, well outside the noise
    assert set(df["verdict"]) == {"faster"}
