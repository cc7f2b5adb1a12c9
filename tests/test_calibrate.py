"""`taxes calibrate`: the fits and the profile assembly from synthetic readings (CPU), the CLI without GPUs,
the calibration kernels under Triton's interpreter with emulated ranks, and the real thing on >= 2 GPUs."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch
from _util import assert_one_line, run_cli
from hypothesis import assume, given
from hypothesis import strategies as st

from taxes.model import calibrate as cal
from taxes.model.calibrate import derive, fits, plan
from taxes.run import calibrate as run
from taxes.run import calibrate as measuring  # where the command finds the machine and the measuring run
from taxes.run import calibration_measurements as measurements
from taxes.cli.calibrate_cmd import calibrate as calibrate_command
from taxes.cli.main import TaxesGroup
from taxes.errors import TaxesError
from taxes.model.hardware import BUILTIN, get_profile, load_profile_file, profile_from_dict, profile_to_dict
from taxes.kernels import probes, runtime
from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankError
from taxes.kernels.runtime import launch
from taxes.model.predict import predict
from taxes.workloads import WORKLOADS, make_workload, model_variants

ROOT = Path(__file__).resolve().parent.parent
H200 = BUILTIN["h200-sxm"]

# The machine the synthetic readings come from (close to a 2 x H200 node), in the profile's units.
TRUTH = dict(torch_bf16_tflops=780.0, torch_fp16_tflops=770.0, triton_bf16_tflops=700.0, hbm_gbps=4200.0,
             copy_gbps=354.0, store_gbps=313.0, load_gbps=291.0, nccl_base_us=20.0, nccl_gbps=300.0,
             triton_host_us=16.0, torch_host_us=23.0, nccl_host_us=30.0, prefilled_us=2.5, graph_us=1.2,
             relaxed_rtt_us=3.0, acquire_rtt_us=6.0, offset_ns=123_456.0, skew_us=8.0, combine_base_us=2.8,
             combine_per_set_us=0.35)


def _noisy(rng, x, n, rel=0.01):
    return [x * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def synthetic_ranks(rng: random.Random, world: int = 2, truth: dict = TRUTH, reps: int = 7) -> list[dict]:
    """Per-rank readings shaped like taxes.run.calibrate.measure()'s, generated from `truth` plus noise."""
    t = truth
    flops = 2 * 8192 ** 3
    ranks = []
    for r in range(world):
        figs = {
            "launch": {"launches": 200, "triton_host_us": _noisy(rng, t["triton_host_us"], reps),
                       "torch_host_us": _noisy(rng, t["torch_host_us"], reps),
                       "eager_device_us": _noisy(rng, t["triton_host_us"], reps),
                       "prefilled_device_us": _noisy(rng, t["prefilled_us"], reps), "prefilled_ahead": [True] * reps,
                       "graph_device_us": _noisy(rng, t["graph_us"], reps), "graph_ahead": [True] * reps},
            "hbm": {"bytes_moved": 2 << 30, "us": _noisy(rng, (2 << 30) / (t["hbm_gbps"] * 1e3), reps)},
            "matmul": {"n": 8192, "flops": flops,
                       "torch_bf16_us": _noisy(rng, flops / (t["torch_bf16_tflops"] * 1e6), reps),
                       "torch_fp16_us": _noisy(rng, flops / (t["torch_fp16_tflops"] * 1e6), reps)},
            "triton_gemm": {"n": 8192, "flops": flops, "rel_error": 2e-3, "tolerance": 1e-2,
                            "us": _noisy(rng, flops / (t["triton_bf16_tflops"] * 1e6), reps)},
            "combine": {"rows": 64, "sets": [4, 64], "checked": True,
                        "us": [_noisy(rng, t["combine_base_us"] + n * t["combine_per_set_us"], reps, 0.001) for n in (4, 64)]},
        }
        if world > 1:
            sizes = [4096 << i for i in range(17)]
            us = [[(t["nccl_base_us"] + (world - 1) * s / (t["nccl_gbps"] * 1e3)) * (1 + rng.uniform(-0.02, 0.02))
                   for _ in range(reps)] for s in sizes]
            figs["nccl"] = {"world": world, "sizes": sizes, "calls": [10] * len(sizes), "us": us,
                            "host_ahead": [[True] * reps for _ in sizes], "host_us": [[30.0] * reps for _ in sizes],
                            "small_host_us": _noisy(rng, t["nccl_host_us"], reps)}
            nb = 256 << 20
            figs["peer"] = {"pairs": [{"src": r, "dst": (r + 1) % world, "bytes": nb,
                                       "copy_us": _noisy(rng, nb / (t["copy_gbps"] * 1e3), reps), "copy_checked": True,
                                       "store_us": _noisy(rng, nb / (t["store_gbps"] * 1e3), reps), "store_checked": True,
                                       "load_us": _noisy(rng, nb / (t["load_gbps"] * 1e3), reps), "load_checked": True}]}
            figs["pingpong"] = {"rounds": 1000, "pairs": []}
            figs["skew"] = {}
        ranks.append({"rank": r, "world": world, "quick": False,
                      "device": {"name": "NVIDIA H200", "sm_count": 132, "memory_bytes": 141 << 30, "capability": "9.0"},
                      "figures": figs, "errors": {}})
    if world > 1:
        for peer in range(1, world):
            offset = t["offset_ns"] * peer
            t0 = [1e9 + 1e5 * i for i in range(200)]
            fwd = [t["relaxed_rtt_us"] * 500 * (1 + rng.uniform(0, 0.5)) for _ in t0]
            back = [t["relaxed_rtt_us"] * 500 * (1 + rng.uniform(0, 0.5)) for _ in t0]
            ranks[0]["figures"]["pingpong"]["pairs"].append({
                "peer": peer, "relaxed_rtt_us": _noisy(rng, t["relaxed_rtt_us"], 5),
                "acquire_rtt_us": _noisy(rng, t["acquire_rtt_us"], 5),
                "t0": t0, "t1": [a + f + offset for a, f in zip(t0, fwd)], "t2": [a + f + b for a, f, b in zip(t0, fwd, back)]})
        reps_skew = 30
        starts = [[2e9 + 1e6 * k + rng.uniform(0, t["skew_us"] * 1e3) for k in range(reps_skew)] for _ in range(world)]
        for k in range(reps_skew):  # the spread of every reading is exactly skew_us: one rank first, one last
            starts[0][k] = 2e9 + 1e6 * k
            starts[-1][k] = 2e9 + 1e6 * k + t["skew_us"] * 1e3
        ranks[0]["figures"]["skew"] = {
            "stamps_ns": [[s + t["offset_ns"] * r for s in starts[r]] for r in range(world)],
            "collective_spread_us": _noisy(rng, t["skew_us"] * 1.5, reps_skew)}
    return ranks


META = {"date": "2026-11-23T10:00:00+00:00", "tool_version": "0.1.0", "git_commit": "0123456789abcdef0123",
        "gpu_names": ["NVIDIA H200", "NVIDIA H200"], "quick": False}


def assemble(ranks, base=H200, peaks="measured", **kw):
    return cal.assemble_profile(ranks, base, META, name="h200-test", peaks=peaks, **kw)


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


# ---- readings -> profile -------------------------------------------------------------------------------


def test_profile_from_synthetic_readings_matches_the_machine_and_loads():
    prof, raw = assemble(synthetic_ranks(random.Random(1)))
    t = TRUTH
    rel = 0.02
    assert prof.name == "h200-test" and prof.sm_count == 132
    assert prof.source == "calibrated on 2 x NVIDIA H200, 2026-11-23, taxes 0.1.0 0123456789ab"
    # peaks: the best rate reached; efficiencies: each method's rate over its peak
    assert prof.matrix_tflops["bf16"] == pytest.approx(t["torch_bf16_tflops"], rel=rel)
    assert prof.matrix_tflops["fp16"] == pytest.approx(t["torch_fp16_tflops"], rel=rel)
    assert prof.matmul_efficiency == 1.0
    assert prof.triton_matmul_efficiency == pytest.approx(t["triton_bf16_tflops"] / t["torch_bf16_tflops"], rel=rel)
    assert prof.hbm_gbps == pytest.approx(t["hbm_gbps"], rel=rel) and prof.hbm_efficiency == 1.0
    assert prof.peer_link_gbps == pytest.approx(t["copy_gbps"], rel=rel)
    assert prof.injection_gbps == pytest.approx(prof.peer_link_gbps)  # h200-sxm: injection = one peer's link
    assert prof.p2p_efficiency == pytest.approx(t["store_gbps"] / t["copy_gbps"], rel=rel)
    assert prof.collective_efficiency == pytest.approx(t["nccl_gbps"] / t["copy_gbps"], rel=0.05)
    assert prof.collective_base_us == pytest.approx(t["nccl_base_us"], rel=0.1)
    assert prof.launch_eager_us == pytest.approx((t["triton_host_us"] + t["torch_host_us"] + t["nccl_host_us"]) / 3, rel=rel)
    assert prof.kernel_floor_us == pytest.approx(t["graph_us"], rel=rel)  # graphs run empty kernels faster here
    assert prof.launch_graph_us == 0.0
    assert prof.link_latency_us == pytest.approx(t["relaxed_rtt_us"] / 2, rel=rel)
    assert prof.flag_round_trip_us == pytest.approx(t["acquire_rtt_us"], rel=rel)
    assert prof.rank_skew_us == pytest.approx(t["skew_us"], rel=rel)
    assert prof.combine_us["per_set"] == pytest.approx(t["combine_per_set_us"], rel=rel)
    assert prof.combine_us["base"] == pytest.approx(t["combine_base_us"], rel=0.05)
    assert prof.combine_kernel_us(33) == pytest.approx(t["combine_base_us"] + 33 * t["combine_per_set_us"], rel=rel)
    assert "globaltimer" in raw["figures"]["rank_skew_method"]
    off = raw["figures"]["clock_offsets"]["1"]
    assert abs(off["offset_ns"] - t["offset_ns"]) <= 2 * off["error_ns"]
    assert raw["failed"] == {} and set(raw["kept_from_base"]) == {"injection_gbps"}
    assert all(h.startswith(("measured", "kept")) for h in raw["fields"].values())
    # the raw record keeps the curve and every reading, and the whole profile survives JSON
    assert len(raw["nccl_curve"]) == 17 and raw["readings"][0]["figures"]["hbm"]["bytes_moved"] == 2 << 30
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(prof), allow_nan=False))) == prof


def _with_shapes_and_read(ranks, rng, shape_tflops: list[float], read_gbps: list[float], checked: bool = True):
    """Add the extra matmul shapes and the HBM read configurations to synthetic readings."""
    for r in ranks:
        m = r["figures"]["matmul"]
        m["bf16_shapes"] = [{"m": a, "n": b, "k": c, "flops": 2 * a * b * c,
                             "us": _noisy(rng, 2 * a * b * c / (tf * 1e6), 7)}
                            for (a, b, c), tf in zip(plan.matmul_shapes(8192), shape_tflops)]
        r["figures"]["hbm"]["read"] = [{"config": f"cfg{j}", "bytes": 1 << 30, "checked": checked,
                                        "us": _noisy(rng, (1 << 30) / (g * 1e3), 7)} for j, g in enumerate(read_gbps)]
    return ranks


def test_peaks_are_the_best_shape_and_the_best_of_copy_and_read_and_the_model_keeps_the_measured_rates():
    rng = random.Random(5)
    t = TRUTH
    ranks = _with_shapes_and_read(synthetic_ranks(rng), rng, [800.0, 795.0, 760.0], [4500.0, 4650.0, 4400.0])
    prof, raw = assemble(ranks)
    # the floor's peaks: the best any method or shape reached
    assert prof.matrix_tflops["bf16"] == pytest.approx(800.0, rel=0.02)
    assert raw["figures"]["torch_bf16_best_shape"] == "8192x4096x8192"
    assert prof.hbm_gbps == pytest.approx(4650.0, rel=0.02) and raw["figures"]["hbm_read_config"] == "cfg1"
    assert "Triton kernel" in raw["fields"]["hbm_gbps"]
    # the model's rates: still the 8192^3 GEMM and the copy (efficiency x peak)
    assert prof.matrix_tflops["bf16"] * prof.matmul_efficiency == pytest.approx(t["torch_bf16_tflops"], rel=0.02)
    assert prof.hbm_gbps * prof.hbm_efficiency == pytest.approx(t["hbm_gbps"], rel=0.02)
    assert prof.matmul_efficiency < 1 and prof.hbm_efficiency < 1
    # slower shapes and reads than the square GEMM and the copy leave the peaks where they were
    ranks = _with_shapes_and_read(synthetic_ranks(random.Random(6)), rng, [700.0] * 3, [4000.0] * 3)
    prof, raw = assemble(ranks)
    assert prof.matrix_tflops["bf16"] == pytest.approx(t["torch_bf16_tflops"], rel=0.02)
    assert prof.hbm_gbps == pytest.approx(t["hbm_gbps"], rel=0.02) and "the read reached" in raw["fields"]["hbm_gbps"]
    # a read whose sums were wrong is no reading: the HBM figure fails and the base profile's is kept
    ranks = _with_shapes_and_read(synthetic_ranks(random.Random(7)), rng, [700.0] * 3, [9000.0] * 3, checked=False)
    prof, raw = assemble(ranks)
    assert "sums were wrong" in raw["failed"]["hbm"] and prof.hbm_gbps == H200.hbm_gbps


def test_combine_readings_that_failed_their_check_keep_the_base_and_the_model_uses_a_measured_one():
    rng = random.Random(8)
    ranks = synthetic_ranks(rng)
    ranks[1]["figures"]["combine"]["checked"] = False
    prof, raw = assemble(ranks)
    assert "differs from float32" in raw["failed"]["combine"] and prof.combine_us == H200.combine_us == {}
    assert prof.combine_kernel_us(33) == prof.kernel_floor_us  # unmeasured: the empty kernel's floor
    measured, _ = assemble(synthetic_ranks(random.Random(9)))
    w = make_workload("flash-decode", {"B": 1, "S": 8192}, 2, "bf16")
    for v in ("bsp-graph", "fused-push-graph"):
        slow, fast = predict(w, v, measured), predict(w, v, prof)
        # the combines' loops over their sets now take base + sets x per set, not the empty kernel's floor
        assert slow.e2e_us > fast.e2e_us
    comb = {ph.name: ph.end_us - ph.start_us for ph in predict(w, "bsp-graph", measured).phases}
    # the one-launch decode merges its splits itself; the global combine merges one partial per rank
    assert comb["global_combine"] == pytest.approx(max(measured.combine_kernel_us(w.world), 0.0), rel=0.01)
    assert measured.combine_kernel_us(w.world) > measured.kernel_floor_us  # the measured loop, not the floor


def test_measure_combine_checks_the_kernel_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    got = measurements.measure_combine(SimpleNamespace(device=torch.device("cpu"), rank=0), TINY, 1.0, rows=20, D=16)
    assert got["checked"] and got["sets"] == list(plan.COMBINE_SETS) and got["us"] == [[], []]


def test_hbm_read_kernel_sums_every_element_once_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    for n in (1, 1000, 3 * 512 + 7):
        x = torch.randint(0, 16, (n,), dtype=torch.int32)
        got = measurements.hbm_read(x, 2, 128, TINY, 1.0)
        assert got["checked"] and got["bytes"] == 4 * n and got["us"] == []
    # each program's sum is exactly its strided blocks (a skipped or repeated block would show here)
    sums = torch.full((4,), -1, dtype=torch.int32)
    x = torch.randint(0, 16, (1000,), dtype=torch.int32)
    probes.hbm_read_kernel[(4,)](x, sums, 1000, BLOCK=64)
    blocks = x.split(64)
    want = [sum(int(b.sum()) for b in blocks[p::4]) for p in range(4)]
    assert sums.tolist() == want


@given(seed=st.integers(0, 10_000), scale=st.floats(0.2, 3), world=st.integers(1, 4))
def test_every_field_in_range_for_any_plausible_machine(seed, scale, world):
    rng = random.Random(seed)
    truth = {k: v * scale * rng.uniform(0.5, 1.5) if not k.startswith("offset") else v for k, v in TRUTH.items()}
    prof, raw = assemble(synthetic_ranks(rng, world, truth))
    d = profile_to_dict(prof)
    profile_from_dict(d)  # every number finite, non-negative, efficiencies in (0, 1]
    for f in ("matmul_efficiency", "triton_matmul_efficiency", "hbm_efficiency", "p2p_efficiency", "collective_efficiency"):
        assert 0 < d[f] <= 1
    assert prof.injection_gbps >= prof.peer_link_gbps > 0
    # units: the rates a model multiplies back out are the measured ones
    assert prof.hbm_gbps * prof.hbm_efficiency == pytest.approx(truth["hbm_gbps"], rel=0.02)
    assert prof.matrix_tflops["bf16"] * prof.matmul_efficiency == pytest.approx(truth["torch_bf16_tflops"], rel=0.02)
    assert prof.matrix_tflops["bf16"] * prof.triton_matmul_efficiency == pytest.approx(truth["triton_bf16_tflops"], rel=0.02)
    kinds = ["triton_host_us", "torch_host_us"] + (["nccl_host_us"] if world > 1 else [])
    assert prof.launch_eager_us == pytest.approx(sum(truth[k] for k in kinds) / len(kinds), rel=0.02)
    assert prof.kernel_floor_us == pytest.approx(min(truth["prefilled_us"], truth["graph_us"]), rel=0.02)
    if world > 1:
        assert prof.peer_link_gbps * prof.p2p_efficiency == pytest.approx(truth["store_gbps"], rel=0.02)
        assert prof.link_latency_us == pytest.approx(truth["relaxed_rtt_us"] / 2, rel=0.02)
    else:  # one GPU: every link figure is the base profile's, and marked so
        for f in ("peer_link_gbps", "injection_gbps", "collective_base_us", "link_latency_us", "flag_round_trip_us",
                  "rank_skew_us"):
            assert getattr(prof, f) == getattr(H200, f)
            assert "one GPU" in raw["kept_from_base"][f]
        assert prof.p2p_efficiency == H200.p2p_efficiency and prof.collective_efficiency == H200.collective_efficiency


def test_each_launcher_kind_gets_its_own_host_cost():
    """TMA-descriptor Triton launches and graph replays are measured beside the three kinds whose mean is
    launch_eager_us; the profile keeps every kind, and readings without the new kinds still calibrate."""
    rng = random.Random(11)
    ranks = synthetic_ranks(rng)
    for r in ranks:
        r["figures"]["launch"]["triton_tma_host_us"] = _noisy(rng, 61.0, 7)
        r["figures"]["launch"]["graph_host_us"] = _noisy(rng, 9.0, 7)
    prof, _ = assemble(ranks)
    want = {"triton": TRUTH["triton_host_us"], "torch": TRUTH["torch_host_us"], "nccl": TRUTH["nccl_host_us"],
            "triton_tma": 61.0, "graph": 9.0}
    assert set(prof.launch_host_us) == set(want)
    for kind, us in want.items():
        assert prof.launch_us(kind) == pytest.approx(us, rel=0.02), kind
    # the mean that older code and profiles use is unchanged by the new kinds
    assert prof.launch_eager_us == pytest.approx((TRUTH["triton_host_us"] + TRUTH["torch_host_us"] + TRUTH["nccl_host_us"]) / 3,
                                                 rel=0.02)
    old, _ = assemble(synthetic_ranks(random.Random(11)))
    assert "triton_tma" not in old.launch_host_us and old.launch_us("triton_tma") == old.launch_eager_us
    assert profile_from_dict(profile_to_dict(prof)).launch_host_us == prof.launch_host_us


@pytest.mark.parametrize("world", [2])
def test_measured_and_datasheet_peaks_predict_the_same_times(world):
    """Only the floor moves between the two peak conventions: efficiency x peak is the measured rate either
    way, so every variant's predicted E2E is the same."""
    ranks = synthetic_ranks(random.Random(5), world)
    measured, _ = assemble(ranks, peaks="measured")
    datasheet, raw = assemble(ranks, peaks="datasheet")
    assert datasheet.matrix_tflops == H200.matrix_tflops and datasheet.hbm_gbps == H200.hbm_gbps
    assert datasheet.peer_link_gbps == H200.peer_link_gbps
    assert datasheet.matmul_efficiency == pytest.approx(TRUTH["torch_bf16_tflops"] / 989.4, rel=0.02)
    assert not any("clipped" in n for n in raw["notes"])
    for name in WORKLOADS:
        w = make_workload(name, {}, world)
        for v in model_variants(name):
            a, b = predict(w, v, measured), predict(w, v, datasheet)
            assert a.e2e_us == pytest.approx(b.e2e_us, rel=1e-9), (name, v)
            # the machine falls short of its datasheet, so its calibrated floor is the higher one
            assert a.floor.ideal_us >= b.floor.ideal_us * (1 - 1e-9)


def test_a_failed_figure_keeps_the_base_with_its_reason():
    ranks = synthetic_ranks(random.Random(2))
    for r in ranks:
        del r["figures"]["nccl"]
        r["errors"]["nccl"] = "RuntimeError: NCCL error: unhandled system error"
        r["figures"]["triton_gemm"]["rel_error"] = 0.5  # a wrong result never counts
    prof, raw = assemble(ranks)
    assert prof.collective_base_us == H200.collective_base_us
    assert "NCCL error" in raw["kept_from_base"]["collective_base_us"]
    # a kept efficiency keeps the base's achieved rate against the new peak
    assert prof.collective_efficiency * prof.peer_link_gbps == pytest.approx(H200.collective_efficiency * H200.peer_link_gbps)
    assert prof.triton_matmul_efficiency == pytest.approx(H200.triton_matmul_efficiency / H200.matmul_efficiency)
    assert "differs from torch.matmul" in raw["failed"]["triton_gemm"]
    assert "nccl" in raw["failed"] and "skew" not in raw["failed"]
    # the launch figure still stands on the kernel and torch-op readings alone
    assert prof.launch_eager_us == pytest.approx((TRUTH["triton_host_us"] + TRUTH["torch_host_us"]) / 2, rel=0.02)
    lines = cal.failure_lines(raw)
    assert len(lines) == 2 and all("\n" not in line for line in lines)


def test_a_run_cut_short_builds_from_what_was_saved(tmp_path):
    ranks = synthetic_ranks(random.Random(3))
    for r in ranks:
        for name in ("pingpong", "skew", "triton_gemm"):
            r["figures"].pop(name)
        (tmp_path / f"rank{r['rank']}.json").write_text(json.dumps(r))
    (tmp_path / "rank5.json").write_text("{not json")
    saved = cal.read_progress(tmp_path, 6)
    assert [r["rank"] for r in saved] == [0, 1]
    prof, raw = assemble(saved, run_error="rank 1 did not finish within 300 s (it was calibrating pingpong)")
    assert set(raw["failed"]) == {"pingpong", "skew", "triton_gemm"}
    assert "did not finish" in raw["failed"]["pingpong"]
    assert prof.flag_round_trip_us == H200.flag_round_trip_us and prof.hbm_gbps != H200.hbm_gbps
    assert cal.failure_lines(raw)[0].startswith("the run stopped early")


def test_a_peer_copy_whose_data_did_not_arrive_does_not_count():
    ranks = synthetic_ranks(random.Random(12))
    for r in ranks:
        for p in r["figures"]["peer"]["pairs"]:
            p["store_checked"] = False
            p["store_us"] = [1.0] * 5  # fast because it moved nothing
        r["figures"]["peer"]["pairs"][0]["store_direct_error"] = "CompilationError: at 3:4: bad [thing]"
    prof, raw = assemble(ranks)
    assert "intact" in raw["failed"]["peer store"]
    assert raw["failed"]["peer store_direct"].startswith("CompilationError")
    assert prof.p2p_efficiency * prof.peer_link_gbps == pytest.approx(H200.p2p_efficiency * H200.peer_link_gbps)
    assert "peer store" in raw["kept_from_base"]["p2p_efficiency"]
    assert prof.peer_link_gbps == pytest.approx(TRUTH["copy_gbps"], rel=0.02)  # the checked methods still count


@pytest.mark.parametrize("outcome", ["finished", "cut short", "nothing measured"])
def test_run_calibration_on_the_host_side(monkeypatch, outcome):
    """The launcher stands in for the GPU ranks: what they return, or the readings they saved before dying."""
    ranks = synthetic_ranks(random.Random(13))
    seen = {}

    def fake_launch(fn, world, base, quick, name, peaks, progress_dir, backend, heap_bytes, timeout_s):
        seen.update(fn=fn, world=world, dir=Path(progress_dir), backend=backend, heap=heap_bytes, timeout=timeout_s)
        if outcome == "finished":
            return [cal.assemble_profile(ranks, base, META, name=name, peaks=peaks), None]
        if outcome == "cut short":
            for r in ranks:
                r["figures"].pop("triton_gemm")
                (Path(progress_dir) / f"rank{r['rank']}.json").write_text(json.dumps(r))
        raise RankError("rank 1 did not finish within 9 s (it was calibrating triton_gemm)")

    monkeypatch.setattr(run, "cuda_gpu_count", lambda: 2)  # the name run_calibration looks up
    monkeypatch.setattr(runtime, "launch", fake_launch)
    if outcome == "nothing measured":
        with pytest.raises(TaxesError, match="before any figure was measured: rank 1 did not finish") as e:
            run.run_calibration(2, H200, True, "box", timeout_s=9)
        assert_one_line(str(e.value))
    else:
        prof, raw = run.run_calibration(2, H200, True, "box", timeout_s=9)
        assert prof.name == "box" and prof.hbm_gbps == pytest.approx(TRUTH["hbm_gbps"], rel=0.02)
        if outcome == "cut short":
            assert "did not finish" in raw["run_error"] and "triton_gemm" in raw["failed"]
        else:
            assert "run_error" not in raw
    assert seen["fn"] is run.calibrate_job and seen["world"] == 2 and seen["backend"] == "cuda"
    assert seen["heap"] >= cal.QUICK.peer_bytes and seen["timeout"] == 9
    assert not seen["dir"].exists()  # the progress files are removed either way
    with pytest.raises(TaxesError, match="this machine has 2"):
        run.run_calibration(3, H200, True, "box")


def test_skew_falls_back_to_collective_spreads_without_clock_offsets():
    ranks = synthetic_ranks(random.Random(4))
    for p in ranks[0]["figures"]["pingpong"]["pairs"]:
        p.pop("t1")
    prof, raw = assemble(ranks)
    assert prof.rank_skew_us == pytest.approx(TRUTH["skew_us"] * 1.5, rel=0.02)
    assert "all-reduce" in raw["figures"]["rank_skew_method"]


def test_implausible_readings_are_refused_not_saved():
    ranks = synthetic_ranks(random.Random(6))
    for r in ranks:
        r["figures"]["hbm"]["us"] = [1e-6] * 5  # a broken timer: petabytes per second
    prof, raw = assemble(ranks)
    assert prof.hbm_gbps == H200.hbm_gbps and "plausible" in raw["failed"]["hbm"]


def test_assemble_refuses_an_unknown_peaks_convention():
    with pytest.raises(TaxesError, match="peaks"):
        assemble(synthetic_ranks(random.Random(0)), peaks="vendor")


# ---- names, bases, saving ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "-x", "a/b", "x" * 65, "h200 box", "../up", "h200-sxm", "mi300x"])
def test_bad_profile_names_are_refused(bad):
    with pytest.raises(TaxesError) as e:
        cal.check_profile_name(bad)
    assert_one_line(str(e.value))


def test_base_profile_by_gpu_name():
    assert cal.base_for_gpu("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert cal.base_for_gpu("NVIDIA H200").name == "h200-sxm"
    assert cal.base_for_gpu("AMD Instinct MI300X").name == "mi300x"
    assert cal.base_for_gpu("NVIDIA A100-SXM4-80GB").name == "h200-sxm"
    assert cal.gpu_summary(["A", "A", "B"]) == "2 x A, B"


def test_saved_profile_loads_back_by_name_and_by_path(tmp_path, monkeypatch):
    prof, _ = assemble(synthetic_ranks(random.Random(7)))
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path / "profiles"))
    path = cal.save_profile(prof)
    assert path == tmp_path / "profiles" / "h200-test.json"
    assert get_profile("h200-test") == prof
    assert get_profile(str(path)) == load_profile_file(path) == prof
    other = cal.save_profile(dataclasses.replace(prof, name="elsewhere"), tmp_path / "x.json")
    assert load_profile_file(other).name == "elsewhere"


def test_saving_where_it_cannot_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    prof, _ = assemble(synthetic_ranks(random.Random(8)))
    with pytest.raises(TaxesError) as e:
        cal.save_profile(prof, tmp_path / "file" / "p.json")
    assert_one_line(str(e.value))
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]  # nothing half-written


# ---- the command line ----------------------------------------------------------------------------------


@pytest.fixture
def calibrate_cli():
    """The calibrate command inside the real TaxesGroup (cli/main.py may not have registered it yet)."""
    group = TaxesGroup(name="taxes", commands={"calibrate": calibrate_command})

    def run(args, capsys):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            group.main(["calibrate", *args])
        out, err = capsys.readouterr()
        return exc.value.code or 0, out, err

    return run


def test_cli_without_gpus_is_one_line_pointing_to_the_profiles(calibrate_cli, capsys, monkeypatch):
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: 0)
    code, out, err = calibrate_cli(["--quick"], capsys)
    assert code == 2 and out == ""
    assert_one_line(err.strip())
    assert "needs CUDA GPUs" in err and "taxes hardware list" in err


def test_cli_on_this_machine_without_gpus(calibrate_cli, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, out, err = calibrate_cli([], capsys)
    assert code == 2 and "needs CUDA GPUs" in err and "Traceback" not in err


@pytest.mark.parametrize("args,match", [
    (["--gpus", "0"], "--gpus 0"),
    (["--timeout-s", "-1"], "positive"),
    (["--name", "h200-sxm"], "built-in"),
    (["--name", "a/b"], "letters, digits"),
    (["--base", "nonesuch"], "unknown hardware profile"),
    (["-o", "/no/such/dir/p.json"], "does not exist"),
    (["-o", "profile.txt"], "JSON"),
    (["--peaks", "vendor"], "vendor"),
])
def test_cli_bad_options_are_one_line(calibrate_cli, capsys, args, match):
    code, out, err = calibrate_cli(args, capsys)
    assert code == 2 and match in err
    assert_one_line(err.strip())


def test_cli_more_gpus_than_the_machine_has(calibrate_cli, capsys, monkeypatch):
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: 2)
    code, _, err = calibrate_cli(["--gpus", "4"], capsys)
    assert code == 2 and "has 2 CUDA GPUs" in err


def _fake_machine(monkeypatch, ranks, calls):
    """A machine whose calibration run returns the synthetic readings (the measuring needs GPUs)."""
    monkeypatch.setattr(measuring, "cuda_gpu_count", lambda: len(ranks))
    monkeypatch.setattr(measuring, "cuda_gpu_names", lambda n: ["NVIDIA H200"] * n)

    def run(world, base, quick, name, peaks="measured", timeout_s=300.0):
        calls.append((world, base.name, quick, name, peaks, timeout_s))
        return cal.assemble_profile(ranks[:world], base, META, name=name, peaks=peaks)

    monkeypatch.setattr(measuring, "run_calibration", run)


def test_cli_saves_a_profile_that_model_loads_by_name(calibrate_cli, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    calls = []
    ranks = synthetic_ranks(random.Random(9))
    ranks[1]["errors"]["matmul"] = "RuntimeError: CUDA out of memory"
    del ranks[1]["figures"]["matmul"]
    _fake_machine(monkeypatch, ranks, calls)
    code, out, err = calibrate_cli(["--quick"], capsys)
    assert code == 0, err
    # named for the GPU kind and world, the name `taxes profile` and `validate` look for on such a machine
    assert calls == [(2, "h200-sxm", True, "h200-x2-calibrated", "measured", 150.0)]
    prof = get_profile("h200-x2-calibrated")
    assert prof.source.startswith("calibrated on 2 x NVIDIA H200")
    assert "peer_link_gbps" in out and "kept from h200-sxm" in out
    assert str(tmp_path / "h200-x2-calibrated.json") in err
    code, out, err = run_cli(["model", "ag-gemm", "--hardware", "h200-x2-calibrated", "--format", "json"], capsys)
    assert code == 0, err
    assert json.loads(out)["metadata"]["hardware_profile"] == "h200-x2-calibrated"
    from taxes.model.hardware import machine_profile

    hw, why, warn = machine_profile("NVIDIA H200", 2)
    assert hw.name == "h200-x2-calibrated" and warn is None, why


def test_cli_one_gpu_keeps_link_figures_and_writes_to_o(calibrate_cli, capsys, monkeypatch, tmp_path):
    calls = []
    _fake_machine(monkeypatch, synthetic_ranks(random.Random(10), world=1), calls)
    out_path = tmp_path / "one.json"
    code, out, err = calibrate_cli(["--base", "h100-sxm", "--name", "box", "-o", str(out_path), "--peaks",
                                    "datasheet", "--timeout-s", "99"], capsys)
    assert code == 0, err
    assert calls == [(1, "h100-sxm", False, "box", "datasheet", 99.0)]
    prof = load_profile_file(out_path)
    assert prof.name == "box" and prof.peer_link_gbps == BUILTIN["h100-sxm"].peer_link_gbps
    assert "one GPU" in err
    kept = prof.extra["calibration"]["kept_from_base"]
    assert "one GPU" in kept["link_latency_us"] and "one GPU" in kept["collective_base_us"]


def test_cli_failed_figures_are_one_line_each(calibrate_cli, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    ranks = synthetic_ranks(random.Random(11))
    for r in ranks:
        r["figures"].pop("pingpong")
        r["errors"]["pingpong"] = "FlagTimeout: rank 0: the ping-pong kernel gave up waiting [bold]for[/bold] [Errno 2]"
    _fake_machine(monkeypatch, ranks, [])
    code, out, err = calibrate_cli([], capsys)
    assert code == 0
    lines = [line for line in err.splitlines() if line.startswith("taxes: calibrate:")]
    assert len(lines) == 1 and "pingpong" in lines[0] and "FlagTimeout" in lines[0]
    assert "[bold]for[/bold] [Errno 2]" in lines[0]  # error text is printed as it is, never as markup
    assert "[bold]for[/bold]" in out and "[Errno" in out  # the table's reason column too (cells wrap at spaces)


def test_installed_command_says_when_there_is_no_gpu_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main", "calibrate", "--quick", "-o", str(tmp_path / "p.json")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr.strip().splitlines() == [f"taxes: error: {run.NO_GPU}"]
    assert list(tmp_path.iterdir()) == []


# ---- the kernels under Triton's interpreter (emulated ranks) --------------------------------------------


def _kernels_job(ctx, rounds, absent):
    flags = ctx.heap.zeros((ctx.world,), torch.int32)
    stamps = ctx.heap.zeros((2 * rounds + 2,), torch.int64)
    buf = ctx.heap.alloc((1000,), torch.int32)
    ctx.barrier()
    peer = 1 - ctx.rank
    out = {"flags": []}
    base = 0
    for relaxed in (True, False):
        if ctx.rank != absent:
            try:
                probes.ping_pong(ctx, flags, stamps, peer, base, rounds, relaxed, stamped=relaxed, wait_s=1.0)
            except Exception as e:
                out.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
        base += rounds
        ctx.barrier()
        out["flags"].append(flags.local.tolist())
        ctx.barrier()  # read before the leader starts the next run (its first signal would show here)
    g = torch.Generator().manual_seed(ctx.rank)
    for via_bases in (True, False):
        src = torch.randint(-2 ** 31, 2 ** 31 - 1, (1000,), generator=g, dtype=torch.int32)
        buf.local.fill_(-1)
        ctx.barrier()
        probes.triton_peer_copy(ctx, buf, src, peer, push=True, via_bases=via_bases, grid=3, block=128)
        ctx.barrier()
        pushed = buf.local.clone()
        back = torch.zeros_like(src)
        probes.triton_peer_copy(ctx, buf, back, peer, push=False, via_bases=via_bases, grid=3, block=128)
        ctx.barrier()
        out.setdefault("copies", []).append({"src": src.tolist(), "pushed": pushed.tolist(), "pulled": back.tolist()})
    return out


@pytest.mark.slow
def test_ping_pong_and_peer_copies_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    rounds = 5
    res = launch(_kernels_job, 2, rounds, -1, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    for r, o in enumerate(res):
        assert "errors" not in o, o["errors"]
        # each rank's flag from its peer reached the last value of each run: base + rounds
        assert [f[1 - r] for f in o["flags"]] == [rounds, 2 * rounds]
        assert [f[r] for f in o["flags"]] == [0, 0]  # nobody writes a rank's own slot
        for mine, theirs in zip(o["copies"], res[1 - r]["copies"]):  # addressed via the bases, then directly
            assert mine["pushed"] == theirs["src"]  # the peer's stores landed here
            assert mine["pulled"] == theirs["pushed"]  # our loads read the peer's buffer
            assert mine["src"] != theirs["src"]


@pytest.mark.slow
def test_ping_pong_without_a_peer_gives_up_instead_of_hanging():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_kernels_job, 2, 3, 1, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    errs = res[0]["errors"]
    assert len(errs) == 2 and all(e.startswith("FlagTimeout") and "rank 1" in e for e in errs)
    assert "errors" not in res[1]


TINY = cal.Plan(reps=1, warmup=0, launches=1, nccl_sizes=(4096,), copy_bytes=4096, peer_bytes=4096, matmul_n=128,
                matmul_reps=1, rounds=4, pingpong_reps=2, skew_reps=1)


def _pingpong_job(ctx, fail_rank):
    if fail_rank is not None:  # this rank's runs fail, the others' succeed: every rank must still stop together
        real = measurements.ping_pong

        def flaky(ctx_, *a, **k):
            if ctx_.rank == fail_rank:
                raise RuntimeError("injected failure")
            return [0] * (2 * a[4] + 2)

        measurements.ping_pong = flaky
        try:
            return measurements.measure_pingpong(ctx, TINY, 1.0)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        finally:
            measurements.ping_pong = real
    return measurements.measure_pingpong(ctx, TINY, 1.0)


@pytest.mark.slow
def test_measure_pingpong_runs_every_pair_under_the_interpreter():
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_pingpong_job, 3, None, backend="emulated", heap_bytes=1 << 20, timeout_s=300)
    pairs = res[0]["pairs"]
    assert [p["peer"] for p in pairs] == [1, 2]
    for p in pairs:
        assert len(p["relaxed_rtt_us"]) == len(p["acquire_rtt_us"]) == TINY.pingpong_reps
        assert len(p["t0"]) == len(p["t1"]) == len(p["t2"]) == TINY.rounds
    assert res[1]["pairs"] == res[2]["pairs"] == []  # the readings live on the leader


@pytest.mark.slow
@pytest.mark.parametrize("fail_rank", [0, 1])
def test_a_figure_failing_on_one_rank_fails_on_every_rank_without_a_hang(fail_rank):
    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_pingpong_job, 2, fail_rank, backend="emulated", heap_bytes=1 << 20, timeout_s=120)
    assert res[fail_rank] == "RuntimeError: injected failure"
    assert res[1 - fail_rank] == "RuntimeError: failed on another rank"


# ---- the real thing -------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_quick_calibration_on_gpus(tmp_path, monkeypatch):
    if interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs and TRITON_INTERPRET=0")
    base = cal.base_for_gpu(torch.cuda.get_device_name(0))
    prof, raw = run.run_calibration(2, base, True, "gpu-test", timeout_s=170)
    assert raw["failed"] == {}, raw["failed"]
    assert "run_error" not in raw
    d = profile_to_dict(prof)
    profile_from_dict(d)
    assert prof.source.startswith("calibrated on ")
    assert 10 < prof.matrix_tflops["bf16"] < 1e5 and 100 < prof.hbm_gbps < 1e5 and 1 < prof.peer_link_gbps < 1e4
    assert 0 < prof.link_latency_us < prof.flag_round_trip_us * 1.5 + 1 and prof.launch_eager_us > prof.launch_graph_us
    assert math.isfinite(prof.rank_skew_us) and prof.collective_base_us > 0
    monkeypatch.setenv("TAXES_PROFILE_DIR", str(tmp_path))
    cal.save_profile(prof)
    assert get_profile("gpu-test") == prof


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


def test_committed_calibrations_load_by_name_and_say_where_and_when_they_were_measured(capsys):
    """Each profile in reports/calibration loads by its name (KIND-xWORLD-calibrated) and `taxes hardware
    list` and `show` give the machine and the date its own record holds."""
    from collections import Counter

    from taxes.model.hardware import calibrated_name

    code, listing, err = run_cli(["hardware", "list"], capsys)
    assert code == 0, err
    for path in sorted((ROOT / "reports" / "calibration").glob("*.json")):
        record = json.loads(path.read_text())["extra"]["calibration"]
        gpus, date = record["metadata"]["gpu_names"], record["metadata"]["date"][:10]
        machine = ", ".join(f"{n} x {g}" if n > 1 else g for g, n in Counter(gpus).items())
        assert get_profile(path.stem).name == path.stem
        if path.stem.endswith("-calibrated"):  # the name a machine of these GPUs looks for
            assert path.stem == calibrated_name(gpus[0], len(gpus))
        row = next(line for line in listing.splitlines() if f" {path.stem} " in line)
        assert f"measured on {machine}, {date}" in row
        code, shown, err = run_cli(["hardware", "show", path.stem], capsys)
        assert code == 0, err
        assert any("machine" in line and machine in line for line in shown.splitlines())
        assert any(" date " in line and date in line for line in shown.splitlines())
