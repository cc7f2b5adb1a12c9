"""Diagnostic (not a benchmark): where the fused gemm-rs loses time against its GEMM alone at world 2.
Times, per rank, graph replays of: the copy-engine fused kernel; the same with the data copies skipped
(flags only: wrong sums, timing only); the same with flags raised before launching (no waiting, no data
copies); and torch.matmul of the same per-rank GEMM."""
from __future__ import annotations

import sys
from dataclasses import replace

import torch

from taxes.run.harness import time_iterations, warm_clocks
from taxes.kernels import gemm_rs as rs
from taxes.kernels.device import replay_graph
from taxes.kernels.runtime import launch


def job(ctx, M, N, K, cfg):
    p = ctx.world
    dt = torch.bfloat16
    a = torch.randn(M, K // p, device=ctx.device).to(dt)
    w = (torch.randn(K // p, N, device=ctx.device) / K ** 0.5).to(dt)
    out = torch.empty(M // p, N, device=ctx.device, dtype=dt)
    part = torch.empty(M, N, device=ctx.device, dtype=dt)
    warm_clocks(ctx, 3.0)
    res = {}
    for mode in ("ce", "no-data", "matmul", "ce-again"):
        ctx.heap.reset()  # every rank is done with the previous mode's inbox (barrier below)
        fused = rs.GemmRsFused(ctx, M, N, K, dt, cfg, wait_s=20.0)
        if mode == "no-data":
            def flags_only(s, c, row, fused=fused):
                o = (ctx.rank + s) % p
                slot = (ctx.rank - o - 1) % p
                f = slot * fused.tiles_per_shard + c
                fused.flags.peers[o][f:f + 1].copy_(fused.counters[row, 2:3], non_blocking=True)
            fused._copy_chunk = flags_only
        graphs = {}
        if mode == "matmul":
            run = lambda a, w, o: replay_graph(graphs, 0, lambda: torch.matmul(a, w, out=part))  # noqa: E731
        else:
            run = lambda a, w, o: replay_graph(graphs, 0, lambda: fused(a, w, o))  # noqa: E731
        t = sorted(time_iterations(ctx, run, [(a, w, out)], 20, 5))
        res[mode] = t[len(t) // 2]
        ctx.barrier()  # synchronises this rank's device first, so every rank is done
    return res


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1].split(","))
    kw = dict(kv.split("=") for kv in sys.argv[2].split(",")) if len(sys.argv) > 2 else {}
    cfg = replace(rs.tuned_config(M, N, K, 2), **{k: (int(v) if v.isdigit() else v) for k, v in kw.items()})
    print(M, N, K, cfg)
    for r, res in enumerate(launch(job, 2, M, N, K, cfg, backend="cuda", heap_bytes=4 * M * N + (64 << 20), timeout_s=200)):
        print(r, {k: round(v, 1) for k, v in res.items()})
