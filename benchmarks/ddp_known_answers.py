"""Known answers on a real job: a DDP training step (benchmarks/programs/ddp_llama.py) with one rank late by
X ms on the host or on the device, traced by `taxes trace` under torchrun, against the same job with nobody late.

Per case: is the late rank named the straggler, and is the waiting ranks' sync wait, minus the no-delay run's,
within 15% of their plain step's change (the truth: CUDA-event step times of the steps run without a record,
measured by the trace hook, independently of the attribution)? Also what the record cost (profiled step over
plain step). Writes one JSON (each case as it ends) and prints a table last.

    python benchmarks/ddp_known_answers.py --gpus 2 --cases 0,host:3,device:3 --out reports/known_answer/ddp-h100-x2.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "ddp_llama.py"
LIMIT = 0.15


def parse_case(text: str) -> tuple[str, float]:
    if text == "0":
        return "none", 0.0
    on, ms = text.split(":")
    return on, float(ms)


def trace_case(out: Path, gpus: int, on: str, ms: float, record: str, port: int) -> dict:
    case_dir = out.parent / f"{out.stem}-traces" / (f"{on}-{ms:g}ms" if ms else "none")
    cmd = [sys.executable, "-m", "taxes", "trace", "--out", str(case_dir), "--record", record, "--format", "json",
           "--steps", "6", "--plain", "6", "--skip", "4", "--timeout-s", "240", "--",
           "torchrun", "--nproc_per_node", str(gpus), "--master-port", str(port), str(PROGRAM), "--steps", "24",
           "--late-rank", str(gpus - 1)]
    if ms:
        cmd += ["--late-ms", str(ms), "--late-on", on]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    res = {"late_on": on, "late_ms": ms, "record": record, "exit": p.returncode, "wall_s": round(time.time() - t0, 1),
           "stderr_tail": p.stderr[-1500:], "program_lines": [ln for ln in p.stdout.splitlines() if ln.startswith("rank ")]}
    report = case_dir / "report.json"
    if not report.exists():
        return res
    doc = json.loads(report.read_text())
    plain = json.loads((case_dir / "plain.json").read_text())
    var = doc["cases"][0]["variants"][0]
    sync = {c["rank"]: c["value_us"] for c in var["components"] if c["name"] == "sync_wait" and c["rank"] is not None}
    strag = doc.get("trace_analysis", {}).get("stragglers", [])
    res.update(plain_step_us={r: statistics.median(v) for r, v in plain.items()},
               sync_wait_us={str(r): v for r, v in sync.items()},
               plain_e2e_us=var.get("plain_e2e_us"), attributed_e2e_us=var.get("attributed_e2e_us"),
               measurement_cost_us=var.get("measurement_cost_us"),
               stragglers=strag, straggler=next((s["rank"] for s in strag if s.get("straggler")), None),
               warnings=doc["metadata"].get("warnings", []))
    for p_ in case_dir.glob("rank*.json.gz"):  # keep the traces small enough to commit: only the first case's
        if ms:
            p_.unlink()
    return res


def judge(base: dict, case: dict, late_rank: int) -> dict:
    waiting = [r for r in case.get("plain_step_us", {}) if int(r) != late_rank]
    if not waiting or "sync_wait_us" not in base:
        return {"ok": False, "why": "no analysis"}
    truth = statistics.mean(case["plain_step_us"][r] - base["plain_step_us"][r] for r in waiting)
    rec = statistics.mean(case["sync_wait_us"].get(r, 0.0) - base["sync_wait_us"].get(r, 0.0) for r in waiting)
    named = case.get("straggler") == late_rank
    within = truth > 0 and abs(rec - truth) <= LIMIT * truth
    return {"truth_us": truth, "recovered_us": rec, "error": (rec / truth - 1) if truth else None,
            "named": named, "ok": bool(named and within)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--cases", default="0,host:3,device:3")
    ap.add_argument("--record", default="timing")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"schema": "taxes.known_answer.ddp", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "gpus": args.gpus, "record": args.record, "program": "benchmarks/programs/ddp_llama.py",
            "limit": LIMIT, "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
    try:
        import torch

        meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception:  # noqa: BLE001 - metadata only
        pass
    results = []
    for i, text in enumerate(args.cases.split(",")):
        on, ms = parse_case(text)
        results.append(trace_case(out, args.gpus, on, ms, args.record, 29500 + i))
        base = results[0]
        for r in results[1:]:
            r["verdict"] = judge(base, r, args.gpus - 1)
        out.write_text(json.dumps({"metadata": meta, "cases": results}, indent=1))
    print(f"{'case':>12} {'exit':>4} {'plain r0':>9} {'plain rN':>9} {'sync r0':>8} {'straggler':>9} "
          f"{'cost':>6} {'truth':>7} {'recov':>7} ok")
    for r in results:
        ps, sw, v = r.get("plain_step_us", {}), r.get("sync_wait_us", {}), r.get("verdict", {})
        cost = (r["measurement_cost_us"] / r["plain_e2e_us"]) if r.get("measurement_cost_us") and r.get("plain_e2e_us") else None
        last = str(args.gpus - 1)
        print(f"{r['late_on'] + ':' + format(r['late_ms'], 'g'):>12} {r['exit']:>4} {ps.get('0', float('nan')):9.0f} "
              f"{ps.get(last, float('nan')):9.0f} {sw.get('0', float('nan')):8.0f} {str(r.get('straggler')):>9} "
              f"{'' if cost is None else format(cost, '+.1%'):>6} {v.get('truth_us', float('nan')):7.0f} "
              f"{v.get('recovered_us', float('nan')):7.0f} {v.get('ok', '')}")


if __name__ == "__main__":
    main()
