"""`taxes profile` end to end on emulated ranks (the kernels under Triton's interpreter, the host clock as
the per-kernel clock): every variant checked, timed plain and instrumented, attributed with rows that add
up to the E2E printed with them; every committed profile document carries rows; re-attribution from the
stored records. No GPU needed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
from committed import committed, result_documents

from taxes.attribution.attribute import ROWS
from taxes.documents.results import load, validate

ROOT = Path(__file__).resolve().parent.parent


TINY_AG = dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=2, chunk_rows=8,
               copy_block=256, grid=4)


def overall(v):
    return {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None}


def assert_rows_add_up(v):
    oc = overall(v)
    assert set(oc) == set(ROWS)
    assert math.fsum(oc.values()) == pytest.approx(v["attributed_e2e_us"], rel=1e-9)
    for r in {c["rank"] for c in v["components"] if c["rank"] is not None}:
        per = [c["value_us"] for c in v["components"] if c["rank"] == r]
        assert len(per) == len(ROWS)


@pytest.mark.slow
def test_emulated_profile_of_both_workloads_checks_every_variant_and_closes():
    from taxes.run.profile import profile

    ag = profile("ag-gemm", ["M=64,N=48,K=32", "M=32,N=32,K=16"], 2, iters=3, warmup=1, emulate=True,
                 config=TINY_AG, timeout_s=300)
    fd = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=40", 2, iters=3, warmup=1, emulate=True,
                 config={"block_n": 16}, timeout_s=300)
    for doc, n_cases, names in ((ag.document, 2, {"bsp", "bsp-graph", "fused-pull", "fused-push", "fused-push-graph",
                                                  "fused-auto"}),
                                (fd.document, 1, {"bsp", "bsp-graph", "fused-push", "fused-push-graph", "bsp-sdpa",
                                                  "bsp-sdpa-graph", "fused-auto"})):
        validate(doc)
        assert doc["metadata"]["emulated"] is True and len(doc["cases"]) == n_cases
        for case in doc["cases"]:
            assert {v["variant"] for v in case["variants"]} == names
            for v in case["variants"]:
                assert v["correctness"]["passed"], (v["variant"], v["config"])
                assert len(v["samples_us"]) == 2 and all(len(s) == 3 for s in v["samples_us"])
                assert {c["rank"] for c in v["components"]} == {0, 1, None}
                assert v["prediction"]["label"] == "predicted"
                assert_rows_add_up(v)
                assert v["plain_e2e_us"] > 0 and v["measurement_cost_us"] == pytest.approx(
                    v["attributed_e2e_us"] - v["plain_e2e_us"])
                assert v["attribution"]["clock"] == "host" and len(v["records"]["ranks"]) == 2
    assert set(ag.components["component"]) == set(ROWS)
    assert not fd.phases.empty
    # a flash-decode document says what ran: our decode's resolved splits and programs (40 tokens in blocks of
    # 16: at most 3 splits per group), PyTorch's attention backend (none under emulation: the float32 path)
    cfg = {v["variant"]: v["config"] for v in fd.document["cases"][0]["variants"]}
    for name in ("bsp", "bsp-graph", "fused-push", "fused-push-graph"):
        assert cfg[name]["block_n"] == 16 and 1 <= cfg[name]["splits"] <= 3
        assert cfg[name]["programs"] == 1 * 2 * cfg[name]["splits"]
    assert cfg["bsp-sdpa"] == {"sdpa_backend": None, "block_r": 16}
    assert cfg["fused-auto"]["picked"] in names and "config" in cfg["fused-auto"]


_CALLS = []  # the order in which the fake plain timing below was called (one list per forked rank)


def _numbered_timing(ctx, run, input_sets, iters, warmup, label="", align=None):
    """Stands in for taxes.run.harness.time_iterations: runs the variant once, returns the call's number per sample."""
    run(*input_sets[0])
    _CALLS.append(label)
    return [float(len(_CALLS) - 1)] * iters


def _counted_instrumented_block(*args, **kwargs):
    """The real instrumented block, counted in the same sequence as the fake plain timing above."""
    _CALLS.append("instrumented")
    return _REAL_INSTRUMENTED_BLOCK(*args, **kwargs)


@pytest.mark.slow
def test_emulated_profile_interleaves_the_variants_in_rounds(monkeypatch):
    from taxes.run import measure
    from taxes.run.profile import profile

    global _REAL_INSTRUMENTED_BLOCK
    _REAL_INSTRUMENTED_BLOCK = measure._instrumented_block
    monkeypatch.setattr(measure, "time_iterations", _numbered_timing)  # the forked ranks inherit it
    monkeypatch.setattr(measure, "_instrumented_block", _counted_instrumented_block)
    doc = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=24", 2, ["bsp", "fused-push"], iters=5, warmup=0,
                  emulate=True, config={"block_n": 16}, timeout_s=300, rounds=2).document
    validate(doc)
    assert doc["metadata"]["rounds"] == 2
    samples = {v["variant"]: v["samples_us"] for v in doc["cases"][0]["variants"]}
    # fused and other variants take turns, the fused one first (taxes.run.measure.alternate_fused). Round 1:
    # 3 plain iterations of fused-push (call 0), its traced build without the clock (1) and its instrumented
    # block (2), then bsp's plain (3) and instrumented block (4); round 2 puts each variant's instrumented
    # block first (5, 8), fused-push's traced build in the middle (6) and the 2 plain iterations last (7, 9)
    traced = {v["variant"]: v.get("traced_samples_us") for v in doc["cases"][0]["variants"]}
    assert traced["bsp"] is None  # no traced build: no such block
    for rank in (0, 1):
        assert samples["bsp"][rank] == [3.0] * 3 + [9.0] * 2
        assert samples["fused-push"][rank] == [0.0] * 3 + [7.0] * 2
        assert traced["fused-push"][rank] == [1.0] * 3 + [6.0] * 2
    for v in doc["cases"][0]["variants"]:
        assert v["correctness"]["passed"]
        # the instrumented iterations, per rank, too: 5 timed windows in each rank's timeline
        assert [sum(not it["warmup"] for it in r["iterations"]) for r in v["records"]["ranks"]] == [5, 5]


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
    (["profile", "ag-gemm", "--emulate", "--config", "copiers=many"], "ag-gemm's copiers is a whole number"),
    (["profile", "ag-gemm", "--emulate", "--config", "split_k=1.5"], "ag-gemm's split_k is a whole number"),
    (["profile", "ag-gemm", "--emulate", "--config", "warp_spec=1"], "ag-gemm's warp_spec is true or false"),
    (["profile", "ag-gemm", "--emulate", "--config", "tiles=4"], "ag-gemm has no configuration key 'tiles'"),
    (["profile", "flash-decode", "--emulate", "--config", "tma=yes"], "flash-decode's tma is true or false"),
    (["profile", "gemm-rs", "--emulate", "--config", "producer=3"], "gemm-rs's producer is a word"),
    (["profile", "tp-mlp", "--emulate", "--config", "rs.block_n=wide"], "tp-mlp's rs.block_n is a whole number"),
    (["profile", "tp-mlp", "--emulate", "--config", "xx.block_n=1"], "tp-mlp has no configuration key"),
    (["profile", "ag-gemm", "--emulate", "--iters", "0"], "--iters"),
    (["profile", "ag-gemm", "--emulate", "--rounds", "0"], "--rounds"),
    (["profile", "ag-gemm", "--emulate", "--start", "sometime"], "--start"),
])
def test_bad_profile_input_is_one_line_and_exit_2(argv, needle):
    r = subprocess.run([sys.executable, "-m", "taxes.cli.main"] + argv, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr


@pytest.mark.slow
def test_emulated_profile_of_gemm_rs():
    from taxes.run.profile import profile

    res = profile("gemm-rs", "M=64,N=40,K=48", 2, iters=2, warmup=0, emulate=True,
                  config=dict(block_m=16, block_n=16, block_k=16, grid=4), timeout_s=300)
    validate(res.document)
    variants = res.document["cases"][0]["variants"]
    assert {v["variant"] for v in variants} == {"bsp", "bsp-graph", "fused-push", "fused-push-graph", "fused-auto"}
    assert all(v["correctness"]["passed"] for v in variants)
    for v in variants:
        assert_rows_add_up(v)
        for r in (0, 1):
            total = math.fsum(c["value_us"] for c in v["components"] if c["rank"] == r)
            assert total > 0 and all(math.isfinite(c["value_us"]) for c in v["components"])


@pytest.mark.slow
def test_report_reattributes_a_measured_document_from_its_stored_records(tmp_path, model_doc):
    from taxes.run.profile import profile

    doc = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=24", 2, ["bsp", "fused-push"], iters=4, warmup=1,
                  emulate=True, config={"block_n": 16}, timeout_s=300, hardware="h200-sxm").document
    path = tmp_path / "run.json"
    path.write_text(json.dumps(doc))
    base = [sys.executable, "-m", "taxes.cli.main", "report", str(path), "--format", "json"]
    same = json.loads(subprocess.run(base, capture_output=True, text=True, timeout=120, check=True).stdout)
    other = json.loads(subprocess.run(base + ["--hardware", "mi300x"], capture_output=True, text=True,
                                      timeout=120, check=True).stdout)
    for a, b in zip(same["report"]["cases"][0]["variants"], other["report"]["cases"][0]["variants"]):
        assert a["e2e_us"] == b["e2e_us"] and a["attributed_e2e_us"] == pytest.approx(b["attributed_e2e_us"], rel=1e-9)
        assert a["components_us"]["ideal"] != pytest.approx(b["components_us"]["ideal"])
        assert math.fsum(b["components_us"].values()) == pytest.approx(b["attributed_e2e_us"])
    predicted = tmp_path / "model.json"
    predicted.write_text(json.dumps(model_doc))
    model = subprocess.run([sys.executable, "-m", "taxes.cli.main", "report", str(predicted), "--hardware", "h200-sxm"],
                           capture_output=True, text=True, timeout=120)
    assert model.returncode == 2 and "re-attributes measured documents" in model.stderr


def tuning_run(doc: dict) -> bool:
    """A tuning run's document (`--tune` in its command): every candidate's time, the evidence of a tuned
    table (kernels/*_tuned.json), not a profile of the variants."""
    return "--tune" in (doc["metadata"].get("command") or "")


def assert_profile_has_rows(doc: dict) -> None:
    """Every measured variant of every case has rows that add up to its instrumented E2E, except
    PyTorch's own fused ops where they were timed plain."""
    from taxes.variants import get

    for case in doc["cases"]:
        for v in case["variants"]:
            if not v.get("samples_us"):
                continue
            name = f"{case['workload']} {case['shape']} {v['variant']}"
            if not v["components"] and get(case["workload"], v["variant"]).peer:
                assert v.get("plain_e2e_us") is not None, name  # timed plain: its E2E stands
                continue
            assert (v.get("attribution") or {}).get("available") and v["components"], f"{name}: no rows"
            oc = overall(v)
            assert math.fsum(oc.values()) == pytest.approx(v["attributed_e2e_us"], rel=0.01), name


@pytest.mark.parametrize("path", result_documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_profile_documents_carry_rows_that_add_up(path):
    """The result set's rule: no committed profile document lacks rows."""
    doc = load(path)
    if doc["metadata"].get("kind") == "profile" and not tuning_run(doc):
        assert_profile_has_rows(doc)


def test_the_rows_rule_catches_a_profile_without_rows():
    doc = load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))
    assert_profile_has_rows(doc)
    assert not tuning_run(doc)
    v = doc["cases"][1]["variants"][2]  # fused-pull at M=8192
    v["components"], v["attribution"] = [], {"available": False, "why": "older rules"}
    with pytest.raises(AssertionError, match="fused-pull: no rows"):
        assert_profile_has_rows(doc)


def test_memory_check_counts_every_variant_kept_alive_across_rounds():
    from taxes.run import preflight
    from taxes.run.profile import bytes_for_case
    from taxes.workloads import make_workload

    w = make_workload("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, 2, "bf16")
    names = ["bsp", "bsp-graph", "fused-pull", "fused-push-graph"]
    alone = {v: preflight.bytes_needed(w, v.removesuffix("-graph") if v.startswith("fused") else v, 4) for v in names}
    need = bytes_for_case(w, names, 4)
    # bsp and bsp-graph each hold their own gathered A (M x K): one more than the largest variant alone
    assert need == pytest.approx(max(alone.values()) + 8192 * 8192 * 2)
    assert bytes_for_case(w, ["fused-pull"], 4) == pytest.approx(alone["fused-pull"])


@pytest.mark.slow
def test_an_iteration_start_aligned_on_the_devices_is_run_and_said(monkeypatch):
    # each timed iteration, plain and instrumented, runs the aligned start after the barrier and before its
    # start event (counted in the forked ranks through a shared file), and the document says which start ran
    import tempfile

    from taxes.run import harness
    from taxes.run.profile import profile

    calls = tempfile.NamedTemporaryFile(delete=False)
    real = harness.AlignedStart.__call__

    def counted(self):
        with open(calls.name, "a") as f:
            f.write("x")
        real(self)

    monkeypatch.setattr(harness.AlignedStart, "__call__", counted)
    doc = profile("flash-decode", "B=1,Hq=8,Hkv=2,D=64,S=24", 2, ["bsp"], iters=3, warmup=1, emulate=True,
                  config={"block_n": 16}, timeout_s=300, rounds=1, start="aligned").document
    validate(doc)
    assert doc["metadata"]["iteration_start"]["mode"] == "aligned"
    assert doc["metadata"]["iteration_start"]["barrier"] == "the emulated ranks' barrier"  # which barrier ran
    n = len(open(calls.name).read())
    # 2 ranks x (plain: 1 warm-up + 3, instrumented: 1 warm-up + 3)
    assert n == 2 * (4 + 4), n



def test_fused_and_other_variants_take_turns_in_each_round():
    # the timing order puts a bulk-synchronous variant between two fused ones wherever the numbers allow,
    # each kind keeping its own order; what is left of the more numerous kind comes last
    from taxes.run.measure import alternate_fused

    names = ["all-bsp", "all-graph", "all-fused-eager", "all-fused"]
    fused = {"all-fused-eager", "all-fused", "x"}
    assert alternate_fused(names, fused.__contains__) == ["all-fused-eager", "all-bsp", "all-fused", "all-graph"]
    got = alternate_fused(names + ["x"], fused.__contains__)
    assert got == ["all-fused-eager", "all-bsp", "all-fused", "all-graph", "x"]
    assert alternate_fused(["a", "b", "c"], lambda n: False) == ["a", "b", "c"]
    assert sorted(alternate_fused(names, lambda n: n.endswith("graph"))) == sorted(names)


def test_config_values_are_read_as_the_fields_declare_them():
    from taxes.run.cases import check_config
    from taxes.run.profile import parse_config

    got = parse_config("block_n=128,producer=copy-engine,warp_spec=true,split_epilogue=false,x=0.5,y=-3,z=1e3")
    assert got == {"block_n": 128, "producer": "copy-engine", "warp_spec": True, "split_epilogue": False,
                   "x": 0.5, "y": -3, "z": 1000.0}
    assert parse_config("producer=nan,q=inf")["producer"] == "nan"  # not a finite number: left a word
    check_config("ag-gemm", {"block_n": 128, "producer": "copy-engine", "warp_spec": True, "split_k": 2})
    check_config("flash-decode", {"tma": None, "splits": 4, "signal": "data"})
    check_config("tp-mlp", {"block_m": 16, "ag.copiers": 2, "rs.producer": "ctas"})
