"""An elementwise chain, eager (two kernels: y = 2x written to HBM and read back) or through torch.compile
(Inductor fuses it into one kernel), run step by step for `taxes trace`: the eager program pays one HBM
round trip of y that the compiled one does not.

    python benchmarks/programs/chain.py --mode eager
    python benchmarks/programs/chain.py --mode compiled
"""

from __future__ import annotations

import argparse

import torch

import taxes


def f(x):
    y = x * 2.0
    return y + 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("eager", "compiled"), default="eager")
    ap.add_argument("--elements", type=int, default=128 << 20)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(args.elements, device=dev)
    fn = torch.compile(f) if args.mode == "compiled" else f
    for _ in range(args.steps):
        fn(x)
        taxes.step()
    if dev == "cuda":
        torch.cuda.synchronize()
    print(f"chain {args.mode}: {args.elements} float32 elements, y = {args.elements * 4 / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
