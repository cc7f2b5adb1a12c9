"""GEMM + reduce-scatter: tune the fused kernel's tiling on this machine's GPUs, in one call.

    python benchmarks/gemm_rs.py --world 2 --out $OUT            # candidates per shape -> the tuned table
    python benchmarks/gemm_rs.py --world 2 --install --out $OUT  # ... and merge it into kernels/gemm_rs_tuned.json
    TRITON_INTERPRET=1 python benchmarks/gemm_rs.py --emulate    # CPU: logic only, tiny shapes, times mean nothing

Per shape (default: issue 8's, the MLP down projection of Llama-3 8B and 70B: N=H, K=F), each candidate
configuration of fused-push-graph (the graph leaves only the kernel to compare) is built, checked once on
NaN-poisoned output against the float32 reference (bf16 relative error under 1e-2), and timed over
barrier-aligned iterations (taxes.harness.check_and_time); bsp-graph is timed beside it as the yardstick.
The fastest correct configuration per shape goes into the tuned table that
kernels.gemm_rs.tuned_config reads (nearest M for the same N, K and world). The benchmark itself is
`taxes profile gemm-rs` (benchmarks/gpu_session.sh), which then runs the tuned configuration.
Installs nothing; needs torch, triton and this checkout (run from the repository root).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import _checkout  # noqa: F401  (this checkout as `taxes`, installed or not)

import torch  # noqa: E402
from taxes.kernels import gemm_rs as rs  # noqa: E402
from taxes.kernels.runtime import launch  # noqa: E402

TOLERANCE = 1e-2
SHAPES = [(m, h, f) for (h, f) in ((4096, 14336), (8192, 28672)) for m in (1024, 4096, 16384)]  # M, N=H, K=F
BASE = rs.Config()
CANDIDATES = [
    BASE,
    replace(BASE, num_stages=4),
    replace(BASE, num_warps=4, num_stages=4),
    replace(BASE, warp_spec=True),
    replace(BASE, block_n=256),
    replace(BASE, block_n=256, warp_spec=True),
    replace(BASE, block_m=256),
    replace(BASE, block_n=256, group_m=16, num_stages=4),
]
# The two tilings that won on 2 x H200 (kernels/gemm_rs_tuned.json), each with either producer: the GEMM
# CTAs storing peer tiles over the link, or a local store and the copy engine, in 1, 2 or 4 chunks.
WINNERS = [replace(BASE, block_n=256), replace(BASE, block_n=256, group_m=16, num_stages=4)]
PRODUCER_CANDIDATES = WINNERS + [replace(c, producer="copy-engine", ce_chunks=n) for c in WINNERS for n in (1, 2, 4)]


def tune_job(ctx, args) -> dict:
    from taxes.harness import check_and_time, gpu_metadata, warm_clocks

    dtype = torch.bfloat16
    warm_clocks(ctx, args.warm_s)
    rows = []
    for (M, N, K) in args.shapes:
        K_local, p = K // ctx.world, ctx.world
        sets = []
        for s in range(args.sets):
            g = torch.Generator(device=ctx.device).manual_seed(1000 * s + 10 * ctx.rank + M + N + K)
            a = torch.randn(M, K_local, generator=g, device=ctx.device).to(dtype)
            w = (torch.randn(K_local, N, generator=g, device=ctx.device) / K ** 0.5).to(dtype)
            sets.append((a, w, torch.empty(M // p, N, dtype=dtype, device=ctx.device)))
        ref = _reference(ctx, sets[0][0], sets[0][1])

        def check(run):
            a, w, out = sets[0]
            out.fill_(float("nan"))
            res = run(a, w, out)
            if hasattr(run, "check"):
                run.check()
            return rs.rel_error(res, ref)

        tried = []
        for variant, cfgs in (("bsp-graph", [None]), ("fused-push-graph", args.candidates)):
            for cfg in cfgs:
                if cfg is not None and ((M // p) % cfg.block_m):
                    continue
                ctx.heap.reset()  # the last candidate's inbox: every rank is done with it (check_and_time agreed)
                ctx.doing(f"{variant} M={M} N={N} K={K} {cfg}")
                res = check_and_time(ctx, lambda: rs.make_variant(ctx, variant, M, N, K, dtype, cfg, wait_s=args.wait_s),
                                     check, sets, args.iters, args.warmup)
                row = {"M": M, "N": N, "K": K, "world": p, "variant": variant, "median_us": res["median"],
                       "rel_error": res["rel_error"], "error": res["error"], "config": asdict(cfg) if cfg else {}}
                tried.append(row)
                if ctx.rank == 0:
                    print(f"  M={M} N={N} K={K} {variant:>16}: {res['median']:9.1f} us err={res['rel_error']} "
                          f"{res['error'] or ''} {_short(cfg)}", flush=True)
                del res
                if ctx.device.type == "cuda":
                    torch.cuda.empty_cache()
        rows += tried
        sets = ref = None  # free before the next shape
    return {"rows": rows, "meta": gpu_metadata() if ctx.rank == 0 else {}}


def _reference(ctx, a, w):
    """float32: this rank's rows of sum_r A_r W_r, from every rank's A_r and W_r."""
    from taxes.cases import _gather

    flat = _gather(ctx, torch.cat([a.flatten(), w.flatten()]).contiguous())
    n_a = a.numel()
    return rs.reference([x[:n_a].view_as(a) for x in flat], [x[n_a:].view_as(w) for x in flat], ctx.rank)


def _short(cfg) -> str:
    if cfg is None:
        return ""
    return (f"[{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} g{cfg.group_m}"
            f"{' ws' if cfg.warp_spec else ''}{f' ce{cfg.ce_chunks}' if cfg.producer == 'copy-engine' else ''}]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--emulate", action="store_true", help="CPU ranks under Triton's interpreter (tiny shapes)")
    ap.add_argument("--shapes", default="", help="M,N,K;M,N,K (default: issue 8's six)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--sets", type=int, default=2, help="rotating input sets")
    ap.add_argument("--wait-s", type=float, default=10.0)
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--candidates", choices=("tilings", "producers"), default="producers",
                    help="tilings: eight tilings (CTA producer); producers: the two winning tilings x both producers")
    ap.add_argument("--install", action="store_true", help="write the table to kernels/gemm_rs_tuned.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--timeout-s", type=float, default=400.0)
    args = ap.parse_args(argv)
    args.shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes else SHAPES
    args.candidates = CANDIDATES if args.candidates == "tilings" else PRODUCER_CANDIDATES
    if args.emulate:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if not args.shapes or args.shapes == SHAPES:
            args.shapes = [(64, 32, 64)]
        args.candidates = [rs.Config(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2, grid=4),
                           rs.Config(block_m=32, block_n=16, block_k=16, group_m=1, num_warps=4, num_stages=2, grid=3,
                                     producer="copy-engine")]
        args.iters, args.warmup, args.warm_s = 1, 0, 0
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    heap = max(4 * (m // args.world) * n * 4 for (m, n, k) in args.shapes) + (64 << 20)
    res = launch(tune_job, args.world, args, backend="emulated" if args.emulate else "cuda", heap_bytes=heap,
                 timeout_s=args.timeout_s)[0]
    rows = res["rows"]
    entries = []
    for shape in dict.fromkeys((r["M"], r["N"], r["K"]) for r in rows):
        good = [r for r in rows if (r["M"], r["N"], r["K"]) == shape and r["variant"] == "fused-push-graph"
                and r["error"] is None and r["rel_error"] is not None and r["rel_error"] <= TOLERANCE]
        if good:
            entries.append(min(good, key=lambda r: r["median_us"]))
    table = {"made_by": "benchmarks/gemm_rs.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d"),
             "gpus": res["meta"].get("gpu_names"), "emulated": args.emulate, "entries": entries}
    (out_dir / "gemm_rs_tune.json").write_text(json.dumps({"rows": rows, "meta": res["meta"]}, indent=1))
    (out_dir / "gemm_rs_tuned.json").write_text(json.dumps(table, indent=1))
    if args.install and not args.emulate:  # merged: entries of shapes not tuned in this run are kept
        tuned = {(e["M"], e["N"], e["K"]) for e in entries}
        old = json.loads(rs.TUNED_FILE.read_text())["entries"] if rs.TUNED_FILE.exists() else []
        kept = [e for e in old if (e["M"], e["N"], e["K"]) not in tuned or e["world"] != args.world]
        rs.TUNED_FILE.write_text(json.dumps(table | {"entries": kept + entries}, indent=1))
    print(f"gemm-rs tuning, {time.time() - t0:.0f} s; best fused-push-graph per shape against bsp-graph:")
    for e in entries:
        yard = next((r["median_us"] for r in rows if (r["M"], r["N"], r["K"]) == (e["M"], e["N"], e["K"])
                     and r["variant"] == "bsp-graph" and r["error"] is None), None)
        ratio = f"{yard / e['median_us']:.2f}x" if yard else "-"
        print(f"  M={e['M']:>5} N={e['N']:>5} K={e['K']:>5}: fused {e['median_us']:8.1f} us, bsp-graph "
              f"{yard or float('nan'):8.1f} us ({ratio}) {_short(rs.Config(**e['config']))}")
    bad = [r for r in rows if r["error"] or (r["rel_error"] or 0) > TOLERANCE]
    for r in bad:
        print(f"  failed: M={r['M']} {r['variant']} {_short(rs.Config(**r['config'])) if r['config'] else ''}: "
              f"{r['error'] or 'rel_error ' + str(r['rel_error'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
