"""benchmarks/tune.py: the fused kernels' tuning through taxes profile's pipeline, on emulated ranks (the
candidates built, checked against float32 and timed; times mean nothing here), and the merge into a
tuned table."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from taxes.run.cases import TOLERANCE
from taxes.kernels import gemm_rs as rs

# the script by its name, so that the emulated ranks (spawned processes) import its rank job too
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tune  # noqa: E402


@pytest.mark.slow
def test_emulated_gemm_rs_tuning_checks_every_candidate_and_keeps_the_fastest(tmp_path):
    table_before = rs.TUNED_FILE.read_bytes()
    assert tune.main(["gemm-rs", "--emulate", "--install", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gemm-rs-tune.json").read_text())
    rows, entries = doc["rows"], doc["entries"]
    assert doc["metadata"]["emulated"] and doc["metadata"]["command"].startswith("benchmarks/tune.py gemm-rs")
    assert [r["variant"] for r in rows][0] == "bsp-graph"
    fused = [r for r in rows if r["variant"] == "fused-push-graph" and not r.get("winner")]
    assert {r["config"]["producer"] for r in fused} == {"ctas", "copy-engine"}
    assert all(r["error"] is None and 0 <= r["rel_error"] <= TOLERANCE for r in rows)  # every candidate checked
    (entry,) = entries
    winner = [r for r in rows if r.get("winner")]
    assert len(winner) == 1 and entry["median_us"] == winner[0]["median_us"] and entry["config"] == winner[0]["config"]
    assert winner[0]["overrides"] == min(fused, key=lambda r: r["median_us"])["overrides"]
    assert entry["world"] == 2 and (entry["M"], entry["N"], entry["K"]) == (64, 32, 64)
    assert "benchmarks/tune.py gemm-rs --emulate --install" in entry["how"] and str(tmp_path) not in entry["how"]
    assert rs.TUNED_FILE.read_bytes() == table_before  # emulated entries never reach the kernel's table


def test_a_tuned_table_keeps_the_command_without_its_output_directory():
    argv = ["ag-gemm", "--out", "/scratch/tune", "--iters", "3", "--out=/scratch/t2", "--install"]
    assert tune.shipped_command(argv) == "benchmarks/tune.py ag-gemm --iters 3 --install"


def test_install_replaces_only_the_same_variant_shape_and_world(tmp_path):
    table = tmp_path / "tuned.json"
    old = [{"variant": "fused-push", "M": 1024, "N": 8, "K": 8, "world": 2, "config": {"copiers": 8}},
           {"variant": "fused-push", "M": 1024, "N": 8, "K": 8, "world": 8, "config": {"copiers": 32}},
           {"variant": "fused-pull", "M": 1024, "N": 8, "K": 8, "world": 2, "config": {"copiers": 16}}]
    table.write_text(json.dumps({"made_by": "x", "entries": old}))
    new = [{"variant": "fused-push", "M": 1024, "N": 8, "K": 8, "world": 2, "config": {"copiers": 64}},
           {"variant": "fused-push", "M": 2048, "N": 8, "K": 8, "world": 2, "config": {"copiers": 16}}]
    tune.install(table, new)
    got = json.loads(table.read_text())
    assert got["made_by"] == "x"
    assert sorted((e["variant"], e["M"], e["world"], e["config"]["copiers"]) for e in got["entries"]) == [
        ("fused-pull", 1024, 2, 16), ("fused-push", 1024, 2, 64), ("fused-push", 1024, 8, 32), ("fused-push", 2048, 2, 16)]


def test_ag_gemm_candidates_vary_copiers_chunks_and_producers():
    shape = {"M": 8192, "N": 8192, "K": 8192}
    push = tune.ag_gemm_candidates("fused-push-graph", shape, 2, {}, ("ctas", "copy-engine"))
    ctas = [c for c in push if c["producer"] == "ctas"]
    assert sorted({c["copiers"] for c in ctas}) == [8, 16, 32] and sorted({c["chunk_rows"] for c in ctas}) == [16, 64]
    assert sorted(c["chunk_rows"] for c in push if c["producer"] == "copy-engine") == [256, 512, 1024]  # shard / 16, 8, 4
    pull = tune.ag_gemm_candidates("fused-pull", shape, 8, {"num_stages": 4}, ("copy-engine",))
    assert {c["producer"] for c in pull} == {"ctas"} and sorted({c["copiers"] for c in pull}) == [16, 32, 48, 64]
    assert all(c["num_stages"] == 4 for c in pull)


def test_ag_gemm_candidates_split_k_only_where_the_per_rank_gemm_is_under_a_wave():
    big = tune.ag_gemm_candidates("fused-push", {"M": 8192, "N": 8192, "K": 8192}, 2, {}, ("ctas",))
    assert all(c.get("split_k", 1) == 1 for c in big)  # 32 x 16 tiles of 128 x 256: several waves
    small = tune.ag_gemm_candidates("fused-push", {"M": 512, "N": 8192, "K": 8192}, 4, {}, ("ctas",))
    plain = [c for c in small if "split_k" not in c]
    assert sorted({c.get("split_k") for c in small if "split_k" in c}) == [2, 4]
    assert len(small) == 3 * len(plain)  # each candidate also cut into 2 and 4 K slices
    odd_k = tune.ag_gemm_candidates("fused-push", {"M": 512, "N": 8192, "K": 192}, 4, {}, ("ctas",))
    assert all(c.get("split_k", 1) == 1 for c in odd_k)  # 192 = 3 x 64: no whole K slices of 2 or 4
