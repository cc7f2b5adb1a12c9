"""How long a late rank's device waited at its host gate, per planted length, from a known-answer run's records.

The late rank (rank 1) of `taxes validate --planted` leaves the aligned start's all-reduce and then waits at
the gate (taxes.run.host_gate) until its host opens it; the gap from that all-reduce's end to the start of the
next device activity other than the gate's own kernel is what the device waited, the gate's kernel included.
A runner that computes before its collective (gemm-rs bsp) meets its gate later, so its gap after the
all-reduce is not the gate's: such runners (no gap of at least half the longest delay) are left out.
Percentiles per runner and planted length, from the per-kernel clock of the instrumented iterations:

    python benchmarks/gate_gaps.py reports/known_answer/h100-x2-1.records.json.gz -o gaps.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys

import numpy as np


def gate_gaps(records: dict, late: int = 1) -> dict:
    """{case key: {"n", "p5", "p25", "p50", "p75", "p95"} (us)} for every host-delay case."""
    out = {}
    for key, ranks in records.items():
        parts = key.split(" ")
        if len(parts) < 4 or parts[-2] != "host":
            continue
        a = ranks[late]["activities"]
        order = np.argsort(a["start_us"])
        names = [a["name"][i] for i in order]
        starts = np.asarray(a["start_us"], float)[order]
        ends = np.asarray(a["end_us"], float)[order]
        gaps = []
        for j, name in enumerate(names[:-1]):
            if "AllReduce" not in name:
                continue
            k = j + 1
            while k < len(names) and "host_gate_wait" in names[k]:
                k += 1
            if k < len(names) and "Sleep" not in names[k] and "AllReduce" not in names[k]:
                gaps.append(starts[k] - ends[j])
        if gaps:
            p = np.percentile(gaps, [5, 25, 50, 75, 95])
            out[key] = {"n": len(gaps), **{f"p{q}": round(float(v), 2) for q, v in zip((5, 25, 50, 75, 95), p)}}
    longest = {}
    for key in out:
        runner, x = key.rsplit(" ", 2)[0], float(key.rsplit(" ", 1)[1])
        if x > longest.get(runner, (0.0, None))[0]:
            longest[runner] = (x, out[key]["p50"])
    gated = {r for r, (x, p50) in longest.items() if p50 >= 0.5 * x}
    return {k: v for k, v in out.items() if k.rsplit(" ", 2)[0] in gated}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records")
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args()
    try:
        records = json.loads(gzip.decompress(open(args.records, "rb").read()))
    except (OSError, ValueError) as e:
        print(f"gate_gaps: {args.records}: {e}", file=sys.stderr)
        return 2
    out = {"records": args.records, "gaps_us": gate_gaps(records)}
    text = json.dumps(out, indent=1) + "\n"
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
    for k, v in out["gaps_us"].items():
        print(f"{k:32s} n={v['n']:3d}  p5 {v['p5']:7.1f}  p50 {v['p50']:7.1f}  p95 {v['p95']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
