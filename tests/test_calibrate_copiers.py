"""The copiers' figure: the fused ag-gemm's own copier CTAs beside its GEMM (taxes calibrate), derived from
readings with a planted rate, priced by the model in place of copies by CTAs alone, and measured on emulated
ranks with the kernel's output checked."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import copy
import random

import pytest
from _calibrate_data import synthetic_ranks

from taxes.model.calibrate.derive import derive_figures
from taxes.model.figures import copier_rate_bytes_per_us
from taxes.model.hardware import get_profile, profile_from_dict, profile_to_dict
from taxes.model.predict import predict
from taxes.workloads import make_workload


def _with_copiers(ranks: list[dict], rng, gbps: float, ctas: int = 16, checked: bool = True) -> list[dict]:
    out = copy.deepcopy(ranks)
    nbytes = 1024 * 4096 * 2 * (len(ranks) - 1)
    for r in out:
        us = [nbytes / (gbps * 1e3) * (1 + rng.uniform(-0.03, 0.03)) for _ in range(5)]
        r["figures"]["copiers"] = {"bytes": nbytes, "copiers": ctas, "us": us, "checked": checked, "rel_error": 3e-3}
    return out


@pytest.mark.parametrize("gbps", [90.0, 205.0, 400.0])
def test_the_copiers_rate_is_derived_from_their_readings(gbps):
    rng = random.Random(int(gbps))
    fig, failed = derive_figures(_with_copiers(synthetic_ranks(rng, world=4), rng, gbps))
    assert fig["copier_gemm_gbps"] == pytest.approx(gbps, rel=0.04)
    assert fig["copier_gemm_ctas"] == 16 and "copiers" not in failed


def test_unchecked_copier_readings_fail_the_figure_and_older_readings_lack_it_quietly():
    rng = random.Random(5)
    ranks = synthetic_ranks(rng, world=2)
    fig, failed = derive_figures(_with_copiers(ranks, rng, 200.0, checked=False))
    assert "copier_gemm_gbps" not in fig and "did not match float32" in failed["copiers"]
    fig, failed = derive_figures(ranks)  # readings made before the figure existed
    assert "copier_gemm_gbps" not in fig and "copiers" not in failed


def _profile_with(hw, **figures):
    d = profile_to_dict(hw)
    d["extra"]["calibration"]["figures"].update(figures)
    return profile_from_dict(d, "test")


def test_the_model_prices_the_copiers_at_their_rate_beside_the_gemm():
    hw = get_profile("h200-x4-calibrated")
    alone = copier_rate_bytes_per_us(hw, 4, 16, push=True)
    figs = hw.extra["calibration"]["figures"]
    half = _profile_with(hw, copier_gemm_gbps=0.5 * alone / 1e3, copier_gemm_ctas=16)
    assert copier_rate_bytes_per_us(half, 4, 16, push=True) == pytest.approx(0.5 * alone)
    assert copier_rate_bytes_per_us(half, 4, 8, push=True) == pytest.approx(0.25 * alone)
    # never above what CTAs alone reach, and a pull's loads keep their own figures
    fast = _profile_with(hw, copier_gemm_gbps=10 * alone / 1e3, copier_gemm_ctas=16)
    assert copier_rate_bytes_per_us(fast, 4, 16, push=True) <= figs["peer_cta_max_gbps"] * 1e3 + 1e-6
    assert copier_rate_bytes_per_us(half, 4, 16, push=False) == copier_rate_bytes_per_us(hw, 4, 16, push=False)
    # slower copiers leave the fused kernel waiting longer: its predicted E2E grows, bsp-graph's does not
    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 4)
    assert predict(w, "fused-push", half).e2e_us > predict(w, "fused-push", hw).e2e_us
    assert predict(w, "bsp-graph", half).e2e_us == pytest.approx(predict(w, "bsp-graph", hw).e2e_us)


def _copiers_job(ctx):
    from rank_jobs import SMALL

    from taxes.model.calibrate import plan
    from taxes.run.calibration_measurements import measure_copiers

    tiny = plan.Plan(reps=2, warmup=1, launches=1, nccl_sizes=(4096,), copy_bytes=4096, peer_bytes=4096,
                     matmul_n=128, matmul_reps=1, rounds=4, pingpong_reps=2, skew_reps=1, copier_rows=32, copier_nk=64)
    return measure_copiers(ctx, tiny, 1.0, config=SMALL)


@pytest.mark.slow
def test_the_copiers_reading_runs_the_fused_kernel_and_checks_its_output_on_emulated_ranks():
    from taxes.kernels.device import interpreting
    from taxes.kernels.runtime import launch

    if not interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET was set")
    res = launch(_copiers_job, 2, backend="emulated", heap_bytes=1 << 20, timeout_s=300)
    for r in res:
        assert r["checked"] and r["rel_error"] < 2e-2
        assert r["bytes"] == 32 * 64 * 2 * 1 and r["shape"] == {"M": 64, "N": 64, "K": 64}
        assert r["us"] == []  # the interpreter's clock reads 0: no copier stamps to time
