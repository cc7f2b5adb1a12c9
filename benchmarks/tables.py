"""The benchmark tables of docs/ag_gemm.md and docs/flash_decode.md, from committed result documents.

    python benchmarks/tables.py ag-gemm reports/profile/ag_gemm_N8192.json reports/profile/ag_gemm_N28672.json
    python benchmarks/tables.py flash-decode reports/profile/flash_decode.json --hbm-gbps 4200

Prints Markdown: per shape the median E2E of every variant (max over ranks per iteration), the best fused
variant's speed-up over bsp and over torch-async-tp (ag-gemm), or the KV-read floor (flash-decode).
"""

from __future__ import annotations

import argparse
import sys

import _checkout  # noqa: F401

from taxes.results import load  # noqa: E402


def _medians(case: dict) -> dict[str, float]:
    return {v["variant"]: v["e2e_us"]["median"] for v in case["variants"] if v["e2e_us"]["median"] is not None
            and v["correctness"].get("passed")}


def ag_gemm_table(docs: list[dict]) -> str:
    names = None
    lines = []
    for doc in docs:
        for case in doc["cases"]:
            med = _medians(case)
            names = names or [v["variant"] for v in case["variants"]]
            fused = {n: t for n, t in med.items() if n.startswith("fused")}
            best = min(fused, key=fused.get)
            peer = med.get("torch-async-tp")
            s = case["shape"]
            cells = " | ".join(f"{med[n]:,.1f}" if n in med else "failed" for n in names)
            lines.append(f"| {s['M']} | {s['N']} | {cells} | {best} | {med['bsp'] / fused[best]:.2f}x | "
                         + (f"{peer / fused[best]:.2f}x |" if peer else "- |"))
    head = "| M | N | " + " | ".join(names) + " | best fused | bsp / best | torch-async-tp / best |"
    return "\n".join([head, "|" + "---:|" * (head.count("|") - 1)] + lines)


def flash_decode_table(doc: dict, hbm_gbps: float) -> str:
    names = [v["variant"] for v in doc["cases"][0]["variants"]]
    lines = []
    for case in doc["cases"]:
        med = _medians(case)
        fused = {n: t for n, t in med.items() if n.startswith("fused")}
        best = min(fused, key=fused.get)
        floor = case["extra"]["kv_bytes"] / (hbm_gbps * 1e3)
        s = case["shape"]
        cells = " | ".join(f"{med[n]:,.1f}" if n in med else "failed" for n in names)
        lines.append(f"| {s['B']} | {s['S'] // 1024}K | {cells} | {best} | {med['bsp'] / fused[best]:.2f}x | "
                     f"{floor:,.1f} | {fused[best] / floor:.2f}x |")
    head = ("| B | S per rank | " + " | ".join(names) + " | best fused | bsp / best | KV floor | best / floor |")
    return "\n".join([head, "|" + "---:|" * (head.count("|") - 1)] + lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=["ag-gemm", "flash-decode"])
    ap.add_argument("documents", nargs="+")
    ap.add_argument("--hbm-gbps", type=float, default=4200.0, help="HBM bandwidth for the KV-read floor (GB/s)")
    args = ap.parse_args(argv)
    docs = [load(p) for p in args.documents]
    print(ag_gemm_table(docs) if args.workload == "ag-gemm" else flash_decode_table(docs[0], args.hbm_gbps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
