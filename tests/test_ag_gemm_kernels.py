"""All-Gather + GEMM kernels under Triton's interpreter with emulated ranks (and on GPUs when present).

Every variant is checked against a float32 all-gather + matmul on fresh random inputs, outputs poisoned
with NaN first, twice in a row (the second call exercises the epoch protocol: flags from the first call
must not satisfy the second)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported anywhere

import pytest
import torch
import triton
import triton.language as tl
from rank_jobs import SMALL, ag_gemm_job

from taxes.run.cases import rel_error
from taxes.kernels import ag_gemm as ag
from taxes.kernels.ag_gemm_kernel import _tile_coords
from taxes.kernels.device import interpreting
from taxes.kernels.rank import RankError
from taxes.kernels.runtime import launch

pytestmark = pytest.mark.skipif(not interpreting(), reason="triton was imported before TRITON_INTERPRET was set")

CASES = [
    ("bsp", SMALL),
    ("bsp-graph", SMALL),
    ("fused-pull", SMALL),
    ("fused-push", SMALL),
    ("fused-push-graph", SMALL),
    ("fused-push", ag.replace(SMALL, producer="copy-engine")),
    ("fused-push-graph", ag.replace(SMALL, producer="copy-engine")),  # its guard stamps the epoch on the device
    ("fused-push", ag.replace(SMALL, static=True)),  # round-robin tiles, copiers do not join
    ("fused-pull", ag.replace(SMALL, copiers=1, split_epilogue=True, block_n=32)),  # one copier joins the GEMM
    ("fused-push", ag.replace(SMALL, split_k=2)),  # two K slices per tile, the last to finish adds them
    ("fused-pull", ag.replace(SMALL, split_k=2, static=True)),
]


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("variant,cfg", CASES, ids=[f"{v}-{c.producer}-{'static' if c.static else 'queue'}-c{c.copiers}-k{c.split_k}"
                                                    for v, c in CASES])
def test_variant_matches_float32_reference(variant, cfg, world):
    dtype = "bf16" if world == 1 else "fp16"
    M, N, K = 64, 48, 32  # N/p = 24: not a multiple of the 16-wide tile, so edges are exercised
    errors = launch(ag_gemm_job, world, variant, cfg, M, N, K, dtype, world, timeout_s=300)
    for rank_errors in errors:
        assert len(rank_errors) == 2
        assert all(e < 1e-2 for e in rank_errors), rank_errors


@pytest.mark.slow
def test_both_dtypes_and_uneven_chunks_at_world_2():
    # chunk_rows 16 over a 32-row shard: two chunks; tiles of 16 rows each wait on one chunk
    cfg = ag.replace(SMALL, chunk_rows=16)
    for dtype in ("bf16", "fp16"):
        errors = launch(ag_gemm_job, 2, "fused-push", cfg, 64, 64, 48, dtype, 7, timeout_s=300)
        assert all(e < 1e-2 for rank_errors in errors for e in rank_errors)


@pytest.mark.slow
@pytest.mark.parametrize("variant,producer", [("fused-push", "ctas"), ("fused-pull", "ctas"),
                                              ("fused-push", "copy-engine")])
def test_fused_variants_at_world_4(variant, producer):
    # four ranks: each takes its three peers' shards in the order they arrive (queue_sources), which at
    # world 2 is the only order there is
    cfg = ag.replace(SMALL, producer=producer)
    errors = launch(ag_gemm_job, 4, variant, cfg, 128, 64, 32, "bf16", 5, timeout_s=600)
    assert all(e < 1e-2 for rank_errors in errors for e in rank_errors), errors


def _late_producer(ctx, calls=3):
    """Rank 0's copy-engine producer runs after its GEMM (its GEMM ends as soon as rank 1's rows are in):
    each call's guard must still stamp that call's epoch, not the one the finished GEMM published."""
    M, N, K = 64, 32, 32
    p, rows = ctx.world, 64 // ctx.world
    a_full = ctx.heap.alloc((M, K), torch.bfloat16)
    a_full.local.fill_(float("nan"))
    a_full.local[ctx.rank * rows:(ctx.rank + 1) * rows] = torch.randn(rows, K).to(torch.bfloat16)
    w = torch.randn(K, N // p).to(torch.bfloat16)
    out = torch.empty(M, N // p, dtype=torch.bfloat16)
    run = ag.make_variant(ctx, "fused-push", M, N // p, K, torch.bfloat16, ag.replace(SMALL, producer="copy-engine"),
                          wait_s=20.0)
    run.producer_after_gemm = ctx.rank == 0
    errors = []
    for _ in range(calls):  # no host barrier between calls: the flags alone keep the ranks in step
        res = run(a_full, w, out.fill_(float("nan")))
        run.check()
        errors.append(rel_error(res, ag.reference([a_full.peers[j][j * rows:(j + 1) * rows] for j in range(p)], w)))
    ctx.barrier()
    return errors


@pytest.mark.slow
def test_copy_engine_guard_counts_its_own_calls_when_it_runs_after_the_gemm():
    for errors in launch(_late_producer, 2, timeout_s=120):
        assert len(errors) == 3 and all(e < 1e-2 for e in errors), errors


def _silent_peer(ctx, variant, producer):
    M, N, K = 64, 64, 32
    a_full = ctx.heap.alloc((M, K), torch.bfloat16)
    a_full.local.normal_()
    w = torch.randn(K, N // 2).to(torch.bfloat16)
    out = torch.empty(M, N // 2, dtype=torch.bfloat16)
    run = ag.make_variant(ctx, variant, M, N // 2, K, torch.bfloat16, ag.replace(SMALL, copiers=1, producer=producer),
                          wait_s=0.5)
    if ctx.rank == 1:
        return None  # never launches: its flags never arrive
    run(a_full, w, out)
    try:
        run.check()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.slow
@pytest.mark.parametrize("variant,producer", [("fused-push", "ctas"), ("fused-pull", "ctas"), ("fused-push", "copy-engine")])
def test_a_flag_that_never_arrives_is_a_clear_error(variant, producer):
    import time

    t0 = time.monotonic()
    msg, _ = launch(_silent_peer, 2, variant, producer, timeout_s=120)
    assert time.monotonic() - t0 < 60  # bounded: a 0.5 s budget, not a hang
    assert msg.startswith("FlagTimeout: rank 0:"), msg
    assert "gave up waiting" in msg and "rank 1" in msg and "\n" not in msg


def _raises(ctx):
    if ctx.rank == 1:
        raise ValueError("planted failure")
    ctx.barrier(timeout_s=20)


def _dies(ctx):
    if ctx.rank == 0:
        os._exit(3)
    ctx.barrier(timeout_s=20)


def test_a_failing_or_dying_rank_ends_the_run_with_one_line():
    with pytest.raises(RankError, match=r"^rank 1 failed while .*planted failure$"):
        launch(_raises, 2, timeout_s=60)
    with pytest.raises(RankError, match=r"rank 0 died \(exit code 3\)"):
        launch(_dies, 2, timeout_s=60)


def test_shapes_the_fused_kernel_cannot_tile_are_refused():
    class Ctx:  # only what the constructor reads before allocating
        world, rank, device = 2, 0, torch.device("cpu")

    with pytest.raises(ValueError, match="not divisible by the world size"):
        ag.AgGemmFused(Ctx(), 63, 16, 16, push=True, config=SMALL)
    with pytest.raises(ValueError, match="not a multiple of block_m"):
        ag.AgGemmFused(Ctx(), 40, 16, 16, push=True, config=SMALL)
    with pytest.raises(ValueError, match="K=48 is not a multiple of split_k=2 x block_k=16"):
        ag.AgGemmFused(Ctx(), 64, 16, 48, push=True, config=ag.replace(SMALL, split_k=2))


@pytest.mark.slow
@triton.jit
def _queue_coords(out_ptr, rank, num_m_shard, num_n, n_tiles, WORLD: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column block, source shard) of every tile of the queue, as the fused kernel takes them."""
    for t in range(n_tiles):
        pm, pn, shard = _tile_coords(t, rank, num_m_shard, num_n, WORLD, GROUP_M)
        tl.store(out_ptr + 3 * t, pm)
        tl.store(out_ptr + 3 * t + 1, pn)
        tl.store(out_ptr + 3 * t + 2, shard)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_the_tile_queue_takes_each_peers_rows_in_the_order_they_arrive(world):
    # every producer sends its rows to its peers in push_peers order, so rank r gets its peers' rows in
    # the order of r's place in their lists; the queue (the kernel's own _tile_coords, run here) must take
    # the peers' shards in that order, or its first peer tiles wait for the rows sent last
    num_m_shard, num_n = 3, 2
    n = world * num_m_shard * num_n
    for rank in range(world):
        out = torch.full((3 * n,), -1, dtype=torch.int32)
        _queue_coords[(1,)](out, rank, num_m_shard, num_n, n, WORLD=world, GROUP_M=2)
        pm, pn, shard = out.view(n, 3).T.tolist()
        per = num_m_shard * num_n
        sources = [shard[j * per] for j in range(world)]
        assert all(shard[t] == sources[t // per] for t in range(n))  # one shard after another
        assert sources == ag.queue_sources(rank, world)
        assert sorted(zip(pm, pn)) == [(m, c) for m in range(world * num_m_shard) for c in range(num_n)]
        assert all(m // num_m_shard == s for m, s in zip(pm, shard))  # each tile's rows are its shard's
        assert sources[0] == rank
        arrival = [ag.push_peers(s, world).index(rank) for s in sources[1:]]
        assert arrival == sorted(arrival), (rank, sources)


def test_a_tiling_taken_from_another_shape_leaves_no_more_than_half_the_sms_idle():
    import json

    sms = 132
    table = json.loads(ag.TUNED_FILE.read_text())["entries"]
    for world in (2, 4, 8):
        for M in (256, 512, 1024, 2048, 8192):
            cfg = ag.tuned_config(M, 8192, 8192, world, "fused-push", sms=sms)
            tiles = (M // cfg.block_m) * -(-8192 // world // cfg.block_n)
            exact = [r for r in table if (r["variant"], r["M"], r["N"], r["K"], r["world"]) ==
                     ("fused-push", M, 8192, 8192, world)]
            if exact:  # tuned at this very shape: the table's own tiling
                assert (cfg.block_m, cfg.block_n) == (exact[0]["config"]["block_m"], exact[0]["config"]["block_n"])
            else:  # at most half the SMs idle, unless even 128 x 128 tiles cannot fill them
                assert 2 * tiles > sms or (cfg.block_m, cfg.block_n) == (128, 128), (world, M, tiles, cfg)
            assert M % cfg.block_m == 0 and (8192 // world) % cfg.block_n == 0


@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_persistent_gemm_alone(split_k):
    gemm = ag.PersistentGemm(torch.device("cpu"), ag.replace(SMALL, grid=3, split_k=split_k))
    g = torch.Generator().manual_seed(3 + split_k)
    a = torch.randn(48, 64, generator=g).to(torch.bfloat16)
    w = torch.randn(64, 40, generator=g).to(torch.bfloat16)
    for _ in range(2):  # the second call finds every tile's count of finished slices back at zero
        out = gemm(a, w, torch.full((48, 40), float("nan"), dtype=torch.bfloat16))
        assert rel_error(out, a.float() @ w.float()) < 1e-2
        assert int(gemm.workspace(48, 40).tile_counts.sum()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(interpreting() or not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA GPUs and TRITON_INTERPRET unset")
def test_every_variant_on_two_gpus():
    for variant in ag.VARIANTS:
        errors = launch(ag_gemm_job, 2, variant, ag.Config(), 1024, 1024, 1024, "bf16", 11, backend="cuda",
                        timeout_s=300)
        assert all(e < 1e-2 for rank_errors in errors for e in rank_errors), (variant, errors)
