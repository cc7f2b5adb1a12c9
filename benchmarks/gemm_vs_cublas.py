"""The fused ag-gemm's GEMM alone against cuBLAS at the per-rank shape, on one GPU.

At world p each rank of the fused all-gather + GEMM multiplies the gathered M x K rows by its K x N/p
columns. Fusion can only win what its GEMM does not lose: this times the fused kernel's persistent GEMM
(kernels/ag_gemm.py PersistentGemm: the same tiles, the same queue, no flags and no copies, every SM
computing) with the tuned configuration of that shape and world, against torch.matmul (cuBLAS) at the
same shape, both checked against a float32 product first (outputs poisoned with NaN).

    python benchmarks/gemm_vs_cublas.py -o OUT/gemm_vs_cublas-h200.json

Times are the median of triton.testing.do_bench (L2 flushed between calls), us; TFLOP/s from 2MNK.
"""

from __future__ import annotations

import argparse
import json
import sys

SHAPES = [(m, 8192, 8192) for m in (512, 1024, 2048, 4096, 8192, 16384)] + [(8192, 28672, 8192)]
WORLDS = (2, 4)


def rel_error(got, ref) -> float:
    import torch

    if not torch.isfinite(got).all():
        return float("inf")
    return float((got.float() - ref).norm() / ref.norm())


def main() -> int:
    import torch
    import triton.testing

    from taxes.documents.provenance import collect
    from taxes.kernels import ag_gemm as ag

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--rep-ms", type=int, default=200)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for M, N, K in SHAPES:
        for world in WORLDS:
            n = N // world
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
            row = {"M": M, "N": N, "K": K, "world": world, "per_rank": [M, n, K], "config": vars(gemm.cfg),
                   "fused_gemm_us": ours, "cublas_us": cublas, "fused_gemm_tflops": flop / ours / 1e6,
                   "cublas_tflops": flop / cublas / 1e6, "fused_over_cublas": ours / cublas,
                   "rel_error_fused": err_ours, "rel_error_cublas": err_cublas}
            rows.append(row)
            print(f"M={M:6d} N/p={n:6d} K={K} world {world}: fused GEMM {ours:8.1f} us, cuBLAS {cublas:8.1f} us, "
                  f"{ours / cublas:5.3f}x time  (errors {err_ours:.1e} / {err_cublas:.1e})", flush=True)
    meta = {"kind": "gemm-vs-cublas", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            **collect(), "statistic": "median of triton.testing.do_bench, us"}
    with open(a.output, "w") as f:
        json.dump({"metadata": meta, "rows": rows}, f, indent=1)
        f.write("\n")
    bad = [r for r in rows if not (r["rel_error_fused"] < 1e-2)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
