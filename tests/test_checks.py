"""The measurement's checks (taxes/checks.py, `taxes check`) on committed real documents and on edited
copies of them, so each check is seen to fail when its quantity leaves its limit."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from _util import run_cli

from taxes.checks import LIMITS, checks_frame, checks_summary
from taxes.results import load, save

ROOT = Path(__file__).resolve().parent.parent
SESSION7 = ROOT / "reports" / "profile" / "session7"
AG = SESSION7 / "ag_gemm_N8192.json.gz"
TRACED = SESSION7 / "flash_decode_traced.json.gz"
needs = pytest.mark.skipif(not AG.exists() or not TRACED.exists(), reason="no session-7 documents")


def _overall(var, name):
    return next(c["value_us"] for c in var["components"] if c["rank"] is None and c["name"] == name)


@needs
def test_every_row_is_recomputed_from_the_document():
    doc = load(AG)
    frame = checks_frame(doc)
    for case in doc["cases"]:
        shape = ",".join(f"{k}={v}" for k, v in case["shape"].items())
        by = {v["variant"]: v for v in case["variants"]}
        for v in case["variants"]:
            if not v.get("attribution"):
                assert not (frame.variant == v["variant"]).any()
                continue
            row = frame[(frame.check == "unattributed") & (frame["shape"] == shape) & (frame.variant == v["variant"])].iloc[0]
            assert row.error == pytest.approx(v["attribution"]["unattributed_share"])
            assert row.ok == (abs(v["attribution"]["unattributed_share"]) <= 0.05)
            row = frame[(frame.check == "instrumented") & (frame["shape"] == shape) & (frame.variant == v["variant"])].iloc[0]
            assert row.error == pytest.approx(v["attribution"]["instrumented_e2e_us"] / v["e2e_us"]["median"] - 1)
        row = frame[(frame.check == "launch") & (frame["shape"] == shape)].iloc[0]
        b, g = by["bsp"], by["bsp-graph"]
        ladder = b["attribution"]["instrumented_e2e_us"] - g["attribution"]["instrumented_e2e_us"]
        timeline = _overall(b, "launch") - _overall(g, "launch")
        assert row.value == pytest.approx(timeline) and row.reference == pytest.approx(ladder)
        assert row.ok == (abs(timeline / ladder - 1) <= LIMITS["launch"])
    summary = checks_summary(frame)
    assert set(summary.check) == {"unattributed", "instrumented", "launch"}
    assert (summary.of == frame.groupby("check").size().reindex(summary.check).values).all()


@needs
def test_profiler_rows_use_the_events_busy_time_and_each_check_can_fail(tmp_path, capsys):
    doc = load(TRACED)
    frame = checks_frame(doc)
    prof = frame[frame.check == "profiler"]
    pc = doc["cases"][0]["extra"]["profiler_check"][0]["bsp"]["split-kv"]
    row = prof[(prof["shape"].str.contains("B=1,")) & (prof["where"] == "rank 0 split-kv") & (prof.variant == "bsp")].iloc[0]
    assert row.value == pytest.approx(pc["events_busy_us"]) and row.reference == pytest.approx(pc["cupti_us"])
    assert pc["events_busy_us"] <= pc["events_us"]
    # a document that passes a check fails it once its number is pushed past the limit
    bad = copy.deepcopy(doc)
    v = bad["cases"][0]["variants"][0]
    v["attribution"]["unattributed_share"] = 0.2
    v["attribution"]["instrumented_e2e_us"] = v["e2e_us"]["median"] * 1.5
    f2 = checks_frame(bad)
    first = (f2["shape"] == f2["shape"].iloc[0]) & (f2.variant == v["variant"])
    assert not f2[first & (f2.check == "unattributed")].ok.iloc[0]
    assert not f2[first & (f2.check == "instrumented")].ok.iloc[0]
    path = tmp_path / "bad.json"
    save(bad, path)
    code, out, _ = run_cli(["check", str(path)], capsys)
    assert code == 0 and "| unattributed |" in out and "Failing:" in out
    code, _, _ = run_cli(["check", str(path), "--strict"], capsys)
    assert code == 1


def test_check_refuses_a_model_document_in_one_line(tmp_path, capsys):
    code, out, _ = run_cli(["model", "ag-gemm", "--format", "json", "-o", str(tmp_path / "m.json")], capsys)
    assert code == 0
    code, out, err = run_cli(["check", str(tmp_path / "m.json")], capsys)
    assert code == 2 and "measured document" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "x.json").write_text(json.dumps({"nope": 1}))
    code, out, err = run_cli(["check", str(tmp_path / "x.json")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
