"""Known answers on a real job: a DDP training step (benchmarks/programs/ddp_llama.py) with one rank late by
X ms on the host or on the device, traced by `taxes trace` under torchrun, against the same job with nobody late.

Per case: is the late rank named the straggler, and is the waiting ranks' sync wait, minus the no-delay run's,
within 15% of their plain step's change (the truth: CUDA-event step times of the steps run without a record,
measured by the trace hook, independently of the attribution)? Also what the record cost: the profiled steps
over the plain ones, on-time steps against on-time steps and late against late (record_cost). Writes one JSON
(each case as it ends) and prints a table last.

With --period P (the default, 1) the late rank is late only in steps i with (i // P) odd, so late and on-time
steps interleave within one run (the hook's plain and profiled blocks each hold both): the truth is the
waiting ranks' plain step, late steps minus on-time ones, and the recovered value their sync wait, late
profiled steps minus on-time ones, both from the same run, free of the drift between runs of a host-bound
job. --period 0: late in every step, judged against the no-delay run (the first case).

    python benchmarks/ddp_known_answers.py --gpus 2 --cases 0,host:1,host:3,host:10,device:1,device:3,device:10 \
        --out reports/known_answer/ddp-h100-x2.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROGRAM = Path(__file__).resolve().parent / "programs" / "ddp_llama.py"
LIMIT = 0.15
# A device-bound step (about 0.5 B parameters, 8 K tokens per rank): the device, not the host, sets the step,
# as in a real training job. The program's small default (4 layers of 1024, 1 K tokens) is host-bound: each
# rank's own host jitter (ms) then decides who is last, a planted delay up to a few ms hides in the device's
# idle time (a 3 ms delay moved the others' step by 0.4 ms on 4 H200s), and the record's per-launch cost is
# a tenth of the step
PROGRAM_ARGS = "--layers 8 --hidden 2048 --batch 8 --tokens 1024"


def parse_case(text: str) -> tuple[str, float]:
    if text == "0":
        return "none", 0.0
    on, ms = text.split(":")
    return on, float(ms)


def trace_case(out: Path, gpus: int, on: str, ms: float, record: str, port: int, period: int, steps: int = 16,
               program_args: str = PROGRAM_ARGS) -> dict:
    case_dir = out.parent / f"{out.stem}-traces" / (f"{on}-{ms:g}ms" if ms else "none")
    cmd = [sys.executable, "-m", "taxes", "trace", "--out", str(case_dir), "--record", record, "--format", "json",
           "--steps", str(steps), "--plain", str(steps), "--skip", "4", "--timeout-s", "240", "--",
           "torchrun", "--nproc_per_node", str(gpus), "--master-port", str(port), str(PROGRAM),
           "--steps", str(2 * steps + 8),
           "--late-rank", str(gpus - 1), *program_args.split()]
    if ms:
        cmd += ["--late-ms", str(ms), "--late-on", on, "--late-period", str(period)]
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
    by_rank = {}
    for f in case_dir.glob("plain_rank*.json"):
        d = json.loads(f.read_text())
        by_rank[str(d["rank"])] = {"plain_steps": d["plain_steps"], "plain_step_us": d["plain_step_us"],
                                   "profiled_steps": d["profiled_steps"]}
    res["steps"] = by_rank
    res.update(analysis_of(doc.get("trace_analysis", {})))
    res.update(plain_step_us={r: statistics.median(v) for r, v in plain.items()},
               sync_wait_us={str(r): v for r, v in sync.items()},
               plain_e2e_us=var.get("plain_e2e_us"), attributed_e2e_us=var.get("attributed_e2e_us"),
               measurement_cost_us=var.get("measurement_cost_us"), warnings=doc["metadata"].get("warnings", []))
    if os.environ.get("DDP_DROP_TRACES"):  # only the verdicts wanted: no traces left behind
        for p_ in case_dir.glob("rank*.json*"):
            p_.unlink()
    return res


def analysis_of(trace_analysis: dict) -> dict:
    """What a case's verdict reads from its trace analysis: per rank and profiled step its sync wait and its
    span (the profiled step's own length), the straggler table, and the rank it names the straggler."""
    strag = trace_analysis.get("stragglers", [])
    return {"step_sync_wait_us": [{"rank": r["rank"], "step": r["step"], "sync_wait_us": r.get("sync_wait"),
                                   "span_us": r.get("span_us")} for r in trace_analysis.get("decomposition", [])],
            "stragglers": strag, "straggler": next((s["rank"] for s in strag if s.get("straggler")), None)}


def verdict(case: dict, base: dict, late_rank: int, period: int) -> dict:
    """A case's verdict: with nobody late, no straggler named; with period P, late steps against on-time ones
    of the same run; with period 0, against the no-delay run (base)."""
    if not case["late_ms"]:
        return {"named": case.get("straggler") is None, "ok": case.get("straggler") is None}
    if period:
        return judge_interleaved(case, late_rank, period)
    return judge(base, case, late_rank)


def late_step(step: int, period: int) -> bool:
    return (step // period) % 2 == 1


def judge_interleaved(case: dict, late_rank: int, period: int) -> dict:
    """Truth and recovered value from one run: late steps against on-time ones (module docstring)."""
    if "steps" not in case:
        return {"ok": False, "why": "no analysis"}
    truth, rec, seen = [], [], []
    truth_sets, rec_sets = [], []  # per waiting rank: (late, on-time) samples, for the intervals
    for r, st in case["steps"].items():
        if int(r) == late_rank:
            continue
        plain = list(zip(st["plain_steps"], st["plain_step_us"]))
        late_p = [us for s, us in plain if late_step(s, period)]
        on_p = [us for s, us in plain if not late_step(s, period)]
        mine = [w for w in case["step_sync_wait_us"] if str(w["rank"]) == r and w["step"] < len(st["profiled_steps"])
                and w["sync_wait_us"] is not None]
        prof = [(st["profiled_steps"][w["step"]], w["sync_wait_us"], w.get("span_us")) for w in mine]
        late_w = [w for s, w, _ in prof if late_step(s, period)]
        on_w = [w for s, w, _ in prof if not late_step(s, period)]
        if not (late_p and on_p and late_w and on_w):
            return {"ok": False, "why": f"rank {r}: too few late or on-time steps"}
        # medians: a host-bound job's step has outliers of several times its length (a 155 ms step among
        # 20 ms ones on 4 H100s), which a mean of a few steps would carry as the delay's effect
        truth.append(statistics.median(late_p) - statistics.median(on_p))
        rec.append(statistics.median(late_w) - statistics.median(on_w))
        truth_sets.append((late_p, on_p))
        rec_sets.append((late_w, on_w))
        spans_late = [sp for s, _, sp in prof if late_step(s, period) and sp is not None]
        spans_on = [sp for s, _, sp in prof if not late_step(s, period) and sp is not None]
        if spans_late and spans_on:
            seen.append(statistics.median(spans_late) - statistics.median(spans_on))
    t, x = statistics.mean(truth), statistics.mean(rec)
    named = case.get("straggler") == late_rank
    cost = record_cost(case, period)
    within = t > 0 and abs(x - t) <= LIMIT * t
    out = {"truth_us": t, "recovered_us": x, "error": (x / t - 1) if t else None, "named": named,
           "ok": bool(named and within), **cost, **decidability(t, truth_sets, rec_sets)}
    if len(seen) == len(truth):
        # the same change in the profiled steps themselves (their spans, not the rows): where it and the plain
        # one differ, recording moved the program, not the rule; rule_ok holds the rows to it
        s_ = statistics.mean(seen)
        out.update(profiled_truth_us=s_, recording_moved_us=s_ - t,
                   rule_ok=bool(s_ > 0 and abs(x - s_) <= LIMIT * s_))
    return out


def median_change_interval(sets: list[tuple[list, list]], confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The bootstrap interval (percentile, 2000 resamples) of the mean over ranks of median(late) - median(on
    time): each rank's late and on-time samples resampled apart, as the steps were drawn."""
    import numpy as np
    from scipy import stats

    data = [np.asarray(x, dtype=float) for late, on in sets for x in (late, on)]

    def change(*xs, axis=-1):
        return np.mean([np.median(xs[2 * i], axis=axis) - np.median(xs[2 * i + 1], axis=axis)
                        for i in range(len(xs) // 2)], axis=0)

    res = stats.bootstrap(data, change, vectorized=True, paired=False, n_resamples=2000, confidence_level=confidence,
                          method="percentile", random_state=seed)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def decidability(truth_us: float, truth_sets: list, rec_sets: list) -> dict:
    """Whether the run's steps can decide the verdict at all: the truth's 95% interval (its plain steps'
    own noise) against the band of +-LIMIT around it. Where the interval's half-width exceeds LIMIT x truth,
    no rule can be shown within LIMIT by this many steps; steps_needed scales the run's plain steps by the
    square of the ratio (an interval narrows as one over the square root of the steps)."""
    n = sum(len(a) + len(b) for a, b in truth_sets) // max(1, len(truth_sets))
    if any(len(x) < 2 for sets in (truth_sets, rec_sets) for pair in sets for x in pair):
        # a bootstrap needs two steps of each kind on every rank: with fewer, nothing is known of the noise
        return {"truth_ci_us": None, "recovered_ci_us": None, "decidable": False, "plain_steps": n,
                "plain_steps_needed": None}
    lo, hi = median_change_interval(truth_sets)
    rlo, rhi = median_change_interval(rec_sets)
    half, band = (hi - lo) / 2.0, LIMIT * abs(truth_us)
    return {"truth_ci_us": [lo, hi], "recovered_ci_us": [rlo, rhi], "decidable": bool(band > 0 and half <= band),
            "plain_steps": n, "plain_steps_needed": (int(math.ceil(n * (half / band) ** 2)) if band > 0 else None)}


def record_cost(case: dict, period: int) -> dict:
    """What the record costs a step, like for like: per rank, the profiled steps' median span less the plain
    steps' median, on-time steps against on-time steps and late against late, as a fraction of the plain
    median (over the ranks: the mean, and the largest). The run's own measurement cost compares all plain
    steps with all profiled ones, and its plain steps hold fewer late ones (the steps after each switch back to
    plain, all late here, are kept apart), so it grows with the delay: not the record's."""
    per = {"on_time": [], "late": []}
    for r, st in case.get("steps", {}).items():
        plain = list(zip(st["plain_steps"], st["plain_step_us"]))
        spans = [(st["profiled_steps"][w["step"]], w["span_us"]) for w in case.get("step_sync_wait_us", [])
                 if str(w["rank"]) == r and w["step"] < len(st["profiled_steps"]) and w.get("span_us")]
        for kind, is_late in (("on_time", False), ("late", True)):
            p = [us for s, us in plain if late_step(s, period) == is_late]
            q = [us for s, us in spans if late_step(s, period) == is_late]
            if p and q:
                per[kind].append(statistics.median(q) / statistics.median(p) - 1.0)
    out = {}
    for kind, v in per.items():
        if v:
            out[f"record_cost_{kind}"] = statistics.mean(v)
            out[f"record_cost_{kind}_max"] = max(v)
    return out


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
    ap.add_argument("--period", type=int, default=1, help="late only in steps i with (i // P) odd; 0: every step")
    ap.add_argument("--steps", type=int, default=32, help="profiled steps, and as many plain ones, per case (medians "
                    "of 8 late and 8 on-time steps moved by up to 1 ms on a 66 ms step)")
    ap.add_argument("--program-args", default=PROGRAM_ARGS, help="the DDP program's model size (its own flags)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"schema": "taxes.known_answer.ddp", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "gpus": args.gpus, "record": args.record, "period": args.period, "program": "benchmarks/programs/ddp_llama.py",
            "limit": LIMIT, "steps": args.steps,
            "program_args": args.program_args,
            "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")}}
    from taxes.provenance import collect

    meta.update(collect())  # the commit that ran (a copied tree: its stamp file)
    try:
        import torch

        meta.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception:  # noqa: BLE001 - metadata only
        pass
    results = []
    for i, text in enumerate(args.cases.split(",")):
        on, ms = parse_case(text)
        results.append(trace_case(out, args.gpus, on, ms, args.record, 29500 + i, args.period, args.steps,
                                   args.program_args))
        for r in results:
            r["verdict"] = verdict(r, results[0], args.gpus - 1, args.period)
        out.write_text(json.dumps({"metadata": meta, "cases": results}, indent=1))
    print(f"{'case':>12} {'exit':>4} {'plain r0':>9} {'plain rN':>9} {'sync r0':>8} {'straggler':>9} "
          f"{'cost':>6} {'truth':>7} {'recov':>7} ok   record cost like for like (on time, late; the largest rank)")
    for r in results:
        ps, sw, v = r.get("plain_step_us", {}), r.get("sync_wait_us", {}), r.get("verdict", {})
        cost = (r["measurement_cost_us"] / r["plain_e2e_us"]) if r.get("measurement_cost_us") and r.get("plain_e2e_us") else None
        last = str(args.gpus - 1)
        print(f"{r['late_on'] + ':' + format(r['late_ms'], 'g'):>12} {r['exit']:>4} {ps.get('0', float('nan')):9.0f} "
              f"{ps.get(last, float('nan')):9.0f} {sw.get('0', float('nan')):8.0f} {str(r.get('straggler')):>9} "
              f"{'' if cost is None else format(cost, '+.1%'):>6} {v.get('truth_us', float('nan')):7.0f} "
              f"{v.get('recovered_us', float('nan')):7.0f} {v.get('ok', '')} "
              f"{v.get('record_cost_on_time_max', float('nan')):+.1%} {v.get('record_cost_late_max', float('nan')):+.1%}")


if __name__ == "__main__":
    main()
