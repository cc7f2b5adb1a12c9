"""What makes a fused variant's instrumented iterations longer than its plain ones? The same eager fused
variant, interleaved in rounds, four ways: plain (events only, the untraced build), plain with the traced
build (its CTAs' stamps on, no clock), the per-kernel clock (cupti-python) on the untraced build, and the clock
on the traced build with its stamps read after every iteration (what taxes profile's instrumented iterations
do). E2E per iteration is the slowest rank's end - start, from the same events in every way.

    python3 benchmarks/fused_trace_cost.py --gpus 2 --out fused_trace_cost.json
"""

from __future__ import annotations

import argparse
import json
import time

CASES = (("ag-gemm", "M=512,N=8192,K=8192"), ("ag-gemm", "M=1024,N=8192,K=8192"),
         ("flash-decode", "B=1,Hq=64,Hkv=8,D=128,S=32768"))
WAYS = ("plain", "plain traced", "clock", "clock traced", "clock traced unread", "plain traced loop",
        "plain traced read", "plain traced idle")
IDLE_S = 300e-6  # what reading the stamps adds between two iterations


def job(ctx, iters: int, rounds: int, variant: str) -> dict:
    import torch

    from taxes.run.cases import make_case
    from taxes.run.harness import time_iterations
    from taxes.run.instrument import make_recorder, record_iterations
    from taxes.run.measure import critical_waits
    from taxes.workloads import make_workload, parse_shape

    out = {}
    for workload, shape in CASES:
        ctx.heap.reset()
        w = make_workload(workload, parse_shape(shape), ctx.world, "bf16")
        case = make_case(ctx, w, 10.0, None)
        runner = case.build(variant)
        runner(*case.inputs[0])

        def traced(*args):
            for _, _, thunk in runner.phases(*args, traced=True):
                thunk()

        def timed(after) -> list[float]:
            """time_iterations' loop with `after` run once the end event is reached (outside the window)."""
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for i in range(3 + iters):
                args = case.inputs[i % len(case.inputs)]
                ctx.start_barrier()
                start.record()
                traced(*args)
                end.record()
                end.synchronize()
                if i >= 3:
                    samples.append(start.elapsed_time(end) * 1e3)
                after()
            return samples

        def idle():
            t = time.perf_counter() + IDLE_S
            while time.perf_counter() < t:
                pass

        got = {k: [] for k in WAYS}
        for r in range(rounds):
            warm = 3
            got["plain"] += time_iterations(ctx, runner, case.inputs, iters, warm)
            got["plain traced"] += time_iterations(ctx, traced, case.inputs, iters, warm)
            got["plain traced loop"] += timed(lambda: None)
            got["plain traced read"] += timed(lambda: critical_waits(runner))
            got["plain traced idle"] += timed(idle)
            for way, fused, read in (("clock", False, False), ("clock traced", True, True),
                                     ("clock traced unread", True, False)):
                raw = record_iterations(ctx, runner, case.inputs, iters, warm, make_recorder("cupti", True, "none"),
                                        graph=False, fused=fused, trace_of=critical_waits if read else None)
                got[way] += [it["e2e_us"] for it in raw["iterations"] if not it["warmup"]]
            torch.cuda.synchronize()
        out[f"{workload} {shape}"] = got
        del runner, case
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--iters", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--variant", default="fused-push")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from taxes.attribution.attribute import iqm
    from taxes.kernels.runtime import launch
    from taxes.run.profile import heap_bytes
    from taxes.workloads import make_workload, parse_shape

    heap = max(heap_bytes(make_workload(wl, parse_shape(sh), a.gpus, "bf16")) for wl, sh in CASES)
    res = launch(job, a.gpus, a.iters, a.rounds, a.variant, backend="cuda", timeout_s=400, heap_bytes=heap)
    table = {}
    for case in res[0]:
        e2e = {way: [max(col) for col in zip(*(r[case][way] for r in res))] for way in WAYS}
        table[case] = {way: iqm(v) for way, v in e2e.items()}
        print(case + ": " + ", ".join(f"{way} {table[case][way]:.1f}" for way in WAYS))
    with open(a.out, "w") as f:
        json.dump({"world": a.gpus, "variant": a.variant, "iters": a.iters, "rounds": a.rounds, "iqm_us": table,
                   "per_rank_us": res}, f)


if __name__ == "__main__":
    main()
