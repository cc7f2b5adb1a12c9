"""benchmarks/decode_probe.py's diagnostic decode kernel under Triton's interpreter: every layout it times
(contiguous or round-robin splits, head-major or split-major programs) gives the float32 result, and its
read-only build reads every K and V value once."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from taxes.run.cases import rel_error
from taxes.kernels.decode_local import attention_partial_f32
from taxes.kernels.device import interpreting

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import decode_probe as dp  # noqa: E402

pytestmark = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")


@pytest.fixture
def small_heads(monkeypatch):
    monkeypatch.setattr(dp, "HQ", 8)
    monkeypatch.setattr(dp, "HKV", 2)


def _inputs(B=1, S=128, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 8, D, generator=g).to(torch.bfloat16)
    k = torch.randn(B, 2, S, D, generator=g).to(torch.bfloat16)
    v = torch.randn(B, 2, S, D, generator=g).to(torch.bfloat16)
    return q, k, v


@pytest.mark.parametrize("cyclic", [False, True])
@pytest.mark.parametrize("split_major", [False, True])
def test_every_layout_of_the_probe_matches_float32(small_heads, cyclic, split_major):
    B, S, D = 2, 128, 64
    q, k, v = _inputs(B, S, D)
    ref, _ = attention_partial_f32(q, k, v)
    p = dp.Probe(B, D, S, splits=4, block_n=16, warps=4, stages=2, cyclic=cyclic, merge=True,
                 split_major=split_major, read_only=False, dev=torch.device("cpu"))
    for _ in range(2):  # the arrival counters only grow: a second call must merge again
        out = torch.full((B, 8, D), float("nan"), dtype=torch.bfloat16)
        p(q, k, v, out)
        assert rel_error(out, ref) < 1e-2


def test_the_read_only_probe_reads_every_value_once(small_heads):
    S, D = 128, 64
    q, k, v = _inputs(1, S, D, seed=3)
    p = dp.Probe(1, D, S, splits=4, block_n=16, warps=4, stages=2, cyclic=True, merge=True, split_major=False,
                 read_only=True, dev=torch.device("cpu"))
    p(q, k, v, torch.empty(1, 8, D, dtype=torch.bfloat16))
    total = k.float().sum() + v.float().sum()
    assert p.o_part[:p.programs].sum().item() == pytest.approx(total.item(), rel=1e-4, abs=1e-2)


# ---- benchmarks/decode_schedule_probe.py: claimed tiles, polled merges, uneven splits ----------------


@pytest.fixture
def sched_probe(monkeypatch):
    import decode_schedule_probe as sp

    monkeypatch.setattr(sp, "HQ", 8)
    monkeypatch.setattr(sp, "HKV", 2)
    return sp


@pytest.mark.parametrize("sched", ["static", "claim"])
@pytest.mark.parametrize("merge", ["ticket", "poll"])
@pytest.mark.parametrize("splits,programs", [(3, 0), (3, 7), (1, 0), (1, 5)],
                         ids=["3-splits", "7-programs-uneven", "one-split", "5-programs-one-or-two"])
def test_every_schedule_and_merge_matches_float32_call_after_call(sched_probe, sched, merge, splits, programs):
    # 2 batches x 2 KV heads = 4 groups; 7 programs: 3 groups of 2 splits and one of 1 (which writes its rows
    # itself); three calls: the claim counters hand out 8 tiles per group per call, the polled merge flips
    # its partial buffers and re-poisons the other set
    B, S, D = 2, 128, 64
    q, k, v = _inputs(B, S, D, seed=5)
    ref, _ = attention_partial_f32(q, k, v)
    p = sched_probe.Probe(B, D, S, splits, 16, 4, 2, sched, merge, torch.device("cpu"), programs)
    for call in range(3):
        out = torch.full((B, 8, D), float("nan"), dtype=torch.bfloat16)
        p(q, k, v, out)
        assert rel_error(out, ref) < 1e-2, call
        if sched == "claim":
            assert p.claims.tolist() == [(call + 1) * (S // 16)] * (B * 2)
        multi = [g < p.extra or p.base > 1 for g in range(B * 2)]  # groups with more than one split
        if merge == "poll":
            assert p.epochs.tolist() == [call + 1 if m else 0 for m in multi]
