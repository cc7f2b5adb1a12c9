"""The DDP known answers' record cost, like for like: planted step times whose profiled steps cost a known
fraction more than their plain ones, late steps among both, with fewer late steps among the plain ones (as the
trace hook keeps the steps after each switch back to plain apart). The cost comes out as planted for on-time
and late steps alike, where comparing every profiled step with every plain one grows with the delay."""

from __future__ import annotations

import random
import statistics
import sys

import pytest

from committed import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import ddp_known_answers as dk  # noqa: E402


def _case(cost: float, late_us: float, seed: int) -> dict:
    rng = random.Random(seed)
    base = 66_000.0
    step_us = lambda i: base + (late_us if dk.late_step(i, 1) else 0.0) + rng.gauss(0.0, 100.0)  # noqa: E731
    plain_steps = [i for i in range(48) if not (dk.late_step(i, 1) and i % 4 == 1)]  # every other late step left out
    profiled = list(range(48, 80))
    steps, spans = {}, []
    for r in range(2):
        steps[str(r)] = {"plain_steps": plain_steps, "plain_step_us": [step_us(i) for i in plain_steps],
                         "profiled_steps": profiled}
        spans += [{"rank": r, "step": k, "sync_wait_us": 0.0, "span_us": step_us(i) * (1.0 + cost)}
                  for k, i in enumerate(profiled)]
    return {"late_on": "host", "late_ms": late_us / 1e3, "steps": steps, "step_sync_wait_us": spans}


@pytest.mark.parametrize("late_us", [1_000.0, 10_000.0])
@pytest.mark.parametrize("cost", [0.01, 0.04])
def test_the_record_cost_compares_late_steps_with_late_and_on_time_with_on_time(cost, late_us):
    case = _case(cost, late_us, seed=int(late_us) + int(cost * 100))
    got = dk.record_cost(case, 1)
    for kind in ("on_time", "late"):
        assert got[f"record_cost_{kind}"] == pytest.approx(cost, abs=0.004)
        assert got[f"record_cost_{kind}_max"] >= got[f"record_cost_{kind}"]
    # all profiled steps against all plain ones: the plain steps hold fewer late ones, so that reads high
    s = case["steps"]["0"]
    naive = statistics.median(w["span_us"] for w in case["step_sync_wait_us"] if w["rank"] == 0) / \
        statistics.median(s["plain_step_us"]) - 1.0
    if late_us >= 10_000.0:
        assert naive > cost + 0.02


def _interleaved(late_us: float, noise_us: float, seed: int, n: int = 64) -> dict:
    """Two waiting ranks and a late rank 2: plain steps late by late_us in every other step, with Gaussian
    noise; the profiled steps' sync wait carries the same change."""
    rng = random.Random(seed)
    steps, waits = {}, []
    for r in range(3):
        plain = list(range(n))
        steps[str(r)] = {"plain_steps": plain, "profiled_steps": list(range(n, 2 * n)),
                         "plain_step_us": [66_000.0 + (late_us if dk.late_step(i, 1) else 0.0) + rng.gauss(0, noise_us)
                                           for i in plain]}
        waits += [{"rank": r, "step": k, "span_us": 66_000.0,
                   "sync_wait_us": (late_us if dk.late_step(n + k, 1) else 0.0) + rng.gauss(0, noise_us)}
                  for k in range(n)]
    return {"late_on": "host", "late_ms": late_us / 1e3, "steps": steps, "step_sync_wait_us": waits, "straggler": 2}


def test_a_change_buried_in_the_steps_own_noise_is_said_to_be_undecidable():
    clear = dk.judge_interleaved(_interleaved(3_000.0, 100.0, seed=1), late_rank=2, period=1)
    lo, hi = clear["truth_ci_us"]
    assert lo < 3_000.0 < hi and hi - lo < 0.15 * 3_000.0  # the planted change, narrowly
    assert clear["decidable"] and clear["ok"]
    assert clear["plain_steps_needed"] <= 64
    buried = dk.judge_interleaved(_interleaved(150.0, 600.0, seed=2), late_rank=2, period=1)
    lo, hi = buried["truth_ci_us"]
    assert lo < 150.0 < hi  # still covers the planted change
    assert not buried["decidable"] and buried["plain_steps_needed"] > 64 * 10
    rlo, rhi = buried["recovered_ci_us"]
    assert rlo < buried["recovered_us"] < rhi


def test_with_one_step_of_a_kind_nothing_is_known_of_the_noise():
    got = dk.decidability(100.0, [([101.0], [1.0, 2.0])], [([99.0, 100.0], [0.0, 1.0])])
    assert got["truth_ci_us"] is None and got["decidable"] is False and got["plain_steps_needed"] is None
