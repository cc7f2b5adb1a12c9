"""How long `taxes model ag-gemm --format table` takes from a cold interpreter to its last line: the
median of 5 runs, each a new process (after one run that warms the file cache), and which heavy
libraries the command loaded (none of pandas and matplotlib is needed to print a prediction).

    python benchmarks/startup.py [-o reports/startup/cpu.json] [--force]

Target: under 0.5 s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

COMMAND = ["model", "ag-gemm", "--format", "table"]
RUNS = 5
TARGET_S = 0.5
HEAVY = ("pandas", "matplotlib", "numpy", "scipy", "torch", "triton", "jinja2", "jsonschema")
# The command in-process, then the heavy modules it left loaded, as one JSON line on stderr.
PROBE = ("import json, sys\nfrom taxes.cli.main import cli\ntry:\n    cli.main({args!r})\nexcept SystemExit:\n    pass\n"
         "sys.stderr.write(json.dumps([m for m in {heavy!r} if m in sys.modules]) + '\\n')\n")


def time_once() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "taxes", *COMMAND], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def heavy_modules() -> list[str]:
    r = subprocess.run([sys.executable, "-c", PROBE.format(args=COMMAND, heavy=HEAVY)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return json.loads(r.stderr.strip().splitlines()[-1])


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=os.path.join("reports", "startup", "cpu.json"))
    parser.add_argument("--force", action="store_true", help="replace the output file when it exists")
    args = parser.parse_args(argv)
    if os.path.exists(args.output) and not args.force:
        parser.error(f"{args.output} exists; pass --force to replace it")
    time_once()  # warms the file cache: the runs below time the interpreter and the imports, not the disk
    runs = [time_once() for _ in range(RUNS)]
    median = statistics.median(runs)
    result = {
        "metadata": {"kind": "startup", "python": platform.python_version(), "platform": platform.platform(),
                     "machine": platform.machine(), "cpus": os.cpu_count(), "commit": commit(),
                     "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
        "command": "taxes " + " ".join(COMMAND),
        "runs_s": [round(t, 4) for t in runs],
        "median_s": round(median, 4),
        "target_s": TARGET_S,
        "within_target": median < TARGET_S,
        "heavy_modules_loaded": heavy_modules(),
    }
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"taxes {' '.join(COMMAND)}: median {median:.3f} s of {RUNS} runs (target {TARGET_S} s); "
          f"heavy modules loaded: {', '.join(result['heavy_modules_loaded']) or 'none'}; wrote {args.output}")
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
