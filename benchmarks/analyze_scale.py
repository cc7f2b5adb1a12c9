"""Scale of `taxes analyze` against Holistic Trace Analysis (HTA) on the same synthetic traces.

Traces of 2, 8 and 32 ranks of about 1M events each are generated on the fly in a temporary directory
(each rank: steps of 500 eager ops, each a cpu op with its launch call, kernel and ac2g flow pair; every
50th op an NCCL all-reduce with its record_param_comms op). Each tool runs in its own subprocess on the
same files: `taxes analyze --format json` (ranks parsed in parallel processes, one per core), and HTA's
TraceAnalysis loading the traces (its own process pool) and computing its temporal breakdown and
communication/computation overlap, the quantities analyze's rows also hold. Wall time is the
subprocess's; peak memory is the largest sum of resident memory over the subprocess's whole process
tree (sampled every 50 ms with psutil), and the largest single process's (getrusage of the children).
A run whose process tree passes --memory-cap-gb is stopped and reported as such.

    python benchmarks/analyze_scale.py --out reports/analyze/scale.json [--worlds 2 8 32] [--events 1000000]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

import taxes

T0 = 4_475_692_692_210.465
OPS_PER_STEP = 500
EVENTS_PER_OP = 5


def generate(path: Path, rank: int, world: int, n_events: int) -> int:
    """One rank's trace of about n_events events (plain JSON); returns the number written."""
    rnd = random.Random(rank)
    n = 0
    with open(path, "w") as out:
        out.write(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                              "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
                              "baseTimeNanoseconds": 1790857026000000000})[:-1] + ', "traceEvents": [\n')
        t = 0.0
        dev = 0.0
        corr = 1
        step = 0
        seq = 0
        first = True
        while n < n_events:
            buf = []
            t_step = t
            for k in range(OPS_PER_STEP):
                comm = k % 50 == 49
                name = "c10d::allreduce_" if comm else "aten::mm"
                kern = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)" if comm else \
                    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
                op_t = t
                t += 1.5
                buf.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": T0 + op_t, "dur": 6.0,
                            "args": {"External id": corr, "Record function id": 0,
                                     "Input Dims": [[256, 128], [128, 256]], "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
                if comm:
                    buf.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
                                "ts": T0 + op_t + 0.5, "dur": 5.0,
                                "args": {"External id": corr, "Collective name": "allreduce", "Process Group Name": "0",
                                         "Seq": seq, "Group size": world}})
                    seq += 1
                buf.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": T0 + t, "dur": 3.0, "args": {"cbid": 211, "correlation": corr, "External id": corr}})
                s = max(dev, t + 5) + rnd.random()
                d = 12.0 if comm else 4.25
                buf.append({"ph": "X", "cat": "kernel", "name": kern, "pid": 0, "tid": 7, "ts": T0 + s, "dur": d,
                            "args": {"External id": corr, "device": 0, "stream": 7, "correlation": corr,
                                     "grid": [1, 1, 1], "block": [128, 1, 1]}})
                buf.append({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": T0 + t, "cat": "ac2g", "name": "ac2g"})
                buf.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": T0 + s, "cat": "ac2g", "name": "ac2g", "bp": "e"})
                dev = s + d
                t += 5.0
                corr += 1
            buf.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                        "ts": T0 + t_step, "dur": t - t_step})
            step += 1
            text = ",\n".join(json.dumps(e) for e in buf)
            out.write(("" if first else ",\n") + text)
            first = False
            n += len(buf)
        out.write("\n], \"traceName\": \"synthetic\"}\n")
    return n


HTA_SCRIPT = """
import json, logging, sys, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
from hta.trace_analysis import TraceAnalysis
files = {i: p for i, p in enumerate(sys.argv[1:])}
t = TraceAnalysis(trace_files=files, trace_dir="")
tb = t.get_temporal_breakdown(visualize=False)
ov = t.get_comm_comp_overlap(visualize=False)
print(json.dumps({"ranks": len(tb), "idle_us": float(tb["idle_time(us)"].sum())}))
"""

WRAPPER = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)
sys.exit(rc)
"""


def measure(cmd: list[str], timeout_s: float, cap_bytes: float) -> dict:
    """Run cmd in a fresh process; wall time, peak tree RSS (psutil samples), largest process RSS."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    stopped = None
    while proc.poll() is None:
        try:
            tree = [root] + root.children(recursive=True)
            rss = sum(p.memory_info().rss for p in tree if p.is_running())
        except psutil.Error:
            rss = 0
        peak = max(peak, rss)
        if rss > cap_bytes and stopped is None:
            stopped = f"stopped: its processes held more than {cap_bytes / 2**30:.0f} GiB"
            _kill(root)
        if time.perf_counter() - t0 > timeout_s and stopped is None:
            stopped = f"stopped after {timeout_s:.0f} s"
            _kill(root)
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    maxrss = next((int(ln.split()[1]) for ln in err.splitlines() if ln.startswith("MAXRSS_KB")), 0)
    ok = proc.returncode == 0 and stopped is None
    return {"ok": ok, "wall_s": round(wall, 2), "peak_tree_rss_mb": round(peak / 2**20, 1),
            "largest_process_rss_mb": round(maxrss / 1024, 1), "note": stopped or ("" if ok else err.strip()[-300:])}


def _kill(root):
    for p in root.children(recursive=True) + [root]:
        try:
            p.kill()
        except psutil.Error:
            pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--timeout-s", type=float, default=3600.0)
    ap.add_argument("--memory-cap-gb", type=float, default=18.0)
    ap.add_argument("--skip-hta", action="store_true")
    args = ap.parse_args(argv)
    import importlib.metadata as md

    result = {"benchmark": "analyze_scale", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "taxes_version": taxes.__version__, "git_commit": _commit(), "machine": {
                  "cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
                  "python": platform.python_version(), "platform": platform.platform()},
              "versions": {d: _version(md, d) for d in ("pandas", "numpy", "holistictraceanalysis")},
              "events_per_rank": args.events, "runs": []}
    with tempfile.TemporaryDirectory(prefix="taxes-scale-") as tmp:
        tmp = Path(tmp)
        world_max = max(args.worlds)
        paths = []
        t = time.perf_counter()
        for r in range(world_max):
            p = tmp / f"rank{r}.json"
            n = generate(p, r, world_max, args.events)
            paths.append(str(p))
        result["generated"] = {"ranks": world_max, "events_per_rank": n, "bytes_per_rank": os.path.getsize(paths[0]),
                               "seconds": round(time.perf_counter() - t, 1),
                               "note": f"the runs at fewer ranks read the first ranks of one {world_max}-rank job"}
        print(f"generated {world_max} ranks x {n} events in {result['generated']['seconds']} s", flush=True)
        for world in sorted(args.worlds):
            use = paths[:world]
            out = tmp / f"analyze_{world}.json"
            cmd = [sys.executable, "-c", "from taxes.cli.main import main; main()", "analyze", "--format", "json",
                   "-o", str(out), "--force", *use]
            run = {"ranks": world, "tool": "taxes analyze", **measure(cmd, args.timeout_s, args.memory_cap_gb * 2**30)}
            result["runs"].append(run)
            print(json.dumps(run), flush=True)
            if not args.skip_hta:
                hta = {"ranks": world, "tool": "HTA", **measure([sys.executable, "-c", HTA_SCRIPT, *use], args.timeout_s,
                                                              args.memory_cap_gb * 2**30)}
                result["runs"].append(hta)
                print(json.dumps(hta), flush=True)
            _write(args.out, result)
    result["summary"] = _summary(result["runs"])
    _write(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    return 0


def _summary(runs: list[dict]) -> list[dict]:
    out = []
    for world in sorted({r["ranks"] for r in runs}):
        ours = next((r for r in runs if r["ranks"] == world and r["tool"] == "taxes analyze"), None)
        hta = next((r for r in runs if r["ranks"] == world and r["tool"] == "HTA"), None)
        row = {"ranks": world}
        if ours and hta and ours["ok"] and hta["ok"]:
            row["speedup"] = round(hta["wall_s"] / ours["wall_s"], 2)
            row["peak_tree_memory_ratio"] = round(ours["peak_tree_rss_mb"] / hta["peak_tree_rss_mb"], 2)
        elif ours and hta:
            row["note"] = "HTA did not finish: " + hta["note"] if not hta["ok"] else "taxes analyze failed: " + ours["note"]
        out.append(row)
    return out


def _write(path, result):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def _version(md, dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
