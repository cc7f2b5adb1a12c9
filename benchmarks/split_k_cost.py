"""What split-K's fixup costs the fused ag-gemm's GEMM, on one GPU.

A GEMM cut into S K slices (split_k=S at M x N x K) runs the same units of work as the whole-K GEMM at
S*M x N x K/S: as many units, each the same size, in the same queue. The difference between the two is
what the slices' fixup costs (every slice stores its float32 partial, the last adds them). cuBLAS at
M x N x K is the bar. Also reported: the compiled kernel's registers and spills per build.

    python benchmarks/split_k_cost.py -o OUT/split_k_cost-h200.json

Times are the median of triton.testing.do_bench (L2 flushed between calls), us.
"""

from __future__ import annotations

import argparse
import json
import sys

# (M, N per rank, K, block_m, block_n, num_warps, num_stages, split_k): the per-rank shapes under a wave
CASES = [(512, 2048, 8192, 128, 128, 4, 4, 2), (512, 2048, 8192, 128, 256, 8, 4, 4),
         (512, 4096, 8192, 128, 256, 8, 4, 2), (512, 4096, 8192, 128, 128, 4, 4, 2),
         (1024, 2048, 8192, 128, 256, 8, 4, 2)]


def compiled_builds() -> list[dict]:
    """Registers, spills and shared memory of every build of the fused kernel compiled so far."""
    from taxes.kernels.ag_gemm_kernel import ag_gemm_fused_kernel as kernel

    out = []
    for cache in kernel.device_caches.values():
        for compiled in cache[0].values():
            compiled._init_handles()
            names = {kernel.arg_names[k[0]] if isinstance(k, tuple) else str(k): v
                     for k, v in compiled.src.constants.items()}
            out.append({"BM": names.get("BM"), "BN": names.get("BN"), "SPLIT_K": names.get("SPLIT_K"),
                        "registers": compiled.n_regs, "spills": compiled.n_spills, "shared_bytes": compiled.metadata.shared})
    return out


def main() -> int:
    import torch
    import triton.testing

    from taxes.provenance import collect
    from taxes.kernels import ag_gemm as ag
    from taxes.run.cases import rel_error

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--rep-ms", type=int, default=100)
    a = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows, bad = [], 0
    for M, n, K, bm, bn, nw, ns, S in CASES:
        row = {"M": M, "N_local": n, "K": K, "tiling": [bm, bn, 64, nw, ns], "split_k": S}
        for key, (m, k, s) in (("split_us", (M, K, S)), ("units_alone_us", (S * M, K // S, 1)), ("whole_k_us", (M, K, 1))):
            A = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
            W = torch.randn(k, n, device=dev, generator=g).to(torch.bfloat16)
            gemm = ag.PersistentGemm(dev, ag.Config(block_m=bm, block_n=bn, num_warps=nw, num_stages=ns, split_k=s))
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            err = rel_error(gemm(A, W, out), A.float() @ W.float())
            bad += not (err < 1e-2)
            row[key] = triton.testing.do_bench(lambda: gemm(A, W, out), rep=a.rep_ms, return_mode="median") * 1e3
            row[key.replace("_us", "_rel_error")] = err
            if key == "split_us":
                row["cublas_us"] = triton.testing.do_bench(lambda: torch.matmul(A, W), rep=a.rep_ms,
                                                           return_mode="median") * 1e3
        row["fixup_us"] = row["split_us"] - row["units_alone_us"]
        rows.append(row)
        print(f"{M}x{n}x{K} {bm}x{bn} split {S}: {row['split_us']:6.1f} us, its units alone {row['units_alone_us']:6.1f}, "
              f"whole K {row['whole_k_us']:6.1f}, cuBLAS {row['cublas_us']:6.1f}", flush=True)
    builds = compiled_builds()
    for b in builds:
        print(b)
    meta = {"kind": "split-k-cost", "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, **collect(),
            "statistic": "median of triton.testing.do_bench, us"}
    with open(a.output, "w") as f:
        json.dump({"metadata": meta, "rows": rows, "builds": builds}, f, indent=1)
        f.write("\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
