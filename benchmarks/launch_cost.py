"""Host cost of one eager call of each variant on one GPU: the time the host spends issuing the work.

    python benchmarks/launch_cost.py --out reports/launch_cost/h100.json
    python benchmarks/launch_cost.py --quick --out /tmp/launch.json     # fewer calls, first shape only
    TRITON_INTERPRET=1 python benchmarks/launch_cost.py --emulate --out /tmp/l.json  # CPU: logic only

For ag-gemm, gemm-rs and tp-mlp at two small shapes each and flash-decode at B=1, S=32K, on one rank
(taxes.kernels.runtime.launch, backend cuda, world 1: the real NCCL and symmetric-memory paths, nothing
divided), every eager variant is built as `taxes profile` builds it (taxes.run.cases), checked once on
NaN-poisoned output against the float32 reference, then timed on the host:

- host_launch_us: time.perf_counter_ns around one call runner(*inputs), the device synchronised before
  each call so the call never waits for room in the launch queue; the median of --calls calls after
  --warmup (and the quartiles), rotating over the case's input sets (each set has its own bound
  launches, as in a profile);
- per_phase_us: the same for each step of runner.phases(*inputs, traced=False), each timed alone
  (synchronised before it) while the steps run in order, so the report shows where the host time goes.

The CUDA-graph variants are extra rows (kind "graph": the host time of one call, a replay), checked on
the first input set after every set has been replayed. --tiers adds a few single launches for comparison
(a Triton kernel through kernel[grid](...) and through a bound launch, one TensorDescriptor built, one
small torch op). The table printed last gives each eager fused variant's ratio to the eager bsp sequence
of the same workload and shape; the target is at most 1.1.

The result is a JSON object {"metadata": {...}, "rows": [{workload, shape, variant, kind,
host_launch_us, per_phase_us, rel_error, ...}]}. It runs on whatever `taxes` is installed, so the same
script measures an older checkout too (--label names it in the metadata).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from taxes.run.cases import TOLERANCE, make_case, rel_error
from taxes.kernels.runtime import launch
from taxes.provenance import collect_metadata
from taxes.workloads import make_workload

SHAPES = {
    "ag-gemm": [{"M": 1024, "N": 8192, "K": 8192}, {"M": 4096, "N": 8192, "K": 8192}],
    "gemm-rs": [{"M": 1024, "N": 8192, "K": 8192}, {"M": 4096, "N": 8192, "K": 8192}],
    "tp-mlp": [{"M": 1024, "H": 4096, "F": 14336}, {"M": 4096, "H": 4096, "F": 14336}],
    "flash-decode": [{"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}],
}
EMULATED_SHAPES = {  # --emulate: tiny, so Triton's interpreter gets through them; times mean nothing
    "ag-gemm": [{"M": 256, "N": 256, "K": 64}],
    "gemm-rs": [{"M": 256, "N": 256, "K": 64}],
    "tp-mlp": [{"M": 256, "H": 64, "F": 128}],
    "flash-decode": [{"B": 1, "Hq": 4, "Hkv": 1, "D": 64, "S": 256}],
}
EAGER = {  # the eager bsp sequence first: the yardstick of the others
    "ag-gemm": ("bsp", "fused-pull", "fused-push"),
    "gemm-rs": ("bsp", "fused-push"),
    "tp-mlp": ("all-bsp", "all-fused-eager"),
    "flash-decode": ("bsp", "fused-push"),
}
GRAPH = {
    "ag-gemm": ("bsp-graph", "fused-push-graph"),
    "gemm-rs": ("bsp-graph", "fused-push-graph"),
    "tp-mlp": ("all-graph", "all-fused"),
    "flash-decode": ("bsp-graph", "fused-push-graph"),
}
TARGET_RATIO = 1.1
METHOD = ("perf_counter_ns around one call, device synchronised before each call; median over {calls} calls "
          "after {warmup} warm-up calls, rotating over {sets} input set(s)")


def _median_us(samples_ns: list[int]) -> float:
    return statistics.median(samples_ns) / 1e3


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _host_cost(runner, inputs: list[tuple], calls: int, warmup: int, spread: dict | None = None) -> float:
    """Median host time (us) of one call, device idle before each call; spread gets the quartiles."""
    n = len(inputs)
    for i in range(warmup):
        runner(*inputs[i % n])
    samples = []
    for i in range(calls):
        _sync()
        t0 = time.perf_counter_ns()
        runner(*inputs[i % n])
        samples.append(time.perf_counter_ns() - t0)
    _sync()
    if spread is not None:
        q = statistics.quantiles(samples, n=4)
        spread.update(p25=q[0] / 1e3, p75=q[2] / 1e3)
    return _median_us(samples)


def _phase_costs(runner, inputs: list[tuple], calls: int, warmup: int) -> dict[str, float]:
    """Median host time (us) of each phase, each timed alone while the phases run in order."""
    steps = [runner.phases(*s, traced=False) for s in inputs]
    names = [name for name, _, _ in steps[0]]
    samples: dict[str, list[int]] = {name: [] for name in names}
    for i in range(warmup + calls):
        for name, _, thunk in steps[i % len(steps)]:
            _sync()
            t0 = time.perf_counter_ns()
            thunk()
            dt = time.perf_counter_ns() - t0
            if i >= warmup:
                samples[name].append(dt)
    _sync()
    return {name: _median_us(s) for name, s in samples.items()}


def _cupti_costs(runner, inputs: list[tuple], calls: int) -> dict:
    """CUPTI's API records of `calls` eager calls (device idle before each): per call, the launch calls' own
    time (launch_api_us), the time from the call's start until its last launch returned (launch_path_us)
    and the number of launches, medians over the calls. {} where cupti-python cannot record."""
    from taxes.run.cupti import Recorder, available

    if available() is not None or not torch.cuda.is_available():
        return {}
    rec = Recorder(api="all").start()
    try:
        for i in range(calls):
            _sync()
            with rec.call(f"call {i}"):
                runner(*inputs[i % len(inputs)])
        _sync()
    finally:
        _, launches, host = rec.stop()
    la = launches[launches["kind"].isin(("launch", "graph"))].sort_values("start_us")
    api, path, n = [], [], []
    for c in host[host["kind"] == "call"].itertuples():
        mine = la[(la["start_us"] >= c.start_us) & (la["start_us"] <= c.end_us)]
        if len(mine):
            api.append(float((mine["end_us"] - mine["start_us"]).sum()))
            path.append(float(mine["end_us"].max() - c.start_us))
            n.append(len(mine))
    if not api:
        return {}
    return {"cupti_launch_api_us": statistics.median(api), "cupti_launch_path_us": statistics.median(path),
            "launches_per_call": statistics.median(n)}


def _checked(runner, case, inputs: tuple) -> float:
    """rel_error of one call on inputs (the first set: the reference's), its output poisoned with NaN."""
    inputs[-1].fill_(float("nan"))
    got = runner(*inputs)
    _sync()
    if hasattr(runner, "check"):
        runner.check()
    return rel_error(got, case.reference)


def _measure_case(ctx, name: str, shape: dict, args) -> list[dict]:
    w = make_workload(name, shape, 1)
    case = make_case(ctx, w)
    rows = []
    for kind, variants in (("eager", EAGER[name]), ("graph", () if args.no_graphs else GRAPH[name])):
        for variant in variants:
            ctx.doing(f"{name} {shape} {variant}")
            row = {"workload": name, "shape": shape, "variant": variant, "kind": kind,
                   "input_sets": len(case.inputs)}
            try:
                runner = case.build(variant)
                err_first = _checked(runner, case, case.inputs[0])
                row["host_launch_us_quartiles"] = spread = {}
                row["host_launch_us"] = _host_cost(runner, case.inputs, args.calls, args.warmup, spread)
                if kind == "eager":
                    row["per_phase_us"] = _phase_costs(runner, case.inputs, args.calls, args.warmup)
                if args.cupti:
                    row.update(_cupti_costs(runner, case.inputs, min(args.calls, 100)))
                # after every input set has been used (graphs captured per set): right on the first set again
                err_after = _checked(runner, case, case.inputs[0])
                row["rel_error"] = max(err_first, err_after)
                row["correct"] = row["rel_error"] < TOLERANCE
                row["method"] = METHOD.format(calls=args.calls, warmup=args.warmup, sets=len(case.inputs))
            except Exception as e:  # one line in the row; the other variants still run
                row["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            finally:
                runner = None
                _sync()
            print(f"  {name:12s} {_shape_text(shape):22s} {variant:17s} "
                  f"{row.get('host_launch_us', math.nan):8.1f} us  err {row.get('rel_error', math.nan):.1e}"
                  f"{'  ' + row['error'] if 'error' in row else ''}", flush=True)
            rows.append(row)
    del case
    _sync()
    ctx.heap.reset()  # nothing of this case is used any more
    return rows


def _tiers(ctx, calls: int, small: bool = False) -> list[dict]:
    """Single launches for comparison: the activation kernel through kernel[grid](...) and bound, one
    TensorDescriptor built, one small torch op."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = []
    M, F = (16, 64) if small else (1024, 1792)
    y1 = torch.randn(M, 2 * F, device=ctx.device).to(torch.bfloat16)
    z = torch.empty(M, F, dtype=torch.bfloat16, device=ctx.device)
    x = torch.zeros(16, device=ctx.device)
    items = [("torch x.add_(1)", lambda: x.add_(1)),
             ("TensorDescriptor.from_tensor", lambda: TensorDescriptor.from_tensor(y1, [128, 64]))]
    try:
        from taxes.kernels.tp_mlp import bind_swiglu

        bound = bind_swiglu(y1, z)
        bound()
        bound()
        items += [("swiglu kernel[grid](...)", lambda: bound.fn[bound.grid](*bound.args, **bound.kwargs)),
                  (f"swiglu bound launch ({bound.mode})", bound)]
    except ImportError:  # an older checkout has no bound launches
        from taxes.kernels.tp_mlp import swiglu

        items.append(("swiglu(y1, z)", lambda: swiglu(y1, z)))
    for label, fn in items:
        rows.append({"what": label, "host_us": _host_cost(lambda: fn(), [()], calls, 20)})
        print(f"  {label:40s} {rows[-1]['host_us']:7.2f} us", flush=True)
    return rows


def job(ctx, args) -> dict:
    rows = []
    for name, shapes in (EMULATED_SHAPES if args.emulate else SHAPES).items():
        if args.workloads and name not in args.workloads:
            continue
        for shape in shapes[:1] if args.quick else shapes:
            rows += _measure_case(ctx, name, shape, args)
    tiers = _tiers(ctx, args.calls, small=args.emulate) if args.tiers else None
    gpu = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "emulated"
    return {"rows": rows, "tiers": tiers, "gpu": gpu}


def _shape_text(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items() if k not in ("Hq", "Hkv", "D"))


def ratio_rows(rows: list[dict]) -> list[tuple]:
    """(workload, shape, variant, host us, bsp host us, ratio) for every eager fused variant."""
    out = []
    for r in rows:
        if r["kind"] != "eager" or r["variant"] == EAGER[r["workload"]][0]:
            continue
        base = next((b for b in rows if b["workload"] == r["workload"] and b["shape"] == r["shape"]
                     and b["variant"] == EAGER[r["workload"]][0]), None)
        us, bsp_us = r.get("host_launch_us"), (base or {}).get("host_launch_us")
        ratio = us / bsp_us if us is not None and bsp_us else None
        out.append((r["workload"], _shape_text(r["shape"]), r["variant"], us, bsp_us, ratio))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="result JSON")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="first shape of each workload, 60 calls")
    ap.add_argument("--workloads", nargs="*", help="only these workloads")
    ap.add_argument("--tiers", action="store_true", help="also time single launches for comparison")
    ap.add_argument("--cupti", action="store_true", help="also CUPTI's API records of each eager call (cupti-python)")
    ap.add_argument("--no-graphs", action="store_true", help="eager variants only")
    ap.add_argument("--label", default="", help="what checkout this measures (recorded in the metadata)")
    ap.add_argument("--commit", default=None, help="the measured commit, when the copy has no .git")
    ap.add_argument("--emulate", action="store_true", help="CPU, Triton's interpreter, tiny shapes: logic only")
    args = ap.parse_args()
    if args.quick or args.emulate:
        args.calls, args.warmup = (3, 1) if args.emulate else (60, 10)
    if not args.emulate and not torch.cuda.is_available():
        raise SystemExit("launch_cost.py measures host launch costs on a GPU; none here (--emulate: logic only)")
    backend, heap = ("emulated", 64 << 20) if args.emulate else ("cuda", 1 << 30)
    res = launch(job, 1, args, backend=backend, heap_bytes=heap, timeout_s=900)[0]
    meta = collect_metadata("launch-cost", 1, None, benchmark="benchmarks/launch_cost.py", label=args.label,
                            gpu=res["gpu"], calls=args.calls, warmup=args.warmup)
    if args.commit:
        meta["git_commit"] = args.commit
    doc = {"metadata": meta, "rows": res["rows"], "tiers": res["tiers"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    bad = [r for r in res["rows"] if not r.get("correct")]
    print(f"\nwrote {args.out}; {len(res['rows'])} rows, {len(bad)} failed or wrong"
          + "".join(f"\n  {r['workload']} {r['variant']}: {r.get('error') or r.get('rel_error')}" for r in bad))
    print(f"\n{'workload':12s} {'shape':22s} {'variant':16s} {'host us':>8s} {'bsp us':>8s} {'ratio':>6s}")
    for wl, shape, variant, us, bsp_us, ratio in ratio_rows(res["rows"]):
        mark = "" if ratio is None else ("  ok" if ratio <= TARGET_RATIO else "  over")
        print(f"{wl:12s} {shape:22s} {variant:16s} {us or math.nan:8.1f} {bsp_us or math.nan:8.1f} "
              f"{ratio or math.nan:6.2f}{mark}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
