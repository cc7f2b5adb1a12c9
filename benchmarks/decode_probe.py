"""Where a one-GPU decode's time goes when its KV barely exceeds L2 (B=1, S=32K, D=64: 67 MB), and what
the eager bsp-sdpa sequence spends on the host.

    python benchmarks/decode_probe.py --out DIR

Part 1 times, from CUDA graphs over KV sets rotated beyond L2 (benchmarks/graph_timing.py):
- reads of the same bytes: the floor's block-cyclic read, and reads laid out like the decode (one
  contiguous range of K and V per program, or every n-th tile of its head) that only sum;
- the decode kernel laid out either way, with and without its merge (without: the partials only, a
  wrong result, timed to price the merge), its programs ordered head-major or split-major;
- per-program %globaltimer stamps (start, end of the KV loop, ticket, end of the merge) of one call.
Part 2 times each step of the eager bsp-sdpa and bsp calls on the host (no synchronisation between
steps) at B=1, S=128K, D=128.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from taxes.run.cases import rel_error
from taxes.kernels.decode_local import (LOG2E, LocalDecode, _merge_group, _merge_tile, attend_tile,
                                        attention_partial_f32, group_query)
from taxes.kernels.sync import globaltimer_ns

from graph_timing import read_all, read_bandwidth, time_graph

HQ, HKV = 64, 8


@triton.jit(do_not_specialize=["S", "split_len", "n_splits"])
def probe_decode_kernel(q_ptr, k_ptr, v_ptr, o_part_ptr, lse_part_ptr, count_ptr, out_ptr, stamp_ptr, S, split_len,
                        n_splits, qk_scale, Hq: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                        G_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MERGE_ROWS: tl.constexpr,
                        MERGE_SPLITS: tl.constexpr, CYCLIC: tl.constexpr, MERGE: tl.constexpr, STAMP: tl.constexpr,
                        SPLIT_MAJOR: tl.constexpr, READ_ONLY: tl.constexpr, DOT_F32: tl.constexpr):
    pid = tl.program_id(0)
    n_groups = tl.num_programs(0) // n_splits
    if SPLIT_MAJOR:
        grp = pid % n_groups
        sp = pid // n_groups
    else:
        sp = pid % n_splits
        grp = pid // n_splits
    if STAMP:
        tl.store(stamp_ptr + pid * 4, globaltimer_ns(False))
    q, rows, row_ok = group_query(q_ptr, grp, Hq, Hkv, D, G, G_PAD)
    d = tl.arange(0, D)
    kv_base = grp.to(tl.int64) * S * D
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    sums = tl.zeros((BLOCK_N, D), tl.float32)
    if CYCLIC:
        lo = sp * BLOCK_N
        hi = S
        step = n_splits * BLOCK_N
    else:
        lo = sp * split_len
        hi = tl.minimum(lo + split_len, S)
        step = BLOCK_N
    for n in range(lo, hi, step):
        tok = n + tl.arange(0, BLOCK_N)
        offs = kv_base + tok.to(tl.int64)[:, None] * D + d[None, :]
        k = tl.load(k_ptr + offs)
        v = tl.load(v_ptr + offs)
        if READ_ONLY:
            sums += k.to(tl.float32) + v.to(tl.float32)
        else:
            m_i, l_i, acc = attend_tile(q, k, v, tok < S, m_i, l_i, acc, qk_scale, DOT_F32)
    if READ_ONLY:
        tl.store(o_part_ptr + pid, tl.sum(tl.sum(sums, 1), 0))
    else:
        if STAMP:
            tl.store(stamp_ptr + pid * 4 + 1, globaltimer_ns(False))
        prow = (grp * G + rows) * n_splits + sp
        tl.store(o_part_ptr + prow[:, None] * D + d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
        tl.store(lse_part_ptr + prow, m_i + tl.log2(l_i), mask=row_ok)
        if MERGE:
            tl.debug_barrier()
            ticket = tl.atomic_add(count_ptr + grp, 1, sem="acq_rel", scope="gpu")
            if STAMP:
                tl.store(stamp_ptr + pid * 4 + 2, globaltimer_ns(False))
            if ticket % n_splits == n_splits - 1:
                tl.debug_barrier()
                _merge_group(o_part_ptr, lse_part_ptr, out_ptr, count_ptr, count_ptr, count_ptr, count_ptr, 0, grp,
                             n_splits, 0, D, G, MERGE_ROWS, MERGE_SPLITS, 0, 1, False)
                if STAMP:
                    tl.store(stamp_ptr + pid * 4 + 3, globaltimer_ns(False))


class Probe:
    def __init__(self, B, D, S, splits, block_n, warps, stages, cyclic, merge, split_major, read_only, dev):
        self.B, self.D, self.S = B, D, S
        self.G = HQ // HKV
        self.splits = splits
        self.split_len = math.ceil(S / splits / block_n) * block_n
        assert S % block_n == 0 and (cyclic or self.split_len * splits == S), "whole tiles only"
        self.programs = B * HKV * splits
        R = B * HQ
        self.o_part = torch.empty(R * splits * D, dtype=torch.float32, device=dev)
        self.lse_part = torch.empty(R * splits, dtype=torch.float32, device=dev)
        self.counts = torch.zeros(B * HKV, dtype=torch.int64, device=dev)
        self.stamps = torch.zeros(self.programs * 4, dtype=torch.int64, device=dev)
        mr, ms = _merge_tile(self.G, D, warps)
        self.kw = dict(Hq=HQ, Hkv=HKV, D=D, G=self.G, G_PAD=16, BLOCK_N=block_n, MERGE_ROWS=mr, MERGE_SPLITS=ms,
                       DOT_F32=dev.type != "cuda", CYCLIC=cyclic, MERGE=merge, SPLIT_MAJOR=split_major, READ_ONLY=read_only,
                       num_warps=warps, num_stages=stages)

    def __call__(self, q, k, v, out, stamp=False):
        probe_decode_kernel[(self.programs,)](q, k, v, self.o_part, self.lse_part, self.counts, out, self.stamps,
                                              self.S, self.split_len, self.splits, LOG2E / math.sqrt(self.D),
                                              STAMP=stamp, **self.kw)
        return out


def make_sets(B, S, D, dev, l2, seed=77):
    """Input sets (q, K, V, out) whose K and V together exceed 3 x L2 bytes, and the bytes of one set's K and V."""
    kv = 2 * B * HKV * S * D * 2
    n = max(1, math.ceil(3 * l2 / kv))
    sets = []
    for i in range(n):
        g = torch.Generator(device=dev).manual_seed(seed + i)
        q = torch.randn(B, HQ, D, generator=g, device=dev).to(torch.bfloat16)
        k = torch.randn(B, HKV, S, D, generator=g, device=dev).to(torch.bfloat16)
        v = torch.randn(B, HKV, S, D, generator=g, device=dev).to(torch.bfloat16)
        sets.append((q, k, v, torch.empty(B, HQ, D, dtype=torch.bfloat16, device=dev)))
    return sets, kv


def part1(dev, args, res):
    props = torch.cuda.get_device_properties(dev)
    l2, sms = props.L2_cache_size, props.multi_processor_count
    bw = read_bandwidth(dev)
    res["read_gb_per_s"] = bw["read_gb_per_s"]
    rows = []
    for (B, S, D) in [(1, 32768, 64), (1, 32768, 128), (1, 131072, 64)]:
        sets, kv = make_sets(B, S, D, dev, l2)
        floor_us = (kv + 2 * B * HQ * D * 2) / (bw["read_gb_per_s"] * 1e3)
        o_ref, _ = attention_partial_f32(sets[0][0], sets[0][1], sets[0][2])
        flat = [torch.cat([s[1].view(-1), s[2].view(-1)]) for s in sets]
        part = torch.empty(sms * 8, dtype=torch.float32, device=dev)
        r = time_graph(lambda i: read_all(flat[i], part, 8), len(sets), args.replays)
        rows.append({"B": B, "S": S, "D": D, "what": "read block-cyclic 8/SM", "us": r["us"], "floor_us": floor_us})
        log(rows[-1])
        tuned = LocalDecode(B, HQ, HKV, D, S, dev)
        fn = lambda i: tuned(*sets[i])
        sets[0][3].fill_(float("nan"))
        fn(0)
        err = rel_error(sets[0][3], o_ref)
        r = time_graph(fn, len(sets), args.replays)
        rows.append({"B": B, "S": S, "D": D, "what": "LocalDecode (tuned)", "config": tuned.describe(), "us": r["us"],
                     "floor_us": floor_us, "rel_error": err})
        log(rows[-1])
        grid = []
        for splits in (16, 33, 32, 66):
            for block_n, warps, stages in ((128, 4, 3), (64, 4, 4), (128, 4, 4), (256, 8, 3), (64, 4, 3)):
                for cyclic in (False, True):
                    grid.append(dict(splits=splits, block_n=block_n, warps=warps, stages=stages, cyclic=cyclic,
                                     merge=True, split_major=False, read_only=False))
        base = dict(splits=16, block_n=128, warps=4, stages=3, merge=True, split_major=False, read_only=False)
        for extra in (dict(cyclic=False, merge=False), dict(cyclic=True, merge=False),
                      dict(cyclic=False, split_major=True), dict(cyclic=True, split_major=True),
                      dict(cyclic=False, read_only=True), dict(cyclic=True, read_only=True),
                      dict(cyclic=True, read_only=True, splits=33), dict(cyclic=False, read_only=True, splits=33),
                      dict(cyclic=True, read_only=True, splits=66, block_n=64, stages=4)):
            grid.append({**base, **extra})
        if D == 128:
            grid = [g for g in grid if g["block_n"] <= 128]
        t_end = time.time() + args.budget_s / 3
        for cfg in grid:
            if time.time() > t_end:
                rows.append({"B": B, "S": S, "D": D, "what": "probe", **cfg, "error": "budget"})
                continue
            if not cfg["cyclic"] and (S // cfg["splits"]) % cfg["block_n"]:
                continue
            try:
                p = Probe(B, D, S, dev=dev, **cfg)
                f = lambda i, p=p: p(*sets[i])
                sets[0][3].fill_(float("nan"))
                f(0)
                torch.cuda.synchronize()
                err = None if (cfg["read_only"] or not cfg["merge"]) else rel_error(sets[0][3], o_ref)
                r = time_graph(f, len(sets), args.replays)
                row = {"B": B, "S": S, "D": D, "what": "probe", **cfg, "us": r["us"], "floor_us": floor_us,
                       "rel_error": err}
                if cfg["merge"] and not cfg["read_only"] and cfg["splits"] in (16, 33) and cfg["block_n"] == 128:
                    row["stamps_summary"] = summarize(stamped_calls(p, sets, 4))
                rows.append(row)
            except Exception as e:
                torch.cuda.synchronize()
                rows.append({"B": B, "S": S, "D": D, "what": "probe", **cfg,
                             "error": " ".join(f"{type(e).__name__}: {e}".split())[:200]})
            log({k: v for k, v in rows[-1].items() if k != "stamps_summary"}, rows[-1].get("stamps_summary", ""))
        del sets, flat
        torch.cuda.empty_cache()
    res["part1"] = rows


def stamped_calls(p, sets, width, calls=5):
    """Per-program stamps (rows of `width` int64) of `calls` single calls of probe p, over the input sets."""
    out = []
    for rep in range(calls):
        p.stamps.zero_()
        p(*sets[rep % len(sets)], stamp=True)
        torch.cuda.synchronize()
        out.append(p.stamps.view(-1, width).tolist())
    return out


def summarize(calls):
    """Per call: ns from the first program's start to each event (quantiles over programs)."""
    out = []
    for st in calls:
        t0 = min(r[0] for r in st)
        starts = sorted(r[0] - t0 for r in st)
        loops = sorted(r[1] - t0 for r in st)
        tickets = sorted(r[2] - t0 for r in st)
        merges = sorted(r[3] - t0 for r in st if r[3] > 0)
        q = lambda xs: [xs[0], xs[len(xs) // 4], xs[len(xs) // 2], xs[3 * len(xs) // 4], xs[-1]] if xs else []
        out.append({"start_q": q(starts), "loop_end_q": q(loops), "ticket_q": q(tickets), "merge_end_q": q(merges),
                    "last_merge_minus_last_loop_ns": (merges[-1] - loops[-1]) if merges else None})
    return out


def part2_job(ctx, B, D, S, iters):
    from taxes.kernels import flash_decode as fd

    g = torch.Generator(device=ctx.device).manual_seed(3)
    q = torch.randn(B, HQ, D, generator=g, device=ctx.device).to(torch.bfloat16)
    k = torch.randn(B, HKV, S, D, generator=g, device=ctx.device).to(torch.bfloat16)
    v = torch.randn(B, HKV, S, D, generator=g, device=ctx.device).to(torch.bfloat16)
    out = torch.empty(B, HQ, D, dtype=torch.bfloat16, device=ctx.device)
    res = {}
    for variant in ("bsp-sdpa", "bsp"):
        run = fd.FlashDecode(ctx, B, HQ, HKV, D, S, torch.bfloat16, variant)
        for _ in range(5):
            run(q, k, v, out)
        torch.cuda.synchronize()
        steps = {}
        calls, e2e = [], []
        for i in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for name, _, thunk in run.phases(q, k, v, out):
                t = time.perf_counter()
                thunk()
                steps.setdefault(name, []).append((time.perf_counter() - t) * 1e6)
            calls.append((time.perf_counter() - t0) * 1e6)
            torch.cuda.synchronize()
            e2e.append((time.perf_counter() - t0) * 1e6)
        res[variant] = {"host_step_us": {n: statistics.median(x) for n, x in steps.items()},
                        "host_call_us": statistics.median(calls), "wall_with_sync_us": statistics.median(e2e),
                        "sdpa_backend": run.sdpa_backend}
        # the SDPA op alone, and the packing after it
        if variant == "bsp-sdpa":
            parts = {"sdpa_op": [], "pack": []}
            for i in range(iters):
                torch.cuda.synchronize()
                t = time.perf_counter()
                o, lse = fd.sdpa_lse(q, k, v, run.sdpa_backend)
                parts["sdpa_op"].append((time.perf_counter() - t) * 1e6)
                t = time.perf_counter()
                packed = run.local.view(B, HKV, HQ // HKV, D + 1)
                packed[..., :D].copy_(o.reshape(B, HKV, HQ // HKV, D))
                torch.mul(lse.reshape(B, HKV, HQ // HKV), LOG2E, out=packed[..., D])
                parts["pack"].append((time.perf_counter() - t) * 1e6)
            res[variant]["parts_us"] = {n: statistics.median(x) for n, x in parts.items()}
            for be in ("cudnn", "flash", "efficient"):
                try:
                    xs = []
                    for i in range(iters):
                        torch.cuda.synchronize()
                        t = time.perf_counter()
                        fd.sdpa_lse(q, k, v, be)
                        xs.append((time.perf_counter() - t) * 1e6)
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    for i in range(iters):
                        fd.sdpa_lse(q, k, v, be)
                    torch.cuda.synchronize()
                    res[variant][f"op_{be}"] = {"host_us": statistics.median(xs),
                                                "back_to_back_us": (time.perf_counter() - t) * 1e6 / iters}
                except Exception as e:
                    res[variant][f"op_{be}"] = {"error": str(e)[:200]}
        log(variant, json.dumps(res[variant]))
    return res


def log(*a):
    print(*a, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=360)
    ap.add_argument("--parts", default="1,2")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    from taxes.run.harness import gpu_metadata
    from taxes.provenance import collect

    res = {"benchmark": "benchmarks/decode_probe.py", "command": " ".join(sys.argv), **collect(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "triton": triton.__version__, "clocks": gpu_metadata().get("clocks"),
           "timing": "CUDA graph of calls over KV sets rotated beyond L2 (benchmarks/graph_timing.py); median "
                     "per call", "floor": "(K, V, q and out bytes) / read_gb_per_s (a 1 GiB read)"}
    if "2" in args.parts:
        from taxes.kernels.runtime import launch

        res["part2"] = launch(part2_job, 1, 1, 128, 131072, 50, backend="cuda", timeout_s=120)[0]
        (out / "decode_probe.json").write_text(json.dumps(res, indent=1))
    if "1" in args.parts:
        try:
            part1(dev, args, res)
        finally:
            (out / "decode_probe.json").write_text(json.dumps(res, indent=1))
    for r in res.get("part1", []):
        if "us" in r:
            log(f"{r['B']} {r['S']} {r['D']} {r['what'][:22]:22s} {r.get('splits','')!s:>3} {r.get('block_n','')!s:>4} "
                f"{r.get('warps','')!s:>2} {r.get('stages','')!s:>2} cyc={r.get('cyclic','')!s:5} merge={r.get('merge','')!s:5} "
                f"sm={r.get('split_major','')!s:5} ro={r.get('read_only','')!s:5} {r['us']:7.2f} us  frac {r['floor_us']/r['us']:.3f}")
    sys.exit(0)


if __name__ == "__main__":
    main()
