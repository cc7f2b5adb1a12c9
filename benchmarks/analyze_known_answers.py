"""Known answers for `taxes trace` / `taxes analyze` on one GPU: programs nobody here wrote (a transformers Llama
with random weights, an elementwise chain under torch.compile), recorded by `benchmarks/gpu_run.sh traces`,
each paired with a twin that removes one tax; the twin's measured E2E says how large the tax is, and the
analysis of the program's own trace must find it.

    case             tax          expected (measured, no profiler)              recovered (the analysis' rows)
    llama graph twin launch       plain E2E(forward) - plain E2E(graph)         launch + host_bound + sync of forward
                                                                                minus those + graph_gaps of graph
    llama host spin  host_bound   plain E2E(steps with the spin)                host_bound(steps with the spin)
                                  - plain E2E(steps without), one run           - host_bound(steps without)
    chain fused twin locality     plain E2E(eager) - plain E2E(compiled)        locality(eager) - locality(compiled)

Plain E2E: the interquartile mean of the steps timed without the profiler (CUDA events at step ends);
rows: the analysis' interquartile-mean rows over the profiled steps. The spin runs in every other step of
one run (llama.py --spin-every 2), so the steps with and without it share the process, its hooks and the
machine's state; program step i is plain step i - skip - 1 and profiled step i - skip - plain - 1 (the hook's
schedule, taxes.trace_hook). Each case passes within 15%.

    python benchmarks/analyze_known_answers.py TRACES_DIR --hardware reports/calibration/h100-x1-calibrated.json \\
        -o reports/known_answer/analyze-h100.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from taxes import analyze as A
from taxes.io import write_output
from taxes.provenance import collect

TOLERANCE = 0.15
HOST_ROWS = ("launch", "host_bound", "sync")


def rows_of(run_dir: Path, hardware: str) -> dict:
    """The analysis of one recorded program: its overall rows, plain E2E and record mode."""
    traces = sorted(str(p) for p in run_dir.glob("rank*.json.gz") if not p.name.endswith(".et.json.gz"))
    plain = A.read_plain(run_dir / "plain.json")
    an = A.analyze(traces, hardware, plain_steps=plain)
    doc = A.analysis_document(an)
    v = doc["cases"][0]["variants"][0]
    rows = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None}
    log = run_dir.with_suffix(".log")
    return {"rows": rows, "plain_us": v["plain_e2e_us"], "instrumented_us": v["attributed_e2e_us"],
            "measurement_cost_us": v["measurement_cost_us"], "steps": int(len(an.decomposition)),
            "plain_steps": len(next(iter(plain.values()))), "program_says": _program_line(log)}


def spin_pair(run_dir: Path, hardware: str, skip: int, plain: int, every: int = 2) -> tuple[float, float, dict]:
    """(expected, recovered, details) for a run that spun in program steps i % every == every - 1."""
    traces = sorted(str(p) for p in run_dir.glob("rank*.json.gz") if not p.name.endswith(".et.json.gz"))
    plain_us = A.read_plain(run_dir / "plain.json")
    an = A.analyze(traces, hardware, plain_steps=plain_us)
    spun = lambda i: i % every == every - 1  # noqa: E731
    p = list(next(iter(plain_us.values())))
    p_on = [x for k, x in enumerate(p) if spun(skip + k + 1)]
    p_off = [x for k, x in enumerate(p) if not spun(skip + k + 1)]
    d = an.decomposition
    d = d[d["flag"].fillna("") == ""] if "flag" in d else d
    on = d[[spun(skip + plain + 1 + int(s)) for s in d["step"]]]
    off = d[[not spun(skip + plain + 1 + int(s)) for s in d["step"]]]
    expected = _iqm(p_on) - _iqm(p_off)
    recovered = _iqm(on["host_bound"]) - _iqm(off["host_bound"])
    return expected, recovered, {
        "plain_steps_with": len(p_on), "plain_steps_without": len(p_off), "profiled_steps_with": len(on),
        "profiled_steps_without": len(off), "plain_with_us": _iqm(p_on), "plain_without_us": _iqm(p_off),
        "host_bound_with_us": _iqm(on["host_bound"]), "host_bound_without_us": _iqm(off["host_bound"]),
        "span_with_us": _iqm(on["span_us"]), "span_without_us": _iqm(off["span_us"]),
        "program_says": _program_line(run_dir.with_suffix(".log"))}


def _iqm(values) -> float:
    """The interquartile mean (docs/method.md): sorted, a quarter dropped at each end, the rest averaged."""
    x = sorted(float(v) for v in values)
    k = len(x) // 4
    rest = x[k:len(x) - k]
    return sum(rest) / len(rest)


def _program_line(log: Path) -> str | None:
    if not log.exists():
        return None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if re.match(r"^(llama|chain) ", ln)]
    return lines[-1] if lines else None


def case(name: str, tax: str, expected: float, recovered: float, runs: dict, how: str) -> dict:
    err = (recovered - expected) / expected if expected else float("nan")
    return {"case": name, "tax": tax, "expected_us": round(expected, 2), "recovered_us": round(recovered, 2),
            "error": round(err, 4), "tolerance": TOLERANCE, "ok": abs(err) <= TOLERANCE, "how": how,
            "runs": runs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="the directory benchmarks/gpu_run.sh traces wrote (one folder per run)")
    ap.add_argument("--hardware", required=True, help="hardware profile of the GPU the traces ran on")
    ap.add_argument("--skip", type=int, default=5, help="the traces' --skip (gpu_run.sh: 5)")
    ap.add_argument("--plain", type=int, default=20, help="the traces' --plain (gpu_run.sh: 20)")
    ap.add_argument("-o", "--output", default="-")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    need = ("llama-forward", "llama-graph", "llama-spin-alternate", "chain-eager", "chain-compiled")
    missing = [n for n in need if not (args.traces / n).is_dir()]
    if missing:
        print(f"analyze_known_answers: {args.traces}: no run {', '.join(missing)}", file=sys.stderr)
        return 2
    r = {n: rows_of(args.traces / n, args.hardware) for n in need if n != "llama-spin-alternate"}
    spin_expected, spin_recovered, spin_runs = spin_pair(args.traces / "llama-spin-alternate", args.hardware,
                                                         args.skip, args.plain)

    def host(n, extra=()):
        return sum(r[n]["rows"].get(k, 0.0) for k in HOST_ROWS + tuple(extra))

    out = [
        case("llama forward, eager against its CUDA-graph twin", "launch",
             r["llama-forward"]["plain_us"] - r["llama-graph"]["plain_us"],
             host("llama-forward") - host("llama-graph", ("graph_gaps",)),
             {k: r[k] for k in ("llama-forward", "llama-graph")},
             "expected: plain E2E(eager) - plain E2E(graph); recovered: launch + host_bound + sync of the eager "
             "trace minus launch + host_bound + sync + graph_gaps of the graph trace"),
        case("llama forward with a host spin before every decoder layer, in every other step", "host_bound",
             spin_expected, spin_recovered, {"llama-spin-alternate": spin_runs},
             "one run: expected: plain E2E of the steps with the spin - of those without; recovered: host_bound of "
             "the profiled steps with the spin - of those without"),
        case("elementwise chain, eager against torch.compile (one fused kernel)", "locality",
             r["chain-eager"]["plain_us"] - r["chain-compiled"]["plain_us"],
             r["chain-eager"]["rows"].get("locality", 0.0) - r["chain-compiled"]["rows"].get("locality", 0.0),
             {k: r[k] for k in ("chain-eager", "chain-compiled")},
             "expected: plain E2E(eager) - plain E2E(compiled); recovered: locality(eager) - locality(compiled)"),
    ]
    meta = collect()
    doc = {"metadata": {"kind": "known-answer-analyze", "hardware_profile": args.hardware,
                        "statistic": "interquartile mean over steps", **meta}, "cases": out}
    write_output(args.output, json.dumps(doc, indent=1) + "\n", args.force)
    for c in out:
        print(f"{c['tax']:<11} expected {c['expected_us']:>9.1f} us  recovered {c['recovered_us']:>9.1f} us  "
              f"{100 * c['error']:+6.1f}%  {'ok' if c['ok'] else 'MISSED'}", file=sys.stderr)
    return 0 if all(c["ok"] for c in out) else 1


if __name__ == "__main__":
    sys.exit(main())
