"""How far apart do the ranks leave the barrier an iteration starts from? Every rank, REPS times for each
barrier (taken in turns, so both see the same machine): synchronise its device, pass the barrier, stamp the
host's CLOCK_MONOTONIC (one clock for every process of the host) and the device's %globaltimer in a kernel
launched right after. The skew of a rep is the latest rank's stamp minus the earliest's.

    python3 benchmarks/start_skew.py --gpus 2 --reps 300 --out start_skew.json

Barriers: "dist" (torch.cuda.synchronize, then dist.barrier(): what taxes profile's iterations started from
before the start gate) and "gate" (RankContext.start_barrier: the ranks' StartGate).
"""

from __future__ import annotations

import argparse
import json
import time


def job(ctx, reps: int) -> dict:
    import torch
    import torch.distributed as dist

    from taxes.kernels.probes import stamp

    def dist_barrier():
        torch.cuda.synchronize()
        dist.barrier()

    modes = {"dist": dist_barrier, "gate": ctx.start_barrier}
    dev = torch.zeros(2 * reps, dtype=torch.int64, device=ctx.device)
    stamp(dev, 0)  # compiled before any timed barrier
    host = {m: [] for m in modes}
    for k in range(reps):
        for j, (m, barrier) in enumerate(modes.items()):
            barrier()
            host[m].append(time.monotonic_ns())
            stamp(dev, 2 * k + j)
    torch.cuda.synchronize()
    d = dev.view(reps, 2).tolist()
    return {"host_ns": host, "device_ns": {m: [row[j] for row in d] for j, m in enumerate(modes)},
            "gate": ctx._gate is not None, "barrier": ctx.start_barrier_kind()}


def spread(per_rank: list[list[int]]) -> list[float]:
    return [(max(col) - min(col)) / 1e3 for col in zip(*per_rank)]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from taxes.kernels.runtime import launch

    res = launch(job, a.gpus, a.reps, backend="cuda", timeout_s=300)
    out = {"world": a.gpus, "reps": a.reps, "gate_shared": all(r["gate"] for r in res), "barrier": res[0]["barrier"],
           "skew_us": {}}
    print(f"iterations start from {out['barrier']}")
    for m in ("dist", "gate"):
        h = spread([r["host_ns"][m] for r in res])
        dv = spread([r["device_ns"][m] for r in res])
        out["skew_us"][m] = {"host": h, "device": dv}
        print(f"{m:5s} host skew us p50 {pct(h, .5):7.1f} p90 {pct(h, .9):7.1f} max {max(h):8.1f} | "
              f"device (globaltimer) p50 {pct(dv, .5):7.1f} p90 {pct(dv, .9):7.1f}")
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
