"""How the per-GPU decode's tail shrinks: who streams which KV tile, and how the splits' partials meet.

    python benchmarks/decode_schedule_probe.py --out DIR

At B=1, S=32K, D=64 (67 MB of KV) the decode's programs end their KV loops up to 2-3 us apart, and the
last group's merge adds 1.5 us after the last loop (benchmarks/decode_probe.py). This times, from CUDA
graphs over KV sets rotated beyond L2, the combinations of
- programs: B x Hkv x splits, or any count shared by the groups as evenly as whole programs allow (132:
  every SM streams, some groups have one split more);
- schedule: `static` (split sp takes every n-th tile of its group, a pipelined loop, as decode_kernel) or,
  with --claims, `claim` (each program takes its first tile statically, then claims the group's remaining
  tiles one at a time from a counter, the claim two tiles ahead and the loads one tile ahead of the
  compute, so a program that streams faster takes more tiles; Triton does not pipeline this loop);
- merge: `ticket` (each split stores its partial, releases, takes a ticket; the last arriver merges, as
  decode_kernel), `poll` (the group's last split merges: it polls the partials, which start as a NaN
  sentinel, until every value has arrived: no fence and no atomic between the last store and the merge;
  it needs every program of the group resident, one wave) or `none` (partials only: a wrong result, timed
  to price the merge);
with per-program %globaltimer stamps (start, loop end, arrival, merge end), %smid and tiles streamed. A
group of one split writes its output itself (no merge), as decode_kernel does.

What it found on one H100 (reports/flash_decode/decode_schedule_probe-h100.json.gz, -claims-h100.json):
claimed tiles take twice as long; 132 programs are 0.2-1 us slower than 128; a correct polled merge is
slower than the ticket everywhere (0.5-1.8 us at B=16, 3-61 us at B <= 4); without any merge B=1, S=32K,
D=64 takes 25.3-25.5 us (0.85 of the floor), so the ticket merge's 1-2 us is what holds it under; one
split per group at B=16 saves 1-4 us. --stress checks the polled merge call after call
(decode_poll_stress-h100.json; its first build, which let threads use values they had not polled
themselves, gave NaN in most calls of two configurations: decode_poll_stress-h100-b7e4efc.json).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

from taxes.run.cases import rel_error
from taxes.kernels.decode_local import LOG2E, LocalDecode, attend_tile, attention_partial_f32, group_query
from taxes.kernels.sync import globaltimer_ns

from decode_probe import HKV, HQ, log, make_sets, stamped_calls
from graph_timing import read_bandwidth, time_graph

SENTINEL = tl.constexpr(0x7FBADBAD)  # a NaN no division or log produces: "not written yet"
SCHEDS = {"static": 0, "claim": 1}
MERGES = {"none": 0, "ticket": 1, "poll": 2}


@triton.jit
def smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def claim_tile(ctr_ptr, ok, T, n_splits, LANES: tl.constexpr):
    """Issue one claim on the group's counter (by lane 0, when ok): a [LANES] tensor whose lane 0 holds the
    counter's old value. Read it with claimed_tile, as late as possible (the read waits for the atomic)."""
    lane = tl.arange(0, LANES)
    return tl.atomic_add(ctr_ptr + lane * 0, tl.full((LANES,), 1, tl.int64), mask=lane < tl.where(ok, 1, 0), sem="relaxed",
                         scope="gpu")


@triton.jit
def claimed_tile(c, ok, T, n_splits, LANES: tl.constexpr):
    """The tile a claim got: tiles n_splits .. T-1 are handed out, T claims per call (each program's last
    claim finds none), so the counter's old value mod T is the claim's place in this call; T: none."""
    lane = tl.arange(0, LANES)
    v = tl.max(tl.where(lane == 0, c, 0), 0) % T
    return tl.where(ok & (v < T - n_splits), (n_splits + v).to(tl.int32), T)


@triton.jit
def _load_tile(k_ptr, v_ptr, kv_base, t, T, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Tile t of K and V (zeros when t >= T: no tile)."""
    tok = t * BLOCK_N + tl.arange(0, BLOCK_N)
    offs = kv_base + tok.to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :]
    m = (tl.zeros((BLOCK_N, D), tl.int32) + t) < T
    return tl.load(k_ptr + offs, mask=m, other=0.0), tl.load(v_ptr + offs, mask=m, other=0.0)


@triton.jit
def _merge_splits(o_ptr, lse_ptr, out_ptr, grp, ns, n_max, POLL: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                  G_P2: tl.constexpr, SPL_P2: tl.constexpr, LSE_COLS: tl.constexpr, CHUNK: tl.constexpr):
    """Merge group grp's ns partials (rows (grp * G + g) * n_max + split) and write its output rows. POLL:
    first wait for every value by polling it (each starts as SENTINEL); else the caller's acquire made
    them visible. A thread uses only values it polled itself, in tiles that hold no value twice: the
    log-sum-exps as [G_P2, LSE_COLS] (padded to four values per thread) for the maximum and the sum, and
    again spread over every D column of each chunk for the weights (kernels/flash_decode.py, poll_rows,
    says why: copies of a value poll on their own)."""
    g = tl.arange(0, G_P2)
    s = tl.arange(0, LSE_COLS)
    ok = (g < G)[:, None] & (s < ns)[None, :]
    idx = (grp * G + g)[:, None] * n_max + s[None, :]
    lse_bits = tl.load(lse_ptr.to(tl.pointer_type(tl.int32)) + idx, mask=ok, other=0, volatile=True)
    if POLL:
        while tl.max(tl.max(tl.where(lse_bits == SENTINEL, 1, 0), 1), 0) > 0:
            lse_bits = tl.load(lse_ptr.to(tl.pointer_type(tl.int32)) + idx, mask=ok, other=0, volatile=True)
    lse = tl.where(ok, lse_bits.to(tl.float32, bitcast=True), float("-inf"))
    m = tl.max(lse, 1)
    m = tl.where(m > float("-inf"), m, 0.0)
    wsum = tl.sum(tl.exp2(lse - m[:, None]), 1)
    d = tl.arange(0, D)
    acc = tl.zeros((G_P2, D), tl.float32)
    for s0 in tl.static_range(0, SPL_P2, CHUNK):
        sc = s0 + tl.arange(0, CHUNK)
        okc = ((g < G)[:, None] & (sc < ns)[None, :])[:, :, None] & (d < D)[None, None, :]
        idc = (grp * G + g)[:, None] * n_max + sc[None, :]
        ptr = o_ptr.to(tl.pointer_type(tl.int32)) + idc[:, :, None] * D + d[None, None, :]
        bits = tl.load(ptr, mask=okc, other=0, volatile=True)
        if POLL:
            lptr = lse_ptr.to(tl.pointer_type(tl.int32)) + idc[:, :, None] + d[None, None, :] * 0
            lse_c = tl.load(lptr, mask=okc, other=0, volatile=True)
            while tl.max(tl.max(tl.max(tl.where((bits == SENTINEL) | (lse_c == SENTINEL), 1, 0), 2), 1), 0) > 0:
                bits = tl.load(ptr, mask=okc, other=0, volatile=True)
                lse_c = tl.load(lptr, mask=okc, other=0, volatile=True)
            wc = tl.exp2(tl.where(okc, lse_c.to(tl.float32, bitcast=True), float("-inf")) - m[:, None, None])
        else:  # the ticket's acquire made every value visible to every thread: the [G_P2, CHUNK] weights once
            okc2 = (g < G)[:, None] & (sc < ns)[None, :]
            lse_c = tl.load(lse_ptr + idc, mask=okc2, other=float("-inf"), cache_modifier=".cg")
            wc = tl.exp2(lse_c - m[:, None])[:, :, None]
        acc += tl.sum(wc * bits.to(tl.float32, bitcast=True), 1)
    o = acc / wsum[:, None]
    row = (grp * G + g).to(tl.int64)
    tl.store(out_ptr + row[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])


@triton.jit(do_not_specialize=["S", "base", "extra", "n_max"])
def sched_probe_kernel(q_ptr, k_ptr, v_ptr, o_part_ptr, lse_part_ptr, count_ptr, claim_ptr, epoch_ptr, out_ptr,
                       stamp_ptr, S, base, extra, n_max, qk_scale, Hq: tl.constexpr, Hkv: tl.constexpr,
                       D: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, G_P2: tl.constexpr,
                       BLOCK_N: tl.constexpr, SPL_P2: tl.constexpr, LSE_COLS: tl.constexpr, CHUNK: tl.constexpr,
                       SCHED: tl.constexpr,
                       MERGE: tl.constexpr, STAMP: tl.constexpr, LANES: tl.constexpr, DOT_F32: tl.constexpr):
    # the first `extra` groups have base + 1 splits, the others base: every program of the grid streams
    pid = tl.program_id(0)
    big = extra * (base + 1)
    p2 = pid - big
    is_big = pid < big
    grp = tl.where(is_big, pid // (base + 1), extra + p2 // base)
    sp = tl.where(is_big, pid % (base + 1), p2 % base)
    ns = tl.where(is_big, base + 1, base)
    if STAMP:
        tl.store(stamp_ptr + pid * 8, globaltimer_ns(False))
        tl.store(stamp_ptr + pid * 8 + 4, smid().to(tl.int64))
    q, rows, row_ok = group_query(q_ptr, grp, Hq, Hkv, D, G, G_PAD)
    d = tl.arange(0, D)
    kv_base = grp.to(tl.int64) * S * D
    set_rows = (extra + (tl.num_programs(0) - big) // base) * G * n_max  # partial rows per set: groups x G x n_max
    epoch = grp * 0
    if MERGE == 2:
        epoch = tl.load(epoch_ptr + grp)
        if (sp == ns - 1) & (ns > 1):  # the merger clears the other set of partials for the next call
            other = (1 - epoch % 2) * set_rows
            for s0 in range(0, ns):
                prow = other + (grp * G + rows) * n_max + s0
                tl.store(lse_part_ptr.to(tl.pointer_type(tl.int32)) + prow, tl.full((G_PAD,), SENTINEL, tl.int32),
                         mask=row_ok)
                tl.store(o_part_ptr.to(tl.pointer_type(tl.int32)) + prow[:, None] * D + d[None, :],
                         tl.full((G_PAD, D), SENTINEL, tl.int32), mask=row_ok[:, None])
    part = (epoch % 2) * set_rows
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D), tl.float32)
    ntiles = 0
    if SCHED == 0:
        for n in range(sp * BLOCK_N, S, ns * BLOCK_N):
            tok = n + tl.arange(0, BLOCK_N)
            offs = kv_base + tok.to(tl.int64)[:, None] * D + d[None, :]
            k = tl.load(k_ptr + offs)
            v = tl.load(v_ptr + offs)
            m_i, l_i, acc = attend_tile(q, k, v, tok < S, m_i, l_i, acc, qk_scale, DOT_F32)
            ntiles += 1
    else:
        T = S // BLOCK_N
        ctr = claim_ptr + grp
        cur = sp
        kc, vc = _load_tile(k_ptr, v_ptr, kv_base, cur, T, BLOCK_N, D)
        c1 = claim_tile(ctr, cur < T, T, ns, LANES)
        n1 = claimed_tile(c1, cur < T, T, ns, LANES)
        k1, v1 = _load_tile(k_ptr, v_ptr, kv_base, n1, T, BLOCK_N, D)
        c2 = claim_tile(ctr, n1 < T, T, ns, LANES)
        while cur < T:
            tok = cur * BLOCK_N + tl.arange(0, BLOCK_N)
            m_i, l_i, acc = attend_tile(q, kc, vc, tok < S, m_i, l_i, acc, qk_scale, DOT_F32)
            ntiles += 1
            n2 = claimed_tile(c2, n1 < T, T, ns, LANES)
            k2, v2 = _load_tile(k_ptr, v_ptr, kv_base, n2, T, BLOCK_N, D)
            c2 = claim_tile(ctr, n2 < T, T, ns, LANES)
            cur = n1
            kc = k1
            vc = v1
            n1 = n2
            k1 = k2
            v1 = v2
    if STAMP:
        tl.store(stamp_ptr + pid * 8 + 1, globaltimer_ns(False))
        tl.store(stamp_ptr + pid * 8 + 5, ntiles)
    if ns == 1:  # the group's only split: its result is the output
        row = (grp * G + rows).to(tl.int64)
        tl.store(out_ptr + row[:, None] * D + d[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])
    else:
        prow = part + (grp * G + rows) * n_max + sp
        tl.store(o_part_ptr + prow[:, None] * D + d[None, :], acc / l_i[:, None], mask=row_ok[:, None])
        tl.store(lse_part_ptr + prow, m_i + tl.log2(l_i), mask=row_ok)
        if MERGE == 1:
            tl.debug_barrier()
            ticket = tl.atomic_add(count_ptr + grp, 1, sem="acq_rel", scope="gpu")
            if STAMP:
                tl.store(stamp_ptr + pid * 8 + 2, globaltimer_ns(False))
            if ticket % ns == ns - 1:
                tl.debug_barrier()
                _merge_splits(o_part_ptr, lse_part_ptr, out_ptr, grp, ns, n_max, False, D, G, G_P2, SPL_P2, LSE_COLS,
                              CHUNK)
                if STAMP:
                    tl.store(stamp_ptr + pid * 8 + 3, globaltimer_ns(False))
        elif MERGE == 2:
            if STAMP:
                tl.store(stamp_ptr + pid * 8 + 2, globaltimer_ns(False))
            if sp == ns - 1:
                _merge_splits(o_part_ptr + part * D, lse_part_ptr + part, out_ptr, grp, ns, n_max, True, D, G, G_P2,
                              SPL_P2, LSE_COLS, CHUNK)
                tl.store(epoch_ptr + grp, epoch + 1)
                if STAMP:
                    tl.store(stamp_ptr + pid * 8 + 3, globaltimer_ns(False))


class Probe:
    """One configuration of sched_probe_kernel: `programs` (default B * Hkv * splits) shared by the groups
    as evenly as whole programs allow."""

    def __init__(self, B, D, S, splits, block_n, warps, stages, sched, merge, dev, programs=0):
        self.B, self.D, self.S = B, D, S
        self.G = HQ // HKV
        groups = B * HKV
        self.programs = programs or groups * splits
        self.base, self.extra = divmod(self.programs, groups)
        assert self.base >= 1, "a program per group at least"
        self.n_max = self.base + (self.extra > 0)
        assert S % block_n == 0 and S // block_n >= self.n_max, "whole tiles, one at least per split"
        R = B * HQ
        self.o_part = torch.empty(2 * R * self.n_max * D, dtype=torch.float32, device=dev)
        self.lse_part = torch.empty(2 * R * self.n_max, dtype=torch.float32, device=dev)
        self.o_part.view(torch.int32).fill_(SENTINEL.value)
        self.lse_part.view(torch.int32).fill_(SENTINEL.value)
        self.counts = torch.zeros(groups, dtype=torch.int64, device=dev)
        self.claims = torch.zeros(groups, dtype=torch.int64, device=dev)
        self.epochs = torch.zeros(groups, dtype=torch.int32, device=dev)
        self.stamps = torch.zeros(self.programs * 8, dtype=torch.int64, device=dev)
        spl_p2 = triton.next_power_of_2(self.n_max)
        g_p2 = triton.next_power_of_2(self.G)
        chunk = max(1, min(spl_p2, (2048 * warps) // (g_p2 * D)))
        self.kw = dict(Hq=HQ, Hkv=HKV, D=D, G=self.G, G_PAD=16, G_P2=g_p2, BLOCK_N=block_n, SPL_P2=spl_p2,
                       LSE_COLS=max(spl_p2, (4 * 32 * warps) // g_p2), CHUNK=chunk, SCHED=SCHEDS[sched],
                       MERGE=MERGES[merge], LANES=32 * warps,
                       DOT_F32=dev.type != "cuda", num_warps=warps, num_stages=stages)

    def _args(self, q, k, v, out):
        return (q, k, v, self.o_part, self.lse_part, self.counts, self.claims, self.epochs, out, self.stamps, self.S,
                self.base, self.extra, self.n_max, LOG2E / math.sqrt(self.D))

    def compile(self, q, k, v, out):
        """The compiled kernel, without a launch (its registers and shared memory say how many fit an SM)."""
        return sched_probe_kernel.warmup(*self._args(q, k, v, out), grid=(self.programs,), STAMP=False, **self.kw)

    def __call__(self, q, k, v, out, stamp=False):
        sched_probe_kernel[(self.programs,)](*self._args(q, k, v, out), STAMP=stamp, **self.kw)
        return out


def resident_per_sm(c, num_warps) -> int:
    """Programs of compiled kernel c one H100 SM holds at once (registers, shared memory, threads)."""
    if getattr(c, "n_regs", None) is None and hasattr(c, "_init_handles"):
        c._init_handles()  # loads the module: registers and spills are known from then on
    threads = 32 * num_warps
    regs = max(1, ((c.n_regs + 7) // 8) * 8) * threads
    smem = c.metadata.shared + 1024
    return max(0, min(65536 // regs, (228 * 1024) // smem, 2048 // threads, 32))


def summarize(calls):
    """Per call, ns from the first program's start (quantiles over programs), and how loop ends and tiles
    streamed go with the SM."""
    out = []
    for st in calls:
        t0 = min(r[0] for r in st)
        q = lambda xs: [xs[0], xs[len(xs) // 4], xs[len(xs) // 2], xs[3 * len(xs) // 4], xs[-1]] if xs else []
        loops = sorted(r[1] - t0 for r in st)
        merges = sorted(r[3] - t0 for r in st if r[3] > 0)
        tiles = sorted(r[5] for r in st)
        slowest = sorted(st, key=lambda r: r[1])[-4:]
        out.append({"start_q": q(sorted(r[0] - t0 for r in st)), "loop_end_q": q(loops),
                    "arrive_q": q(sorted(r[2] - t0 for r in st if r[2] > 0)), "merge_end_q": q(merges),
                    "tiles_q": q(tiles), "last_merge_minus_last_loop_ns": (merges[-1] - loops[-1]) if merges else None,
                    "slowest_sms": [r[4] for r in slowest]})
    return out


def stress(dev, calls, budget_s):
    """The polling merge, call after call: every call's output poisoned and checked against its set's float32
    reference, eagerly and from a CUDA graph over the sets; for a wrong call, which groups went wrong, the
    groups' epochs before and after, and the sentinels left in each set of partials. The ticket merge of
    the same configurations is the control."""
    props = torch.cuda.get_device_properties(dev)
    rows = []
    t_end = time.time() + budget_s
    # (B, S, D, splits, block_n, warps, stages): the two configurations the sweep found wrong, and two it found right
    for (B, S, D, splits, block_n, warps, stages) in [(4, 8192, 64, 8, 128, 4, 2), (1, 32768, 128, 16, 128, 8, 3),
                                                       (4, 8192, 64, 4, 128, 4, 3), (1, 32768, 64, 16, 128, 4, 3)]:
        sets, _ = make_sets(B, S, D, dev, props.L2_cache_size, seed=91)
        refs = [attention_partial_f32(s[0], s[1], s[2])[0] for s in sets]
        G = HQ // HKV
        for merge in ("poll", "ticket"):
            if time.time() > t_end:
                rows.append({"B": B, "S": S, "D": D, "splits": splits, "merge": merge, "error": "budget"})
                continue
            p = Probe(B, D, S, splits, block_n, warps, stages, "static", merge, dev)
            bad = []

            def check(i, how, n):
                err = rel_error(sets[i][3], refs[i])
                if not err <= 0.01 and len(bad) < 8:
                    diff = (sets[i][3].float() - refs[i]).view(B * HKV, G, D)
                    per_grp = diff.abs().nan_to_num(float("inf")).amax(dim=(1, 2)).tolist()
                    sent = [int((h.view(torch.int32) == SENTINEL.value).sum()) for h in p.lse_part.chunk(2)]
                    bad.append({"how": how, "call": n, "set": i, "rel_error": err,
                                "wrong_groups": [g for g, e in enumerate(per_grp) if not e <= 0.05],
                                "epochs": p.epochs.tolist(), "lse_sentinels_per_set": sent})
                return err <= 0.01

            n_ok = n_calls = 0
            epochs_before = None
            for n in range(calls):
                i = n % len(sets)
                sets[i][3].fill_(float("nan"))
                epochs_before = p.epochs.tolist()
                p(*sets[i])
                torch.cuda.synchronize()
                n_calls += 1
                if check(i, "eager", n):
                    n_ok += 1
                elif len(bad) <= 8:
                    bad[-1]["epochs_before"] = epochs_before
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(len(sets)):
                    p(*sets[i])
            g_ok = g_calls = 0
            for rep in range(max(1, calls // len(sets))):
                for s in sets:
                    s[3].fill_(float("nan"))
                g.replay()
                torch.cuda.synchronize()
                for i in range(len(sets)):
                    g_calls += 1
                    g_ok += check(i, "graph", rep)
            del g
            rows.append({"B": B, "S": S, "D": D, "splits": splits, "block_n": block_n, "warps": warps,
                         "stages": stages, "merge": merge, "eager_ok": n_ok, "eager_calls": n_calls,
                         "graph_ok": g_ok, "graph_calls": g_calls, "wrong": bad})
            log({k: v for k, v in rows[-1].items() if k != "wrong"}, bad[:2])
        del sets
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=300)
    ap.add_argument("--claims", action="store_true", help="also every configuration with claimed tiles")
    ap.add_argument("--stress", type=int, default=0, metavar="CALLS",
                    help="only check the polling merge call after call (CALLS eager calls, as many graph calls)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    from taxes.run.harness import gpu_metadata
    from taxes.provenance import collect

    props = torch.cuda.get_device_properties(dev)
    l2 = props.L2_cache_size
    res = {"benchmark": "benchmarks/decode_schedule_probe.py", "command": " ".join(sys.argv), **collect(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "triton": triton.__version__, "clocks": gpu_metadata().get("clocks"),
           "timing": "CUDA graph of calls over KV sets rotated beyond L2 (benchmarks/graph_timing.py); median "
                     "per call", "floor": "(K, V, q and out bytes) / read_gb_per_s (a 1 GiB read)"}
    if args.stress:
        res["stress"] = stress(dev, args.stress, args.budget_s)
        (out / "decode_poll_stress.json").write_text(json.dumps(res, indent=1))
        return
    bw = read_bandwidth(dev)
    res["read_gb_per_s"] = bw["read_gb_per_s"]
    rows = []
    t_end = time.time() + args.budget_s
    sms = props.multi_processor_count
    # (B, S, D): [(splits, programs (0: B * Hkv * splits), block_n, warps, stages)], each with every merge
    shapes = {(1, 32768, 64): [(16, 0, 128, 4, 3), (16, 132, 128, 4, 3), (32, 0, 128, 4, 2), (32, 0, 64, 4, 3),
                               (64, 0, 64, 4, 2)],
              (1, 32768, 128): [(16, 0, 128, 8, 3), (16, 132, 128, 8, 3), (32, 0, 64, 4, 3)],
              (1, 131072, 64): [(32, 0, 128, 4, 2), (16, 0, 128, 4, 3), (16, 132, 128, 4, 3)],
              (4, 8192, 64): [(4, 0, 128, 4, 3), (8, 0, 128, 4, 2)],
              (4, 32768, 64): [(4, 0, 128, 4, 3)],
              (16, 8192, 128): [(2, 0, 64, 4, 2), (1, 0, 128, 4, 3), (1, 0, 128, 4, 2), (1, 0, 64, 4, 3)],
              (16, 8192, 64): [(1, 0, 128, 4, 3), (2, 0, 128, 4, 2)],
              (1, 8192, 64): [(16, 0, 64, 4, 4), (32, 0, 64, 4, 3)]}
    try:
        for (B, S, D), cfgs in shapes.items():
            sets, kv = make_sets(B, S, D, dev, l2, seed=91)
            floor_us = (kv + 2 * B * HQ * D * 2) / (bw["read_gb_per_s"] * 1e3)
            o_ref, _ = attention_partial_f32(sets[0][0], sets[0][1], sets[0][2])
            o_ref2 = attention_partial_f32(sets[1][0], sets[1][1], sets[1][2])[0] if len(sets) > 1 else None
            base = {"B": B, "S": S, "D": D, "floor_us": floor_us}
            tuned = LocalDecode(B, HQ, HKV, D, S, dev)
            sets[0][3].fill_(float("nan"))
            tuned(*sets[0])
            err = rel_error(sets[0][3], o_ref)
            r = time_graph(lambda i: tuned(*sets[i]), len(sets), args.replays)
            rows.append({**base, "what": "LocalDecode (tuned)", "config": tuned.describe(), "us": r["us"],
                         "rel_error": err})
            log(rows[-1])
            for (splits, programs, block_n, warps, stages) in cfgs:
                n_prog = programs or B * HKV * splits
                for sched, merge in [(sc, m) for sc in ("static", "claim")[:1 + args.claims]
                                     for m in ("ticket", "poll", "none")]:
                    cfg = dict(splits=splits, programs=n_prog, block_n=block_n, warps=warps, stages=stages,
                               sched=sched, merge=merge)
                    if time.time() > t_end:
                        rows.append({**base, **cfg, "error": "budget"})
                        continue
                    try:
                        p = Probe(B, D, S, dev=dev, **cfg)
                        fits = resident_per_sm(p.compile(*sets[0]), warps)
                        if merge == "poll" and n_prog > sms * fits:  # the merger waits for the others: one wave only
                            rows.append({**base, **cfg, "error": f"not one wave ({fits} per SM)"})
                            log(rows[-1])
                            continue
                        sets[0][3].fill_(float("nan"))
                        p(*sets[0])
                        torch.cuda.synchronize()
                        err = rel_error(sets[0][3], o_ref) if merge != "none" else None
                        r = time_graph(lambda i, p=p: p(*sets[i]), len(sets), args.replays)
                        err2 = None
                        if merge != "none" and o_ref2 is not None:  # still right after a graph's many calls
                            sets[1][3].fill_(float("nan"))
                            p(*sets[1])
                            torch.cuda.synchronize()
                            err2 = rel_error(sets[1][3], o_ref2)
                        row = {**base, "what": "probe", **cfg, "us": r["us"], "rel_error": err, "rel_error_after": err2,
                               "per_sm": fits}
                        row["stamps_summary"] = summarize(stamped_calls(p, sets, 8))
                        rows.append(row)
                    except Exception as e:
                        torch.cuda.synchronize()
                        rows.append({**base, **cfg, "error": " ".join(f"{type(e).__name__}: {e}".split())[:300]})
                    log({k: v for k, v in rows[-1].items() if k != "stamps_summary"})
            del sets
            torch.cuda.empty_cache()
    finally:
        res["rows"] = rows
        (out / "decode_schedule_probe.json").write_text(json.dumps(res, indent=1))
    for r in rows:
        if "us" in r:
            log(f"{r['B']:>2} {r['S']:>6} {r['D']:>3} {r.get('splits', '')!s:>3} {r.get('programs', '')!s:>4} "
                f"{r.get('block_n', '')!s:>4} {r.get('sched', 'tuned'):6} {r.get('merge', ''):6} "
                f"{r['us']:8.2f} us  frac {r['floor_us'] / r['us']:.3f}  err {r.get('rel_error')}")
        else:
            log(r)


if __name__ == "__main__":
    main()
