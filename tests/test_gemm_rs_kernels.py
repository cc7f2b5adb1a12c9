"""GEMM + reduce-scatter kernels under Triton's interpreter with emulated ranks (and on GPUs when present).

Every variant is checked against a float32 sum of the ranks' partial products on fresh random inputs
per call (so a slot read a call too early or too late gives a wrong answer), the output poisoned with
NaN first, three calls in a row (epochs 1-3: both halves of the double-buffered inbox, then the first
again)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import dataclasses
import time

import pytest
import torch

from taxes.run.cases import rel_error
from taxes.kernels import gemm_rs as rs
from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankError
from taxes.kernels.runtime import launch

pytestmark = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")

SMALL = rs.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, grid=3)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(seed: int, rank: int, M: int, N: int, K_local: int, dtype: torch.dtype):
    """Rank `rank`'s A_r (M x K/p) and W_r (K/p x N) for one call; any rank can rebuild any rank's."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(M, K_local, generator=g).to(dtype), torch.randn(K_local, N, generator=g).to(dtype)


def _job(ctx, variant, cfg, M, N, K, dtype_names, seed, calls=3):
    p, r = ctx.world, ctx.rank
    errors = {}
    for dtype_name in dtype_names:
        dtype = DTYPES[dtype_name]
        run = rs.make_variant(ctx, variant, M, N, K, dtype, cfg, wait_s=30.0)
        out = torch.empty(M // p, N, dtype=dtype)
        ctx.barrier()
        errs = []
        for i in range(calls):
            call_seed = seed * 10 + i
            parts = [_inputs(call_seed, q, M, N, K // p, dtype) for q in range(p)]
            a, w = parts[r]
            out.fill_(float("nan"))
            res = run(a, w, out)
            if hasattr(run, "check"):
                run.check()
            errs.append(rel_error(res, rs.reference([x for x, _ in parts], [y for _, y in parts], r)))
        errors[dtype_name] = errs
        ctx.barrier()  # (emulated) ranks reuse heap memory only after everyone is done with this runner
        ctx.heap.reset()
        ctx.barrier()
    return errors


EMULATED = [v for v in rs.VARIANTS if v != "torch-fused-rs"]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("variant", EMULATED)
def test_variant_matches_float32_reference(variant, world):
    # M/p = 32: two row blocks per owner; N = 40: two full 16-wide tiles and an 8-wide edge;
    # K/p = 24: a full 16-deep step and a partial one
    M, N, K = 32 * world, 40, 24 * world
    errors = launch(_job, world, variant, SMALL, M, N, K, ("fp16", "bf16"), world + 7, timeout_s=300)
    for rank_errors in errors:
        for dtype_name, errs in rank_errors.items():
            assert len(errs) == 3
            assert all(e < 1e-2 for e in errs), (dtype_name, errs)


@pytest.mark.slow
@pytest.mark.parametrize("world,chunks", [(2, 1), (2, 2), (3, 2)])
def test_copy_engine_producer_matches_float32_reference(world, chunks):
    # launches per chunk of each owner's rows, copies and flags by the (here synchronous) copy engine,
    # guard before each copy: four calls in a row reuse the single inbox half, so a copy that overwrote
    # rows the owner had not reduced yet, or a flag of an earlier call or another chunk, gives a wrong answer
    cfg = dataclasses.replace(SMALL, producer="copy-engine", ce_chunks=chunks, group_m=1)
    M, N, K = 32 * world, 40, 24 * world
    for variant in ("fused-push", "fused-push-graph"):
        errors = launch(_job, world, variant, cfg, M, N, K, ("bf16",), world + 3, 4, timeout_s=300)
        for rank_errors in errors:
            assert len(rank_errors["bf16"]) == 4
            assert all(e < 1e-2 for e in rank_errors["bf16"]), (variant, rank_errors)


def _chunks(ctx, cfg, M):
    return rs.GemmRsFused(ctx, M, 16, 16, torch.bfloat16, cfg).chunks


def test_copy_engine_chunks_fall_back_to_one_when_rows_do_not_split_into_groups():
    cfg = dataclasses.replace(SMALL, producer="copy-engine", ce_chunks=2, group_m=2)
    assert launch(_chunks, 2, cfg, 2 * 64, timeout_s=60) == [2, 2]  # 4 row blocks = 2 chunks x 2 groups
    assert launch(_chunks, 2, cfg, 2 * 32, timeout_s=60) == [1, 1]  # 2 row blocks: one group, one chunk
    assert launch(_chunks, 1, cfg, 64, timeout_s=60) == [1]  # world 1: no copy engine


def test_an_unknown_producer_is_refused():
    with pytest.raises(RankError, match="ValueError: gemm-rs producer 'dma'"):
        launch(_job, 1, "fused-push", dataclasses.replace(SMALL, producer="dma"), 32, 16, 16, ("bf16",), 1, 1,
               timeout_s=60)


@pytest.mark.slow
def test_float32_partials_and_a_larger_grid_at_world_2():
    # float32 partials must be at least as accurate; 5 CTAs over 2 x 3 x 3 tiles: most CTAs do several
    cfg = dataclasses.replace(SMALL, fp32_partials=True, grid=5, group_m=1)
    errors = launch(_job, 2, "fused-push", cfg, 96, 48, 32, ("bf16",), 3, timeout_s=300)
    assert all(e < 1e-2 for rank_errors in errors for e in rank_errors["bf16"])


def _halves_kept(ctx, calls):
    """After each call, the inbox half the call filled (parity of its epoch) must stay as it was through
    the next call: that half is what the owner reads, and no peer may write it again before epoch + 2."""
    M, N, K = 64, 24, 32
    run = rs.make_variant(ctx, "fused-push", M, N, K, torch.float16, SMALL, wait_s=30.0)
    out = torch.empty(M // 2, N, dtype=torch.float16)
    kept = []
    previous = None
    for i in range(calls):
        a, w = _inputs(20 + i, ctx.rank, M, N, K // 2, torch.float16)  # fresh data: a rewrite would show
        run(a, w, out)
        run.check()
        # Both ranks done with this call before looking: a peer may legitimately write this half again in
        # epoch + 2, and without the barrier it could already be there (a race, not a fault).
        ctx.barrier()
        epoch = i + 1
        if previous is not None:
            kept.append(torch.equal(run.inbox.local[previous[0]], previous[1]))
        # every peer's epoch tiles are in (the call waited for them); later epochs write the other half
        previous = (epoch % 2, run.inbox.local[epoch % 2].clone())
    return kept


@pytest.mark.slow
def test_a_call_never_rewrites_the_half_the_owner_just_read():
    for kept in launch(_halves_kept, 2, 3, timeout_s=120):
        assert kept == [True, True]


def _silent_peer(ctx, peer_calls, producer="ctas"):
    """Rank 1 makes peer_calls calls, rank 0 one more: rank 0's last call must give up, not use the
    flags (or slots) of an earlier epoch."""
    M, N, K = 64, 32, 32
    cfg = dataclasses.replace(SMALL, producer=producer)
    run = rs.make_variant(ctx, "fused-push", M, N, K, torch.bfloat16, cfg, wait_s=0.5)
    a, w = _inputs(5, ctx.rank, M, N, K // 2, torch.bfloat16)
    out = torch.empty(M // 2, N, dtype=torch.bfloat16)
    for i in range(peer_calls + (ctx.rank == 0)):
        run(a, w, out)
        try:
            run.check()
        except Exception as e:
            return i, f"{type(e).__name__}: {e}"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("producer", ["ctas", "copy-engine"])
@pytest.mark.parametrize("peer_calls", [0, 1])
def test_a_flag_that_never_arrives_is_a_clear_error(peer_calls, producer):
    t0 = time.monotonic()
    result, peer = launch(_silent_peer, 2, peer_calls, producer, timeout_s=120)
    assert time.monotonic() - t0 < 60  # bounded: a 0.5 s budget, not a hang
    assert peer is None
    call, msg = result
    assert call == peer_calls  # the earlier calls, matched by the peer, succeeded
    assert msg.startswith("FlagTimeout: rank 0:"), msg
    assert "gave up waiting" in msg and "from rank 1" in msg and f"reach {peer_calls + 1}" in msg, msg
    assert "\n" not in msg


class _Ctx:  # only what the constructors read before allocating
    world, rank, device, backend = 2, 0, torch.device("cpu"), "emulated"


@pytest.mark.parametrize("shape,match", [
    ((63, 16, 16), "M=63 is not divisible by the world size 2"),
    ((64, 16, 15), "K=15 is not divisible by the world size 2"),
    ((40, 16, 16), r"M/p=20 is not a multiple of block_m=16"),
    ((64, 12, 16), "must be multiples of 8"),
    ((64, 16, 20), "must be multiples of 8"),
    ((0, 16, 16), "M=0 must be a positive"),
])
def test_shapes_the_fused_kernel_cannot_tile_are_refused(shape, match):
    with pytest.raises(ValueError, match=match):
        rs.GemmRsFused(_Ctx(), *shape, torch.bfloat16, SMALL)


def test_bsp_refuses_uneven_splits_and_unknown_variants():
    with pytest.raises(ValueError, match="not divisible by the world size"):
        rs.GemmRsBsp(_Ctx(), 63, 16, 16, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown gemm-rs variant 'fused-pull'"):
        rs.make_variant(_Ctx(), "fused-pull", 64, 16, 16, torch.bfloat16)
    with pytest.raises(NotImplementedError, match="needs CUDA"):
        rs.make_variant(_Ctx(), "torch-fused-rs", 64, 16, 16, torch.bfloat16)


def _wrong_call(ctx):
    run = rs.make_variant(ctx, "fused-push", 64, 16, 32, torch.float16, SMALL)
    a, w = _inputs(1, ctx.rank, 64, 16, 16, torch.float16)
    try:
        run(a, w, torch.empty(64, 16, dtype=torch.float16))  # out must be M/p x N, not M x N
    except ValueError as e:
        return str(e)
    return "accepted"


@pytest.mark.slow
def test_a_call_with_tensors_of_the_wrong_shape_is_refused():
    for msg in launch(_wrong_call, 2, timeout_s=60):
        assert msg.startswith("gemm-rs expects a, w, out of shapes ((64, 16), (16, 16), (32, 16))"), msg


def test_reference_is_the_sum_of_partials_rows():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(8, 3, generator=g) for _ in range(2)]
    w = [torch.randn(3, 5, generator=g) for _ in range(2)]
    full = a[0] @ w[0] + a[1] @ w[1]
    assert torch.allclose(rs.reference(a, w, 1), full[4:], atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs and TRITON_INTERPRET unset")
def test_every_variant_on_two_gpus():
    for variant in rs.VARIANTS:
        errors = launch(_job, 2, variant, rs.Config(), 1024, 1024, 1024, ("bf16",), 11, backend="cuda", timeout_s=300)
        assert all(e < 1e-2 for rank_errors in errors for e in rank_errors["bf16"]), (variant, errors)


def _graph_phases_job(ctx):
    """fused-push-graph's phases, as if on a GPU: the harness captures them into its own graph, so they
    must run the kernel itself, never replay the runner's graph (a replay cannot be captured)."""
    M, N, K = 32 * ctx.world, 16, 16 * ctx.world
    run = rs.make_variant(ctx, "fused-push-graph", M, N, K, torch.float16, SMALL, wait_s=30.0)
    run.on_gpu = True  # __call__ would now replay a CUDA graph, which fails on the CPU
    a, w = _inputs(5, ctx.rank, M, N, K // ctx.world, torch.float16)
    parts = [_inputs(5, q, M, N, K // ctx.world, torch.float16) for q in range(ctx.world)]
    out = torch.full((M // ctx.world, N), float("nan"), dtype=torch.float16)
    names = []
    for name, role, thunk in run.phases(a, w, out):
        names.append((name, role))
        thunk()
    run.check()
    return names, rel_error(out, rs.reference([x for x, _ in parts], [y for _, y in parts], ctx.rank))


def test_graph_variant_phases_run_the_kernel_not_a_graph_replay():
    for names, err in launch(_graph_phases_job, 2, timeout_s=120):
        assert names == [("fused-gemm-rs", "compute")]
        assert err < 1e-2
