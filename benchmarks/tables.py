"""The result tables of docs/, from result documents: per shape every variant's E2E (the interquartile
mean over iterations of the slowest rank's time, us), the best fused variant and its speed-up over the
bulk-synchronous one and over PyTorch's own fused op where there is one; for flash decode the KV-read
floor beside it.

    python benchmarks/tables.py reports/profile/ag_gemm-h100-x2.json.gz reports/profile/ag_gemm-h100-x4.json.gz
    python benchmarks/tables.py DOCUMENT --hbm-gbps GBPS     # flash decode: the KV-read floor at that rate

Prints Markdown. A variant that failed its check, or was not run, reads "-".
"""

from __future__ import annotations

import argparse
import sys

from taxes.documents.results import load
from taxes.reports.markdown_table import md_table
from taxes.variants import get, rung_of

DIMS = {"ag-gemm": ("M", "N"), "gemm-rs": ("M", "N", "K"), "tp-mlp": ("M", "H", "F"), "flash-decode": ("B", "S")}


def e2e(case: dict) -> dict[str, float]:
    """Each correct variant's E2E (us): the interquartile mean, else the median of older documents."""
    out = {}
    for v in case["variants"]:
        t = v["e2e_us"].get("iqm", v["e2e_us"].get("median"))
        if t is not None and (v.get("correctness") or {}).get("passed"):
            out[v["variant"]] = t
    return out


def table(docs: list[dict], hbm_gbps: float | None = None) -> str:
    cases = [c for d in docs for c in d["cases"]]
    workload = cases[0]["workload"]
    names = list(dict.fromkeys(v["variant"] for c in cases for v in c["variants"]))
    base = rung_of(workload, "bsp")[0]
    peer = next((n for n in names if get(workload, n).peer), None)
    head = [*DIMS[workload], *names, "best fused", f"{base} / best"] + ([f"{peer} / best"] if peer else [])
    if workload == "flash-decode":
        head += ["KV floor", "best / floor"]
    rows = []
    for case in cases:
        t = e2e(case)
        fused = {n: x for n, x in t.items() if get(workload, n).fused}
        best = min(fused, key=fused.get) if fused else None
        row = [_dim(case["shape"], d) for d in DIMS[workload]]
        row += [f"{t[n]:,.1f}" if n in t else "-" for n in names]
        row += [best or "-", f"{t[base] / fused[best]:.2f}x" if best and base in t else "-"]
        if peer:
            row.append(f"{t[peer] / fused[best]:.2f}x" if best and peer in t else "-")
        if workload == "flash-decode":
            floor = case["extra"]["kv_bytes"] / (hbm_gbps * 1e3) if hbm_gbps else None
            row += [f"{floor:,.1f}" if floor else "-", f"{fused[best] / floor:.2f}x" if floor and best else "-"]
        rows.append(row)
    return md_table(head, rows, numbers=range(len(head)))


def _dim(shape: dict, d: str) -> str:
    return f"{shape[d] // 1024}K" if d == "S" else str(shape[d])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("documents", nargs="+", help="result documents of one workload")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="flash decode: HBM rate of the KV-read floor (GB/s)")
    args = ap.parse_args(argv)
    print(table([load(p) for p in args.documents], args.hbm_gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
