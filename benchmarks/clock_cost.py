"""What measuring costs, clock by clock: one workload's variants on one GPU, timed plain (CUDA events) and
instrumented with each per-kernel clock, the modes interleaved in rounds so drift touches all alike.

    python benchmarks/clock_cost.py --workload flash-decode --shape B=1,S=131072 --out cost.json

Modes: stamps (host stamps only, no device clock: what the stamps themselves cost), cupti (device
activities, launch calls in the warm-up only: the default clock), cupti-capture (the same with graphs
instantiated after the clock started), cupti-api (launch calls recorded in every iteration),
torch.profiler. Cost = interquartile-mean E2E instrumented / plain - 1.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from taxes.attribution.attribute import iqm
from taxes.run.cases import make_case
from taxes.run.harness import time_iterations
from taxes.run.instrument import HostRecorder, make_recorder, record_iterations
from taxes.kernels.runtime import launch
from taxes.provenance import collect_metadata
from taxes.variants import get, names
from taxes.workloads import DEFAULT_SHAPES, make_workload, parse_shape

MODES = ("stamps", "cupti", "cupti-capture", "cupti-api", "torch.profiler")


class Stamps(HostRecorder):
    """Host stamps on the host clock and nothing else (the device runs unobserved)."""

    name = "stamps"


def job(ctx, args):
    w = make_workload(args.workload, dict(DEFAULT_SHAPES[args.workload]) | parse_shape(args.shape), 1)
    case = make_case(ctx, w)
    out = {}
    variants = [v for v in names(args.workload) if not get(args.workload, v).peer]
    runners = {v: case.build(v) for v in variants}
    for v, r in runners.items():
        r(*case.inputs[0])
    torch.cuda.synchronize()
    modes = [m for m in MODES if m != "torch.profiler"] + ["torch.profiler"]  # torch.profiler last: one CUPTI client
    for rnd in range(args.rounds):
        for mode in modes:
            if mode == "torch.profiler" and rnd != args.rounds - 1:
                continue
            for v, r in runners.items():
                x = get(args.workload, v)
                plain = time_iterations(ctx, r, case.inputs, args.iters, 3)
                rec = (Stamps() if mode == "stamps" else make_recorder(
                    "cupti" if mode.startswith("cupti") else "torch.profiler", True,
                    api="all" if mode == "cupti-api" else "warmup"))
                raw = record_iterations(ctx, r, case.inputs, args.iters, 3, rec, graph=x.graphed, fused=False,
                                        capture_after_start=mode == "cupti-capture")
                instr = [it["e2e_us"] for it in raw["iterations"] if not it["warmup"]]
                d = out.setdefault(v, {}).setdefault(mode, {"plain": [], "instrumented": []})
                d["plain"] += plain
                d["instrumented"] += instr
    rows = []
    for v, modes_ in out.items():
        for mode, d in modes_.items():
            p, i = iqm(d["plain"]), iqm(d["instrumented"])
            rows.append({"variant": v, "mode": mode, "plain_us": p, "instrumented_us": i, "cost_pct": 100 * (i / p - 1),
                         "n": len(d["plain"])})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="flash-decode")
    ap.add_argument("--shape", default="B=1,S=131072")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    t0 = time.time()
    rows = launch(job, 1, args, backend="cuda", timeout_s=500)[0]
    meta = collect_metadata("clock-cost", 1, "n/a", gpu_names=[torch.cuda.get_device_name(0)] if torch.cuda.is_available() else [])
    with open(args.out, "w") as f:
        json.dump({"metadata": meta, "workload": args.workload, "shape": args.shape, "rows": rows}, f, indent=1)
    print(f"{'variant':18s}" + "".join(f"{m:>15s}" for m in MODES))
    for v in dict.fromkeys(r["variant"] for r in rows):
        cells = {r["mode"]: r["cost_pct"] for r in rows if r["variant"] == v}
        print(f"{v:18s}" + "".join(f"{cells[m]:+14.1f}%" if m in cells else f"{'-':>15s}" for m in MODES))
    print(f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
