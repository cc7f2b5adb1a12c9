"""`taxes validate --planted` on emulated ranks: the pipeline of the known answers runs end to end, and the
one planted tax the host clock can carry (a host spin between launching calls) is recovered. The other rules
are checked on simulated timelines (tests/test_attribute.py) and on a GPU (reports/known_answer/)."""

from __future__ import annotations

import gzip
import json
import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.mark.slow
def test_planted_runs_and_recovers_a_host_spin_on_the_host_clock(tmp_path):
    from taxes.run.known_answers import run_planted

    out, rec = tmp_path / "ka.json", tmp_path / "ka.records.json.gz"
    # 16 iterations: the host clock of a loaded two-core runner moved 8 iterations' spin case by 10.6% once
    rows, path = run_planted(1, True, 16, "auto", str(out), 300, str(rec))
    assert path == str(out)
    doc = json.loads(out.read_text())
    assert doc["rows"] == rows and doc["metadata"]["kind"] == "known-answer"
    for r in rows:
        assert {"tax", "case", "planted_us", "recovered_us", "method", "ok"} <= set(r)
    spin = next(r for r in rows if r["tax"] == "host_bound")
    assert spin["planted_us"] > 400 and spin["ok"], spin  # 20 spins of 25 us per iteration
    records = json.loads(gzip.decompress(rec.read_bytes()))
    assert {"base", "extra", "spin", "spin_more", "graph", "unfused", "fused"} <= set(records)
    longer = next(r for r in rows if r["case"] == "a longer host spin lands in host_bound, not launch")
    assert len(longer["launch_path_us"]) == 2 and longer["planted_us"] > 400  # 20 more spins of 25 us
    assert longer["recovered_us"] > 100 and "launch_row_change_us" in longer
    assert all(len(ranks) == 1 and ranks[0]["iterations"] for ranks in records.values())


@pytest.mark.slow
def test_a_late_rank_on_emulated_ranks_is_recovered_as_the_other_ranks_sync_wait(tmp_path):
    # two emulated ranks (processes sharing the host's clock and its two cores): rank 1 is made late by
    # milliseconds before the collective of ag-gemm and gemm-rs, on its "device" (a launching call that
    # spins) and on its host. The plumbing is checked whole (ranks on one clock, the late rank's delay, the
    # rows and the records that redo them); the numbers only loosely: an emulated collective is two host
    # barriers with copies between them, and the processes' noise is a millisecond here
    from taxes.run.known_answers import run_planted

    out, rec = tmp_path / "ka.json", tmp_path / "ka.records.json.gz"
    rows, _ = run_planted(2, True, 8, "auto", str(out), 300, str(rec))
    late = [r for r in rows if r["tax"] == "sync_wait"]
    assert {(r["workload"], r["variant"], r["delay"]) for r in late} == {
        (w, "bsp", d) for w in ("ag-gemm", "gemm-rs") for d in ("device", "host")}
    for r in late:
        assert [p["rank"] for p in r["per_rank"]] == [0]
        delay = r["delay_measured_us"]
        assert delay >= 0.97 * r["delay_asked_us"], r
        if r["delay_asked_us"] >= 10_000:  # far above the noise: the waiting rank waited about that long
            assert 0.6 * delay <= r["recovered_us"] <= 1.3 * delay, r
            assert 0.6 * r["planted_us"] <= r["recovered_us"] <= 1.3 * r["planted_us"], r
        assert r["recovered_us"] > 0.2 * delay, r
    from taxes.run.planted_answers import late_rows
    from taxes.run.planted_records import results_from_records

    again = {r["case"]: r for r in late_rows(results_from_records(json.loads(gzip.decompress(rec.read_bytes()))))}
    for r in late:  # the records keep what the rows need
        assert again[r["case"]]["recovered_us"] == pytest.approx(r["recovered_us"])
