"""Timing for a benchmark on one GPU: calls replayed from a CUDA graph over rotated input sets, and the
read bandwidth of HBM that a bytes-over-bandwidth floor divides by.

- `time_graph(fn, n_sets, replays)`: one CUDA graph holds calls over every input set in turn (the sets
  together beyond L2, so no call is served from it), each replay is timed with events, and the median of
  the time per call is the figure; `time_host` is its stand-in off a GPU (wall time, no meaning);
- `read_bandwidth(dev)`: a full read of a 1 GiB buffer, by torch's sum and by a streaming Triton read
  (`read_kernel`, launched by `read_all`), timed by `time_graph`; the larger rate is the floor's.

Imported by the benchmark scripts beside it (python puts a script's folder first on the import path).
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import triton
import triton.language as tl


def time_graph(fn, n_sets: int, replays: int, warm: int = 2, min_graph_us: float = 2000.0) -> dict:
    """fn(i) runs one call on input set i. One CUDA graph holds calls over every set in turn, repeated
    until the graph lasts about min_graph_us; each replay is timed with events; returns the median (and
    spread) of the time per call."""
    for i in range(n_sets):
        fn(i)
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for i in range(n_sets):
        fn(i)
    t1.record()
    t1.synchronize()
    est_us = max(t0.elapsed_time(t1) * 1e3 / n_sets, 1.0)
    reps = max(1, math.ceil(min_graph_us / (est_us * n_sets)))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            for i in range(n_sets):
                fn(i)
    for _ in range(warm):
        g.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)]
    for a, b in events:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    calls = reps * n_sets
    per_call = sorted(a.elapsed_time(b) * 1e3 / calls for a, b in events)
    del g
    return {"us": statistics.median(per_call), "min_us": per_call[0], "max_us": per_call[-1], "replays": replays,
            "calls_per_replay": calls}


def time_host(fn, n_sets: int, replays: int, **_) -> dict:
    """Off a GPU (smoke runs): wall time, which means nothing but exercises the path."""
    t = []
    for r in range(replays):
        s = time.perf_counter()
        fn(r % n_sets)
        t.append((time.perf_counter() - s) * 1e6)
    return {"us": statistics.median(t), "min_us": min(t), "max_us": max(t), "replays": replays, "calls_per_replay": 1}


@triton.jit
def read_kernel(x_ptr, out_ptr, n, n_iters, BLOCK: tl.constexpr):
    """Each program sums every num_programs-th block of x: a plain streaming read."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(n_iters):
        offs = (i * tl.num_programs(0) + pid).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_all(x, part, per_sm=8, block=4096):
    """One read_kernel launch over every element of x (partial sums in part, sms * per_sm of them)."""
    grid = part.numel() // 8 * per_sm
    read_kernel[(grid,)](x, part, x.numel(), triton.cdiv(x.numel(), grid * block), BLOCK=block, num_warps=8)


def read_bandwidth(dev) -> dict:
    """Bytes per second a full read of a 1 GiB buffer reaches: torch's sum, and a streaming Triton read
    (read_kernel); the larger is the floor's bandwidth."""
    n = (1 << 30) // 4
    x = torch.ones(n, dtype=torch.float32, device=dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    res = {}
    part = torch.empty(sms * 8, dtype=torch.float32, device=dev)
    ways = {"torch.sum": lambda i: x.sum()}
    for per_sm in (4, 8):
        ways[f"triton read, {per_sm} programs per SM"] = lambda i, p=per_sm: read_all(x, part, p)
    for name, fn in ways.items():
        r = time_graph(fn, 1, 10, warm=2, min_graph_us=3000)
        res[name] = {"us": r["us"], "gb_per_s": n * 4 / (r["us"] * 1e-6) / 1e9}
    ok = abs(part.sum().item() - n) < 1  # the last Triton read (8 per SM) summed every element (x is ones)
    del x
    torch.cuda.empty_cache()
    best = max(res.values(), key=lambda r: r["gb_per_s"])["gb_per_s"]
    return {"bytes": n * 4, "ways": res, "read_gb_per_s": best, "triton_read_checked": ok}
