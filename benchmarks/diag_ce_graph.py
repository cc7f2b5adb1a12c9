"""Diagnostic (not a benchmark): build the copy-engine fused-push-graph over and over and run its first
calls (eager, capture, replays), as the tuner does; on a FlagTimeout, print what each rank's producer and
kernel had reached (guard stamp, kernel counters, the flags and free words in its memory).

    python benchmarks/diag_ce_graph.py M,N,K chunk_rows [trials]
"""
from __future__ import annotations

import sys
from dataclasses import replace

import _checkout  # noqa: F401

import torch  # noqa: E402
from taxes.kernels import ag_gemm as ag  # noqa: E402
from taxes.kernels.runtime import launch  # noqa: E402


def job(ctx, M, N, K, chunk, trials):
    p, rows = ctx.world, M // ctx.world
    dt = torch.bfloat16
    cfg = replace(ag.tuned_config(M, N, K, p, "fused-push-graph"), producer="copy-engine", chunk_rows=chunk)
    out_lines = []
    a_full = ctx.heap.alloc((M, K), dt)
    a_full.local[ctx.rank * rows:(ctx.rank + 1) * rows] = torch.randn(rows, K, device=ctx.device).to(dt)
    w = (torch.randn(K, N // p, device=ctx.device) / K ** 0.5).to(dt)
    out = torch.empty(M, N // p, device=ctx.device, dtype=dt)
    for t in range(trials):
        run = ag.make_variant(ctx, "fused-push-graph", M, N // p, K, dt, cfg, wait_s=4.0)
        status = "ok"
        for call in range(4):
            run(a_full, w, out)
            try:
                run.check()
            except Exception as e:  # noqa: BLE001
                inner = run.inner
                torch.cuda.synchronize()
                status = (f"call {call}: {str(e)[:120]} | stamp {inner.stamp.item()} counters "
                          f"{inner.counters.tolist()} flags {sorted(set(inner.flags.local.tolist()))} "
                          f"aux {inner.aux.local.tolist()}")
                break
        out_lines.append(f"trial {t}: {status}")
        ctx.barrier()  # synchronises this rank's device first, so every rank is done
    return out_lines


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1].split(","))
    chunk = int(sys.argv[2])
    trials = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    res = launch(job, 2, M, N, K, chunk, trials, backend="cuda", heap_bytes=M * K * 2 + (64 << 20), timeout_s=300)
    for r, lines in enumerate(res):
        for line in lines:
            print(f"rank {r} {line}")
