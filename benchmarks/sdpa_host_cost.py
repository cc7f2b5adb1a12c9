"""What a per-kernel clock adds to the host time of PyTorch's attention call (the eager bsp-sdpa step whose
host time comes before its first kernel), clock state by clock state.

    python benchmarks/sdpa_host_cost.py --out DIR

States, in blocks of calls interleaved over rounds (the order mirrored every round): no clock; CUPTI kernel
records only (never any API record in this process until then); kernel records after a warm-up with API
records switched off again (what `taxes profile`'s cupti clock did in every round, before its launch
calls were recorded once, after the rounds). Per call: the host time of the attention call (device
synchronised before it) and the event time of the call. The states that enable API records run last: whether anything of them stays is the
question, so the first states never saw them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from taxes.kernels import flash_decode as fd


def block(fn, n):
    host, dev = [], []
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        a.record()
        fn()
        host.append((time.perf_counter() - t) * 1e6)
        b.record()
        b.synchronize()
        dev.append(a.elapsed_time(b) * 1e3)
    return host, dev


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--n", type=int, default=20)
    args = ap.parse_args()
    from taxes.run.cupti import Recorder
    from taxes.provenance import collect

    B, Hq, Hkv, D, S = 1, 64, 8, 128, 131072
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(B, Hq, D, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(B, Hkv, S, D, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(B, Hkv, S, D, generator=g, device="cuda").to(torch.bfloat16)
    fn = lambda: fd.sdpa_lse(q, k, v, "flash")
    for _ in range(10):
        fn()
    res = {"benchmark": "benchmarks/sdpa_host_cost.py", **collect(), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "shape": dict(B=B, Hq=Hq, Hkv=Hkv, D=D, S=S), "backend": "flash"}
    data: dict = {}

    def run(state, phase):
        if state == "none":
            h, d = block(fn, args.n)
        else:
            rec = Recorder("queued" if state == "kernels" else "warmup").start()
            if state == "kernels after api":
                block(fn, 3)  # warm-up with API records
                rec.api_off()
                block(fn, 1)
            elif state == "kernels":
                block(fn, 1)
            h, d = block(fn, args.n)
            rec.stop()
        data.setdefault(phase, {}).setdefault(state, {"host": [], "dev": []})
        data[phase][state]["host"] += h
        data[phase][state]["dev"] += d

    for r in range(args.rounds):  # phase 1: no API record has ever been enabled
        order = ["none", "kernels"]
        for s in (order if r % 2 == 0 else order[::-1]):
            run(s, "before any API record")
    for r in range(args.rounds):  # phase 2: API records on in warm-ups, then off
        order = ["none", "kernels", "kernels after api"]
        for s in (order if r % 2 == 0 else order[::-1]):
            run(s, "after API records")
    summary = {ph: {s: {"host_us_median": statistics.median(x["host"]), "e2e_us_median": statistics.median(x["dev"]),
                        "n": len(x["host"])} for s, x in st.items()} for ph, st in data.items()}
    res["summary"] = summary
    res["samples"] = data
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "sdpa_host_cost.json").write_text(json.dumps(res))
    for ph, st in summary.items():
        for s, x in st.items():
            print(f"{ph:24s} {s:18s} host {x['host_us_median']:7.1f} us   e2e {x['e2e_us_median']:7.1f} us  n={x['n']}")
    sys.exit(0)


if __name__ == "__main__":
    main()
