"""The analytical model: closure, non-negativity, the schedule, the floor, and sanity checks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from _util import assert_one_line
from hypothesis import given
from hypothesis import strategies as st

from taxes.model import predict as model
from taxes.errors import TaxesError
from taxes.model.hardware import BUILTIN
from taxes.method import TAXES
from taxes.model.predict import COMPONENTS, ModelOptions, floor_of, predict, predict_all
from taxes.variants import get, model_names
from taxes.workloads import WORKLOADS, make_workload, model_variants

MODEL_VARIANTS = model_names("ag-gemm")

PROFILES = list(BUILTIN)
REL = 1e-9


def check_prediction(pred, hw) -> None:
    """Every invariant a prediction must satisfy, whatever the shape."""
    w, comp = pred.workload, pred.components
    assert set(comp) == set(COMPONENTS)
    for c in COMPONENTS:
        assert math.isfinite(comp[c]) and comp[c] >= 0.0, (c, comp[c])
    # closure, exactly
    assert math.fsum(comp[c] for c in COMPONENTS) == pred.e2e_us
    assert pred.e2e_us > 0
    tol = REL * pred.e2e_us
    # the phases: one per launch, in order, not overlapping, each as long as its parts
    assert len(pred.phases) == w.kernel_count(pred.variant)
    prev_end = 0.0
    gaps = []
    for ph in pred.phases:
        assert ph.role in ("compute", "communication")
        assert ph.start_us >= prev_end - tol, "phases overlap"
        assert ph.end_us >= ph.start_us
        assert all(v >= -1e-12 for v in ph.parts.values())
        assert set(ph.parts) <= set(COMPONENTS) - {"launch"}
        assert abs((ph.end_us - ph.start_us) - math.fsum(ph.parts.values())) <= tol
        gaps.append(ph.start_us - prev_end)
        prev_end = ph.end_us
    # the first kernel waits for its launch at least; no kernel starts before its launch could arrive
    assert gaps[0] > 0
    assert abs(pred.phases[-1].end_us - pred.e2e_us) <= tol
    # the launch tax is the device's idle time: the gaps before and between phases
    assert abs(comp["launch"] - math.fsum(gaps)) <= tol
    # the phases' parts, summed per component, are the other components
    for c in COMPONENTS:
        if c != "launch":
            assert abs(math.fsum(ph.parts.get(c, 0.0) for ph in pred.phases) - comp[c]) <= tol
    # taxes_us groups the components as TAXES says
    taxes = pred.taxes_us()
    assert set(taxes) == {"bulk-synchronous", "data-locality", "kernel-launch"}
    assert taxes["bulk-synchronous"] == comp["sync_wait"] + comp["exposed_transfer"]
    assert taxes["data-locality"] == comp["locality"] and taxes["kernel-launch"] == comp["launch"]
    # the floor's ideal never exceeds what any variant takes
    assert pred.floor.ideal_us <= pred.e2e_us + tol
    if w.world == 1:  # nobody to wait for, nothing to send
        assert comp["sync_wait"] == comp["exposed_transfer"] == comp["start_skew"] == 0.0
        assert pred.floor.link_us == 0.0 and pred.exposed_communication_us == 0.0


@pytest.mark.parametrize("name, variant", [(n, v) for n in WORKLOADS for v in model_variants(n)])
@pytest.mark.parametrize("hw_name", PROFILES)
def test_every_workload_profile_variant(name, hw_name, variant):
    hw = BUILTIN[hw_name]
    for world in (1, 2, 8):
        w = make_workload(name, {}, world)
        pred = predict(w, variant, hw)
        assert pred.variant == variant and pred.hardware == hw_name and pred.workload is w
        check_prediction(pred, hw)


@st.composite
def workloads(draw):
    name = draw(st.sampled_from(list(WORKLOADS)))
    p = draw(st.integers(1, 8))
    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    if name == "flash-decode":
        hkv = draw(st.integers(1, 32))
        shape = {"B": draw(st.integers(1, 128)), "Hkv": hkv, "Hq": hkv * draw(st.integers(1, 16)),
                 "D": draw(st.integers(1, 512)), "S": draw(st.integers(1, 1 << 20))}
    elif name == "tp-mlp":
        shape = {d: p * draw(st.integers(1, 1 << draw(st.integers(0, 15)))) for d in ("M", "H", "F")}
    else:
        shape = {d: p * draw(st.integers(1, 1 << draw(st.integers(0, 15)))) for d in ("M", "N", "K")}
    return make_workload(name, shape, p, dtype)


@given(workloads(), st.sampled_from(PROFILES), st.integers(1, 32), st.integers(0, 100))
def test_random_shapes_close_and_stay_non_negative(w, hw_name, chunks, producer_pct):
    hw = BUILTIN[hw_name]
    opt = ModelOptions(chunks_per_peer=chunks, push_producer_sms=hw.sm_count * producer_pct // 200)
    for pred in predict_all(w, hw, options=opt):
        check_prediction(pred, hw)


def calibrated_hbm_bytes_per_us(hw):
    return hw.hbm_gbps * 1e3 * hw.hbm_efficiency


@given(workloads(), st.sampled_from(PROFILES))
def test_locality_tax_is_intermediate_bytes_over_calibrated_bandwidth(w, hw_name):
    """docs/model.md: locality = intermediate bytes (written + read) / calibrated HBM bandwidth."""
    hw = BUILTIN[hw_name]
    splits = w.kv_splits(hw.sm_count) if w.name == "flash-decode" else None
    for pred in predict_all(w, hw):
        nbytes = w.intermediate_bytes(pred.variant, splits) if splits else w.intermediate_bytes(pred.variant)
        expected = nbytes / calibrated_hbm_bytes_per_us(hw)
        assert pred.components["locality"] == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("variant", MODEL_VARIANTS)
def test_flash_decode_one_split_locality_matches_intermediate_bytes(variant):
    hw = BUILTIN["h200-sxm"]
    w = make_workload("flash-decode", {"B": 64, "Hq": 64, "Hkv": 8, "D": 128, "S": 4096}, 2)
    assert w.kv_splits(hw.sm_count) == 1
    expected = w.intermediate_bytes(variant, 1) / calibrated_hbm_bytes_per_us(hw)
    assert predict(w, variant, hw).components["locality"] == pytest.approx(expected, rel=1e-9)


# ---- the floor -------------------------------------------------------------------------------------


def test_floor_by_hand_ag_gemm_h200():
    hw = BUILTIN["h200-sxm"]
    fl = floor_of(make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 2), hw)
    # 2 * 8192 * 4096 * 8192 FLOP at 989.4 TFLOP/s
    assert fl.compute_us == pytest.approx(2 * 8192 * 4096 * 8192 / 989.4e12 * 1e6, rel=1e-12)
    assert fl.compute_us == pytest.approx(555.7, abs=0.1)
    # (A shard 4096x8192 + W shard 8192x4096 + C block 8192x4096) x 2 B at 4.8 TB/s
    assert fl.hbm_us == pytest.approx(3 * 4096 * 8192 * 2 / 4.8e12 * 1e6, rel=1e-12)
    # the peer's A shard (4096 x 8192 x 2 B) at 450 GB/s, plus one 2 us link latency
    assert fl.link_us == pytest.approx(4096 * 8192 * 2 / 450e9 * 1e6 + 2.0, rel=1e-12)
    assert fl.ideal_us == max(fl.compute_us, fl.hbm_us, fl.link_us) == fl.compute_us


@pytest.mark.parametrize("world, inbound_gbps", [(2, 64.0), (4, 192.0), (8, 448.0)])
def test_floor_link_uses_the_narrower_of_peer_links_and_injection(world, inbound_gbps):
    """MI300X: 64 GB/s to each peer, 448 GB/s in total: receiving from p-1 peers at once."""
    hw = BUILTIN["mi300x"]
    w = make_workload("gemm-rs", {"M": 8192, "N": 8192, "K": 8192}, world)
    nbytes = (world - 1) * (8192 // world) * 8192 * 2
    assert floor_of(w, hw).link_us == pytest.approx(nbytes / (inbound_gbps * 1e3) + hw.link_latency_us, rel=1e-12)


@given(workloads(), st.sampled_from(PROFILES))
def test_floor_is_max_of_compute_hbm_link(w, hw_name):
    hw = BUILTIN[hw_name]
    fl = floor_of(w, hw)
    assert fl.compute_us == pytest.approx(w.flops() / (hw.matrix_tflops[w.dtype] * 1e12) * 1e6, rel=1e-12)
    assert fl.hbm_us == pytest.approx(w.hbm_bytes() / (hw.hbm_gbps * 1e9) * 1e6, rel=1e-12)
    if w.world > 1:
        bw = min(hw.injection_gbps, (w.world - 1) * hw.peer_link_gbps) * 1e9
        assert fl.link_us == pytest.approx(w.link_bytes() / bw * 1e6 + hw.link_latency_us, rel=1e-12)
    else:
        assert fl.link_us == 0.0
    assert fl.ideal_us == max(fl.compute_us, fl.hbm_us, fl.link_us)
    assert fl.work_us == max(fl.compute_us, fl.hbm_us)
    assert fl.unhideable_link_us == pytest.approx(max(0.0, fl.link_us - fl.work_us), abs=1e-9)
    pred = predict(w, model_variants(w.name)[0], hw)
    assert pred.floor == fl
    # the ideal component is the floor: exactly T_ideal for every variant
    for p in predict_all(w, hw):
        assert p.components["ideal"] == pytest.approx(fl.ideal_us, rel=1e-9)


# ---- sanity and the ablation ladder ----------------------------------------------------------------


def test_anchor_ag_gemm_h200_world2_8k():
    """Measured anchor: bsp ag-gemm, M=N=K=8192 bf16 on 2 x H200 took about 1024 us."""
    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 2, "bf16")
    e2e = predict(w, "bsp", BUILTIN["h200-sxm"]).e2e_us
    assert abs(e2e - 1024.0) <= 0.25 * 1024.0, e2e


@pytest.mark.parametrize("hw_name", PROFILES)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_bsp_e2e_grows_with_m(hw_name, world):
    hw = BUILTIN[hw_name]
    e2e = [predict(make_workload("ag-gemm", {"M": m, "N": 4096, "K": 4096}, world), "bsp", hw).e2e_us
           for m in (1024, 2048, 4096, 8192, 16384, 32768)]
    assert all(a < b for a, b in zip(e2e, e2e[1:])), e2e


@pytest.mark.parametrize("hw_name", PROFILES)
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_more_work_never_takes_less_time(hw_name, name):
    """Doubling the KV length / K never makes any variant faster."""
    hw = BUILTIN[hw_name]
    dim = {"flash-decode": "S", "tp-mlp": "F"}.get(name, "K")
    w = make_workload(name, {}, 4)
    for v in model_variants(name):
        e2e = [predict(model.replace_dim(w, dim, x), v, hw).e2e_us for x in (1024, 4096, 16384, 65536)]
        assert all(a <= b * (1 + 1e-12) for a, b in zip(e2e, e2e[1:])), (v, e2e)


def test_graph_cuts_flash_decode_launch_tax_on_h200():
    hw = BUILTIN["h200-sxm"]
    w = make_workload("flash-decode", {"S": 8192}, 2)  # launch-bound: the decode is shorter than a launch
    eager, graph = predict(w, "bsp", hw), predict(w, "bsp-graph", hw)
    assert graph.components["launch"] < eager.components["launch"]
    assert graph.e2e_us < eager.e2e_us


@given(workloads(), st.sampled_from(PROFILES))
def test_graph_changes_only_the_launch_tax(w, hw_name):
    """bsp -> bsp-graph removes launch tax and nothing else: E2E(bsp) - E2E(graph) = launch difference."""
    hw = BUILTIN[hw_name]
    bsp, bsp_graph = model_variants(w.name)[:2]
    eager, graph = predict(w, bsp, hw), predict(w, bsp_graph, hw)
    for c in COMPONENTS:
        if c != "launch":
            assert eager.components[c] == graph.components[c], c
    assert eager.e2e_us - graph.e2e_us == pytest.approx(
        eager.components["launch"] - graph.components["launch"], abs=1e-9 * eager.e2e_us)
    # a graph: one replay call (a datasheet profile prices it as any launch), then launch_graph_us before
    # each later kernel
    n = w.kernel_count(bsp_graph)
    assert graph.components["launch"] == pytest.approx(hw.launch_eager_us + (n - 1) * hw.launch_graph_us, rel=1e-9)
    # eager: the first kernel waits for its launch at least, and never pays less than the graph
    assert eager.components["launch"] >= hw.launch_eager_us * (1 - 1e-12)
    assert eager.components["launch"] >= graph.components["launch"] * (1 - 1e-12)


def test_pytorch_attention_call_is_priced_by_its_own_host_time():
    """Eager bsp-sdpa: PyTorch's attention call costs the "sdpa" launcher's host time and a pack kernel
    follows it; everything after it waits for the host. In a graph the call's host time is gone."""
    import dataclasses

    base = BUILTIN["h200-sxm"]
    w = make_workload("flash-decode", {"B": 1, "Hq": 8, "Hkv": 1, "D": 128, "S": 2048}, 2)  # tiny: host-bound
    costs = {"torch": 7.0, "triton": 11.0, "triton_tma": 13.0, "nccl": 25.0, "graph": 9.0}
    cheap = dataclasses.replace(base, launch_host_us=costs | {"sdpa": 11.0})
    dear = dataclasses.replace(base, launch_host_us=costs | {"sdpa": 111.0})
    ours, theirs, theirs_dear = predict(w, "bsp", cheap), predict(w, "bsp-sdpa", cheap), predict(w, "bsp-sdpa", dear)
    assert [ph.name for ph in theirs.phases] == ["local_sdpa", "pack", "all_gather_partials", "global_combine"]
    assert [ph.name for ph in ours.phases] == ["local_decode", "all_gather_partials", "global_combine"]
    # the pack kernel's host call (a Triton launch) comes after the attention call and before the collective
    assert theirs.phases[2].start_us >= 11.0 + costs["triton"] + costs["nccl"] - 1e-9
    assert theirs_dear.e2e_us - theirs.e2e_us == pytest.approx(100.0)
    assert theirs_dear.components["launch"] - theirs.components["launch"] == pytest.approx(100.0)
    assert "bsp-sdpa" in [p.variant for p in predict_all(w, dear)]
    # graphed, the attention's host time does not count: bsp-sdpa-graph is modelled as bsp-graph
    with pytest.raises(TaxesError):
        predict(w, "bsp-sdpa-graph", dear)


def test_eager_launches_cost_their_launchers_host_time():
    """Eager: the host issues each step after the previous call returned, at its launcher's cost; a graph
    costs one replay call. Only the launch tax moves when one launcher gets dearer."""
    import dataclasses

    base = BUILTIN["h200-sxm"]
    costs = {"torch": 7.0, "triton": 11.0, "triton_tma": 60.0, "nccl": 25.0, "graph": 9.0}
    hw = dataclasses.replace(base, launch_host_us=costs, launch_graph_us=0.5)
    w = make_workload("ag-gemm", {"M": 256, "N": 512, "K": 512}, 2)  # tiny: every step waits for the host
    bsp = predict(w, "bsp", hw)
    # all-gather (NCCL) then matmul (torch): the matmul cannot start before both calls returned
    assert [ph.name for ph in bsp.phases] == ["all_gather", "matmul"]
    assert bsp.phases[0].start_us == pytest.approx(costs["nccl"])
    assert bsp.phases[1].start_us >= costs["nccl"] + costs["torch"] - 1e-9
    fused = predict(w, "fused-push", hw)
    assert fused.phases[0].start_us == pytest.approx(costs["triton_tma"]) == fused.components["launch"]
    graphed = predict(w, "fused-push-graph", hw)
    assert graphed.components["launch"] == pytest.approx(costs["graph"])
    for c in COMPONENTS:  # the graph changes the launch tax only
        if c != "launch":
            assert graphed.components[c] == pytest.approx(fused.components[c]), c
    dearer = predict(w, "fused-push", dataclasses.replace(hw, launch_host_us=costs | {"triton_tma": 120.0}))
    assert dearer.components["launch"] == pytest.approx(120.0)
    assert dearer.e2e_us - fused.e2e_us == pytest.approx(60.0)
    # a profile without per-kind costs charges launch_eager_us to every kind
    assert predict(w, "fused-push", base).components["launch"] == pytest.approx(base.launch_eager_us)


@pytest.mark.parametrize("hw_name", PROFILES)
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_fused_ag_gemm_has_less_locality_than_bsp(hw_name, world):
    hw = BUILTIN[hw_name]
    w = make_workload("ag-gemm", {"M": 24 * 1024, "N": 8 * 1024 * 3, "K": 4096}, world)
    bsp = predict(w, "bsp", hw).components["locality"]
    for v in ("fused-pull", "fused-push"):
        assert predict(w, v, hw).components["locality"] < bsp


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_the_start_skew_is_paid_once_per_iteration_at_the_first_wait(name):
    """The ranks leave the barrier rank_skew_us apart; the first step that waits for a peer absorbs it and
    the ranks go on in step: tp-mlp's two collectives pay it once, like one collective. It is no tax."""
    hw = BUILTIN["h100-sxm"]
    for world in (2, 4):
        w = make_workload(name, {}, world)
        for v in model_variants(name):
            pred = predict(w, v, hw)
            if get(name, v).bulk_synchronous:  # eager and graphed: the first collective waits the whole skew
                assert pred.components["start_skew"] == pytest.approx(hw.rank_skew_us)
            assert pred.components["start_skew"] <= hw.rank_skew_us * (1 + 1e-12)
            assert sum(ph.parts.get("start_skew", 0.0) > 0 for ph in pred.phases) <= 1
            skewless = predict(w, v, dataclasses.replace(hw, rank_skew_us=0.0))
            assert skewless.components["start_skew"] == 0.0
            assert pred.e2e_us - skewless.e2e_us == pytest.approx(pred.components["start_skew"], abs=1e-9 * pred.e2e_us)
            assert pred.taxes_us() == pytest.approx(skewless.taxes_us(), abs=1e-9 * pred.e2e_us)


def test_taxes_table_is_a_partition_of_the_tax_components():
    named = [c for parts in TAXES.values() for c in parts]
    assert len(named) == len(set(named))
    assert set(named) | {"ideal", "start_skew", "inefficiency", "unattributed"} == set(COMPONENTS)


# ---- errors ----------------------------------------------------------------------------------------


def test_predict_rejects_unknown_variant():
    with pytest.raises(TaxesError) as e:
        predict(make_workload("ag-gemm", {}, 2), "bsp-eager", BUILTIN["h200-sxm"])
    assert_one_line(str(e.value))
    assert "bsp-eager" in str(e.value)


def test_predict_rejects_dtype_the_hardware_lacks():
    import dataclasses

    hw = dataclasses.replace(BUILTIN["h200-sxm"], matrix_tflops={"bf16": 989.4})
    w = make_workload("gemm-rs", {}, 2, "fp16")
    with pytest.raises(TaxesError) as e:
        predict(w, "bsp", hw)
    assert_one_line(str(e.value))
    assert "fp16" in str(e.value)


@pytest.mark.parametrize("text, dim, values", [
    ("M=1024:16384", "M", [1024, 2048, 4096, 8192, 16384]),
    ("K=1K:5K", "K", [1024, 2048, 4096]),
    ("N=8K:8K", "N", [8192]),
])
def test_parse_sweep(text, dim, values):
    assert model.parse_sweep(text, make_workload("ag-gemm", {}, 2)) == (dim, values)


@pytest.mark.parametrize("text", ["M", "M=1024", "M=1024-2048", "Z=1:4", "M=4K:1K", "M=0:8", "M=a:b", "M=1:2:3", "S=1:4"])
def test_parse_sweep_rejects(text):
    with pytest.raises(TaxesError) as e:
        model.parse_sweep(text, make_workload("ag-gemm", {}, 2))
    assert_one_line(str(e.value))
    assert str(e.value).startswith("sweep:") or str(e.value).startswith("shape:")


def test_sweep_validates_each_value_and_predicts_each():
    hw = BUILTIN["h100-sxm"]
    w = make_workload("ag-gemm", {}, 2)
    out = model.sweep(w, "M", [1024, 2048], hw, variants=("bsp", "fused-pull"))
    assert [[(p.workload.M, p.variant) for p in ps] for ps in out] == [
        [(1024, "bsp"), (1024, "fused-pull")], [(2048, "bsp"), (2048, "fused-pull")]]
    with pytest.raises(TaxesError, match="divisible"):
        model.sweep(w, "M", [1, 2], hw)
    assert [v for v in model_names("ag-gemm") if get("ag-gemm", v).bulk_synchronous] == ["bsp", "bsp-graph"]


# ---- consistency checks: each one planted, then every sweep on every profile ---------------------------

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = sorted(p.stem for p in (ROOT / "reports" / "calibration").glob("*-calibrated*.json"))


def _planted(monkeypatch, name: str, part: str, value: float, world: int = 1):
    """Predict with one part of every step of one workload's builder forced to `value`."""
    builder = model._STEPS[name]

    def planted(*args, **kw):
        steps = builder(*args, **kw)
        for s in steps:
            s.parts[part] = value
        return steps

    monkeypatch.setitem(model._STEPS, name, planted)
    return make_workload(name, {}, world)


@pytest.mark.parametrize("part", ["exposed_transfer", "sync_wait", "start_skew"])
def test_communication_at_world_1_is_refused(monkeypatch, part):
    w = _planted(monkeypatch, "flash-decode", part, 27.0)
    with pytest.raises(model.ModelInconsistency) as e:
        predict(w, "bsp", BUILTIN["h100-sxm"])
    assert_one_line(str(e.value))
    assert "world 1" in str(e.value) and part in str(e.value)


def test_link_time_at_world_1_is_refused():
    pred = predict(make_workload("ag-gemm", {}, 1), "bsp", BUILTIN["h100-sxm"])
    with pytest.raises(model.ModelInconsistency, match="link time"):
        model.check(dataclasses.replace(pred, floor=dataclasses.replace(pred.floor, link_us=5.0)))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_one_rank_has_no_communication_of_any_kind(name):
    """The issue of a one-rank collective costing its base latency as exposed transfer: at world 1 a
    collective is a local copy (NCCL copies the rank's buffer into its output), priced by its bytes."""
    hw = BUILTIN["h100-sxm"]
    for v in model_variants(name):
        pred = predict(make_workload(name, {}, 1), v, hw)
        for c in ("start_skew", "sync_wait", "exposed_transfer"):
            assert pred.components[c] == 0.0
    # ag-gemm bsp at world 1: the all-gather copies A (M x K) into its output: read and written once
    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 1)
    copy = next(ph for ph in predict(w, "bsp", hw).phases if ph.name == "all_gather")
    nbytes = 2 * 8192 * 8192 * 2
    assert copy.end_us - copy.start_us == pytest.approx(nbytes / (hw.hbm_gbps * 1e3 * hw.hbm_efficiency), rel=1e-9)


@pytest.mark.parametrize("part", ["sync_wait", "exposed_transfer", "locality"])
def test_a_negative_tax_is_refused(monkeypatch, part):
    w = _planted(monkeypatch, "gemm-rs", part, -3.0, world=2)
    with pytest.raises(model.ModelInconsistency) as e:
        predict(w, "bsp", BUILTIN["h200-sxm"])
    assert_one_line(str(e.value))
    assert "negative" in str(e.value) and part in str(e.value)


def test_a_negative_launch_tax_is_refused():
    pred = predict(make_workload("gemm-rs", {}, 2), "bsp", BUILTIN["h200-sxm"])
    bad = dataclasses.replace(pred, components=pred.components | {"launch": -1.0})
    with pytest.raises(model.ModelInconsistency, match="kernel-launch tax's launch is negative"):
        model.check(bad)


def test_a_floor_above_the_prediction_is_refused():
    pred = predict(make_workload("ag-gemm", {}, 2), "fused-push", BUILTIN["h200-sxm"])
    model.check(pred)  # as predicted it passes
    higher = dataclasses.replace(pred.floor, compute_us=pred.e2e_us * 1.01)
    with pytest.raises(model.ModelInconsistency, match="floor"):
        model.check(dataclasses.replace(pred, floor=higher))


def test_a_graph_dearer_than_eager_is_refused():
    """A profile whose one replay costs more than every eager launch of the same steps together."""
    hw = dataclasses.replace(BUILTIN["h200-sxm"], launch_host_us={"triton": 3.0, "nccl": 3.0, "graph": 80.0})
    w = make_workload("flash-decode", {"S": 32768}, 2)
    assert predict(w, "bsp", hw).components["launch"] < 80.0
    with pytest.raises(model.ModelInconsistency) as e:
        predict(w, "bsp-graph", hw)
    assert_one_line(str(e.value))
    assert "CUDA graph" in str(e.value)


@pytest.mark.parametrize("hw_name", ["h100-sxm", "h200-sxm"])
def test_flash_decode_graph_pays_no_more_launch_than_eager(hw_name):
    """Flash decode at world 2, S=32K: the eager kernels queue behind the decode; a graph replays the same
    kernels with no more than a stream's gap between them, so it can never be the slower of the two."""
    hw = BUILTIN[hw_name]
    w = make_workload("flash-decode", {"B": 1, "S": 32768}, 2)
    eager, graph = predict(w, "bsp", hw), predict(w, "bsp-graph", hw)
    assert graph.components["launch"] <= eager.components["launch"]
    assert graph.e2e_us <= eager.e2e_us
    # the eager kernels, queued while the decode runs, start a stream's gap after the previous one ends
    queued = [b.start_us - a.end_us for a, b in zip(eager.phases, eager.phases[1:])]
    assert all(g >= hw.launch_graph_us - 1e-9 for g in queued)


def _sweeps(name: str, world: int):
    """Every dimension of the workload swept from its smallest legal value, doubling, as `taxes model
    --sweep DIM=LO:HI` would."""
    base = make_workload(name, {}, world)
    for dim in base.dims:
        lo = world if dim in base.split_dims else 1
        if name == "flash-decode" and dim == "Hq":
            lo = base.Hkv
        if name == "flash-decode" and dim == "Hkv":
            hi = base.Hq
        else:
            hi = 1 << 17
        yield base, model.parse_sweep(f"{dim}={lo}:{hi}", base)


@pytest.mark.parametrize("hw_name", PROFILES + COMMITTED)
def test_checks_hold_on_every_sweep_of_every_profile(hw_name):
    """Every shape `taxes model --sweep` reaches, on every built-in and committed calibrated profile, at 1,
    2, 4 and 8 GPUs: predict() runs the checks on every variant (a graph against the same steps eager)."""
    from taxes.model.hardware import get_profile

    hw = get_profile(hw_name)
    count = 0
    for name in WORKLOADS:
        for world in (1, 2, 4, 8):
            for base, (dim, values) in _sweeps(name, world):
                for preds in model.sweep(base, dim, values, hw):
                    by = {p.variant: p for p in preds}
                    for p in preds:
                        model.check(p)
                        count += 1
                        twin = get(name, p.variant).eager_twin
                        if twin in by:
                            assert p.components["launch"] <= by[twin].components["launch"] + 1e-6
    assert count > 2000


def test_readings_that_are_not_numbers_fall_back_to_the_profiles_fields():
    """A profile's calibration record with unusable readings (a hand-edited file): the model takes the
    profile's own fields, as for a datasheet profile."""
    base = BUILTIN["h100-sxm"]
    broken = dataclasses.replace(base, extra={"calibration": {
        "world": 2, "nccl_curve": [{"bytes_in": "x", "us": 3}, None, {"us": -1, "bytes_in": 5}],
        "collective_curves": ["junk", {"op": "all_gather", "world": 2, "points": "none"}],
        "figures": {"first_launch_us": [1, 2], "prefilled_period_us": "fast", "peer_cta_gbps": None}}})
    for name in WORKLOADS:
        w = make_workload(name, {}, 2)
        for v in model_variants(name):
            assert predict(w, v, broken).e2e_us == pytest.approx(predict(w, v, base).e2e_us, rel=1e-12), (name, v)


@pytest.mark.parametrize("hw_name", ["h100-sxm", "h200-sxm"])
@pytest.mark.parametrize("M,world", [(512, 2), (512, 4), (1024, 4)])
def test_a_fused_gemm_of_fewer_tiles_than_sms_takes_at_least_one_tiles_time(hw_name, M, world):
    # a persistent GEMM whose output tiles do not fill the GPU cannot finish before one SM has done one whole
    # tile at its share of the GPU's peak: 64 tiles of 128 x 256 on 132 SMs leave half of them idle
    hw = BUILTIN[hw_name]
    w = make_workload("ag-gemm", {"M": M, "N": 8192, "K": 8192}, world, "bf16")
    n_local = 8192 // world
    tiles = (M // 128) * (n_local // 256)
    assert tiles < hw.sm_count
    one_tile_us = 2.0 * 128 * 256 * 8192 / (hw.peak_flops("bf16") / hw.sm_count) * 1e6
    for variant in ("fused-push", "fused-pull"):
        pred = predict(w, variant, hw, ModelOptions(tile_m=128, tile_n=256))
        kernel = pred.e2e_us - pred.components["start_skew"]
        assert kernel >= one_tile_us, (variant, kernel, one_tile_us)
        # twice the tiles (128 x 128): no longer bound by one wave of half the SMs, and predicted quicker
        halved = predict(w, variant, hw, ModelOptions(tile_m=128, tile_n=128))
        assert halved.e2e_us < pred.e2e_us


def test_the_schedule_a_document_recorded_is_the_one_predicted():
    from taxes.model.steps import options_from_config

    opt = options_from_config({"block_m": 64, "block_n": 128, "copiers": 32, "producer": "ctas", "static": False})
    assert (opt.tile_m, opt.tile_n, opt.copier_ctas) == (64, 128, 32)
    # fused-auto keeps the picked variant's configuration inside its own
    auto = options_from_config({"picked": "fused-push-graph", "config": {"block_n": 128, "copiers": 0}})
    assert (auto.tile_n, auto.copier_ctas) == (128, 0)
    assert options_from_config(None) == ModelOptions()


def test_a_collective_calibrate_did_not_time_from_idle_pays_what_idle_added_to_the_timed_launchers():
    """calibrate times the idle launch of torch, Triton and graph launches, not of NCCL's. A collective that
    starts an iteration is priced at its host time plus the median of what starting from idle added to the
    timed eager launchers, so a graph replay (timed from idle) is never predicted to start later than the
    same collective launched eagerly (with the host time alone, the eager collective started sooner)."""
    from taxes.model.figures import first_launch_us

    base = BUILTIN["h200-sxm"]
    host = {"torch": 10.0, "triton": 14.0, "triton_tma": 12.0, "graph": 4.0}
    idle = {"torch": 70.0, "triton": 60.0, "triton_tma": 50.0, "graph": 30.0}  # added: 60, 46, 38 -> median 46
    hw = dataclasses.replace(base, launch_host_us=host, launch_eager_us=13.0,
                             extra={"calibration": {"figures": {"first_launch_us": idle}}})
    assert first_launch_us(hw, "nccl") == pytest.approx(13.0 + 46.0)
    assert first_launch_us(hw, "torch") == 70.0 and first_launch_us(hw, "graph") == 30.0
    datasheet = dataclasses.replace(base, extra={})  # no idle reading at all: the host time
    assert first_launch_us(datasheet, "nccl") == pytest.approx(datasheet.launch_us("nccl"))
    for world in (2, 4):  # bsp-graph starts with the all-gather: checked against the same steps eager
        w = make_workload("ag-gemm", {"M": 1024, "N": 8192, "K": 8192}, world=world)
        graph, eager = predict(w, "bsp-graph", hw), predict(w, "bsp", hw)
        assert graph.components["launch"] <= eager.components["launch"]
