"""`taxes validate --from`: predicted against measured per variant, per tax and per world, the spread over
calibrations, the held-out shapes; and the committed validation tables against the committed documents."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from _util import assert_one_line, run_cli

from taxes.documents import validation
from taxes.errors import TaxesError
from taxes.model.hardware import BUILTIN, get_profile
from taxes.model.predict import predict
from taxes.documents.results import load
from taxes.workloads import make_workload

ROOT = Path(__file__).resolve().parent.parent


def _variant(name: str, measured_e2e: float, rows: dict, predicted: dict, model_variant: str | None = None) -> dict:
    """A measured variant as a result document holds it: its plain E2E, its overall rows (rank null) and the
    model's prediction; a rank's rows that must not count beside them."""
    comps = [{"name": k, "rank": None, "value_us": v, "label": "measured"} for k, v in rows.items()]
    comps += [{"name": k, "rank": 0, "value_us": 1e6, "label": "measured"} for k in rows]
    return {"variant": name, "plain_e2e_us": measured_e2e, "e2e_us": {"median": measured_e2e + 1.0},
            "components": comps, "prediction": {"variant": model_variant or name, "e2e_us": sum(predicted.values()),
                                                "components": predicted}}


def _doc(world: int, variants: list[dict], shape=None) -> dict:
    shape = shape or {"M": 1024, "N": 2048, "K": 4096}
    return {"metadata": {}, "cases": [{"workload": "ag-gemm", "shape": shape, "world": world, "dtype": "bf16",
                                       "variants": variants}]}


MEASURED = {"ideal": 50.0, "launch": 6.0, "host_bound": 3.0, "graph_gaps": 1.0, "sync_wait": 4.0,
            "exposed_transfer": 16.0, "start_skew": 5.0, "locality": 2.0, "inefficiency": 13.0}
PREDICTED = {"ideal": 50.0, "launch": 5.0, "sync_wait": 0.0, "exposed_transfer": 25.0, "start_skew": 5.0,
             "locality": 3.0, "inefficiency": 2.0}


def test_rows_compare_every_tax_with_the_measured_rows_of_the_slowest_rank():
    (row,) = validation.validation_rows([_doc(2, [_variant("bsp", 100.0, MEASURED, PREDICTED)])])
    # E2E: the plain interquartile mean, 100 measured against 90 predicted
    assert row["measured_e2e_us"] == 100.0 and row["predicted_e2e_us"] == 90.0
    assert row["e2e_error_pct"] == pytest.approx(-10.0)
    # bulk-synchronous: 4 + 16 = 20 measured against 0 + 25: +25%, a fifth of E2E
    assert row["measured_bulk-synchronous_us"] == 20.0 and row["predicted_bulk-synchronous_us"] == 25.0
    assert row["bulk-synchronous_error_pct"] == pytest.approx(25.0) and row["bulk-synchronous_share_pct"] == 20.0
    # kernel-launch: launch, host-bound and the graph's gaps, 6 + 3 + 1 = 10 against 5: -50%
    assert row["measured_kernel-launch_us"] == 10.0 and row["kernel-launch_error_pct"] == pytest.approx(-50.0)
    assert row["kernel-launch_error_us"] == pytest.approx(-5.0)
    # locality 2 against 3: +50%; the start skew (no tax) 5 against 5
    assert row["data-locality_error_pct"] == pytest.approx(50.0)
    assert row["start skew_error_pct"] == 0.0
    assert row["world"] == 2 and row["shape"] == "M=1024,N=2048,K=4096"


def test_rows_skip_what_has_no_prediction_and_keep_the_model_variant_that_predicts():
    no_pred = _variant("torch-async-tp", 80.0, MEASURED, PREDICTED)
    del no_pred["prediction"]
    sdpa = _variant("bsp-sdpa", 200.0, MEASURED, PREDICTED, model_variant="bsp")
    no_rows = _variant("bsp", 100.0, {}, PREDICTED)
    rows = validation.validation_rows([_doc(2, [no_pred, sdpa, no_rows])])
    assert [(r["variant"], r["model_variant"]) for r in rows] == [("bsp-sdpa", "bsp"), ("bsp", "bsp")]
    assert "kernel-launch_error_pct" not in rows[1]  # no measured rows: E2E alone
    assert rows[1]["e2e_error_pct"] == pytest.approx(-10.0)


def test_summaries_per_world_and_where_a_tax_matters():
    small = dict(MEASURED, exposed_transfer=0.0, sync_wait=1.0)  # bulk-sync 1 us of 100: below 5%
    docs = [_doc(1, [_variant("bsp", 100.0, small, PREDICTED)]),
            _doc(2, [_variant("bsp", 100.0, MEASURED, PREDICTED), _variant("bsp-graph", 50.0, MEASURED, PREDICTED)])]
    rows = validation.validation_rows(docs)
    by_world = validation.per_world(rows)
    assert set(by_world) == {"1", "2"}
    two = by_world["2"]
    # E2E: -10% (90 of 100) and +80% (90 of 50)
    assert two["e2e"]["mean_absolute_error_pct"] == pytest.approx(45.0)
    assert two["e2e"]["mean_signed_error_pct"] == pytest.approx(35.0)
    assert two["e2e"]["within_10_pct"] == 1 and two["e2e"]["worst"]["variant"] == "bsp-graph"
    bulk = two["per_tax"]["bulk-synchronous"]["where_it_matters"]
    assert bulk["cases"] == 2 and bulk["mean_signed_error_pct"] == pytest.approx(25.0) and bulk["within_25_pct"] == 2
    # at world 1 the planted bulk-sync tax is 1% of E2E: it counts in the overall error, not where it matters
    one = by_world["1"]["per_tax"]["bulk-synchronous"]
    assert one["cases"] == 1 and "where_it_matters" not in one


def _checkout(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "kernels").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        'SHAPES = ["M=2048,N=8K,K=8192"]\n'
        'w = make_workload("flash-decode", {"B": 4, "S": 32768}, 2)\n'
        'd = make_workload("gemm-rs", {}, 4)\n')
    (tmp_path / "kernels" / "ag_gemm_tuned.json").write_text(json.dumps({"entries": [
        {"variant": "fused-push", "M": 512, "N": 28672, "K": 4096, "world": 2}]}))
    (tmp_path / "kernels" / "flash_decode_tuned.json").write_text(json.dumps({"tables": [  # one per GPU kind
        {"gpu": "A", "entries": [{"B": 1, "Hkv": 8, "S": 8192, "D": 128}]},
        {"gpu": "B", "entries": [{"B": 16, "Hkv": 8, "S": 8192, "D": 128}]}]}))
    return tmp_path


@pytest.mark.parametrize("workload, shape, tests, tables", [
    ("ag-gemm", {"M": 2048, "N": 8192, "K": 8192}, ["test_a.py"], []),  # a --shape string, 8K spelled so
    ("ag-gemm", {"M": 2048, "N": 8192, "K": 4096}, [], []),  # one dimension off: held out
    ("flash-decode", {"B": 4, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, ["test_a.py"], []),  # a dict, defaults filled
    ("flash-decode", {"B": 16, "Hq": 64, "Hkv": 8, "D": 128, "S": 8192}, [], ["kernels/flash_decode_tuned.json"]),
    ("gemm-rs", {"M": 8192, "N": 8192, "K": 8192}, ["test_a.py"], []),  # make_workload(..., {}): the defaults
    ("tp-mlp", {"M": 512, "H": 4096, "F": 14336}, [], ["kernels/ag_gemm_tuned.json"]),  # its first GEMM was tuned
    ("tp-mlp", {"M": 1024, "H": 4096, "F": 14336}, [], []),
])
def test_held_out_means_in_no_test_and_no_tuning_table(tmp_path, workload, shape, tests, tables):
    (got,) = validation.held_out([(workload, shape)], _checkout(tmp_path))
    assert got["in_tests"] == tests and got["in_tuning_tables"] == tables
    assert got["held_out"] == (not tests and not tables) and got["known"]


def test_the_spread_over_calibrations_predicts_with_each():
    """Planted: the measured E2E is exactly what h100-sxm predicts; a profile with dearer launches
    predicts more."""
    hw = BUILTIN["h100-sxm"]
    dear = dataclasses.replace(hw, name="dear", launch_eager_us=hw.launch_eager_us + 100.0)
    w = make_workload("ag-gemm", {"M": 1024, "N": 2048, "K": 4096}, 2)
    truth = predict(w, "bsp", hw).e2e_us
    spread = validation.calibration_spread([_doc(2, [_variant("bsp", truth, MEASURED, PREDICTED)])], [hw, dear])
    exact, high = spread["profiles"]
    assert exact["profile"] == "h100-sxm" and exact["e2e_mean_absolute_error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert high["e2e_mean_signed_error_pct"] > 0
    (row,) = spread["rows"]
    assert row["least_error_pct"] == pytest.approx(0.0, abs=1e-9) and row["greatest_error_pct"] > 0


def test_a_document_whose_profile_is_gone_is_validated_with_its_machines_calibration():
    doc = {"metadata": {"hardware_profile": "h100-sxm-calibrated", "gpu_names": ["NVIDIA H100 80GB HBM3"] * 2,
                        "world_size": 2}, "cases": []}
    hw, why = validation.document_profile(doc)
    assert hw.name == "h100-x2-calibrated" and "calibrated" in why
    named = dict(doc, metadata=doc["metadata"] | {"hardware_profile": "h100-sxm"})
    assert validation.document_profile(named)[0] is BUILTIN["h100-sxm"]


def test_each_calibration_needs_a_directory_of_profiles(tmp_path):
    with pytest.raises(TaxesError, match="not a directory"):
        validation.calibrations_in(tmp_path / "none")
    (tmp_path / "raw.json").write_text("{}")
    with pytest.raises(TaxesError, match="no hardware profile"):
        validation.calibrations_in(tmp_path)


def test_validate_cli_writes_the_table_per_world_with_the_held_out_list(capsys):
    doc = str(ROOT / "reports" / "profile" / "gemm_rs-h100-x2.json.gz")
    code, out, err = run_cli(["validate", "--from", doc, "--format", "json"], capsys)
    assert code == 0, err
    table = json.loads(out)
    assert table["hardware"] == "h100-x2-calibrated" and table["documents"] == [doc]
    assert set(table["per_world"]) == {"2"} and table["cases"] == 4
    assert [h["shape"] for h in table["held_out"]] == ["M=4096,N=4096,K=14336"]
    measured = {v["variant"]: v["plain_e2e_us"] for v in load(doc)["cases"][0]["variants"]}
    for r in table["rows"]:
        assert r["measured_e2e_us"] == measured[r["variant"]]  # the measured numbers as committed
    code, out, err = run_cli(["validate", "--from", doc, "--each-calibration", str(ROOT / "README.md")], capsys)
    assert code == 2
    assert_one_line(err.strip())


# ---- the committed tables ----------------------------------------------------------------------------

TABLES = sorted((ROOT / "reports" / "validate").glob("h100-x*.json"))


def test_the_h100_tables_exist_for_one_two_and_four_gpus():
    assert [p.name for p in TABLES] == ["h100-x1.json", "h100-x2.json", "h100-x4.json"]


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_a_committed_table_is_its_documents_measured_against_todays_model(path):
    """Every row's measured E2E is the committed document's, and its predicted E2E is what the model says
    today with the table's profile: a table that falls behind the model fails here."""
    from taxes.model.steps import options_from_config

    table = json.loads(path.read_text())
    hw = get_profile(table["hardware"])
    measured = {}
    for name in table["documents"]:
        for case in load(ROOT / name)["cases"]:
            for v in case["variants"]:
                measured[(name, case["workload"], validation.shape_text(case["shape"]), v["variant"])] = (case, v)
    for r in table["rows"]:
        case, v = measured.pop((r["document"], r["workload"], r["shape"], r["variant"]))
        assert r["measured_e2e_us"] == v["plain_e2e_us"]
        w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
        opt = options_from_config(v.get("config"))  # the schedule the variant ran
        assert r["predicted_e2e_us"] == pytest.approx(predict(w, r["model_variant"], hw, opt).e2e_us, rel=1e-9), r
    assert all(not v.get("prediction") for _, v in measured.values())  # every predicted variant has its row
    assert table["per_world"] and all(h["known"] for h in table["held_out"])
