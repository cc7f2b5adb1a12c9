"""Diagnostic (not a benchmark): what each way of timing phases costs E2E at launch-bound shapes.

Per variant, on every rank, the median E2E of the same iterations timed
- plain: a start and an end event (what the tables use);
- events: an event before and after every phase (fused: the traced build);
- events-untraced: the same, fused variants with their plain build (the events' own cost);
- cupti: plain iterations under torch.profiler with CUDA activities only (kernel timestamps, no host
  ranges);
- cupti+cpu: the same with CPU activities too (what `--trace` records);
- plain again (drift).
Writes OUT/diag_timing.json and each rank's CUPTI trace of the last variant's `cupti` run; prints a table.

    python benchmarks/diag_timing.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import _checkout  # noqa: F401

import torch  # noqa: E402
from taxes.kernels.runtime import launch  # noqa: E402

CASES = [("ag-gemm", {"M": 1024, "N": 8192, "K": 8192}, ["bsp", "bsp-graph", "fused-push-graph"]),
         ("flash-decode", {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 8192},
          ["bsp", "bsp-graph", "fused-push", "fused-push-graph"])]


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def _device_activities(trace_path: Path) -> list[dict]:
    evs = json.loads(trace_path.read_text())["traceEvents"]
    return [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("ph") == "X"]


def job(ctx, out_dir: str, iters: int):
    from torch.profiler import ProfilerActivity, profile

    from taxes.cases import make_case
    from taxes.harness import time_iterations, time_phases, warm_clocks
    from taxes.workloads import is_fused, is_graphed, make_workload

    warm_clocks(ctx, 2.0)
    res = []
    for name, shape, variants in CASES:
        ctx.heap.reset()
        w = make_workload(name, shape, ctx.world, "bf16")
        case = make_case(ctx, w, 5.0, {})
        for v in variants:
            run = case.build(v)
            run(*case.inputs[0])
            torch.cuda.synchronize()
            row = {"workload": name, "shape": shape, "variant": v}
            row["plain"] = _median(time_iterations(ctx, run, case.inputs, iters, 5))
            fused = is_fused(v)
            recs = time_phases(ctx, lambda *x: run.phases(*x, traced=fused), case.inputs, iters, 5, graph=is_graphed(v))
            row["events"] = _median([r["e2e_us"] for r in recs])
            if fused:
                recs = time_phases(ctx, lambda *x: run.phases(*x, traced=False), case.inputs, iters, 5,
                                   graph=is_graphed(v))
                row["events_untraced"] = _median([r["e2e_us"] for r in recs])
            for key, acts in (("cupti", [ProfilerActivity.CUDA]),
                              ("cupti+cpu", [ProfilerActivity.CPU, ProfilerActivity.CUDA])):
                with profile(activities=acts) as prof:
                    row[key] = _median(time_iterations(ctx, run, case.inputs, iters, 5))
                if key == "cupti":
                    path = Path(out_dir) / f"cupti_{name}_{v}_rank{ctx.rank}.json"
                    prof.export_chrome_trace(str(path))
                    acts_ = _device_activities(path)
                    row["device_activities"] = len(acts_)
                    row["per_iteration"] = len(acts_) / (iters + 5)
                    names: dict = {}
                    for e in acts_:
                        names.setdefault(e["name"][:90], []).append(e["dur"])
                    row["kernels"] = {k: {"n": len(d), "median_us": _median(d)} for k, d in names.items()}
            row["plain_again"] = _median(time_iterations(ctx, run, case.inputs, iters, 5))
            res.append(row)
            run = None
            torch.cuda.synchronize()
            ctx.barrier()
    return res


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    results = launch(job, 2, str(out), 40, backend="cuda", heap_bytes=1 << 30, timeout_s=400)
    (out / "diag_timing.json").write_text(json.dumps(results, indent=1))
    keys = ["plain", "events", "events_untraced", "cupti", "cupti+cpu", "plain_again"]
    print(f"{'case':34} {'variant':17} " + " ".join(f"{k:>16}" for k in keys) + "  acts/iter")
    for r0, r1 in zip(*results):
        shape = ",".join(f"{k}={v}" for k, v in r0["shape"].items() if k in "MNBS")
        cells = []
        for k in keys:
            if k not in r0:
                cells.append(f"{'-':>16}")
                continue
            e = max(r0[k], r1[k])
            cells.append(f"{e:8.1f} {100 * (e / max(r0['plain'], r1['plain']) - 1):+6.1f}%")
        print(f"{r0['workload'] + ' ' + shape:34} {r0['variant']:17} " + " ".join(cells) + f"  {r0.get('per_iteration', 0):.1f}")
    for r in results[0]:
        print(r["variant"], {k[:60]: round(v["median_us"], 1) for k, v in r.get("kernels", {}).items()})
