"""How fast the fused ag-gemm's copier CTAs push a rank's rows to its peers beside the GEMM, read from the CTAs'
own stamps in a `taxes validate --planted` run's records (each CTA's start and when its copies were done), set
against what `taxes calibrate` measured for peer copies by CTAs alone (figures peer_cta_gbps, peer_cta_max_gbps).

    python benchmarks/copier_rate.py RUN.records.json.gz --hardware h200-x4-calibrated -o copier_rate.json

Per rank, over the timed calls of the case without a delay: the copiers' last "copies done" after the kernel's
first CTA started (median), the kernel's own length, and the rate that makes: the rank's shard (M/p rows of K
bf16 values) pushed to each of its p - 1 peers.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys


def copier_rates(records: dict, figures: dict | None = None) -> list[dict]:
    """One row per fused case without a delay and rank: copiers, copies done and kernel length (us, median
    over timed calls), bytes pushed per call, the achieved rate (GB/s) and, where figures are given, the rate
    16 such CTAs make alone by calibration (GB/s) and the ratio."""
    from taxes.run.cases import copies_done_us

    out = []
    for key, ranks in records.items():
        if not (isinstance(ranks, list) and key.endswith(" 0") and " fused" in key):
            continue
        world = len(ranks)
        shape = dict((k, int(v)) for k, v in re.findall(r"(\w+)=(\d+)", ranks[0]["facts"]["shape"]))
        pushed = shape["M"] // world * shape["K"] * 2 * (world - 1)
        for rank, r in enumerate(ranks):
            done, length, copiers = [], [], 0
            for it in r["iterations"]:
                if it.get("warmup") or "ctas" not in it:
                    continue
                for rows in it["ctas"].values():
                    copied = copies_done_us(rows)
                    if copied is None:
                        continue
                    copiers = copied[0]
                    done.append(copied[1])
                    length.append((max(x[1] for x in rows) - min(x[0] for x in rows)) / 1e3)
            if not done:
                continue
            row = {"case": key, "rank": rank, "world": world, "shape": shape, "copier_ctas": copiers,
                   "calls": len(done), "copies_done_us": statistics.median(done),
                   "kernel_us": statistics.median(length), "bytes_pushed": pushed,
                   "achieved_gbps": pushed / statistics.median(done) / 1e3}
            if figures and figures.get("peer_cta_gbps"):
                alone = min(figures["peer_cta_gbps"] * copiers, figures.get("peer_cta_max_gbps") or float("inf"))
                row |= {"calibrated_alone_gbps": alone, "achieved_over_alone": row["achieved_gbps"] / alone}
            out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records")
    ap.add_argument("--hardware", help="a calibrated profile whose peer-copy figures to compare with")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    figures = None
    if a.hardware:
        from taxes.model.hardware import get_profile

        hw = get_profile(a.hardware)
        figures = ((hw.extra or {}).get("calibration") or {}).get("figures")
    with gzip.open(a.records, "rt") as f:
        rows = copier_rates(json.load(f), figures)
    if not rows:
        print(f"copier_rate: no fused case with CTA stamps in {a.records}", file=sys.stderr)
        return 2
    with open(a.output, "w") as f:
        json.dump({"made_by": "benchmarks/copier_rate.py", "records": a.records.rsplit("/", 1)[-1],
                   "hardware": a.hardware, "rows": rows}, f, indent=1)
        f.write("\n")
    for r in rows:
        extra = f", {r['achieved_over_alone']:.2f} of {r['calibrated_alone_gbps']:.0f} alone" if "achieved_over_alone" in r else ""
        print(f"{r['case']} rank {r['rank']}: {r['copier_ctas']} copiers done at {r['copies_done_us']:.1f} us of "
              f"{r['kernel_us']:.1f}; {r['achieved_gbps']:.0f} GB/s{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
