"""Tune the fused kernels on this machine's GPUs: the tables kernels/ag_gemm_tuned.json and
kernels/gemm_rs_tuned.json that `taxes profile` then runs.

    python benchmarks/tune.py ag-gemm --gpus 2 --out OUT                               # every fused variant, the sweep's shapes
    python benchmarks/tune.py ag-gemm --gpus 2 --variants fused-push-graph --install --out OUT
    python benchmarks/tune.py ag-gemm --gpus 2 --variants fused-push --producers ctas \
        --shape M=4096,N=28672,K=4096 --install --out OUT                                # tp-mlp's first GEMM
    python benchmarks/tune.py gemm-rs --gpus 2 --install --out OUT                     # tilings x producers
    TRITON_INTERPRET=1 python benchmarks/tune.py gemm-rs --emulate --out OUT            # CPU: logic only

The same pipeline as `taxes profile`: per shape the inputs, the float32 reference and every runner come
from taxes.run.cases; each candidate (overrides of the table's configuration) is built, checked once on
NaN-poisoned output (taxes.run.cases.checked_error) and timed over barrier-aligned iterations
(taxes.run.harness.check_and_time), the ranks agreeing on every failure; bsp-graph is timed beside them as
the yardstick. The fastest correct candidate per variant and shape is timed again with --final-iters and
becomes the table's entry. Why the candidates are these:

- ag-gemm: one copier CTA moves only ~10 GB/s over NVLink, so the copier count and the rows per flag
  decide whether the all-gather keeps up with the GEMM: 8, 16, 32 copiers (16 to 64 from 4 GPUs on, a
  rank receiving (p-1)/p of A) x 16 or 64 rows per flag; for push also the copy engine in a few large
  chunks eagerly (each chunk costs two host calls) and smaller ones in a graph (replayed without the host).
- gemm-rs: the two tilings that won (128 x 256 x 64, 8 warps, 3 or 4 stages) with either producer (the
  GEMM CTAs storing peer tiles over the link, or a local store and the copy engine in 1, 2 or 4 chunks);
  --candidates tilings tries eight tilings with the CTA producer.

Writes OUT/WORKLOAD-tune.json (every candidate's median, error and configuration, with the run's
metadata); --install merges the entries into the kernel's table (entries of other shapes and worlds are
kept). Prints a short table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from taxes.run import preflight
from taxes.run.cases import TOLERANCE, checked_error, make_case
from taxes.run.harness import check_and_time, gpu_metadata, warm_clocks
from taxes.kernels import ag_gemm as ag
from taxes.kernels import gemm_rs as rs
from taxes.kernels.runtime import launch
from taxes.files import write_atomic
from taxes.provenance import collect_metadata
from taxes.variants import rung_of
from taxes.workloads import make_workload, parse_shape

YARDSTICK = "bsp-graph"
SHAPES = {  # the benchmark sweeps: ag-gemm at K=8192; gemm-rs at the MLP down projections of Llama 3 8B and 70B
    "ag-gemm": [{"M": m, "N": n, "K": 8192} for n in (8192, 28672) for m in (1024, 2048, 4096, 8192, 16384)],
    "gemm-rs": [{"M": m, "N": h, "K": f} for h, f in ((4096, 14336), (8192, 28672)) for m in (1024, 4096, 16384)],
}
TABLES = {"ag-gemm": ag.TUNED_FILE, "gemm-rs": rs.TUNED_FILE}
EMULATED = {  # tiny shapes and tilings for the interpreter
    "ag-gemm": ([{"M": 64, "N": 64, "K": 32}], dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4,
                                                     num_stages=2, copiers=1, chunk_rows=16, copy_block=256, grid=4)),
    "gemm-rs": ([{"M": 64, "N": 32, "K": 64}], dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4,
                                                     num_stages=2, grid=4)),
}


def ag_gemm_candidates(variant: str, shape: dict, world: int, base: dict, producers: tuple) -> list[dict]:
    """Overrides --tune tries for one fused ag-gemm variant (its GEMM tiling stays the table's)."""
    cfg = replace(ag.tuned_config(shape["M"], shape["N"], shape["K"], world, variant), **base)
    shard_rows = shape["M"] // world
    chunks = sorted({c for c in (16, 64) if 0 < c <= shard_rows and shard_rows % c == 0}) or [shard_rows]
    grid = cfg.grid or 132
    copiers = [c for c in ((8, 16, 32) if world <= 2 else (16, 32, 48, 64)) if c < grid // 2] or [1]
    out = []
    if "ctas" in producers or variant == "fused-pull":
        out += [base | {"producer": "ctas", "copiers": n, "chunk_rows": c} for n in copiers for c in chunks]
    if variant in ("fused-push", "fused-push-graph") and "copy-engine" in producers:
        fracs = (8, 2) if variant == "fused-push" else (16, 8, 4)
        ce = sorted({c for c in (shard_rows // f for f in fracs) if c >= 16 and shard_rows % c == 0}) or [shard_rows]
        out += [base | {"producer": "copy-engine", "chunk_rows": c} for c in ce]
    # split-K where the per-rank GEMM has fewer output tiles than CTAs: each candidate cut into 2 and 4 K
    # slices too (benchmarks/gemm_vs_cublas.py --split-k measures the GEMM alone)
    tiles = (shape["M"] // cfg.block_m) * -(-(shape["N"] // world) // cfg.block_n)
    if tiles < grid and "split_k" not in base:
        out += [o | {"split_k": s} for o in list(out) for s in (2, 4)
                if tiles * s <= 2 * grid and shape["K"] % (s * cfg.block_k) == 0]
    return out


GEMM_RS_TILINGS = [{}, {"num_stages": 4}, {"num_warps": 4, "num_stages": 4}, {"warp_spec": True}, {"block_n": 256},
                   {"block_n": 256, "warp_spec": True}, {"block_m": 256}, {"block_n": 256, "group_m": 16, "num_stages": 4}]
GEMM_RS_WINNERS = [{"block_n": 256}, {"block_n": 256, "group_m": 16, "num_stages": 4}]


def gemm_rs_candidates(variant: str, shape: dict, world: int, base: dict, kind: str) -> list[dict]:
    """Full configurations (as overrides of the default) --tune tries for fused gemm-rs; a tiling whose
    block_m does not divide a rank's rows is left out."""
    if kind == "tilings":
        tried = [t | {"producer": "ctas"} for t in GEMM_RS_TILINGS]
    else:
        tried = ([w | {"producer": "ctas"} for w in GEMM_RS_WINNERS]
                 + [w | {"producer": "copy-engine", "ce_chunks": n} for w in GEMM_RS_WINNERS for n in (1, 2, 4)])
    full = [asdict(replace(rs.Config(), **t)) | base for t in tried]
    return [c for c in full if (shape["M"] // world) % c["block_m"] == 0]


def candidates(args, variant: str, shape: dict, world: int) -> list[dict]:
    """The distinct configurations to try (overrides that end up alike are tried once)."""
    if args.workload == "ag-gemm":
        tried = ag_gemm_candidates(variant, shape, world, args.base, args.producers)
    else:
        tried = gemm_rs_candidates(variant, shape, world, args.base, args.candidates)
    return list({json.dumps(o, sort_keys=True): o for o in tried}.values())


def tune_job(ctx, args) -> dict:
    """Every candidate of every variant at every shape, on this rank; rank 0's rows are the result."""
    warm_clocks(ctx, args.warm_s)
    rows = []
    for shape in args.shapes:
        ctx.heap.reset()
        if ctx.rank == 0:
            print(f"{args.workload} {shape}", flush=True)
        w = make_workload(args.workload, shape, ctx.world, args.dtype)
        ctx.doing(f"building the {args.workload} inputs for {shape}")
        case = make_case(ctx, w, args.wait_s)
        for variant in [YARDSTICK, *args.variants]:
            tried = [None] if variant == YARDSTICK else candidates(args, variant, shape, ctx.world)
            timed = [_time(ctx, case, variant, o, args.iters if len(tried) > 1 else args.final_iters, args)
                     for o in tried]
            good = [t for t in timed if t["error"] is None and t["rel_error"] <= TOLERANCE]
            best = min(good, key=lambda t: t["median_us"], default=None)
            if best is not None and len(tried) > 1:  # the winner again, with more iterations
                best = _time(ctx, case, variant, best["overrides"], args.final_iters, args)
                best["winner"] = True
            rows += [t | {"shape": shape, "variant": variant} for t in timed + ([best] if len(tried) > 1 and best else [])]
    return {"rows": rows, "meta": gpu_metadata() if ctx.rank == 0 else {}}


def _time(ctx, case, variant: str, overrides: dict | None, iters: int, args) -> dict:
    """Build, check and time one configuration; the heap it allocated is released afterwards."""
    ctx.doing(f"{variant} {overrides or ''}")
    mark = ctx.heap.mark()
    res = check_and_time(ctx, lambda: case.build(variant, overrides), lambda run: checked_error(case, run),
                         case.inputs, iters, args.warmup)
    cfg = getattr(res["run"], "cfg", None)
    out = {"overrides": overrides, "config": asdict(cfg) if cfg is not None else {}, "median_us": res["median"],
           "rel_error": res["rel_error"], "error": res["error"], "iters": iters}
    if ctx.rank == 0:
        print(f"  {variant:>16}: {res['median']:9.1f} us  error {res['rel_error']:.2g}  {res['error'] or ''} "
              f"{_brief(args.workload, overrides)}", flush=True)
    res = None
    ctx.barrier()  # every rank is done with this build's buffers before they are given out again
    ctx.heap.release(mark)
    return out


def _brief(workload: str, overrides: dict | None) -> dict:
    """The overrides that differ from the kernel's default configuration."""
    default = asdict(ag.Config() if workload == "ag-gemm" else rs.Config())
    return {k: v for k, v in (overrides or {}).items() if default.get(k) != v}


def entries(rows: list[dict], world: int, how: str) -> list[dict]:
    """The table's entries: each variant's and shape's winner (or its only correct configuration)."""
    out = {}
    for r in rows:
        if r["variant"] == YARDSTICK or r["error"] is not None or not r["rel_error"] <= TOLERANCE:
            continue
        key = (r["variant"], *(r["shape"][d] for d in ("M", "N", "K")))
        if r.get("winner") or key not in out or (not out[key].get("winner") and r["median_us"] < out[key]["median_us"]):
            out[key] = r
    return [{"variant": v, "M": m, "N": n, "K": k, "world": world, "median_us": r["median_us"], "config": r["config"],
             "how": how} for (v, m, n, k), r in out.items()]


def install(table: Path, new: list[dict]) -> None:
    """Merge new entries into a tuned table: an entry of the same variant, shape and world is replaced."""
    key = lambda e: (e.get("variant", "fused-push-graph"), e["M"], e["N"], e["K"], e["world"])  # noqa: E731
    doc = json.loads(table.read_text()) if table.exists() else {"entries": []}
    fresh = {key(e) for e in new}
    doc["entries"] = [e for e in doc["entries"] if key(e) not in fresh] + new
    write_atomic(table, json.dumps(doc, indent=1) + "\n")


def shipped_command(argv: list[str]) -> str:
    """The command as a tuned table keeps it: without --out, a directory of the machine it ran on."""
    kept, skip = [], False
    for a in argv:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        kept.append(a)
    return " ".join(["benchmarks/tune.py", *kept])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=sorted(TABLES))
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--shape", action="append", default=[], help="M=..,N=..,K=.. (repeatable; default: the sweep)")
    ap.add_argument("--variants", default="", help="fused variants to tune (default: ag-gemm every fused one, "
                                                   "gemm-rs fused-push-graph, whose entry every fused variant runs)")
    ap.add_argument("--producers", default="ctas,copy-engine", help="ag-gemm: the producers push variants try")
    ap.add_argument("--candidates", choices=("producers", "tilings"), default="producers", help="gemm-rs")
    ap.add_argument("--config", default="", help="overrides under every candidate, e.g. block_m=128,num_stages=4")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per candidate")
    ap.add_argument("--final-iters", type=int, default=30, help="timed iterations of each winner")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--wait-s", type=float, default=10.0, help="budget of every in-kernel wait")
    ap.add_argument("--warm-s", type=float, default=3.0, help="seconds of matmuls before measuring (clock ramp)")
    ap.add_argument("--install", action="store_true", help="merge the entries into the kernel's tuned table")
    ap.add_argument("--emulate", action="store_true", help="CPU ranks under Triton's interpreter (tiny shapes)")
    ap.add_argument("--out", default="tune-out")
    ap.add_argument("--timeout-s", type=float, default=560.0)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    args.shapes = [parse_shape(s) for s in args.shape] or SHAPES[args.workload]
    args.variants = [v for v in args.variants.split(",") if v] or (
        rung_of(args.workload, "fused") if args.workload == "ag-gemm" else ["fused-push-graph"])
    args.producers = tuple(p for p in args.producers.split(",") if p)
    args.base = {k: (int(v) if v.lstrip("-").isdigit() else v == "True" if v in ("True", "False") else v)
                 for k, v in (kv.split("=", 1) for kv in args.config.split(",") if kv)}
    if args.emulate:
        shapes, tiny = EMULATED[args.workload]
        args.shapes = [parse_shape(s) for s in args.shape] or shapes
        args.base = tiny | args.base
        args.iters = args.final_iters = 1
        args.warmup, args.warm_s = 0, 0.0
    heap = max(preflight.heap_bytes_needed(make_workload(args.workload, s, args.gpus, args.dtype), v, 4)
               for s in args.shapes for v in [YARDSTICK, *args.variants])
    t0 = time.time()
    res = launch(tune_job, args.gpus, args, backend="emulated" if args.emulate else "cuda", heap_bytes=heap,
                 timeout_s=args.timeout_s)[0]
    meta = collect_metadata("tune", args.gpus, "", command=" ".join(["benchmarks/tune.py", *argv]),
                            emulated=args.emulate, **res["meta"])
    gpus = meta.get("gpu_names") or ["emulated ranks"]
    how = f"{meta['date']}: {shipped_command(argv)} on {len(gpus)} x {gpus[0]}"
    new = entries(res["rows"], args.gpus, how)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.workload}-tune.json"
    write_atomic(path, json.dumps({"metadata": meta, "rows": res["rows"], "entries": new}, indent=1) + "\n")
    if args.install and not args.emulate:
        install(TABLES[args.workload], new)
    print(f"wrote {path} ({time.time() - t0:.0f} s); per shape, {YARDSTICK} and each variant's best:")
    for e in new:
        yard = next((r["median_us"] for r in res["rows"] if r["variant"] == YARDSTICK and r["error"] is None
                     and all(r["shape"][d] == e[d] for d in ("M", "N", "K"))), float("nan"))
        print(f"  M={e['M']:>5} N={e['N']:>5} K={e['K']:>5} {e['variant']:>16}: {e['median_us']:9.1f} us "
              f"({YARDSTICK} {yard:.1f} us) {e['config'].get('producer', '')}")
    for r in res["rows"]:
        if r["error"] or not (r["rel_error"] or 0) <= TOLERANCE:
            print(f"  failed: {r['variant']} {r['shape']} {r['overrides']}: {r['error'] or r['rel_error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
