"""benchmarks/copier_rate.py: the fused ag-gemm's copier rate read from the CTAs' own stamps (a planted run's
records), against a rate planted in synthetic stamps."""

from __future__ import annotations

import random
import sys

import pytest

from committed import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))


def _records(world: int, M: int, K: int, done_ns: float, kernel_ns: float, copiers: int, rng) -> dict:
    """A planted run's records for one fused case without a delay: per rank, 5 timed calls whose copier CTAs
    finish their copies at done_ns (the last one) after the kernel's first CTA started."""
    ranks = []
    for _ in range(world):
        its = []
        for _ in range(5):
            t0 = rng.randrange(10**12, 10**13)
            rows = [[t0 + rng.randrange(0, 500), t0 + int(kernel_ns) - rng.randrange(0, 3000), 0, 0, 2, 0] for _ in range(100)]
            for c in range(copiers):
                rows.append([t0 + rng.randrange(0, 500), t0 + int(kernel_ns) - rng.randrange(0, 3000), 0, 0, 1,
                             t0 + int(done_ns) - (0 if c == 0 else rng.randrange(1, 2000))])
            rows[0][0] = t0  # the kernel's first CTA
            rows[-1][1] = t0 + int(kernel_ns)
            its.append({"step": len(its), "e2e_us": 1.0, "waits": {}, "warmup": False, "ctas": {"fused-gemm": rows}})
        ranks.append({"iterations": [{"step": -1, "warmup": True}] + its,
                      "facts": {"shape": f"M={M},N=4096,K={K}", "workload": "ag-gemm", "variant": "fused-push"}})
    return {"ag-gemm fused-push device 0": ranks, "ag-gemm fused-push device 20": ranks, "base": {}}


@pytest.mark.parametrize("world, gbps", [(2, 150.0), (4, 205.0), (8, 90.0)])
def test_the_copier_rate_is_the_pushed_bytes_over_the_copies_time(world, gbps):
    from copier_rate import copier_rates

    rng = random.Random(world)
    M, K = 4096, 4096
    pushed = M // world * K * 2 * (world - 1)
    done_ns = pushed / gbps  # bytes / (GB/s) = ns
    recs = _records(world, M, K, done_ns, done_ns * 1.4, 16, rng)
    rows = copier_rates(recs, {"peer_cta_gbps": 20.0, "peer_cta_max_gbps": 300.0})
    assert len(rows) == world  # the case without a delay only
    for r in rows:
        assert r["copier_ctas"] == 16 and r["calls"] == 5
        assert r["achieved_gbps"] == pytest.approx(gbps, rel=1e-3)
        assert r["kernel_us"] == pytest.approx(done_ns * 1.4 / 1e3, rel=1e-3)
        assert r["achieved_over_alone"] == pytest.approx(gbps / min(20.0 * 16, 300.0), rel=1e-3)
