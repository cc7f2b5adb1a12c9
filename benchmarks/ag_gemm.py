"""All-Gather + GEMM benchmark: check and time every variant on this machine's GPUs, in one call.

    python benchmarks/ag_gemm.py --world 2 --out $OUT                 # the sweep of issue 3, tuned table
    python benchmarks/ag_gemm.py --world 2 --tune --out $OUT          # also try candidate configs per shape
    python benchmarks/ag_gemm.py --world 8 --tune --install ...       # ... and merge them into kernels/ag_gemm_tuned.json
    python benchmarks/ag_gemm.py --gemm-only --out $OUT               # the fused kernel's GEMM alone vs torch.matmul
    TRITON_INTERPRET=1 python benchmarks/ag_gemm.py --emulate         # CPU: logic only, tiny shapes, times mean nothing

Per shape and variant: outputs poisoned with NaN, one checked run against a float32 reference (bf16
relative error must stay under 1e-2), then barrier-aligned iterations timed with device events over
rotated input sets. Writes a result document (taxes.results) and prints a short table last.
Installs nothing; needs torch, triton and this checkout (run from the repository root).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import _checkout  # noqa: E402,F401  (this checkout as `taxes`, installed or not)

import torch  # noqa: E402
from taxes.kernels import ag_gemm as ag  # noqa: E402
from taxes.kernels.runtime import launch  # noqa: E402

TOLERANCE = 1e-2
SWEEP = [(m, n, 8192) for n in (8192, 28672) for m in (1024, 2048, 4096, 8192, 16384)]


def candidates(variant: str, base: ag.Config, shard_rows: int, producers=("ctas", "copy-engine"),
               world: int = 2) -> list[ag.Config]:
    """Configurations --tune tries for a fused variant (the GEMM's own tiling stays fixed): how many CTAs
    copy and how many rows each flag covers; for push, last, the copy engine as producer."""
    # One copier CTA moves only ~10 GB/s over NVLink (measured), so chunks must be small enough that
    # every copier has work: 16-64 rows (256 KiB to 1 MiB at K=8192). Each rank receives (p-1)/p of A,
    # so more GPUs want more copiers (at 8 GPUs 32 beat 8 and 16 at three of the four shapes tuned).
    chunks = sorted({c for c in (16, 64) if 0 < c <= shard_rows and shard_rows % c == 0}) or [shard_rows]
    grid = base.grid or 132
    copier_counts = [c for c in ((8, 16, 32) if world <= 2 else (16, 32, 48, 64)) if c < grid // 2] or [1]
    out = []
    if "ctas" in producers or variant == "fused-pull":
        out += [replace(base, producer="ctas", copiers=n, chunk_rows=c) for n in copier_counts for c in chunks]
    if variant in ("fused-push", "fused-push-graph") and "copy-engine" in producers:
        # Each copy-engine chunk costs two host calls (data, flag), eagerly: few, large chunks there; a graph
        # replays them without the host, so smaller chunks (the first arrives sooner) are tried too.
        fracs = (8, 2) if variant == "fused-push" else (16, 8, 4)
        ce_chunks = sorted({c for c in (shard_rows // f for f in fracs) if c >= 16 and shard_rows % c == 0}) or [shard_rows]
        out += [replace(base, producer="copy-engine", chunk_rows=c) for c in ce_chunks]
    return out


def _inputs(ctx, M, N_local, K, dtype, n_sets, seed):
    """n_sets rotating input sets: a symmetric a_full (this rank's rows random), W_local, out."""
    sets = []
    rows = M // ctx.world
    for s in range(n_sets):
        g = torch.Generator(device=ctx.device).manual_seed(seed * 1000 + s * 10 + ctx.rank)
        a_full = ctx.heap.alloc((M, K), dtype)
        a_full.local.fill_(float("nan"))  # peer rows are workspace: poisoned until a variant fills them
        r0 = ctx.rank * rows
        a_full.local[r0:r0 + rows] = torch.randn(rows, K, generator=g, device=ctx.device, dtype=torch.float32).to(dtype)
        w = (torch.randn(K, N_local, generator=g, device=ctx.device, dtype=torch.float32) / K ** 0.5).to(dtype)
        out = torch.empty(M, N_local, dtype=dtype, device=ctx.device)
        sets.append((a_full, w, out))
    ctx.barrier()
    return sets


def _check(ctx, run, a_full, w, out, ref) -> float:
    """One run on poisoned output; relative error against the float32 reference."""
    out.fill_(float("nan"))
    res = run(a_full, w, out)
    if hasattr(run, "check"):
        run.check()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return ag.rel_error(res, ref)


def _measure(ctx, variant, M, N_local, K, dtype, cfg, sets, ref, iters, args) -> dict:
    """Check and time one configuration (taxes.harness.check_and_time: the ranks agree on failures)."""
    from taxes.harness import check_and_time

    res = check_and_time(ctx, lambda: ag.make_variant(ctx, variant, M, N_local, K, dtype, cfg, wait_s=args.wait_s),
                         lambda run: _check(ctx, run, *sets[0], ref), sets, iters, args.warmup)
    res["cfg"] = cfg
    res.pop("run", None)
    if ctx.rank == 0:  # progress, and a record that survives a later hang
        line = {"variant": variant, "M": M, "N_local": N_local, "K": K, "median_us": res["median"],
                "rel_error": res["rel_error"], "error": res["error"], "config": asdict(cfg) if cfg else {}}
        print(f"  {variant:>15} M={M} N_local={N_local}: {res['median']:.1f} us err={res['rel_error']} "
              f"{res['error'] or ''} {_short_cfg(cfg)}", flush=True)
        with open(Path(args.out) / f"{args.name}_progress.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
    return res


def _short_cfg(cfg) -> str:
    if cfg is None:
        return ""
    return f"[{cfg.producer} copiers={cfg.copiers} chunk={cfg.chunk_rows} bm{cfg.block_m} bn{cfg.block_n} s{cfg.num_stages}]"


def bench_job(ctx, args) -> dict:
    from taxes.harness import gpu_metadata, time_iterations, warm_clocks

    dtype = ag.TORCH_DTYPES[args.dtype]
    cases = []
    tuned = []
    warm_clocks(ctx, args.warm_s)
    ctx.barrier()
    for (M, N, K) in args.shapes:
        N_local = N // ctx.world
        ctx.heap.reset()
        n_sets = args.sets
        ctx.doing(f"allocating inputs for M={M} N={N} K={K}")
        sets = _inputs(ctx, M, N_local, K, dtype, n_sets, seed=M + N + K)
        rows = M // ctx.world
        ref = ag.reference([sets[0][0].peers[r][r * rows:(r + 1) * rows] for r in range(ctx.world)], sets[0][1])
        case = {"shape": {"M": M, "N": N, "K": K}, "variants": []}
        for variant in args.variants:
            entry = {"variant": variant, "config": {}, "samples": [], "rel_error": None, "error": None}
            configs = [None]
            if variant.startswith("fused"):
                base = ag.tuned_config(M, N, K, ctx.world, variant)
                if args.gemm_config:
                    base = replace(base, **args.gemm_config)
                configs = (candidates(variant, base, M // ctx.world, args.producers, ctx.world) if args.tune
                           else [base])
            tried = []
            for cfg in configs:
                ctx.doing(f"{variant} M={M} N={N} K={K} config {cfg}")
                iters = args.tune_iters if len(configs) > 1 else args.iters
                t = _measure(ctx, variant, M, N_local, K, dtype, cfg, sets, ref, iters, args)
                tried.append(t)
            good = [t for t in tried if t["error"] is None and t["rel_error"] <= TOLERANCE]
            best = min(good, key=lambda t: t["median"], default=tried[0])
            if len(configs) > 1 and best in good:  # the winner again, with the full iteration count
                best = _measure(ctx, variant, M, N_local, K, dtype, best["cfg"], sets, ref, args.iters, args)
            entry.update(samples=best["samples"], rel_error=best["rel_error"], error=best["error"],
                         config=asdict(best["cfg"]) if best["cfg"] else {})
            if len(tried) > 1 and best["error"] is None:
                tuned.append({"variant": variant, "M": M, "N": N, "K": K, "world": ctx.world, "median_us": best["median"],
                              "config": {k: v for k, v in asdict(best["cfg"]).items()}})
            if len(tried) > 1:
                entry["config"]["candidates"] = [{"median_us": t["median"] if t["error"] is None else None,
                                                  "rel_error": t["rel_error"], "error": t["error"],
                                                  **asdict(t["cfg"])} for t in tried]
            case["variants"].append(entry)
            ctx.barrier()
        if args.gemm_alone and ctx.device.type == "cuda":
            ctx.doing(f"GEMM alone M={M} N_local={N_local} K={K}")
            a = torch.randn(M, K, device=ctx.device).to(dtype)
            cfg = ag.tuned_config(M, N, K, ctx.world, "fused-push")
            if args.gemm_config:
                cfg = replace(cfg, **args.gemm_config)
            mine = ag.PersistentGemm(ctx.device, cfg)
            w, out = sets[0][1], sets[0][2]
            gemm_sets = [(a, w, out)]
            case["gemm_alone_us"] = sorted(time_iterations(ctx, mine, gemm_sets, args.iters, args.warmup))[args.iters // 2]
            case["torch_matmul_alone_us"] = sorted(time_iterations(
                ctx, lambda a, w, o: torch.matmul(a, w, out=o), gemm_sets, args.iters, args.warmup))[args.iters // 2]
            ref_alone = a.float() @ w.float()
            case["gemm_alone_rel_error"] = ag.rel_error(mine(a, w, out.fill_(float("nan"))), ref_alone)
            del a, ref_alone
        del sets, ref
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        cases.append(case)
    meta = gpu_metadata() if ctx.rank == 0 else {}
    return {"rank": ctx.rank, "cases": cases, "meta": meta, "tuned": tuned}


def gemm_only_job(ctx, args) -> dict:
    """World 1: the fused kernel's GEMM for several tilings against torch.matmul."""
    from taxes.harness import gpu_metadata, time_iterations

    dtype = ag.TORCH_DTYPES[args.dtype]
    rows = []
    tilings = [dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3),
               dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=4),
               dict(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4),
               dict(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=4),
               dict(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3),
               dict(block_m=256, block_n=128, block_k=64, num_warps=8, num_stages=3),
               dict(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)]
    variants = []
    if args.gemm_variants == "all":
        for t in tilings:
            for sched in ({"static": False}, {"static": True}):
                variants.append({**t, **sched})
        variants.append({**tilings[0], "warp_spec": True})
        variants.append({**tilings[2], "warp_spec": True})
    else:  # the schedule and epilogue options on the best tiling (128x256x64, 8 warps)
        t = tilings[0]
        for stages in (3, 4):
            for opts in ({"static": False}, {"static": True}, {"static": True, "flatten": True},
                         {"static": False, "split_epilogue": True}, {"static": True, "flatten": True, "split_epilogue": True}):
                variants.append({**t, "num_stages": stages, **opts})
    for (M, N_local, K) in args.gemm_shapes:
        g = torch.Generator(device=ctx.device).manual_seed(M)
        sets = [(torch.randn(M, K, generator=g, device=ctx.device).to(dtype),
                 (torch.randn(K, N_local, generator=g, device=ctx.device) / K ** 0.5).to(dtype),
                 torch.empty(M, N_local, device=ctx.device, dtype=dtype)) for _ in range(2)]
        ref = sets[0][0].float() @ sets[0][1].float()
        tm = sorted(time_iterations(ctx, lambda a, w, o: torch.matmul(a, w, out=o), sets, args.iters, args.warmup))[args.iters // 2]
        flops = 2 * M * N_local * K
        row = {"M": M, "N_local": N_local, "K": K, "torch_matmul_us": tm, "torch_tflops": flops / tm / 1e6, "ours": []}
        for v in variants:
            try:
                gemm = ag.PersistentGemm(ctx.device, replace(ag.Config(), **v))
                a, w, o = sets[0]
                err = ag.rel_error(gemm(a, w, o.fill_(float("nan"))), ref)
                us = sorted(time_iterations(ctx, gemm, sets, args.iters, args.warmup))[args.iters // 2]
                row["ours"].append({**v, "us": us, "tflops": flops / us / 1e6, "vs_torch": tm / us, "rel_error": err})
            except Exception as e:
                row["ours"].append({**v, "error": f"{type(e).__name__}: {e}".splitlines()[0][:200]})
        rows.append(row)
        del sets, ref
        torch.cuda.empty_cache()
    return {"rows": rows, "meta": gpu_metadata()}


def build_document(results: list[dict], args) -> dict:
    from taxes.results import collect_metadata, new_document, summarize_samples

    meta = results[0]["meta"]
    doc = new_document(collect_metadata("profile", args.world, args.hardware, benchmark="benchmarks/ag_gemm.py",
                                        command=" ".join(sys.argv), emulated=args.emulate, **meta))
    for i, case in enumerate(results[0]["cases"]):
        M, N, K = case["shape"]["M"], case["shape"]["N"], case["shape"]["K"]
        variants = []
        for j, v in enumerate(case["variants"]):
            samples = [r["cases"][i]["variants"][j]["samples"] for r in results]
            ok = v["error"] is None and v["rel_error"] is not None and v["rel_error"] <= TOLERANCE
            variants.append({
                "variant": v["variant"], "config": v["config"] | ({"error": v["error"]} if v["error"] else {}),
                "correctness": {"checked": v["error"] is None, "passed": ok if v["error"] is None else None,
                                "rel_error": v["rel_error"], "tolerance": TOLERANCE,
                                "reference": "float32 all-gather + matmul, outputs poisoned with NaN"},
                "samples_us": samples if v["error"] is None and ok else [],
                "e2e_us": summarize_samples(samples if v["error"] is None and ok else []),
                "phases": [], "components": [],
            })
        entry = {"workload": "ag-gemm", "shape": {"M": M, "N": N, "K": K}, "world": args.world, "dtype": args.dtype,
                 "variants": variants}
        for key in ("gemm_alone_us", "torch_matmul_alone_us", "gemm_alone_rel_error"):
            if key in case:
                entry.setdefault("extra", {})[key] = case[key]
        doc["cases"].append(entry)
    return doc


def print_table(doc: dict) -> None:
    names = [v["variant"] for v in doc["cases"][0]["variants"]]
    head = f"{'M':>6} {'N':>6} " + " ".join(f"{n:>14}" for n in names) + f" {'best fused':>18} {'bsp/best':>8} {'tatp/best':>9} {'gemm vs mm':>10}"
    print(head)
    for case in doc["cases"]:
        med = {v["variant"]: v["e2e_us"]["median"] for v in case["variants"]}
        cells = " ".join(f"{med[n]:>14.1f}" if med[n] else f"{'FAIL':>14}" for n in names)
        fused = {n: med[n] for n in names if n.startswith("fused") and med[n]}
        best = min(fused, key=fused.get) if fused else None
        cfg = next((v["config"] for v in case["variants"] if v["variant"] == best), {})
        label = f"{best}/{cfg.get('producer', '')[:2]}{cfg.get('copiers', '')}" if best else "-"
        r1 = f"{med['bsp'] / fused[best]:.2f}x" if best and med.get("bsp") else "-"
        r2 = f"{med['torch-async-tp'] / fused[best]:.2f}x" if best and med.get("torch-async-tp") else "-"
        ex = case.get("extra", {})
        eff = f"{ex['torch_matmul_alone_us'] / ex['gemm_alone_us']:.2f}" if ex.get("gemm_alone_us") else "-"
        print(f"{case['shape']['M']:>6} {case['shape']['N']:>6} {cells} {label:>18} {r1:>8} {r2:>9} {eff:>10}")
    from taxes.results import failures

    for line in failures(doc):
        print(f"  {line}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--emulate", action="store_true", help="CPU ranks under Triton's interpreter (tiny shapes)")
    ap.add_argument("--shapes", default="", help="M,N,K;M,N,K (default: the issue's sweep)")
    ap.add_argument("--variants", default=",".join(ag.VARIANTS))
    ap.add_argument("--dtype", default="bf16", choices=sorted(ag.TORCH_DTYPES))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--sets", type=int, default=2, help="rotating input sets")
    ap.add_argument("--tune", action="store_true", help="try candidate configs per fused variant and shape")
    ap.add_argument("--tune-iters", type=int, default=10)
    ap.add_argument("--install", action="store_true", help="merge the tuned entries into kernels/ag_gemm_tuned.json")
    ap.add_argument("--producers", default="ctas,copy-engine", help="fused-push producers --tune tries")
    ap.add_argument("--gemm-config", default="", help="override GEMM tiling, e.g. block_m=128,block_n=256,num_stages=3")
    ap.add_argument("--gemm-alone", action="store_true", help="also time the fused kernel's GEMM alone vs torch.matmul")
    ap.add_argument("--gemm-only", action="store_true", help="world 1: GEMM tilings against torch.matmul, nothing else")
    ap.add_argument("--gemm-variants", default="all", help="all tilings, or 'schedules' of the best tiling")
    ap.add_argument("--wait-s", type=float, default=10.0, help="budget of every in-kernel wait")
    ap.add_argument("--hardware", default="h200-sxm")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--name", default="ag_gemm")
    ap.add_argument("--timeout-s", type=float, default=560.0)
    ap.add_argument("--warm-s", type=float, default=3.0, help="seconds of matmuls before measuring (clock ramp)")
    args = ap.parse_args(argv)
    args.shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes else SWEEP
    args.variants = [v for v in args.variants.split(",") if v]
    args.producers = tuple(p for p in args.producers.split(",") if p)
    args.gemm_config = {k: (int(v) if v.lstrip("-").isdigit() else v == "True") for k, v in
                        (kv.split("=") for kv in args.gemm_config.split(",") if kv)} if args.gemm_config else {}
    if args.emulate:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.shapes == SWEEP:
            args.shapes = [(64, 64, 32), (128, 64, 64)]
        args.gemm_config = {**dict(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=2,
                                   copiers=1, chunk_rows=16, copy_block=256, grid=4), **args.gemm_config}
        args.variants = [v for v in args.variants if v != "torch-async-tp"]
        args.iters, args.warmup = min(args.iters, 2), min(args.warmup, 1)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = "emulated" if args.emulate else "cuda"
    t0 = time.time()
    if args.gemm_only:
        args.gemm_shapes = [(m, n // 2, k) for (m, n, k) in args.shapes]
        res = launch(gemm_only_job, 1, args, backend=backend, heap_bytes=1 << 20, timeout_s=args.timeout_s)[0]
        (out_dir / f"{args.name}_gemm_only.json").write_text(json.dumps(res, indent=1))
        print(f"GEMM alone, {time.time() - t0:.0f} s; TFLOP/s (ours / torch.matmul):")
        for row in res["rows"]:
            good = [o for o in row["ours"] if "us" in o and o["rel_error"] < TOLERANCE]
            best = max(good, key=lambda o: o["tflops"], default=None)
            desc = (f"{best['tflops']:.0f} ({best['vs_torch']:.2f}x) bm{best['block_m']} bn{best['block_n']} bk{best['block_k']} "
                    f"w{best['num_warps']} s{best['num_stages']} {'static' if best.get('static') else 'queue'}"
                    f"{' ws' if best.get('warp_spec') else ''}{' flat' if best.get('flatten') else ''}"
                    f"{' split' if best.get('split_epilogue') else ''}") if best else "none correct"
            print(f"  {row['M']}x{row['N_local']}x{row['K']}: torch {row['torch_tflops']:.0f}; ours best {desc}")
            for o in row["ours"]:
                if "error" in o:
                    print(f"    failed {o}")
        return 0
    heap = max(args.sets * m * k * 2 for (m, n, k) in args.shapes) + (64 << 20)
    results = launch(bench_job, args.world, args, backend=backend, heap_bytes=heap, timeout_s=args.timeout_s)
    from taxes.results import save

    doc = build_document(results, args)
    path = out_dir / f"{args.name}.json"
    save(doc, path)
    if results[0]["tuned"]:  # the tuned table: the fastest correct configuration per variant and shape
        table = {"made_by": " ".join(sys.argv), "date": doc["metadata"]["date"], "gpus": doc["metadata"].get("gpu_names"),
                 "entries": results[0]["tuned"]}
        (out_dir / f"{args.name}_tuned.json").write_text(json.dumps(table, indent=1))
        if args.install and not args.emulate:  # merged: the old entries of other shapes and worlds are kept
            new = {(e["variant"], e["M"], e["N"], e["K"], e["world"]) for e in table["entries"]}
            old = json.loads(ag.TUNED_FILE.read_text()) if ag.TUNED_FILE.exists() else table | {"entries": []}
            kept = [e for e in old["entries"] if (e["variant"], e["M"], e["N"], e["K"], e["world"]) not in new]
            gpus = table["gpus"] or ["?"]
            added = [e | {"how": f"{table['date']}: {table['made_by']} on {len(gpus)} x {gpus[0]}"} for e in table["entries"]]
            ag.TUNED_FILE.write_text(json.dumps(old | {"entries": kept + added}, indent=1))
    print(f"wrote {path} ({time.time() - t0:.0f} s)")
    print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
