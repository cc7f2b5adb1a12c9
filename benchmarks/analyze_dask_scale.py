"""`taxes analyze` on a local process pool against the same on a Dask cluster (and Holistic Trace Analysis).

Synthetic traces (benchmarks/analyze_scale.py's generator: steps of 500 eager ops, each a cpu op with its
launch call, kernel and ac2g flow pair, every 50th an NCCL all-reduce with its record_param_comms op) are
written for each configuration of ranks x events per rank, then analysed, each run in fresh processes:

    local pool   taxes analyze --format json --jobs W (W worker processes)
    Dask         a LocalCluster of W worker processes (one thread each), started for the run, and
                 taxes analyze --format json --scheduler ADDRESS: each rank read and attributed on a worker,
                 only the per-rank tables gathered
    HTA          TraceAnalysis loading the traces (its own process pool) and its temporal breakdown and
                 communication/computation overlap, when holistictraceanalysis imports

Wall time is the analysis command's; memory is sampled every 50 ms with psutil: the peak resident memory of
the command's own process (the caller that gathers), of each worker process (the pool's children, the
Dask workers, HTA's pool), and of their sum. The two taxes runs must give the same document (compared
without its date). The result is a JSON file.

    python benchmarks/analyze_dask_scale.py --out reports/analyze/dask-scale.json \\
        [--configs 8:500000 32:125000 128:31250] [--workers 2] [--skip-hta]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from analyze_scale import generate  # noqa: E402  (the same traces as the HTA comparison)

import taxes  # noqa: E402

CLUSTER = """
import sys, time
from distributed import LocalCluster
cluster = LocalCluster(n_workers=int(sys.argv[1]), threads_per_worker=1, processes=True, dashboard_address=None)
print(cluster.scheduler_address, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
cluster.close()
"""
TAXES_COMMAND = [sys.executable, "-c", "from taxes.cli.main import main; main()"]
# HTA's loading, temporal breakdown and communication overlap. HTA 0.5.0 types a column after the correlation
# ids (int16 when they are small) and pandas 3 refuses the wider values it then writes: widen first, as
# tests/test_analyze_hta.py does.
HTA_SCRIPT = """
import json, logging, sys, warnings
logging.disable(logging.WARNING)
warnings.filterwarnings("ignore")
import hta.common.trace as hta_trace
from hta.trace_analysis import TraceAnalysis
original = hta_trace.transform_correlation_to_index
def widened(df, symbol_table):
    if "correlation" in df.columns:
        df["correlation"] = df["correlation"].astype("int64")
    return original(df, symbol_table)
hta_trace.transform_correlation_to_index = widened
files = {i: p for i, p in enumerate(sys.argv[1:])}
t = TraceAnalysis(trace_files=files, trace_dir="")
tb = t.get_temporal_breakdown(visualize=False)
ov = t.get_comm_comp_overlap(visualize=False)
print(json.dumps({"ranks": len(tb), "idle_us": float(tb["idle_time(us)"].sum())}))
"""


class Sampler:
    """Peak RSS of a command's process, of each of its descendants and of other watched processes."""

    def __init__(self, extra: list[psutil.Process] = ()):
        self.extra = list(extra)
        self.peak_self = 0
        self.peak_each: dict = {}
        self.peak_sum = 0

    def sample(self, root: psutil.Process) -> None:
        procs = [root] + root.children(recursive=True) + [p for x in self.extra for p in [x] + x.children(recursive=True)]
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.Error:
                continue
            total += rss
            if p.pid == root.pid:
                self.peak_self = max(self.peak_self, rss)
            else:
                self.peak_each[p.pid] = max(self.peak_each.get(p.pid, 0), rss)
        self.peak_sum = max(self.peak_sum, total)


def measure(cmd: list[str], timeout_s: float, workers: list[psutil.Process] = ()) -> dict:
    s = Sampler(workers)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    note = ""
    while proc.poll() is None:
        try:
            s.sample(root)
        except psutil.Error:
            pass
        if time.perf_counter() - t0 > timeout_s:
            note = f"stopped after {timeout_s:.0f} s"
            for p in root.children(recursive=True) + [root]:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out, err = proc.communicate()
    ok = proc.returncode == 0 and not note
    per_worker = sorted((round(v / 2**20, 1) for v in s.peak_each.values() if v > 32 << 20), reverse=True)
    return {"ok": ok, "wall_s": round(wall, 2), "caller_peak_rss_mb": round(s.peak_self / 2**20, 1),
            "worker_peak_rss_mb": per_worker, "max_worker_peak_rss_mb": per_worker[0] if per_worker else None,
            "peak_total_rss_mb": round(s.peak_sum / 2**20, 1),
            "note": note or ("" if ok else err.strip()[-300:]), "stdout": out.strip()[-200:]}


def dask_run(paths: list[str], out: Path, workers: int, timeout_s: float) -> dict:
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER, str(workers)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = cluster.stdout.readline().strip()
        time.sleep(1.0)  # the workers register
        procs = psutil.Process(cluster.pid).children(recursive=True)
        cmd = TAXES_COMMAND + ["analyze", "--format", "json", "-o", str(out), "--force", "--scheduler", address, *paths]
        return measure(cmd, timeout_s, procs)
    finally:
        cluster.stdin.close()
        try:
            cluster.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cluster.kill()


def _document(path: Path) -> dict:
    doc = json.loads(path.read_text())
    for k in ("date", "git_commit", "git_dirty", "git_diff_sha256", "provenance"):  # when and from what, not what
        doc["metadata"].pop(k, None)
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", nargs="+", default=["8:500000", "32:125000", "128:31250"],
                    help="RANKS:EVENTS_PER_RANK")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--timeout-s", type=float, default=1800.0)
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--tools", default="local,dask,hta", help="which of local, dask, hta to run")
    ap.add_argument("--append", action="store_true", help="add the runs to --out's, replacing those of the same "
                                                         "ranks and tool")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    import importlib.metadata as md

    def version(d):
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            return None

    tools = set(args.tools.split(","))
    hta = "hta" in tools and not args.skip_hta and version("holistictraceanalysis") is not None
    result = {"benchmark": "analyze_dask_scale", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "taxes_version": taxes.__version__, "git_commit": _commit(), "note": args.note,
        "machine": {"cpus": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
                    "python": platform.python_version(), "platform": platform.platform()},
        "versions": {d: version(d) for d in ("pandas", "numpy", "dask", "distributed", "holistictraceanalysis")},
        "workers": args.workers, "runs": []}
    if args.append and Path(args.out).exists():
        before = json.loads(Path(args.out).read_text())
        mine = {(ranks, tool) for ranks, tool in ((int(c.split(":")[0]), t) for c in args.configs for t in
                                                  ("taxes analyze, local pool", "HTA",
                                                   "taxes analyze --scheduler (Dask LocalCluster)"))
                if {"HTA": "hta", "taxes analyze, local pool": "local"}.get(tool, "dask") in tools}
        before["runs"] = [r for r in before["runs"] if (r["ranks"], r["tool"]) not in mine]
        before.setdefault("appended", []).append({k: result[k] for k in ("date", "git_commit", "note")} | {
            "configs": args.configs, "tools": sorted(tools)})
        result = before
    for config in args.configs:
        ranks, events = (int(x) for x in config.split(":"))
        with tempfile.TemporaryDirectory(prefix="taxes-dask-scale-") as tmp:
            tmp = Path(tmp)
            t = time.perf_counter()
            paths, n = [], 0
            for r in range(ranks):
                p = tmp / f"rank{r}.json"
                n = generate(p, r, ranks, events)
                paths.append(str(p))
            gen = {"ranks": ranks, "events_per_rank": n, "bytes_per_rank": os.path.getsize(paths[0]),
                   "seconds": round(time.perf_counter() - t, 1)}
            print(f"generated {ranks} ranks x {n} events in {gen['seconds']} s", flush=True)
            local_out, dask_out = tmp / "local.json", tmp / "dask.json"
            if "local" in tools:
                local = measure(TAXES_COMMAND + ["analyze", "--format", "json", "-o", str(local_out), "--force", "--jobs",
                                         str(args.workers), *paths], args.timeout_s)
                print(json.dumps({"tool": "local pool", **local}), flush=True)
                result["runs"].append({**gen, "tool": "taxes analyze, local pool", **local})
            if "dask" in tools:
                dask = dask_run(paths, dask_out, args.workers, args.timeout_s)
                print(json.dumps({"tool": "Dask", **dask}), flush=True)
                same = "local" in tools and local["ok"] and dask["ok"] and _document(local_out) == _document(dask_out)
                result["runs"].append({**gen, "tool": "taxes analyze --scheduler (Dask LocalCluster)", **dask,
                                       "same_document_as_local": same})
            if hta:
                h = measure([sys.executable, "-c", HTA_SCRIPT, *paths], args.timeout_s)
                print(json.dumps({"tool": "HTA", **h}), flush=True)
                result["runs"].append({**gen, "tool": "HTA", **h})
        _write(args.out, result)
    _write(args.out, result)
    return 0


def _write(path, result):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def _commit():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or None
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
