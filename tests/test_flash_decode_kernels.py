"""Flash decode kernels under Triton's interpreter with emulated ranks (and on GPUs when present).

Each variant is checked against float32 softmax(q k^T / sqrt(D)) v over every rank's KV, outputs
poisoned with NaN first, three calls in a row (both inbox parities, and the sentinel written back)."""

from __future__ import annotations

import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from taxes.kernels import flash_decode as fd
from taxes.kernels.runtime import interpreting, launch

pytestmark = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")


def _job(ctx, variant, signal, B, Hq, Hkv, D, S, dtype_name, calls=3, scale=1.0):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    g = torch.Generator().manual_seed(100 + ctx.rank)
    q = (torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(7)) * scale).to(dtype)  # replicated
    k = ctx.heap.alloc((B, Hkv, S, D), dtype)
    v = ctx.heap.alloc((B, Hkv, S, D), dtype)
    k.local.copy_(torch.randn(B, Hkv, S, D, generator=g).to(dtype))
    v.local.copy_(torch.randn(B, Hkv, S, D, generator=g).to(dtype))
    out = torch.empty(B, Hq, D, dtype=dtype)
    run = fd.FlashDecode(ctx, B, Hq, Hkv, D, S, dtype, variant, fd.Config(block_n=16, signal=signal), wait_s=30)
    ctx.barrier()
    errors = []
    for i in range(calls):
        out.fill_(float("nan"))
        run(q, k.local, v.local, out, traced=run.fused and i == 1)  # the traced build must agree too
        run.check()
        ctx.barrier()
        ref = fd.reference(q, k.peers, v.peers)
        errors.append(((out.float() - ref).norm() / ref.norm()).item())
        ctx.barrier()
    return errors, run.n_splits


CASES = [("bsp", "flag"), ("bsp-graph", "flag"), ("fused-push", "flag"), ("fused-push", "data"),
         ("fused-push-graph", "flag")]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("variant,signal", CASES)
def test_variant_matches_float32_reference(variant, signal, world):
    # S = 40 is not a multiple of the 16-token block; 2 splits of 32 and 8 tokens
    results = launch(_job, world, variant, signal, 2, 8, 2, 64, 40, "bf16" if world == 1 else "fp16", timeout_s=300)
    for errors, splits in results:
        assert splits >= 2
        assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors


@pytest.mark.slow
def test_long_sequence_head_dim_128_and_peaked_scores():
    # many splits and a query scaled up so one token dominates: the rescaling must stay exact
    results = launch(_job, 2, "fused-push", "flag", 1, 16, 2, 128, 200, "bf16", 2, 8.0, timeout_s=300)
    for errors, splits in results:
        assert splits > 2
        assert all(e < 1e-2 for e in errors), errors


def test_split_count_never_leaves_a_split_empty():
    for S in (1, 15, 16, 17, 40, 1000, 131072):
        for B, Hkv in ((1, 8), (64, 8), (3, 1)):
            n, per = fd.split_count(S, B, Hkv, 132, 64)
            assert per % 64 == 0 and n >= 1
            assert (n - 1) * per < S <= n * per  # every split has tokens, all tokens are covered


def test_combine_math_is_safe_for_far_apart_log_sum_exps():
    # two partials whose lse differ by 200 (in log2): exp2 of the raw values would overflow float32
    o1, o2 = torch.randn(4), torch.randn(4)
    lse = torch.tensor([500.0, 300.0])
    m = lse.max()
    w = torch.exp2(lse - m)
    merged = (w[0] * o1 + w[1] * o2) / w.sum()
    assert torch.isfinite(merged).all() and torch.allclose(merged, o1, atol=1e-6)
    assert math.isfinite(float(m + torch.log2(w.sum())))


def test_bad_shapes_are_refused():
    class Ctx:
        world, rank, device, backend = 1, 0, torch.device("cpu"), "emulated"

    with pytest.raises(ValueError, match="not a multiple"):
        fd.FlashDecode(Ctx(), 1, 6, 4, 64, 32, torch.bfloat16, "bsp")
    with pytest.raises(ValueError, match="head dim"):
        fd.FlashDecode(Ctx(), 1, 8, 2, 96, 32, torch.bfloat16, "bsp")
    with pytest.raises(ValueError, match="unknown flash-decode variant"):
        fd.FlashDecode(Ctx(), 1, 8, 2, 64, 32, torch.bfloat16, "fused-pull")


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs and TRITON_INTERPRET unset")
def test_every_variant_on_two_gpus():
    for variant, signal in CASES:
        results = launch(_job, 2, variant, signal, 4, 64, 8, 128, 4096, "bf16", backend="cuda", timeout_s=300)
        assert all(e < 1e-2 for errors, _ in results for e in errors), (variant, signal, results)
