"""Synthetic calibration readings shared by the `taxes calibrate` tests: a machine close to a 2 x H200
node (TRUTH), what each rank would read from it, and the profile assembled from those readings.
"""

from __future__ import annotations

import random

from taxes.model import calibrate as cal
from taxes.model.hardware import BUILTIN


H200 = BUILTIN["h200-sxm"]

# The machine the synthetic readings come from (close to a 2 x H200 node), in the profile's units.
TRUTH = dict(torch_bf16_tflops=780.0, torch_fp16_tflops=770.0, triton_bf16_tflops=700.0, hbm_gbps=4200.0,
             copy_gbps=354.0, store_gbps=313.0, load_gbps=291.0, nccl_base_us=20.0, nccl_gbps=300.0,
             triton_host_us=16.0, torch_host_us=23.0, nccl_host_us=30.0, prefilled_us=2.5, graph_us=1.2,
             relaxed_rtt_us=3.0, acquire_rtt_us=6.0, offset_ns=123_456.0, skew_us=8.0, combine_base_us=2.8,
             combine_per_set_us=0.35)


def _noisy(rng, x, n, rel=0.01):
    return [x * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def synthetic_ranks(rng: random.Random, world: int = 2, truth: dict = TRUTH, reps: int = 7) -> list[dict]:
    """Per-rank readings shaped like taxes.run.calibrate.measure()'s, generated from `truth` plus noise."""
    t = truth
    flops = 2 * 8192 ** 3
    ranks = []
    for r in range(world):
        figs = {
            "launch": {"launches": 200, "triton_host_us": _noisy(rng, t["triton_host_us"], reps),
                       "torch_host_us": _noisy(rng, t["torch_host_us"], reps),
                       "eager_device_us": _noisy(rng, t["triton_host_us"], reps),
                       "prefilled_device_us": _noisy(rng, t["prefilled_us"], reps), "prefilled_ahead": [True] * reps,
                       "graph_device_us": _noisy(rng, t["graph_us"], reps), "graph_ahead": [True] * reps},
            "hbm": {"bytes_moved": 2 << 30, "us": _noisy(rng, (2 << 30) / (t["hbm_gbps"] * 1e3), reps)},
            "matmul": {"n": 8192, "flops": flops,
                       "torch_bf16_us": _noisy(rng, flops / (t["torch_bf16_tflops"] * 1e6), reps),
                       "torch_fp16_us": _noisy(rng, flops / (t["torch_fp16_tflops"] * 1e6), reps)},
            "triton_gemm": {"n": 8192, "flops": flops, "rel_error": 2e-3, "tolerance": 1e-2,
                            "us": _noisy(rng, flops / (t["triton_bf16_tflops"] * 1e6), reps)},
            "combine": {"rows": 64, "sets": [4, 64], "checked": True,
                        "us": [_noisy(rng, t["combine_base_us"] + n * t["combine_per_set_us"], reps, 0.001) for n in (4, 64)]},
        }
        if world > 1:
            sizes = [4096 << i for i in range(17)]
            us = [[(t["nccl_base_us"] + (world - 1) * s / (t["nccl_gbps"] * 1e3)) * (1 + rng.uniform(-0.02, 0.02))
                   for _ in range(reps)] for s in sizes]
            figs["nccl"] = {"world": world, "sizes": sizes, "calls": [10] * len(sizes), "us": us,
                            "host_ahead": [[True] * reps for _ in sizes], "host_us": [[30.0] * reps for _ in sizes],
                            "small_host_us": _noisy(rng, t["nccl_host_us"], reps)}
            nb = 256 << 20
            figs["peer"] = {"pairs": [{"src": r, "dst": (r + 1) % world, "bytes": nb,
                                       "copy_us": _noisy(rng, nb / (t["copy_gbps"] * 1e3), reps), "copy_checked": True,
                                       "store_us": _noisy(rng, nb / (t["store_gbps"] * 1e3), reps), "store_checked": True,
                                       "load_us": _noisy(rng, nb / (t["load_gbps"] * 1e3), reps), "load_checked": True}]}
            figs["pingpong"] = {"rounds": 1000, "pairs": []}
            figs["skew"] = {}
        ranks.append({"rank": r, "world": world, "quick": False,
                      "device": {"name": "NVIDIA H200", "sm_count": 132, "memory_bytes": 141 << 30, "capability": "9.0"},
                      "figures": figs, "errors": {}})
    if world > 1:
        for peer in range(1, world):
            offset = t["offset_ns"] * peer
            t0 = [1e9 + 1e5 * i for i in range(200)]
            fwd = [t["relaxed_rtt_us"] * 500 * (1 + rng.uniform(0, 0.5)) for _ in t0]
            back = [t["relaxed_rtt_us"] * 500 * (1 + rng.uniform(0, 0.5)) for _ in t0]
            ranks[0]["figures"]["pingpong"]["pairs"].append({
                "peer": peer, "relaxed_rtt_us": _noisy(rng, t["relaxed_rtt_us"], 5),
                "acquire_rtt_us": _noisy(rng, t["acquire_rtt_us"], 5),
                "t0": t0, "t1": [a + f + offset for a, f in zip(t0, fwd)], "t2": [a + f + b for a, f, b in zip(t0, fwd, back)]})
        reps_skew = 30
        starts = [[2e9 + 1e6 * k + rng.uniform(0, t["skew_us"] * 1e3) for k in range(reps_skew)] for _ in range(world)]
        for k in range(reps_skew):  # the spread of every reading is exactly skew_us: one rank first, one last
            starts[0][k] = 2e9 + 1e6 * k
            starts[-1][k] = 2e9 + 1e6 * k + t["skew_us"] * 1e3
        ranks[0]["figures"]["skew"] = {
            "stamps_ns": [[s + t["offset_ns"] * r for s in starts[r]] for r in range(world)],
            "collective_spread_us": _noisy(rng, t["skew_us"] * 1.5, reps_skew)}
    return ranks


META = {"date": "2026-11-23T10:00:00+00:00", "tool_version": "0.1.0", "git_commit": "0123456789abcdef0123",
        "gpu_names": ["NVIDIA H200", "NVIDIA H200"], "quick": False}


def assemble(ranks, base=H200, peaks="measured", **kw):
    return cal.assemble_profile(ranks, base, META, name="h200-test", peaks=peaks, **kw)
