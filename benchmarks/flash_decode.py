"""Flash Decode across GPUs: check and time every variant on this machine's GPUs, in one call.

    python benchmarks/flash_decode.py --world 2 --out $OUT              # the sweep of issue 4
    TRITON_INTERPRET=1 python benchmarks/flash_decode.py --emulate      # CPU: logic only

Per shape and variant: output poisoned with NaN, one checked run against a float32 reference computed
independently (torch attention over each rank's KV in float32, chunked over S, merged across ranks),
then barrier-aligned iterations timed with device events over rotated KV sets when one set would fit
in L2. Reports the KV-read floor (KV bytes / measured HBM bandwidth) beside each time. Writes a result
document and prints a short table last. Installs nothing; run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import _checkout  # noqa: E402,F401  (this checkout as `taxes`, installed or not)

import torch  # noqa: E402

from taxes.kernels import flash_decode as fd  # noqa: E402
from taxes.kernels.runtime import launch  # noqa: E402

TOLERANCE = 1e-2
SWEEP = [(b, s) for b in (1, 4, 16, 64) for s in (8192, 32768, 131072)]
VARIANTS = {"bsp": ("bsp", {}), "bsp-graph": ("bsp-graph", {}), "fused-push": ("fused-push", {"signal": "flag"}),
            "fused-push-data": ("fused-push", {"signal": "data"})}
L2_BYTES = 60 << 20


def reference(ctx, q, k, v):
    """Merge every rank's float32 partial (NCCL all-gather on GPUs, the heap when emulated)."""
    o, lse = fd.attention_partial_f32(q, k, v)
    packed = torch.cat([o, lse[..., None]], dim=-1).contiguous()
    if ctx.backend == "cuda":
        import torch.distributed as dist

        allp = torch.empty((ctx.world,) + packed.shape, device=packed.device)
        dist.all_gather_into_tensor(allp, packed)
    else:
        buf = ctx.heap.alloc(packed.shape, torch.float32)
        buf.local.copy_(packed)
        ctx.barrier()
        allp = torch.stack([b.clone() for b in buf.peers])
        ctx.barrier()
    return fd.merge_partials_f32(allp[..., :-1], allp[..., -1])


def hbm_gbps(ctx) -> float | None:
    """A large device-to-device copy: bytes read + written per second."""
    if ctx.device.type != "cuda":
        return None
    x = torch.empty(1 << 30, dtype=torch.uint8, device=ctx.device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10):
        y.copy_(x)
    t1.record()
    t1.synchronize()
    gbps = 2 * 10 * x.numel() / (t0.elapsed_time(t1) * 1e-3) / 1e9
    del x, y
    return gbps


def bench_job(ctx, args) -> dict:
    from taxes.harness import check_and_time, gpu_metadata

    dtype = torch.bfloat16
    Hq, Hkv, D = args.hq, args.hkv, args.d
    bw = hbm_gbps(ctx)
    cases = []
    for (B, S) in args.shapes:
        ctx.heap.reset()
        ctx.doing(f"inputs B={B} S={S}")
        kv_bytes = 2 * B * Hkv * S * D * 2
        n_sets = 1 if ctx.device.type != "cuda" else max(1, min(4, math.ceil(3 * L2_BYTES / kv_bytes)))
        gq = torch.Generator(device=ctx.device).manual_seed(B * 7 + S)  # the query is replicated: same seed
        q = torch.randn(B, Hq, D, generator=gq, device=ctx.device).to(dtype)
        sets = []
        for i in range(n_sets):
            g = torch.Generator(device=ctx.device).manual_seed(1000 * ctx.rank + i + S)
            k = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device, dtype=dtype)
            v = torch.randn(B, Hkv, S, D, generator=g, device=ctx.device, dtype=dtype)
            sets.append((q, k, v, torch.empty(B, Hq, D, dtype=dtype, device=ctx.device)))
        ref = reference(ctx, q, sets[0][1], sets[0][2])
        case = {"shape": {"B": B, "Hq": Hq, "Hkv": Hkv, "D": D, "S": S}, "variants": [], "kv_bytes": kv_bytes,
                "hbm_gbps": bw, "kv_floor_us": kv_bytes / (bw * 1e3) if bw else None}
        for name in args.variants:
            variant, opts = VARIANTS[name]
            cfg = replace(fd.Config(), **opts, **args.config)
            ctx.doing(f"{name} B={B} S={S}")

            def check(run, sets=sets, ref=ref):
                out = sets[0][3].fill_(float("nan"))
                res = run(*sets[0][:3], out)
                if hasattr(run, "check"):
                    run.check()
                return ((res.float() - ref).norm() / ref.norm()).item() if torch.isfinite(res.float()).all() else math.inf

            r = check_and_time(ctx, lambda: fd.FlashDecode(ctx, B, Hq, Hkv, D, S, dtype, variant, cfg, args.wait_s),
                               check, [s[:4] for s in sets], args.iters, args.warmup)
            splits = r["run"].n_splits if r["run"] is not None else None
            r.pop("run", None)
            case["variants"].append({"variant": name, "config": {**asdict(cfg), "splits": splits}, **r})
            if ctx.rank == 0:
                print(f"  {name:>16} B={B} S={S}: {r['median']:.1f} us err={r['rel_error']} {r['error'] or ''}", flush=True)
                with open(Path(args.out) / f"{args.name}_progress.jsonl", "a") as f:
                    f.write(json.dumps({"variant": name, "B": B, "S": S, "median_us": r["median"],
                                        "rel_error": r["rel_error"], "error": r["error"]}) + "\n")
            ctx.barrier()
        del sets, ref, q
        if ctx.device.type == "cuda":
            torch.cuda.empty_cache()
        cases.append(case)
    return {"cases": cases, "meta": gpu_metadata() if ctx.rank == 0 else {}}


def build_document(results, args) -> dict:
    from taxes.results import collect_metadata, new_document, summarize_samples

    meta = results[0]["meta"]
    doc = new_document(collect_metadata("profile", args.world, args.hardware, benchmark="benchmarks/flash_decode.py",
                                        command=" ".join(sys.argv), emulated=args.emulate, **meta))
    for i, case in enumerate(results[0]["cases"]):
        variants = []
        for j, v in enumerate(case["variants"]):
            ok = v["error"] is None and v["rel_error"] is not None and v["rel_error"] <= TOLERANCE
            samples = [r["cases"][i]["variants"][j]["samples"] for r in results] if ok else []
            variants.append({
                "variant": v["variant"], "config": v["config"] | ({"error": v["error"]} if v["error"] else {}),
                "correctness": {"checked": v["error"] is None, "passed": ok if v["error"] is None else None,
                                "rel_error": v["rel_error"], "tolerance": TOLERANCE,
                                "reference": "float32 attention over every rank's KV, outputs poisoned with NaN"},
                "samples_us": samples, "e2e_us": summarize_samples(samples), "phases": [], "components": []})
        doc["cases"].append({"workload": "flash-decode", "shape": case["shape"], "world": args.world, "dtype": "bf16",
                             "variants": variants,
                             "extra": {k: case[k] for k in ("kv_bytes", "hbm_gbps", "kv_floor_us") if case[k] is not None}})
    return doc


def from_progress(args) -> int:
    """A result document from a progress log: medians (max over ranks) only, per-iteration samples lost."""
    from taxes.results import collect_metadata, new_document, save

    rows = [json.loads(line) for line in open(args.from_progress)]
    meta = collect_metadata("profile", args.world, args.hardware, benchmark="benchmarks/flash_decode.py",
                            partial="run cut short; medians from the progress log, samples lost",
                            source=str(args.from_progress))
    meta["git_commit"] = None  # the measuring commit is not this one
    if args.metadata_from:  # the measuring machine's facts, from a document of the same machine and session
        other = json.loads(Path(args.metadata_from).read_text())["metadata"]
        for key in ("gpu_names", "torch_version", "triton_version", "cuda_version", "nccl_version", "python"):
            if key in other:
                meta[key] = other[key]
        meta["metadata_from"] = args.metadata_from
    if args.measured_at:
        meta["date"] = args.measured_at
    doc = new_document(meta)
    shapes = sorted({(r["B"], r["S"]) for r in rows})
    for B, S in shapes:
        variants = []
        for r in (r for r in rows if (r["B"], r["S"]) == (B, S)):
            ok = r["error"] is None and r["rel_error"] is not None and r["rel_error"] <= TOLERANCE
            variants.append({
                "variant": r["variant"], "config": {"error": r["error"]} if r["error"] else {},
                "correctness": {"checked": r["error"] is None, "passed": ok if r["error"] is None else None,
                                "rel_error": r["rel_error"], "tolerance": TOLERANCE,
                                "reference": "float32 attention over every rank's KV, outputs poisoned with NaN"},
                "samples_us": [], "e2e_us": {"median": r["median_us"] if ok else None, "p10": None, "p90": None,
                                             "n": args.iters if ok else 0, "label": "measured"},
                "phases": [], "components": []})
        kv = 2 * B * args.hkv * S * args.d * 2
        doc["cases"].append({"workload": "flash-decode", "shape": {"B": B, "Hq": args.hq, "Hkv": args.hkv, "D": args.d, "S": S},
                             "world": args.world, "dtype": "bf16", "variants": variants, "extra": {"kv_bytes": kv}})
    out = Path(args.out) / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    save(doc, out)
    print(f"wrote {out}")
    return 0


def print_table(doc) -> None:
    names = [v["variant"] for v in doc["cases"][0]["variants"]]
    print(f"{'B':>3} {'S':>7} " + " ".join(f"{n:>16}" for n in names) + f" {'bsp/best fused':>15} {'KV floor':>9} {'fused/floor':>11}")
    for case in doc["cases"]:
        med = {v["variant"]: v["e2e_us"]["median"] for v in case["variants"]}
        fused = {n: t for n, t in med.items() if n.startswith("fused") and t}
        best = min(fused.values()) if fused else None
        ratio = f"{med['bsp'] / best:.2f}x" if best and med.get("bsp") else "-"
        floor = case.get("extra", {}).get("kv_floor_us")
        eff = f"{best / floor:.2f}x" if best and floor else "-"
        cells = " ".join(f"{med[n]:>16.1f}" if med[n] else f"{'FAIL':>16}" for n in names)
        print(f"{case['shape']['B']:>3} {case['shape']['S']:>7} {cells} {ratio:>15} {floor or 0:>9.1f} {eff:>11}")
    from taxes.results import failures

    for line in failures(doc):
        print(f"  {line}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--shapes", default="", help="B,S;B,S (default: the issue's sweep)")
    ap.add_argument("--hq", type=int, default=64)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--wait-s", type=float, default=5.0)
    ap.add_argument("--config", default="", help="e.g. block_n=64,splits=16")
    ap.add_argument("--hardware", default="h200-sxm")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    ap.add_argument("--name", default="flash_decode")
    ap.add_argument("--timeout-s", type=float, default=560.0)
    ap.add_argument("--metadata-from", help="with --from-progress: copy GPU/library metadata from this document")
    ap.add_argument("--measured-at", help="with --from-progress: when the run was made (ISO date)")
    ap.add_argument("--from-progress", metavar="JSONL", help="build a (medians-only) result document from the progress "
                    "log of a run that was cut short, instead of running")
    args = ap.parse_args(argv)
    if args.from_progress:
        return from_progress(args)
    args.shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")] if args.shapes else SWEEP
    args.variants = [v for v in args.variants.split(",") if v]
    args.config = {k: int(v) if v.isdigit() else v for k, v in (kv.split("=") for kv in args.config.split(",") if kv)}
    if args.emulate:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        if args.shapes == SWEEP:
            args.shapes = [(1, 40), (2, 72)]
        args.hq, args.hkv, args.d = 8, 2, 64
        args.config = {"block_n": 16, **args.config}
        args.iters, args.warmup = min(args.iters, 2), min(args.warmup, 1)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    heap = 2 * max(b * args.hq for b, _ in args.shapes) * (args.d + 1) * 4 * args.world + (64 << 20)
    results = launch(bench_job, args.world, args, backend="emulated" if args.emulate else "cuda", heap_bytes=heap,
                     timeout_s=args.timeout_s)
    from taxes.results import save

    doc = build_document(results, args)
    path = out_dir / f"{args.name}.json"
    save(doc, path)
    print(f"wrote {path} ({time.time() - t0:.0f} s); HBM copy {results[0]['cases'][0]['hbm_gbps']} GB/s")
    print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
