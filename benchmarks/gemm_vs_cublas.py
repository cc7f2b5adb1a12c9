"""The fused ag-gemm's GEMM alone against cuBLAS at the per-rank shape, on one GPU.

At world p each rank of the fused all-gather + GEMM multiplies the gathered M x K rows by its K x N/p
columns. Fusion can only win what its GEMM does not lose: this times the fused kernel's persistent GEMM
(kernels/ag_gemm.py PersistentGemm: the same tiles, the same queue, no flags and no copies, every SM
computing) with the tuned configuration of that shape and world, against torch.matmul (cuBLAS) at the
same shape, both checked against a float32 product first (outputs poisoned with NaN).

    python benchmarks/gemm_vs_cublas.py -o OUT/gemm_vs_cublas-h200.json
    python benchmarks/gemm_vs_cublas.py --tune -o OUT/gemm_tilings-h200.json   # every tiling of CANDIDATES too
    python benchmarks/gemm_vs_cublas.py --tune --split-k --under-a-wave -o OUT/gemm_split_k-h200.json
        # and each of SPLIT_TILINGS cut into 2, 4 and 8 K slices, at the per-rank shapes under one wave

Split-K is for the per-rank shapes with fewer output tiles than the GPU has SMs (M/p small, N/p small):
there a tile's K loop is the whole critical path and most SMs idle; cut into K slices, the same tiles
keep every SM busy and the last slice of each tile adds the float32 partials.

Times are the median of triton.testing.do_bench (L2 flushed between calls), us; TFLOP/s from 2MNK.
"""

from __future__ import annotations

import argparse
import json
import sys

SHAPES = [(m, 8192, 8192) for m in (512, 1024, 2048, 4096, 8192, 16384)] + [(8192, 28672, 8192)]
WORLDS = (2, 4)
# tilings tried with --tune (block_m, block_n, block_k, num_warps, num_stages): fewer, smaller tiles fill
# more SMs where the per-rank GEMM has fewer 128 x 256 tiles than the GPU has SMs
CANDIDATES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
              (128, 128, 128, 8, 3), (64, 128, 64, 4, 4), (64, 256, 64, 8, 4), (128, 64, 64, 4, 4)]
# with --split-k, each of these cut into SPLITS K slices too (tiling + (split_k,))
SPLIT_TILINGS = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 64, 4, 4),
                 (64, 128, 64, 4, 4)]
SPLITS = (2, 4, 8)
SMS = 132


def main() -> int:
    import torch
    import triton.testing

    from taxes.provenance import collect
    from taxes.kernels import ag_gemm as ag
    from taxes.run.cases import rel_error

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--tune", action="store_true", help="also time every tiling of CANDIDATES")
    ap.add_argument("--split-k", action="store_true", help="with --tune: SPLIT_TILINGS cut into SPLITS K slices too")
    ap.add_argument("--under-a-wave", action="store_true",
                    help="only per-rank shapes with fewer 128 x 256 output tiles than the GPU has SMs")
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for M, N, K in SHAPES:
        for world in WORLDS:
            n = N // world
            if a.under_a_wave and (M // 128) * (n // 256) >= SMS:
                continue
            A = torch.randn(M, K, device=dev, generator=g).to(torch.bfloat16)
            W = torch.randn(K, n, device=dev, generator=g).to(torch.bfloat16)
            ref = A.float() @ W.float()
            cfg = ag.tuned_config(M, N, K, world, "fused-push")
            gemm = ag.PersistentGemm(dev, cfg)
            out = torch.full((M, n), float("nan"), device=dev, dtype=torch.bfloat16)
            err_ours = rel_error(gemm(A, W, out), ref)
            err_cublas = rel_error(torch.matmul(A, W), ref)
            ours = triton.testing.do_bench(lambda: gemm(A, W, out), rep=a.rep_ms, return_mode="median") * 1e3
            cublas = triton.testing.do_bench(lambda: torch.matmul(A, W), rep=a.rep_ms, return_mode="median") * 1e3
            flop = 2.0 * M * n * K
            tilings = []
            tried = [t + (1,) for t in CANDIDATES] + [t + (s,) for t in SPLIT_TILINGS for s in SPLITS if a.split_k]
            for bm, bn, bk, nw, ns, sk in (tried if a.tune else []):
                if M % bm or n % bn or K % (sk * bk):
                    continue
                c = ag.replace(cfg, block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, split_k=sk)
                try:
                    gm = ag.PersistentGemm(dev, c)
                    o = torch.full((M, n), float("nan"), device=dev, dtype=torch.bfloat16)
                    e = rel_error(gm(A, W, o), ref)
                    t = triton.testing.do_bench(lambda: gm(A, W, o), rep=a.rep_ms // 2, return_mode="median") * 1e3
                except Exception as ex:  # a tiling that does not fit (shared memory) is left out, named
                    tilings.append({"tiling": [bm, bn, bk, nw, ns], "split_k": sk,
                                    "error": str(ex).splitlines()[0][:200]})
                    continue
                tilings.append({"tiling": [bm, bn, bk, nw, ns], "split_k": sk, "us": t, "rel_error": e})
            row = {"M": M, "N": N, "K": K, "world": world, "per_rank": [M, n, K], "config": vars(gemm.cfg),
                   "fused_gemm_us": ours, "cublas_us": cublas, "fused_gemm_tflops": flop / ours / 1e6,
                   "cublas_tflops": flop / cublas / 1e6, "fused_over_cublas": ours / cublas,
                   "rel_error_fused": err_ours, "rel_error_cublas": err_cublas, "tilings": tilings}
            rows.append(row)
            print(f"M={M:6d} N/p={n:6d} K={K} world {world}: fused GEMM {ours:8.1f} us, cuBLAS {cublas:8.1f} us, "
                  f"{ours / cublas:5.3f}x time  (errors {err_ours:.1e} / {err_cublas:.1e})", flush=True)
            ok = [t for t in tilings if "us" in t and t["rel_error"] < 1e-2]
            if ok:
                best = min(ok, key=lambda t: t["us"])
                print(f"    best tiling {best['tiling']} split_k {best['split_k']}: {best['us']:8.1f} us, "
                      f"{best['us'] / cublas:5.3f}x cuBLAS", flush=True)
    meta = {"kind": "gemm-vs-cublas", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            **collect(), "statistic": "median of triton.testing.do_bench, us"}
    with open(a.output, "w") as f:
        json.dump({"metadata": meta, "rows": rows}, f, indent=1)
        f.write("\n")
    bad = [r for r in rows if not (r["rel_error_fused"] < 1e-2)
           or any(not (t["rel_error"] < 1e-2) for t in r["tilings"] if "us" in t)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
