"""Known answers for `taxes trace` / `taxes analyze` on one GPU: programs nobody here wrote (a transformers Llama
with random weights, an elementwise chain under torch.compile), recorded by `benchmarks/gpu_run.sh traces`,
each paired with a twin that removes one tax; the twin's measured E2E says how large the tax is, and the
analysis of the program's own trace must find it.

    case             tax          expected (measured, no profiler)              recovered (the analysis' rows)
    llama graph twin launch       plain E2E(eager steps)                        launch + host_bound + sync of the eager
                                  - plain E2E(graph steps), one run             steps minus those + graph_gaps of the
                                                                                graph steps
    llama host spin  host_bound   plain E2E(steps with the spin)                host_bound(steps with the spin)
                                  - plain E2E(steps without), one run; beside   - host_bound(steps without)
                                  it the spins' own time (8 layers x the
                                  median spin, as the program timed them)
    chain fused twin locality     plain E2E(eager) - plain E2E(compiled)        locality(eager) - locality(compiled)

Plain E2E: the interquartile mean of the steps timed without the profiler (CUDA events at step ends);
rows: the analysis' interquartile-mean rows over the profiled steps. The twins run in alternate steps of one
run (llama.py --mode alternate: eager in even steps, the graph in odd ones; --spin-every 2: the spin in odd
steps), so both kinds share the process and the machine's state (separate runs of the same eager forward
differ by more than the tolerance); which program step each plain and each profiled step was comes from the
hook's plain_rank0.json (taxes.run.trace_hook's schedule). Each case passes within 15%.

The plain steps with the spin were longer than those without by more than the spin itself in some runs
(1.16-1.34x on an H100 when all plain steps ran before the profiled ones), an after-effect on the host that
the profiled steps then showed less of; with plain and profiled steps in alternating blocks (the timing
record's schedule) both kinds see the same host. The document carries the spins' own time and the error
against it too.

    python benchmarks/analyze_known_answers.py TRACES_DIR --hardware reports/calibration/h100-x1-calibrated.json \\
        -o reports/known_answer/analyze-h100.json

--set device-bound: the same Llama made device-bound (2048 tokens, hidden 4096: the GPU computes for most of
each step while the host has long queued the launches; `benchmarks/gpu_run.sh devicebound`), where the timing
record's launches (each kernel's queued and submitted times) are furthest from the host's calls:

    case              tax          expected                                     recovered
    graph twin        launch       as above                                     as above
    hidden spin       host_bound   plain E2E(steps with a spin before every     launch + host_bound + sync + queued
                                   layer) - plain E2E(steps without): about 0,  (with) - the same (without): the idle
                                   the device still busy with earlier layers    rows a host stall could land in
    exposed spin      host_bound   the same with the device synchronised        host_bound (with) - host_bound
                                   before each spin: the spin stalls the GPU    (without)

Each passes within 15% of its expected tax or 1% of the step's plain E2E, whichever is larger (a tax of about
0 has no relative error).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from taxes.attribution import analyze as A
from taxes.documents import analysis_document as D
from taxes.attribution.attribute import iqm as _iqm  # the interquartile mean of docs/method.md
from taxes.files import write_output
from taxes.provenance import collect

TOLERANCE = 0.15
ABS_TOLERANCE_SHARE = 0.01  # device-bound set: of the step's plain E2E, for taxes of about 0
DEVICE_BOUND_RUNS = ("llama-big-alternate", "llama-big-spin", "llama-big-sync-spin")
HOST_ROWS = ("launch", "host_bound", "sync")


def rows_of(run_dir: Path, hardware: str) -> dict:
    """The analysis of one recorded program: its overall rows, plain E2E and record mode."""
    traces = sorted(str(p) for p in run_dir.glob("rank*.json.gz") if not p.name.endswith(".et.json.gz"))
    plain = A.read_plain(run_dir / "plain.json")
    an = A.analyze(traces, hardware, plain_steps=plain)
    doc = D.analysis_document(an)
    v = doc["cases"][0]["variants"][0]
    rows = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None}
    log = run_dir.with_suffix(".log")
    return {"rows": rows, "plain_us": v["plain_e2e_us"], "instrumented_us": v["attributed_e2e_us"],
            "measurement_cost_us": v["measurement_cost_us"], "steps": int(len(an.decomposition)),
            "plain_steps": len(next(iter(plain.values()))), "program_says": _program_line(log)}


def paired(run_dir: Path, hardware: str, skip: int, plain: int, on) -> dict:
    """One run whose program steps i alternate (on(i) or not): the plain step times and the analysis' per-step
    rows of each kind (flagged steps left out)."""
    traces = sorted(str(p) for p in run_dir.glob("rank*.json.gz") if not p.name.endswith(".et.json.gz"))
    plain_us = A.read_plain(run_dir / "plain.json")
    an = A.analyze(traces, hardware, plain_steps=plain_us)
    p = list(next(iter(plain_us.values())))
    plain_steps, profiled_steps = program_steps(run_dir, len(p), skip, plain)
    d = an.decomposition
    d = d[d["flag"].fillna("") == ""] if "flag" in d else d
    is_on = [bool(on(profiled_steps[int(s)])) for s in d["step"]]
    w = an.what_if
    graphs = w[(w["change"] == "graphs") & w["step"].isin(d["step"][is_on])]
    return {"plain_on": [x for k, x in zip(plain_steps, p) if on(k)],
            "plain_off": [x for k, x in zip(plain_steps, p) if not on(k)],
            "rows_on": d[is_on], "rows_off": d[[not x for x in is_on]],
            "plain_by_step": dict(zip(plain_steps, p)),
            "rows_by_step": d.assign(program_step=[profiled_steps[int(s)] for s in d["step"]]).set_index("program_step"),
            "graphs_projected_on": list(graphs["projected_us"]),
            "program_says": _program_line(run_dir.with_suffix(".log"))}


def paired_difference(by_step: dict, on) -> float:
    """The interquartile mean, over the steps k with on(k), of x[k] less the mean of its neighbours k - 1 and
    k + 1 that are of the other kind and of the same phase (both plain, or both profiled): the host of the
    H100 machine changed speed by up to 2x every second or two, which a difference of two separate means
    carries and a difference of neighbours does not."""
    d = []
    for k, x in by_step.items():
        if on(k):
            nb = [by_step[j] for j in (k - 1, k + 1) if j in by_step and not on(j)]
            if nb:
                d.append(x - sum(nb) / len(nb))
    return _iqm(d)


def program_steps(run_dir: Path, n_plain: int, skip: int, plain: int) -> tuple[list, list]:
    """The program step of each plain and each profiled step: from the hook's plain_rank0.json, or, for a
    run recorded before it said, the plain steps first (skip + 1, ...), then the profiled ones."""
    try:
        d = json.loads((run_dir / "plain_rank0.json").read_text())
        if "plain_steps" in d and "profiled_steps" in d:
            return [int(k) for k in d["plain_steps"]], [int(k) for k in d["profiled_steps"]]
    except (OSError, ValueError):
        pass
    return [skip + 1 + k for k in range(n_plain)], [skip + plain + 1 + k for k in range(10_000)]


def spins_per_step_us(line: str | None) -> float | None:
    """The spins' own time per step from the program's last line ("spins 200.2 us x 8 per step")."""
    m = re.search(r"spins ([0-9.]+) us x ([0-9]+) per step", line or "")
    return float(m.group(1)) * int(m.group(2)) if m else None


def _summary(pr: dict, rows: tuple) -> dict:
    on, off = pr["rows_on"], pr["rows_off"]
    return {"plain_steps": [len(pr["plain_on"]), len(pr["plain_off"])],
            "profiled_steps": [len(on), len(off)],
            "plain_us": [_iqm(pr["plain_on"]), _iqm(pr["plain_off"])],
            "profiled_span_us": [_iqm(on["span_us"]), _iqm(off["span_us"])],
            "rows_us": {r: [_iqm(on[r]), _iqm(off[r])] for r in rows},
            "program_says": pr["program_says"]}


def recorded_at(run_dir: Path) -> str | None:
    """The commit that recorded a run (the report `taxes trace` wrote beside its traces)."""
    try:
        return json.loads((run_dir / "report.json").read_text())["metadata"].get("git_commit")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _program_line(log: Path) -> str | None:
    if not log.exists():
        return None
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if re.match(r"^(llama|chain) ", ln)]
    return lines[-1] if lines else None


def case(name: str, tax: str, expected: float, recovered: float, runs: dict, how: str,
         planted_us: float | None = None, unpaired: tuple | None = None, slack_us: float = 0.0) -> dict:
    """A known answer: ok when recovered is within TOLERANCE of expected, or within slack_us (us) of it."""
    err = (recovered - expected) / expected if expected else float("nan")
    ok = abs(recovered - expected) <= max(TOLERANCE * abs(expected), slack_us)
    out = {"case": name, "tax": tax, "expected_us": round(expected, 2), "recovered_us": round(recovered, 2),
           "error": round(err, 4), "tolerance": TOLERANCE, "ok": ok, "how": how, "runs": runs}
    if slack_us:
        out["slack_us"] = round(slack_us, 2)
    if planted_us:
        out["planted_us"] = round(planted_us, 2)
        out["error_against_planted"] = round((recovered - planted_us) / planted_us, 4)
    if unpaired:  # the same from the two kinds' separate interquartile means
        e, r = unpaired
        out["unpaired"] = {"expected_us": round(e, 2), "recovered_us": round(r, 2), "error": round((r - e) / e, 4)}
    return out


def summed(pr: dict, rows: tuple, graph_gaps_off=None) -> dict:
    """Per program step of a paired run: the sum of `rows` (plus graph_gaps in the steps k where
    graph_gaps_off(k) is false: the graph steps of a graph twin)."""
    return {k: float(r[list(rows)].sum()) + (float(r["graph_gaps"]) if graph_gaps_off and not graph_gaps_off(k)
                                             else 0.0) for k, r in pr["rows_by_step"].iterrows()}


IDLE_HOST = HOST_ROWS + ("queued",)  # every idle row a host stall could be put in


def device_bound(args) -> int:
    """The known answers of the device-bound Llama runs (module docstring, --set device-bound)."""
    missing = [n for n in DEVICE_BOUND_RUNS if not (args.traces / n).is_dir()]
    if missing:
        print(f"analyze_known_answers: {args.traces}: no run {', '.join(missing)}", file=sys.stderr)
        return 2
    launch = paired(args.traces / "llama-big-alternate", args.hardware, args.skip, args.plain, lambda i: i % 2 == 0)
    hidden = paired(args.traces / "llama-big-spin", args.hardware, args.skip, args.plain, lambda i: i % 2 == 1)
    exposed = paired(args.traces / "llama-big-sync-spin", args.hardware, args.skip, args.plain, lambda i: i % 2 == 1)
    eager_on = lambda i: i % 2 == 0  # noqa: E731
    spin_on = lambda i: i % 2 == 1  # noqa: E731

    def slack(pr):
        return ABS_TOLERANCE_SHARE * _iqm(pr["plain_off"] + pr["plain_on"])

    def info(pr, rows):  # the rows of each kind of step, and the device's share of it (compute over the span)
        return _summary(pr, rows) | {"device_busy_share": [round(_iqm(x["compute"]) / _iqm(x["span_us"]), 3)
                                                           for x in (pr["rows_on"], pr["rows_off"])]}

    def diagnosis(c, pr, on, less_compute=False):
        """Beside the verdict (plain E2E, as in the host-bound set): the same tax taken from the profiled steps'
        spans, which the rows add up to (less the kernels' busy-time difference where the twin runs other
        kernels), and what measuring cost each kind of step; the verdict does not use them."""
        span = paired_difference({k: float(r["span_us"]) for k, r in pr["rows_by_step"].iterrows()}, on)
        dc = paired_difference({k: float(r["compute"]) for k, r in pr["rows_by_step"].iterrows()}, on)
        e = span - (dc if less_compute else 0.0)
        c["from_profiled_steps"] = {"expected_us": round(e, 2), "error": round((c["recovered_us"] - e) / e, 4) if e else None,
                                    "compute_difference_us": round(dc, 2),
                                    "measurement_cost_us": [round(_iqm(x["span_us"]) - _iqm(p), 2) for x, p in
                                                            ((pr["rows_on"], pr["plain_on"]),
                                                             (pr["rows_off"], pr["plain_off"]))]}
        return c

    out = [
        diagnosis(case("device-bound llama prefill, eager steps against CUDA-graph steps of the same model in one run",
                       "launch",
             paired_difference(launch["plain_by_step"], eager_on),
             paired_difference(summed(launch, HOST_ROWS, graph_gaps_off=eager_on), eager_on),
             {"llama-big-alternate": info(launch, IDLE_HOST + ("graph_gaps", "compute"))},
             "paired as in the host-bound set; expected: plain E2E; recovered: launch + host_bound + sync of the "
             "eager step - launch + host_bound + sync + graph_gaps of the graph steps (lists: [eager, graph])",
             slack_us=slack(launch)), launch, eager_on, less_compute=True),
        diagnosis(case("device-bound llama prefill with a host spin before every decoder layer in every other step, hidden "
             "behind the device", "host_bound",
             paired_difference(hidden["plain_by_step"], spin_on), paired_difference(summed(hidden, IDLE_HOST), spin_on),
             {"llama-big-spin": info(hidden, IDLE_HOST + ("compute",))},
             "paired; expected: plain E2E (about 0: the spins overlap the device's work); recovered: launch + "
             "host_bound + sync + queued (lists: [with, without]); planted: the spins' own time per step, which "
             "should not show",
             planted_us=spins_per_step_us(hidden["program_says"]), slack_us=slack(hidden)), hidden, spin_on),
        diagnosis(case("device-bound llama prefill, the device synchronised and then a host spin before every decoder layer "
             "in every other step", "host_bound",
             paired_difference(exposed["plain_by_step"], spin_on),
             paired_difference(summed(exposed, ("host_bound",)), spin_on),
             {"llama-big-sync-spin": info(exposed, IDLE_HOST + ("compute",))},
             "paired; expected: plain E2E; recovered: host_bound (lists: [with, without]); planted: the spins' own "
             "time per step",
             planted_us=spins_per_step_us(exposed["program_says"]), slack_us=slack(exposed)), exposed, spin_on),
    ]
    recorded = sorted({c for n in DEVICE_BOUND_RUNS if (c := recorded_at(args.traces / n))})
    doc = {"metadata": {"kind": "known-answer-analyze", "set": "device-bound", "hardware_profile": args.hardware,
                        "statistic": "interquartile mean of each step less its neighbours of the other kind",
                        "traces_recorded_by": recorded, **collect()},
           "cases": out}
    write_output(args.output, json.dumps(doc, indent=1) + "\n", args.force)
    for c in out:
        print(f"{c['tax']:<11} expected {c['expected_us']:>9.1f} us  recovered {c['recovered_us']:>9.1f} us"
              f"  (within {max(TOLERANCE * abs(c['expected_us']), c['slack_us']):.1f} us)  "
              f"{'ok' if c['ok'] else 'MISSED'}" + (f"  planted {c['planted_us']:.1f} us" if "planted_us" in c else "")
              + f"  (from the profiled steps: expected {c['from_profiled_steps']['expected_us']:.1f} us)", file=sys.stderr)
    return 0 if all(c["ok"] for c in out) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", type=Path, help="the directory benchmarks/gpu_run.sh traces wrote (one folder per run)")
    ap.add_argument("--hardware", required=True, help="hardware profile of the GPU the traces ran on")
    ap.add_argument("--skip", type=int, default=5, help="the traces' --skip (gpu_run.sh: 5)")
    ap.add_argument("--plain", type=int, default=80, help="the Llama traces' --plain (gpu_run.sh: 80)")
    ap.add_argument("-o", "--output", default="-")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--set", choices=("host-bound", "device-bound"), default="host-bound",
                    help="which programs' known answers (module docstring)")
    args = ap.parse_args()
    if args.set == "device-bound":
        return device_bound(args)
    need = ("llama-alternate", "llama-spin-alternate", "chain-eager", "chain-compiled")
    missing = [n for n in need if not (args.traces / n).is_dir()]
    if missing:
        print(f"analyze_known_answers: {args.traces}: no run {', '.join(missing)}", file=sys.stderr)
        return 2
    r = {n: rows_of(args.traces / n, args.hardware) for n in ("chain-eager", "chain-compiled")}
    launch = paired(args.traces / "llama-alternate", args.hardware, args.skip, args.plain, lambda i: i % 2 == 0)
    spin = paired(args.traces / "llama-spin-alternate", args.hardware, args.skip, args.plain, lambda i: i % 2 == 1)
    host_eager = launch["rows_on"][list(HOST_ROWS)].sum(axis=1)
    host_graph = launch["rows_off"][list(HOST_ROWS) + ["graph_gaps"]].sum(axis=1)

    eager_on = lambda i: i % 2 == 0  # noqa: E731
    spin_on = lambda i: i % 2 == 1  # noqa: E731
    host_by_step = summed(launch, HOST_ROWS, graph_gaps_off=eager_on)
    spin_by_step = summed(spin, ("host_bound",))
    out = [
        case("llama forward, eager steps against CUDA-graph steps of the same model in one run", "launch",
             paired_difference(launch["plain_by_step"], eager_on), paired_difference(host_by_step, eager_on),
             {"llama-alternate": _summary(launch, HOST_ROWS + ("graph_gaps", "compute"))},
             "paired: each eager step against its neighbouring graph steps of the same phase; expected: plain E2E; "
             "recovered: launch + host_bound + sync of the eager step - launch + host_bound + sync + graph_gaps of "
             "the graph steps (lists: [eager, graph], unpaired means)",
             unpaired=(_iqm(launch["plain_on"]) - _iqm(launch["plain_off"]), _iqm(host_eager) - _iqm(host_graph))),
        case("llama forward with a host spin before every decoder layer, in every other step", "host_bound",
             paired_difference(spin["plain_by_step"], spin_on), paired_difference(spin_by_step, spin_on),
             {"llama-spin-alternate": _summary(spin, HOST_ROWS + ("compute",))},
             "paired: each step with the spin against its neighbouring steps without, of the same phase; expected: "
             "plain E2E; recovered: host_bound (lists: [with, without], unpaired means); planted: the spins' own "
             "time per step, as the program timed them",
             planted_us=spins_per_step_us(spin["program_says"]),
             unpaired=(_iqm(spin["plain_on"]) - _iqm(spin["plain_off"]),
                       _iqm(spin["rows_on"]["host_bound"]) - _iqm(spin["rows_off"]["host_bound"]))),
        case("elementwise chain, eager against torch.compile (one fused kernel)", "locality",
             r["chain-eager"]["plain_us"] - r["chain-compiled"]["plain_us"],
             r["chain-eager"]["rows"].get("locality", 0.0) - r["chain-compiled"]["rows"].get("locality", 0.0),
             {k: r[k] for k in ("chain-eager", "chain-compiled")},
             "expected: plain E2E(eager) - plain E2E(compiled); recovered: locality(eager) - locality(compiled)"),
    ]
    # the what-if `graphs` of the eager steps against the graph steps of the same run (reported, not a known
    # answer: the projection is labelled predicted)
    projected = _iqm(launch["graphs_projected_on"])
    twin = _iqm(launch["rows_off"]["span_us"])
    graphs_check = {"case": "what-if graphs of the eager Llama steps against its graph steps", "projected_us": projected,
                    "graph_steps_profiled_us": twin, "graph_steps_plain_us": _iqm(launch["plain_off"]),
                    "error_against_profiled": round((projected - twin) / twin, 4)}
    cost = []  # what each record mode cost on the same eager forward: profiled against plain steps
    for run, record in (("llama-forward", "timing"), ("llama-forward-full", "full")):
        if (args.traces / run).is_dir():
            x = rows_of(args.traces / run, args.hardware)
            cost.append({"run": run, "record": record, "plain_us": x["plain_us"], "instrumented_us": x["instrumented_us"],
                         "cost_pct": round(100 * x["measurement_cost_us"] / x["plain_us"], 1)})
    for name, pr, labels in (("llama-alternate", launch, ("eager", "graph")),
                             ("llama-spin-alternate", spin, ("with spin", "without"))):
        for part, plain_steps, rows in ((labels[0], pr["plain_on"], pr["rows_on"]), (labels[1], pr["plain_off"], pr["rows_off"])):
            p, q = _iqm(plain_steps), _iqm(rows["span_us"])
            cost.append({"run": f"{name} ({part} steps)", "record": "timing", "plain_us": p, "instrumented_us": q,
                         "cost_pct": round(100 * (q - p) / p, 1)})
    meta = collect()
    recorded = sorted({c for n in need if (c := recorded_at(args.traces / n))})
    doc = {"metadata": {"kind": "known-answer-analyze", "hardware_profile": args.hardware,
                        "statistic": "alternating runs: interquartile mean of each step less its neighbours of the other kind; others: interquartile mean over steps", "traces_recorded_by": recorded, **meta},
           "cases": out,
           "what_if_check": graphs_check,
           "measurement_cost": cost}
    write_output(args.output, json.dumps(doc, indent=1) + "\n", args.force)
    for c in out:
        print(f"{c['tax']:<11} expected {c['expected_us']:>9.1f} us  recovered {c['recovered_us']:>9.1f} us"
              f"  {100 * c['error']:+6.1f}%  {'ok' if c['ok'] else 'MISSED'}"
              + (f"  (planted {c['planted_us']:.1f} us: {100 * c['error_against_planted']:+.1f}%)"
                 if "planted_us" in c else "")
              + (f"  (unpaired means: {100 * c['unpaired']['error']:+.1f}%)" if "unpaired" in c else ""),
              file=sys.stderr)
    print(f"what-if graphs of the eager steps {projected:.1f} us against the graph steps {twin:.1f} us (profiled), "
          f"{100 * graphs_check['error_against_profiled']:+.1f}%", file=sys.stderr)
    for c in cost:
        print(f"measuring ({c['record']}) {c['run']}: plain {c['plain_us']:.1f} us, profiled {c['instrumented_us']:.1f} us,"
              f" {c['cost_pct']:+.1f}%", file=sys.stderr)
    return 0 if all(c["ok"] for c in out) else 1


if __name__ == "__main__":
    sys.exit(main())
