"""The configuration sweep of benchmarks/decode_world1.py --tune: the kernel variants compiled ahead in
parallel, the candidates per shape (or, with --splits-extra, given split counts for the best variants of a
prior sweep), each timed, the best few again, and the winners written into the tuned table."""

from __future__ import annotations

import json
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import torch

from taxes.files import read_maybe_gzip
from taxes.kernels.decode_local import TUNED_FILE, Config, LocalDecode, load_tuned, resolve, split_count
from decode_methods import HKV, HQ, log, measure_ours

GRID = {128: {"block_n": (32, 64, 128)}, 64: {"block_n": (64, 128, 256)}}
WARPS, STAGES, PPS = (4, 8), (2, 3, 4), (1, 2, 3, 4)
SMEM_LIMIT = 200 << 10  # K and V stages beyond this cannot be resident (228 KB per SM on Hopper)


# ---- compiling ahead ------------------------------------------------------------------------------


def _compile_one(D, block_n, warps, stages, tma=False, evict_first=False):
    """In a worker process: one tiny decode, so Triton compiles (and caches on disk) this variant with
    the same specialisation as the real shapes (Hq=64, Hkv=8, R a multiple of 16)."""
    dev = torch.device("cuda")
    S = block_n * 4
    q = torch.randn(1, HQ, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, HKV, S, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty(1, HQ, D, device=dev, dtype=torch.bfloat16)
    try:
        dec = LocalDecode(1, HQ, HKV, D, S, dev, Config(block_n=block_n, splits=2, num_warps=warps,
                                                             num_stages=stages, tma=tma, evict_first=evict_first))
        dec(q, k, k, out)
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return " ".join(f"{type(e).__name__}: {e}".split())[:200]


def compile_ahead(variants: list[tuple], limit_s: float) -> dict:
    """Compile the kernel variants in parallel processes (Triton's disk cache then serves this one)."""
    import multiprocessing as mp

    t0 = time.time()
    failed = {}
    try:
        with ProcessPoolExecutor(max_workers=min(12, len(variants)), mp_context=mp.get_context("spawn")) as ex:
            futs = {ex.submit(_compile_one, *v): v for v in variants}
            for f in as_completed(futs, timeout=limit_s):
                err = f.result()
                if err:
                    failed[futs[f]] = err
    except Exception as e:
        log(f"compile ahead stopped: {' '.join(str(e).split())[:200]}")
    log(f"compiled {len(variants)} variants ahead in {time.time() - t0:.0f} s ({len(failed)} failed)")
    return failed


# ---- the sweep ------------------------------------------------------------------------------------


def kernel_variants(D):
    """(block_n, warps, stages, tma, evict_first) of the sweep: pointer loads, TMA loads (one stage more
    allowed: no registers staged), pointer loads hinted evict-first (4 warps)."""
    out = []
    for bn in GRID[D]["block_n"]:
        for w in WARPS:
            for st in STAGES + (5,):
                if st * bn * D * 4 > SMEM_LIMIT:
                    continue
                if st in STAGES:
                    out.append((bn, w, st, False, False))
                out.append((bn, w, st, True, False))
                if st in STAGES and w == 4:
                    out.append((bn, w, st, False, True))
    return out


def candidates(B, S, D, sms):
    """Configs of the sweep (dicts), without two that give the same kernel and split count."""
    seen = set()
    for bn, w, st, tma, ev in kernel_variants(D):
        for pps in PPS:
            splits, _ = split_count(S, B, HKV, sms, bn, 0, pps)
            if (bn, w, st, tma, ev, splits) in seen:
                continue
            seen.add((bn, w, st, tma, ev, splits))
            yield {"block_n": bn, "num_warps": w, "num_stages": st, "tma": tma, "evict_first": ev,
                   "programs_per_sm": pps, "splits": splits}


def targeted_candidates(B, S, D, sms, args):
    """--splits-extra: the --top kernel variants of the --prior sweep at this shape, at the given split
    counts, and the tuned table's config for the shape (so both are timed in the same run)."""
    # an earlier sweep's JSON, compressed (as the committed one is) or not
    prior = json.loads(read_maybe_gzip(args.prior, 1 << 30))["sweep"] if args.prior else []
    rows = sorted((e for e in prior if (e["B"], e["S"], e["D"]) == (B, S, D) and e.get("us")), key=lambda e: e["us"])
    variants = []
    for e in rows:
        v = (e["block_n"], e["num_warps"], e["num_stages"], e["tma"], e["evict_first"])
        if v not in variants:
            variants.append(v)
    extra = {int(b): [int(x) for x in xs.split(",")] for b, xs in
             (part.split("=") for part in args.splits_extra.split(";") if part)}.get(B, [])
    cands, seen = [], set()
    c, splits, _ = resolve(Config(), B, HKV, S, D, sms, True, gpu=torch.cuda.get_device_name())
    table = {"block_n": c.block_n, "num_warps": c.num_warps, "num_stages": c.num_stages, "tma": bool(c.tma),
             "evict_first": bool(c.evict_first), "splits": splits}
    for bn, w, st, tma, ev in [tuple(table[k] for k in ("block_n", "num_warps", "num_stages", "tma", "evict_first"))] \
            + variants[:args.top]:
        for want in ([splits] if (bn, w, st, tma, ev) == tuple(list(table.values())[:5]) and not cands else extra):
            n, _ = split_count(S, B, HKV, sms, bn, want)
            if (bn, w, st, tma, ev, n) in seen:
                continue
            seen.add((bn, w, st, tma, ev, n))
            cands.append({"block_n": bn, "num_warps": w, "num_stages": st, "tma": tma, "evict_first": ev,
                          "programs_per_sm": round(n * B * HKV / sms, 4), "splits": n})
    return cands


def with_table(table: dict) -> dict:
    """The whole tuned file (kernels/flash_decode_tuned.json) with `table` as its GPU's table: replacing the
    one measured on the same GPU kind, else added after the others."""
    doc = json.loads(TUNED_FILE.read_text())
    tables = [t for t in doc.get("tables", []) if t.get("gpu") != table["gpu"]]
    return {**doc, "tables": tables + [table]}


def update_table(rows, meta, out_dir):
    """Replace this GPU's tuned entries of the shapes just swept by their new best (kept where the table's
    own config won); writes kernels/flash_decode_tuned.json and a copy under out_dir."""
    table = load_tuned(gpu=meta["gpu_name"])
    if table.get("gpu") != meta["gpu_name"]:
        raise SystemExit(f"--update-table: no tuned table for {meta['gpu_name']} yet; run --tune first")
    new = {(r["B"], r["S"], r["D"]): r for r in rows if r.get("best")}
    for e in table["entries"]:
        r = new.get((e["B"], e["S"], e["D"]))
        if r:
            b = r["best"]
            e.update({k: b[k] for k in ("block_n", "num_warps", "num_stages", "tma", "evict_first", "splits",
                                         "programs_per_sm")})
            e["us"] = r["us"]
            e["from"] = meta["command"]
    text = json.dumps(with_table(table), indent=1) + "\n"
    TUNED_FILE.write_text(text)
    (out_dir / "flash_decode_tuned.json").write_text(text)


def tune_shape(B, S, D, Hq, Hkv, sets, ref, dev, sms, timer, args, t_start, smoke):
    """Every candidate at a few replays, then the best few again at more: (best entry, all entries)."""
    if args.splits_extra and not smoke:
        cands = targeted_candidates(B, S, D, sms, args)
    else:
        cands = list(candidates(B, S, D, sms)) if not smoke else [
            {"block_n": 16, "num_warps": 4, "num_stages": 2, "tma": tma, "evict_first": False, "programs_per_sm": 2,
             "splits": 2} for tma in (False, True)]
    entries = []
    for c in cands:
        if time.time() - t_start > args.budget_s:
            break
        cfg = Config(**{k: v for k, v in c.items() if k != "programs_per_sm"})
        dec = LocalDecode(B, Hq, Hkv, D, S, dev, cfg)
        r = measure_ours(dec, sets, ref, timer, args.tune_replays, 1000.0)
        entries.append({"B": B, "S": S, "D": D, **c, "splits": dec.n_splits, "tma_used": dec.tma,
                        **{k: r.get(k) for k in ("us", "error")}})
    ok = sorted((e for e in entries if e["error"] is None), key=lambda e: e["us"])
    for e in ok[:args.refine]:
        cfg = Config(**{k: e[k] for k in ("block_n", "num_warps", "num_stages", "tma", "evict_first", "splits")})
        r = measure_ours(LocalDecode(B, Hq, Hkv, D, S, dev, cfg), sets, ref, timer, args.replays, 2500.0)
        e["refined_us"] = r.get("us") if "error" not in r else None
    refined = [e for e in ok[:args.refine] if e.get("refined_us")]
    best = min(refined, key=lambda e: e["refined_us"]) if refined else (ok[0] if ok else None)
    return best, entries
