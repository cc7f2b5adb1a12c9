"""`taxes calibrate` fits: latency + bandwidth from noisy points, clocks, skew and launch figures, and the
mechanisms behind the model's terms (first launch, copier CTAs, collectives by op and world).
"""

from __future__ import annotations

import random

import pytest
from _calibrate_data import TRUTH, _noisy, assemble, synthetic_ranks
from _util import assert_one_line
from hypothesis import assume, given
from hypothesis import strategies as st

from taxes.model import calibrate as cal
from taxes.model.calibrate import derive, fits, plan
from taxes.model.predict import predict
from taxes.workloads import make_workload


# ---- the latency + bandwidth fit ---------------------------------------------------------------------------


SIZES = [4096 << i for i in range(17)]


@given(base_us=st.floats(1, 200), gbps=st.floats(5, 2000), noise=st.floats(0, 0.03), seed=st.integers(0, 2 ** 32 - 1))
def test_fit_recovers_latency_and_bandwidth_from_noisy_points(base_us, gbps, noise, seed):
    rng = random.Random(seed)
    t = [(base_us + x / (gbps * 1e3)) * (1 + rng.uniform(-noise, noise)) for x in SIZES]
    fit = fits.fit_latency_bandwidth(SIZES, t)
    assert fit["bytes_per_us"] / 1e3 == pytest.approx(gbps, rel=3 * noise + 1e-6)
    assert fit["base_us"] == pytest.approx(base_us, rel=3 * noise + 1e-6, abs=1e-6)
    assert fit["rel_rms"] <= noise + 1e-9


@given(bad=st.integers(0, len(SIZES) - 1), factor=st.sampled_from([0.2, 3.0, 10.0]))
def test_fit_drops_an_outlier_size(bad, factor):
    t = [20 + x / 300e3 for x in SIZES]
    t[bad] *= factor
    fit = fits.fit_latency_bandwidth(SIZES, t)
    assert fit["dropped"] == [SIZES[bad]]
    assert fit["base_us"] == pytest.approx(20, rel=1e-6)
    assert fit["bytes_per_us"] == pytest.approx(300e3, rel=1e-6)


def test_fit_follows_the_trend_of_a_non_monotone_curve():
    # NCCL switches protocols with size: some larger sizes run faster than smaller ones.
    wiggle = [1.0, 1.15, 0.9, 1.2, 0.85, 1.1, 0.95, 1.15, 0.9, 1.1, 0.95, 1.05, 1.0, 1.05, 0.97, 1.03, 1.0]
    t = [(25 + x / 280e3) * w for x, w in zip(SIZES, wiggle)]
    assert any(b < a for a, b in zip(t, t[1:]))  # really not monotone
    fit = fits.fit_latency_bandwidth(SIZES, t)
    assert fit["base_us"] == pytest.approx(25, rel=0.25)
    assert fit["bytes_per_us"] == pytest.approx(280e3, rel=0.1)


@pytest.mark.parametrize("xs,ts,match", [
    ([4096, 8192], [20, 21], "2 usable sizes"),
    ([4096, 4096, 4096, 4096], [20, 21, 20, 22], "1 usable sizes"),
    ([4096, 8192, 16384], [20, float("nan"), 25], "2 usable sizes"),
    ([], [], "0 usable sizes"),
    (SIZES, [50.0] * len(SIZES), "do not grow"),
    (SIZES, [100 - i for i in range(len(SIZES))], "do not grow"),
    ([1e6, 2e6, 4e6, 8e6], [1.0, 3.0, 7.0, 15.0], "negative"),
    ([1, 2, 3], [1, 2], "3 sizes but 2 times"),
])
def test_fit_refuses_what_cannot_be_fitted(xs, ts, match):
    with pytest.raises(cal.CalibrationError, match=match) as e:
        fits.fit_latency_bandwidth(xs, ts, "NCCL curve")
    assert_one_line(str(e.value))


def test_medians_ignore_failed_readings_and_say_when_none_is_left():
    assert fits.median_reading([3.0, float("nan"), -1, 0, 5.0, 4.0, True], "x") == 4.0
    with pytest.raises(cal.CalibrationError, match="HBM copy: no valid reading"):
        fits.median_reading([float("inf"), 0.0, None], "HBM copy")


def test_nccl_curve_prefers_readings_taken_with_the_host_ahead():
    rs = [{"world": 2, "sizes": [4096, 8192], "us": [[10.0, 50.0, 11.0], [12.0, 13.0]],
           "host_ahead": [[True, False, True], [False, False]]}]
    curve = derive.nccl_curve(rs)
    assert [c["us"] for c in curve] == [10.5, 12.5]  # the host-bound 50 us is left out; size 2 had no choice
    assert [c["bytes_in"] for c in curve] == [4096, 8192]
    assert [c["host_ahead"] for c in curve] == [True, False]


# ---- clocks, skew, launch ------------------------------------------------------------------------------


@given(offset=st.floats(-1e9, 1e9), fwd=st.floats(200, 20_000), back=st.floats(200, 20_000), seed=st.integers(0, 1000))
def test_clock_offset_is_within_its_stated_error(offset, fwd, back, seed):
    rng = random.Random(seed)
    t0 = [1e12 + 1e5 * i for i in range(100)]
    f = [fwd * (1 + rng.uniform(0, 1)) for _ in t0]
    b = [back * (1 + rng.uniform(0, 1)) for _ in t0]
    t1 = [a + x + offset for a, x in zip(t0, f)]
    t2 = [a + x + y for a, x, y in zip(t0, f, b)]
    est, err = fits.clock_offset_ns(t0, t1, t2)
    assert err == pytest.approx(min(x + y for x, y in zip(f, b)) / 2)
    assert abs(est - offset) <= max(x + y for x, y in zip(f, b)) / 2 + 1e-3
    if fwd == back:  # symmetric directions: the estimate is good to the noise, not just the bound
        assert abs(est - offset) <= fwd + 1e-3


def test_clock_offset_needs_a_round():
    with pytest.raises(cal.CalibrationError):
        fits.clock_offset_ns([5, 6], [1, 1], [4, 6])  # round trips not positive


@given(world=st.integers(2, 8), seed=st.integers(0, 1000))
def test_skew_spreads_undo_each_clocks_offset(world, seed):
    rng = random.Random(seed)
    arrive = [[rng.uniform(0, 5e4) for _ in range(10)] for _ in range(world)]
    offsets = [0.0] + [rng.uniform(-1e9, 1e9) for _ in range(world - 1)]
    stamps = [[1e12 + a + offsets[r] for a in arrive[r]] for r in range(world)]
    spreads = fits.skew_spreads_us(stamps, offsets)
    want = [(max(a[k] for a in arrive) - min(a[k] for a in arrive)) / 1e3 for k in range(10)]
    assert spreads == pytest.approx(want, abs=1e-3)
    with pytest.raises(cal.CalibrationError):
        fits.skew_spreads_us(stamps, offsets[:-1])


@given(pre=st.lists(st.floats(0.5, 5), min_size=1, max_size=9), graph=st.lists(st.floats(0.5, 5), min_size=1, max_size=9))
def test_launch_figures_make_the_models_floor_and_gap(pre, graph):
    f = fits.launch_figures(pre, graph)
    assert f["launch_graph_us"] >= 0 and f["kernel_floor_us"] > 0
    # the model's per-kernel times: eager back to back at the floor, graph at floor + gap
    assert f["kernel_floor_us"] + f["launch_graph_us"] == pytest.approx(f["graph_period_us"])
    assert f["kernel_floor_us"] <= f["prefilled_period_us"]


# ---- the mechanisms behind the model's terms: first launch, copier CTAs, collectives by op and world ----


def test_first_launch_is_the_start_events_time_to_the_kernels_start():
    """Planted: a drained device takes `latency` from the start event to each kind's kernel, which then
    runs `device` us; the profile keeps the latency per kind and the model's first kernel starts there."""
    rng = random.Random(31)
    latency = {"triton": 21.0, "torch": 13.0, "triton_tma": 17.0, "graph": 9.0}
    device = {"triton": 1.5, "torch": 2.0, "triton_tma": 6.0, "graph": 1.4}
    ranks = synthetic_ranks(rng)
    for r in ranks:
        r["figures"]["launch"]["first_launch"] = {
            k: {"idle_us": _noisy(rng, latency[k] + device[k], 7, 0.002), "device_us": _noisy(rng, device[k], 7, 0.002)}
            for k in latency}
    prof, raw = assemble(ranks)
    got = raw["figures"]["first_launch_us"]
    assert set(got) == set(latency)
    for k in latency:
        assert got[k] == pytest.approx(latency[k], abs=0.1 + 0.01 * latency[k]), k
    w = make_workload("flash-decode", {"B": 1, "S": 32768}, 1)
    assert predict(w, "bsp", prof).phases[0].start_us == pytest.approx(got["triton"])
    assert predict(w, "bsp-graph", prof).phases[0].start_us == pytest.approx(got["graph"])
    assert "launch_cold_host_us" not in raw["figures"]  # readings without one call's host time: none made up
    # with it: one call's host time after a drained device, per kind, kept beside the back-to-back figure
    cold = {"triton": 70.0, "torch": 60.0, "triton_tma": 45.0, "graph": 20.0}
    for r in ranks:
        for k, reading in r["figures"]["launch"]["first_launch"].items():
            reading["host_us"] = _noisy(rng, cold[k], 7, 0.01)
    prof_cold, raw_cold = assemble(ranks)
    assert raw_cold["figures"]["launch_cold_host_us"] == pytest.approx(cold, rel=0.02)
    assert predict(w, "bsp", prof_cold).e2e_us == pytest.approx(predict(w, "bsp", prof).e2e_us)  # not priced yet
    # readings from before the idle launch was measured: the first kernel waits its launcher's host time
    old, old_raw = assemble(synthetic_ranks(random.Random(31)))
    assert "first_launch_us" not in old_raw["figures"]
    assert predict(w, "bsp", old).phases[0].start_us == pytest.approx(old.launch_us("triton"))


def test_first_launch_noise_below_the_kernels_time_is_no_latency():
    got = fits.first_launch_figures({"torch": {"idle_us": [2.0, 2.1], "device_us": [2.2, 2.3]},
                                     "graph": {"idle_us": [5.0], "device_us": []}, "triton": {}})
    assert got == {"torch": 0.0}


@given(per_cta=st.floats(0.5, 50), most=st.floats(20, 900), noise=st.floats(0, 0.03), seed=st.integers(0, 2 ** 32 - 1))
def test_saturating_fit_recovers_the_rate_per_cta_and_the_ceiling(per_cta, most, noise, seed):
    assume(most >= 2.2 * per_cta)  # the rate of one CTA shows below the ceiling at two counts or more
    rng = random.Random(seed)
    ctas = list(plan.PEER_CTAS)
    gbps = [min(c * per_cta, most) * (1 + rng.uniform(-noise, noise)) for c in ctas]
    fit = fits.fit_saturating_rate(ctas, gbps)
    assert fit["per_cta_gbps"] == pytest.approx(per_cta, rel=3 * noise + 1e-6)
    if most < ctas[-2] * per_cta:  # the ceiling shows at two counts or more
        assert fit["max_gbps"] == pytest.approx(most, rel=3 * noise + 1e-6)
    assert fit["max_gbps"] <= ctas[-1] * fit["per_cta_gbps"] * (1 + 1e-9)
    assert fit["rel_rms"] <= 2 * noise + 1e-6


@pytest.mark.parametrize("ctas,gbps", [([16], [100.0]), ([16, 16], [100.0, 101.0]), ([1, 2], [float("nan"), 3.0]), ([], [])])
def test_saturating_fit_needs_two_counts(ctas, gbps):
    with pytest.raises(cal.CalibrationError, match="at least 2") as e:
        fits.fit_saturating_rate(ctas, gbps)
    assert_one_line(str(e.value))


def _with_cta_copies(ranks, rng, per_cta: float, most: float, checked: bool = True):
    nb = plan.PEER_CTA_BYTES
    for r in ranks:
        for pair in r["figures"]["peer"]["pairs"]:
            pair["ctas"] = {"bytes": nb, "ctas": list(plan.PEER_CTAS), "checked": checked,
                            "store_us": [_noisy(rng, nb / (min(c * per_cta, most) * 1e3), 5) for c in plan.PEER_CTAS],
                            "load_us": [_noisy(rng, nb / (min(c * per_cta / 2, most) * 1e3), 5) for c in plan.PEER_CTAS]}
    return ranks


def test_copier_ctas_cap_the_fused_kernels_arrivals():
    """Planted: one copier CTA stores 4 GB/s to a peer (loads 2 GB/s), 40 GB/s at most: 16 copier CTAs
    deliver 40 GB/s, far below the link; a fused ag-gemm then waits for its peer's rows, a bsp does not."""
    rng = random.Random(32)
    prof, raw = assemble(_with_cta_copies(synthetic_ranks(rng), rng, 4.0, 40.0))
    figs = raw["figures"]
    assert figs["peer_cta_gbps"] == pytest.approx(4.0, rel=0.03) and figs["peer_cta_max_gbps"] == pytest.approx(40.0, rel=0.03)
    assert figs["peer_cta_load_gbps"] == pytest.approx(2.0, rel=0.03)
    plain, _ = assemble(synthetic_ranks(random.Random(32)))  # the same machine, copies by CTA count not measured
    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 2)
    link_bytes = 4096 * 8192 * 2
    for v in ("fused-push", "fused-pull"):
        capped, free = predict(w, v, prof), predict(w, v, plain)
        assert capped.components["sync_wait"] > free.components["sync_wait"] + 100
        # the rows arrive at 16 CTAs' rate: the kernel cannot end before the last of them
        rate = min(16 * (4.0 if v == "fused-push" else 2.0), 40.0) * 1e3
        assert capped.phases[0].end_us >= capped.phases[0].start_us + link_bytes / rate
    for v in ("bsp", "bsp-graph"):
        assert predict(w, v, prof).e2e_us == pytest.approx(predict(w, v, plain).e2e_us, rel=1e-12)
    # readings whose data did not arrive intact do not count
    _, bad_raw = assemble(_with_cta_copies(synthetic_ranks(rng), rng, 4.0, 40.0, checked=False))
    assert "peer_cta_gbps" not in bad_raw["figures"]


def _with_curves(ranks, rng, world_curves: dict):
    """Per (op, world): (base us, GB/s received per rank) planted as the readings of measure_nccl's curves."""
    sizes = [4096 << i for i in range(0, 17, 2)]
    for r in ranks:
        r["figures"]["nccl"]["curves"] = [
            {"op": op, "world": world, "sizes": sizes, "calls": [10] * len(sizes),
             "us": [_noisy(rng, base + (world - 1) * s / (gbps * 1e3), 5, 0.002) if r["rank"] < world else []
                    for s in sizes],
             "host_ahead": [[True] * 5 if r["rank"] < world else [] for _ in sizes], "host_us": [[]] * len(sizes)}
            for (op, world), (base, gbps) in world_curves.items()]
    return ranks


def test_collectives_are_priced_from_their_own_curve_at_their_world():
    """Planted: a reduce-scatter that takes 3x the all-gather's latency; the model's gemm-rs bsp collective
    takes the reduce-scatter's measured time at its size, ag-gemm's the all-gather's; at a world with no
    curve the fit's latency + bytes / bandwidth stands."""
    rng = random.Random(33)
    ranks = _with_curves(synthetic_ranks(rng, world=4), rng, {("reduce_scatter", 4): (60.0, 250.0),
                                                              ("all_gather", 2): (12.0, 320.0),
                                                              ("reduce_scatter", 2): (36.0, 320.0)})
    prof, raw = assemble(ranks)
    got = {(c["op"], c["world"]) for c in raw["collective_curves"]}
    assert got == {("all_gather", 4), ("reduce_scatter", 4), ("all_gather", 2), ("reduce_scatter", 2)}
    size = 4096 << 10  # one of the measured sizes (bytes per rank)
    for name, op, coll in (("gemm-rs", "reduce_scatter", "reduce_scatter"), ("ag-gemm", "all_gather", "all_gather")):
        for world in (2, 4):
            m = size * world // (2 * 1024)  # ag-gemm: M/p rows x K = 1024; gemm-rs: M/p rows x N = 1024; 2 bytes each
            shape = {"M": m, "N": 1024, "K": 1024}
            w = make_workload(name, shape, world)
            step = next(ph for ph in predict(w, "bsp-graph", prof).phases if ph.name == coll)
            transfer = step.parts["ideal"] + step.parts["exposed_transfer"]
            if (op, world) == ("all_gather", 4):
                base, gbps = TRUTH["nccl_base_us"], TRUTH["nccl_gbps"]
            else:
                base, gbps = {("reduce_scatter", 4): (60.0, 250.0), ("all_gather", 2): (12.0, 320.0),
                              ("reduce_scatter", 2): (36.0, 320.0)}[(op, world)]
            assert transfer == pytest.approx(base + (world - 1) * size / (gbps * 1e3), rel=0.03), (name, world)
    # 8 GPUs: no curve measured there, so the fit stands (its latency and bandwidth)
    w = make_workload("ag-gemm", {"M": 8 * 1024, "N": 1024, "K": 1024}, 8)
    step = next(ph for ph in predict(w, "bsp", prof).phases if ph.name == "all_gather")
    fit = prof.collective_base_us + w.link_bytes() / (prof.inbound_bytes_per_us(8) * prof.collective_efficiency)
    assert step.parts["ideal"] + step.parts["exposed_transfer"] == pytest.approx(fit, rel=1e-9)
