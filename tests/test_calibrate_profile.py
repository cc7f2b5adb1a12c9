"""`taxes calibrate` readings -> profile (CPU): peaks, failed and implausible figures, host costs, every field
in range, names, bases, saving, and the committed calibrations.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
from _calibrate_data import H200, META, TRUTH, _noisy, assemble, synthetic_ranks
from _util import assert_one_line, run_cli
from hypothesis import given
from hypothesis import strategies as st

from taxes.model import calibrate as cal
from taxes.model.calibrate import plan
from taxes.run import calibrate as run
from taxes.errors import TaxesError
from taxes.model.hardware import get_profile, load_profile_file, profile_from_dict, profile_to_dict
from taxes.kernels import runtime
from taxes.kernels.rank import RankError
from taxes.model.predict import predict
from taxes.workloads import WORKLOADS, make_workload, model_variants


ROOT = Path(__file__).resolve().parent.parent


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
        r["figures"]["launch"]["sdpa_host_us"] = _noisy(rng, 83.0, 7)
    prof, _ = assemble(ranks)
    want = {"triton": TRUTH["triton_host_us"], "torch": TRUTH["torch_host_us"], "nccl": TRUTH["nccl_host_us"],
            "triton_tma": 61.0, "graph": 9.0, "sdpa": 83.0}
    assert set(prof.launch_host_us) == set(want)
    for kind, us in want.items():
        assert prof.launch_us(kind) == pytest.approx(us, rel=0.02), kind
    # the mean that older code and profiles use is unchanged by the new kinds
    assert prof.launch_eager_us == pytest.approx((TRUTH["triton_host_us"] + TRUTH["torch_host_us"] + TRUTH["nccl_host_us"]) / 3,
                                                 rel=0.02)
    old, _ = assemble(synthetic_ranks(random.Random(11)))
    assert "triton_tma" not in old.launch_host_us and old.launch_us("triton_tma") == old.launch_eager_us
    assert profile_from_dict(profile_to_dict(prof)).launch_host_us == prof.launch_host_us


def test_one_gpu_takes_the_all_gather_host_cost_from_the_launch_figure():
    """One GPU has no collective figures, but the one-rank all-gather's host call is timed beside the launches:
    it becomes the nccl launcher's cost (and joins launch_eager_us's mean); at two GPUs the collective figure's
    small sizes are the ones kept."""
    rng = random.Random(3)
    one = synthetic_ranks(rng, world=1)
    one[0]["figures"]["launch"]["nccl_host_us"] = _noisy(rng, 47.0, 7)
    prof, _ = assemble(one)
    assert prof.launch_us("nccl") == pytest.approx(47.0, rel=0.02)
    assert prof.launch_eager_us == pytest.approx((TRUTH["triton_host_us"] + TRUTH["torch_host_us"] + 47.0) / 3, rel=0.02)
    without, _ = assemble(synthetic_ranks(random.Random(3), world=1))
    assert "nccl" not in without.launch_host_us
    two = synthetic_ranks(random.Random(3), world=2)
    for r in two:
        r["figures"]["launch"]["nccl_host_us"] = _noisy(rng, 47.0, 7)
    assert assemble(two)[0].launch_us("nccl") == pytest.approx(TRUTH["nccl_host_us"], rel=0.02)


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
