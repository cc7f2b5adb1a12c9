"""Rank jobs the kernel tests share: each runs on every emulated rank (a spawned process imports it from
here), calls a variant on NaN-poisoned output and returns its errors against a float32 reference."""

from __future__ import annotations

import torch

from taxes.run.cases import rel_error
from taxes.kernels import ag_gemm as ag
from taxes.kernels import decode_local
from taxes.kernels import flash_decode as fd

SMALL = ag.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, copiers=2,
                  chunk_rows=8, copy_block=256, grid=4)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def ag_gemm_job(ctx, variant, cfg, M, N, K, dtype_name, seed, calls=2, wait_s=30.0):
    """One ag-gemm variant on emulated ranks, `calls` calls on NaN-poisoned output: each call's relative
    error against the float32 reference (the second call of a fused variant runs its traced build)."""
    dtype = DTYPES[dtype_name]
    p, r = ctx.world, ctx.rank
    g = torch.Generator().manual_seed(seed * 100 + r)
    rows = M // p
    a_full = ctx.heap.alloc((M, K), dtype)
    a_full.local.fill_(float("nan"))  # rows other ranks own are workspace until a variant fills them
    a_full.local[r * rows:(r + 1) * rows] = torch.randn(rows, K, generator=g).to(dtype)
    w = torch.randn(K, N // p, generator=g).to(dtype)
    out = torch.empty(M, N // p, dtype=dtype)
    run = ag.make_variant(ctx, variant, M, N // p, K, dtype, cfg, wait_s=wait_s)
    ctx.barrier()
    errors = []
    fused = isinstance(run, (ag.AgGemmFused, ag.AgGemmFusedGraph))
    for i in range(calls):
        out.fill_(float("nan"))
        traced = fused and i == 1  # the instrumented build must compute the same
        res = run(a_full, w, out, traced=True) if traced else run(a_full, w, out)
        if hasattr(run, "check"):
            run.check()
        ctx.barrier()
        ref = ag.reference([a_full.peers[j][j * rows:(j + 1) * rows] for j in range(p)], w)
        errors.append(rel_error(res, ref))
        if traced:  # every tile computed exactly once, by some CTA, and recorded against its source rank
            tiles = sum(row["tiles"] for row in run.cta_trace_rows())
            sources = [src for src, _ in run.tile_waits()]
            n_tiles = (M // run.cfg.block_m) * -(-(N // p) // run.cfg.block_n)
            assert tiles == n_tiles * run.cfg.split_k and len(sources) == n_tiles, tiles  # units: tiles x K slices
            assert sorted(set(sources)) == list(range(p))
        ctx.barrier()
    return errors


def flash_decode_job(ctx, variant, signal, B, Hq, Hkv, D, S, dtype_name, calls=3, scale=1.0, splits=0):
    """One flash decode variant on emulated ranks, `calls` calls on NaN-poisoned output: each call's relative
    error against float32 attention over every rank's KV, and the number of KV splits (splits: forced; 0:
    the interpreter's rule)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    g = torch.Generator().manual_seed(100 + ctx.rank)
    q = (torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(7)) * scale).to(dtype)  # replicated
    k = ctx.heap.alloc((B, Hkv, S, D), dtype)
    v = ctx.heap.alloc((B, Hkv, S, D), dtype)
    k.local.copy_(torch.randn(B, Hkv, S, D, generator=g).to(dtype))
    v.local.copy_(torch.randn(B, Hkv, S, D, generator=g).to(dtype))
    out = torch.empty(B, Hq, D, dtype=dtype)
    cfg = decode_local.Config(block_n=16, splits=splits, signal=signal)
    run = fd.FlashDecode(ctx, B, Hq, Hkv, D, S, dtype, variant, cfg, wait_s=30)
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
