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
    from taxes.cli.profile_cmd import run_planted

    out, rec = tmp_path / "ka.json", tmp_path / "ka.records.json.gz"
    rows, path = run_planted(1, True, 8, "auto", str(out), 300, str(rec))
    assert path == str(out)
    doc = json.loads(out.read_text())
    assert doc["rows"] == rows and doc["metadata"]["kind"] == "known-answer"
    for r in rows:
        assert {"tax", "case", "planted_us", "recovered_us", "method", "ok"} <= set(r)
    spin = next(r for r in rows if r["tax"] == "host_bound")
    assert spin["planted_us"] > 400 and spin["ok"], spin  # 20 spins of 25 us per iteration
    records = json.loads(gzip.decompress(rec.read_bytes()))
    assert {"base", "extra", "spin", "spin_more", "graph", "unfused", "fused"} <= set(records)
    longer = next(r for r in rows if r["case"] == "a longer host spin leaves launch unchanged")
    assert len(longer["launch_path_us"]) == 2 and longer["host_bound_change_us"] > 100  # 20 more spins of 25 us
    assert all(len(ranks) == 1 and ranks[0]["iterations"] for ranks in records.values())
