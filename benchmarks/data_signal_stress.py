"""The fused flash decode's data signal (the payload is the signal) against a live writer, on one GPU.

    python benchmarks/data_signal_stress.py --out DIR [--calls 3000]

fused_combine_kernel, as rank 0 of a world of two, polls its inbox for rank 1's partial while a second
kernel on another stream writes that partial after a delay (0 to 6 us, different per call and program), so
the payload lands while the combine is polling, the case a whole-GPU run meets only now and then. Every
call's output (poisoned before) is checked against the float32 merge of the two partials; a wrong call
records which rows were wrong and whether they were NaN (a sentinel taken for data), and a call whose
wait gave up (20 ms) is counted apart. Shapes: G = 8 query heads per KV head (Hq=64, Hkv=8) and G = 1, at D=64
and 128, B=4.
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

from taxes.kernels import flash_decode as fd
from taxes.kernels.decode_local import merge_partials_f32
from taxes.kernels.sync import ERR_WORDS, globaltimer_ns, wait_budget


@triton.jit(do_not_specialize=["delay_ns", "R", "parity"])
def late_writer(inbox_ptr, payload_ptr, delay_ns, R, parity, D: tl.constexpr, G: tl.constexpr,
                G_POW2: tl.constexpr):
    """Rank 1's rows of group pid, written into rank 0's inbox slot after delay_ns plus a little per group,
    the values first and the log-sum-exp last, as the decode kernel pushes them (no fence)."""
    pid = tl.program_id(0)
    t0 = globaltimer_ns(False)
    wait = delay_ns + (pid % 7) * 150
    while globaltimer_ns(False) - t0 < wait:
        pass
    g = tl.arange(0, G_POW2)
    ok = g < G
    rows = (pid * G + g).to(tl.int64)
    d = tl.arange(0, D)
    src = payload_ptr + rows * (D + 1)
    box = inbox_ptr + ((parity * 2 + 1) * R + rows) * (D + 1)
    tl.store(box[:, None] + d[None, :], tl.load(src[:, None] + d[None, :], mask=ok[:, None]), mask=ok[:, None])
    tl.store(box + D, tl.load(src + D, mask=ok), mask=ok)


@triton.jit
def thread_index():
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def reduce_copies_kernel(out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, THREADS: tl.constexpr):
    """Each value of a [ROWS, COLS] int32 tile (a [COLS] vector when ROWS is 0) set to the index of the
    thread holding it, then the tile's max: what every thread got, into out[thread]."""
    if ROWS == 0:
        x = tl.arange(0, COLS) * 0 + thread_index()
        r = tl.max(x, 0)
    else:
        x = tl.arange(0, ROWS)[:, None] * 0 + tl.arange(0, COLS)[None, :] * 0 + thread_index()
        r = tl.max(tl.max(x, 1), 0)
    t = tl.arange(0, THREADS)
    tl.store(out_ptr + t, tl.zeros([THREADS], tl.int32) + r)


def reductions_over_copies(dev) -> list[dict]:
    """Whether a reduction gives every thread of a 4-warp program the same result, for tiles with fewer
    values than threads (copies) and more: the count of distinct results (1: the same everywhere)."""
    res = []
    for rows, cols in [(0, 8), (0, 64), (0, 512), (1, 64), (8, 8), (8, 64), (4, 128)]:
        out = torch.full((128,), -1, dtype=torch.int32, device=dev)
        reduce_copies_kernel[(1,)](out, ROWS=rows, COLS=cols, THREADS=128, num_warps=4)
        res.append({"tile": [rows, cols] if rows else [cols], "distinct_results": len(set(out.tolist()))})
    return res


def stress(B, Hkv, G, D, calls, dev, budget_s, seed=0):
    R = B * Hkv * G
    n_blocks = B * Hkv
    g = torch.Generator(device=dev).manual_seed(seed)
    sets = []
    for _ in range(4):
        p0 = torch.randn(R, D + 1, generator=g, device=dev)
        p1 = torch.randn(R, D + 1, generator=g, device=dev)
        p0[:, D] *= 3  # log-sum-exps spread, so both partials weigh
        p1[:, D] *= 3
        # the float32 merge of the two packed partials (log-sum-exps in base 2, the helper's in base e)
        ref = merge_partials_f32(torch.stack([p0[:, :D], p1[:, :D]]), torch.stack([p0[:, D], p1[:, D]]) * math.log(2))
        sets.append((p0, p1, ref))
    inbox = torch.empty(2, 2, R, D + 1, dtype=torch.float32, device=dev)
    inbox.view(torch.int32).fill_(fd.SENTINEL_BITS)
    flags = torch.zeros(2 * n_blocks, dtype=torch.int32, device=dev)
    err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=dev)
    state = torch.zeros(2, dtype=torch.int32, device=dev)
    trace = torch.zeros(n_blocks * fd.TRACE_WORDS.value, dtype=torch.int64, device=dev)
    out = torch.empty(R, D, dtype=torch.float32, device=dev)
    writer = torch.cuda.Stream(dev)
    budget = wait_budget(0.02, False)
    delays = torch.randint(0, 6000, (calls,), generator=torch.Generator().manual_seed(seed)).tolist()
    rows = fd.poll_rows(G, D, fd.COMBINE_WARPS)
    res = {"B": B, "Hkv": Hkv, "G": G, "D": D, "poll_rows": rows, "calls": 0, "ok": 0, "wrong": 0, "nan_calls": 0,
           "timed_out": 0, "examples": []}
    # compiled before the first timed call: a writer compiling while the combine waits would time the wait out
    scratch = torch.empty_like(inbox)
    late_writer[(n_blocks,)](scratch, sets[0][1], 0, R, 0, D=D, G=G, G_POW2=triton.next_power_of_2(G))
    torch.cuda.synchronize()
    t_end = time.time() + budget_s
    for c in range(calls):
        if time.time() > t_end:
            break
        res["calls"] += 1
        p0, p1, ref = sets[c % len(sets)]
        parity = (c + 1) % 2  # the combine's epoch is state[0] + 1 = c + 1
        out.fill_(float("nan"))
        inbox[parity, 0].copy_(p0)
        ready = torch.cuda.Event()
        ready.record()  # the previous call's combine (which put this slot back to the sentinel) has ended
        fd.fused_combine_kernel[(n_blocks,)](inbox, out, flags, err, state, trace, 0, R, n_blocks, budget, WORLD=2, D=D,
                                             G=G, G_POW2=rows, DATA_SIGNAL=True, SENTINEL=fd.SENTINEL_BITS,
                                             TRACE=False, INTERPRET=False, num_warps=fd.COMBINE_WARPS)
        with torch.cuda.stream(writer):
            writer.wait_event(ready)
            late_writer[(n_blocks,)](inbox, p1, delays[c], R, parity, D=D, G=G, G_POW2=triton.next_power_of_2(G))
        torch.cuda.synchronize()
        if err[0].item():
            res["timed_out"] += 1
            err.zero_()
            state[0] = c + 1  # as if the call had ended, so the next one waits for its own epoch
            inbox.view(torch.int32).fill_(fd.SENTINEL_BITS)
            continue
        bad = ~torch.isclose(out, ref, rtol=1e-4, atol=1e-4)
        if bool(bad.any()):
            res["wrong"] += 1
            nan = bool(out.isnan().any())
            res["nan_calls"] += nan
            if len(res["examples"]) < 5:
                wrong_rows = bad.any(1).nonzero().flatten().tolist()
                res["examples"].append({"call": c, "delay_ns": delays[c], "wrong_rows": wrong_rows[:16],
                                        "wrong_values": int(bad.sum()), "nan": nan})
        else:
            res["ok"] += 1
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--budget-s", type=float, default=60, help="per shape")
    args = ap.parse_args()
    dev = torch.device("cuda")
    from taxes.provenance import collect

    res = {"benchmark": "benchmarks/data_signal_stress.py", "command": " ".join(sys.argv), **collect(),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(dev),
           "torch": torch.__version__, "triton": triton.__version__, "rows": []}
    res["reductions_over_copies"] = reductions_over_copies(dev)
    print(res["reductions_over_copies"], flush=True)
    for (G, D) in [(8, 64), (8, 128), (1, 64), (1, 128)]:
        t0 = time.time()
        r = stress(4, 8, G, D, args.calls, dev, args.budget_s)
        r["seconds"] = round(time.time() - t0, 1)
        res["rows"].append(r)
        print({k: v for k, v in r.items() if k != "examples"}, r["examples"][:2], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_signal_stress.json").write_text(json.dumps(res, indent=1))
    for r in res["rows"]:
        print(f"G={r['G']} D={r['D']:>3} rows={r['poll_rows']}: {r['ok']}/{r['calls']} right, {r['wrong']} wrong "
              f"({r['nan_calls']} with NaN), {r['timed_out']} timed out")


if __name__ == "__main__":
    main()
