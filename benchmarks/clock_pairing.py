"""Do the ranks' per-kernel clocks line up? Several processes on one host each place CUPTI's clock on the
host's shared clock (CLOCK_MONOTONIC) the way every recorder does when it starts
(taxes.traces.timeline.shared_clock_offset_ns), again and again for a few seconds, and report the offsets: a
constant offset, equal in every process, means CUPTI's timestamps are a host-wide clock and the pairing
adds only its bracket's width (about a microsecond). Also against CLOCK_REALTIME, for comparison.

    python3 benchmarks/clock_pairing.py --procs 2 --out clock_pairing.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time


def one(rank: int, seconds: float, q) -> None:
    import torch
    from cupti import cupti

    from taxes.traces.timeline import shared_clock_offset_ns

    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.zeros(1, device="cuda")  # a context, as in a rank
    out = {"rank": rank, "monotonic": [], "realtime": [], "bracket_ns": []}
    t_end = time.time() + seconds
    while time.time() < t_end:
        out["monotonic"].append(shared_clock_offset_ns(cupti.get_timestamp))
        m0 = time.monotonic_ns()
        r = time.time_ns() - cupti.get_timestamp()
        out["bracket_ns"].append(time.monotonic_ns() - m0)
        out["realtime"].append(r)
        time.sleep(0.05)
    q.put(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=one, args=(r, a.seconds, q)) for r in range(a.procs)]
    for p in ps:
        p.start()
    res = sorted((q.get() for _ in ps), key=lambda d: d["rank"])
    for p in ps:
        p.join()
    summary = []
    base = res[0]["monotonic"][0]  # offsets are ~1e18 ns: medians of the differences from one of them keep the ns
    for d in res:
        mono = [m - base for m in d["monotonic"]]
        summary.append({"rank": d["rank"], "readings": len(mono), "monotonic_offset_ns_median": statistics.median(mono),
                        "relative_to_ns": base,
                        "monotonic_offset_spread_ns": max(mono) - min(mono),
                        "realtime_offset_ns_median": statistics.median(d["realtime"]),
                        "realtime_offset_spread_ns": max(d["realtime"]) - min(d["realtime"])})
    between = max(s["monotonic_offset_ns_median"] for s in summary) - min(s["monotonic_offset_ns_median"] for s in summary)
    doc = {"processes": summary, "monotonic_offset_between_processes_ns": between}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(doc | {"raw": res}, f)
    for s in summary:
        print(f"rank {s['rank']}: CUPTI - monotonic {s['monotonic_offset_ns_median']:.0f} ns (spread "
              f"{s['monotonic_offset_spread_ns']} ns over {s['readings']}), realtime spread {s['realtime_offset_spread_ns']} ns")
    print(f"offset differs between processes by {between:.0f} ns")


if __name__ == "__main__":
    main()
