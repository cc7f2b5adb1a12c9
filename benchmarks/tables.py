"""The benchmark tables of docs/ag_gemm.md, docs/gemm_rs.md, docs/tp_mlp.md and docs/flash_decode.md, from
committed result documents.

    python benchmarks/tables.py ag-gemm reports/profile/ag_gemm_N8192.json reports/profile/ag_gemm_N28672.json
    python benchmarks/tables.py gemm-rs reports/gemm_rs/gemm_rs.json
    python benchmarks/tables.py tp-mlp reports/tp_mlp/tp_mlp.json
    python benchmarks/tables.py flash-decode reports/profile/flash_decode.json --hbm-gbps 4200

Prints Markdown: per shape the median E2E of every variant (max over ranks per iteration), the best fused
variant's speed-up over bsp and over PyTorch's fused op (ag-gemm, gemm-rs), or the KV-read floor (flash-decode).
"""

from __future__ import annotations

import argparse
import sys

import _checkout  # noqa: F401

from taxes.results import load  # noqa: E402


def _medians(case: dict) -> dict[str, float]:
    return {v["variant"]: v["e2e_us"]["median"] for v in case["variants"] if v["e2e_us"]["median"] is not None
            and v["correctness"].get("passed")}


# per workload: the baseline, the prefix of the fused variants, PyTorch's own fused op, the shape's columns
TABLES = {"ag-gemm": ("bsp", "fused", "torch-async-tp", ("M", "N")),
          "gemm-rs": ("bsp", "fused", "torch-fused-rs", ("M", "N", "K")),
          "tp-mlp": ("all-bsp", "all-fused", None, ("M", "H", "F"))}


def speedup_table(workload: str, docs: list[dict]) -> str:
    base, prefix, peer_name, dims = TABLES[workload]
    names = None
    lines = []
    for doc in docs:
        for case in doc["cases"]:
            med = _medians(case)
            names = names or [v["variant"] for v in case["variants"]]
            fused = {n: t for n, t in med.items() if n.startswith(prefix)}
            best = min(fused, key=fused.get) if fused else None
            peer = med.get(peer_name)
            s = case["shape"]
            cells = " | ".join(f"{med[n]:,.1f}" if n in med else "failed" for n in names)
            ratio = f"{med[base] / fused[best]:.2f}x" if best and base in med else "-"
            vs_peer = f"{peer / fused[best]:.2f}x" if best and peer else "-"
            lines.append(f"| {' | '.join(str(s[d]) for d in dims)} | {cells} | {best or '-'} | {ratio} |"
                         + (f" {vs_peer} |" if peer_name else ""))
    head = (f"| {' | '.join(dims)} | " + " | ".join(names) + f" | best fused | {base} / best |"
            + (f" {peer_name} / best |" if peer_name else ""))
    return "\n".join([head, "|" + "---:|" * (head.count("|") - 1)] + lines)


def ag_gemm_table(docs: list[dict]) -> str:
    return speedup_table("ag-gemm", docs)


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
    ap.add_argument("workload", choices=[*TABLES, "flash-decode"])
    ap.add_argument("documents", nargs="+")
    ap.add_argument("--hbm-gbps", type=float, default=4200.0, help="HBM bandwidth for the KV-read floor (GB/s)")
    args = ap.parse_args(argv)
    docs = [load(p) for p in args.documents]
    print(flash_decode_table(docs[0], args.hbm_gbps) if args.workload == "flash-decode" else speedup_table(args.workload, docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
