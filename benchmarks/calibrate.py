"""Calibrate this machine's hardware profile from a bare checkout (what `taxes calibrate` does), in one call.

    python benchmarks/calibrate.py --out $OUT            # all visible GPUs, full calibration (2-3 minutes)
    python benchmarks/calibrate.py --out $OUT --quick    # under a minute

Writes OUT/NAME.json (the profile: `taxes model --hardware OUT/NAME.json`, or copy it into
~/.config/taxes/profiles/) and OUT/NAME_raw.json (every reading, the NCCL curve, what was kept and why).
A figure that fails is one line on stdout; the others are still measured and written. The short table
is printed last. Installs nothing; run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import _checkout  # noqa: E402,F401  (this checkout as `taxes`, installed or not)

from taxes import calibrate as cal  # noqa: E402
from taxes.errors import TaxesError  # noqa: E402
from taxes.hardware import get_profile  # noqa: E402
from taxes.results import write_atomic  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all visible)")
    ap.add_argument("--base", default="", help="base profile (default: by GPU name)")
    ap.add_argument("--name", default="", help="profile name (default: BASE-calibrated)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peaks", choices=("measured", "datasheet"), default="measured")
    ap.add_argument("--timeout-s", type=float, default=0.0, help="default: 300, --quick 150")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        count = cal.cuda_gpu_count()
        if count < 1:
            raise TaxesError(cal.NO_GPU)
        world = args.gpus or count
        names = cal.cuda_gpu_names(min(world, count))
        base = get_profile(args.base) if args.base else cal.base_for_gpu(names[0])
        name = cal.check_profile_name(args.name or f"{base.name}-calibrated")
        profile, raw = cal.run_calibration(world, base, args.quick, name, args.peaks,
                                           args.timeout_s or (150.0 if args.quick else 300.0))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = cal.save_profile(profile, out / f"{name}.json")
        write_atomic(out / f"{name}_raw.json", json.dumps(raw, indent=1, allow_nan=False) + "\n")
    except TaxesError as e:
        print(f"calibrate: error: {e}")
        return 1
    print(f"wrote {path} and {out / (name + '_raw.json')} ({time.time() - t0:.0f} s)")
    for line in cal.failure_lines(raw):
        print(f"FAILED {line}")
    seconds = {k: v for r in raw.get("readings", [])[:1] for k, v in r.get("seconds", {}).items()}
    if seconds:
        print("seconds per figure (rank 0): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    print_table(profile, base)
    return 0


def print_table(profile, base) -> None:
    rows = cal.summary_rows(profile, base)
    w = [max(len(r[i]) for r in rows + [("figure", base.name, "calibrated", "")]) for i in range(3)]
    print(f"{profile.name}: {profile.source}")
    print(f"{'figure':<{w[0]}}  {base.name:>{w[1]}}  {'calibrated':>{w[2]}}  how")
    for f, b, c, how in rows:
        print(f"{f:<{w[0]}}  {b:>{w[1]}}  {c:>{w[2]}}  {how}")


if __name__ == "__main__":
    sys.exit(main())
