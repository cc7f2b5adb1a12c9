"""A profile's result document: every rank's records -> attribution, ladder and prediction per variant.

Per variant (beside what every document holds, taxes.documents.results):
    plain_e2e_us         the interquartile mean of the plain iterations' E2E (no instrumentation)
    attributed_e2e_us    the same statistic of the instrumented iterations: what the rows add up to
    measurement_cost_us  attributed - plain, its own row, never spread into a tax; over 3% of plain E2E
                         marks the variant `perturbed`
    components           the rows (taxes.attribution.rows.ROWS) per rank and overall (rank null: per iteration
                         the slowest rank's rows), averaged over the interquartile iterations
    records              every rank's raw records of the chosen clock (taxes.traces.records.raw_to_columns), so
                         `taxes report --hardware` can assemble and attribute them again
    attribution          {available, clock, clocks: {name: measurement cost}, rules, commit, unattributed_share,
                         kept_iterations, locality_bytes, gaps: {cause: us}, ...}
One statistic everywhere: the interquartile mean (the mean of the iterations ranked between the 25th and
75th percentile), robust like a median and additive, so rows add up to the E2E printed above them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from taxes.attribution import attribute as att
from taxes.model.floor import floor_of, kernel_floor_us
from taxes.model.hardware import HardwareProfile
from taxes.traces.records import assemble_ranks, phase_order, raw_from_columns, raw_to_columns
from taxes.method import PERTURBED, STATISTIC
from taxes.documents.results import TIMED_PLAIN
from taxes.traces.timeline import Timeline
from taxes.variants import get, lookup
from taxes.workloads import make_workload

RULES = "one-timeline rules 4 (taxes.attribution.attribute)"


def per_iteration_e2e(samples_us: list[list[float]]) -> list[float]:
    """E2E per iteration: the slowest rank's time."""
    return [max(vals) for vals in zip(*samples_us)] if samples_us else []


def build_document(results: list[dict], job, hw: HardwareProfile, emulated: bool) -> dict:
    """Rank 0: one result document from every rank's records."""
    from taxes.documents.results import new_document
    from taxes.provenance import collect_metadata

    clocks = results[0].get("clocks", {})
    start = getattr(job, "start", "barrier")
    rank0 = dict(results[0]["meta"])
    barrier = rank0.pop("start_barrier", None)
    meta = collect_metadata("profile", job.world, hw.name, emulated=emulated, iterations=job.iters,
                            warmup=job.warmup, rounds=job.rounds, statistic=STATISTIC,
                            iteration_start={"mode": start, "how": getattr(job, "start_how", start),
                                             **({"barrier": barrier} if barrier else {})},
                            timing=("cuda events around every iteration (plain, and instrumented); per-kernel "
                                    f"clock: {clocks.get('why', clocks.get('main'))}; globaltimer per CTA in fused "
                                    "kernels' traced builds"),
                            **rank0)
    doc = new_document(meta)
    for i in range(len(results[0]["cases"])):
        doc["cases"].append(case_document([r["cases"][i] for r in results], job.workload, job.world, job.dtype, hw))
    return doc


def case_document(results: list[dict], workload: str, world: int, dtype: str, hw: HardwareProfile) -> dict:
    from taxes.method import TOLERANCE
    from taxes.documents.results import case_entry, summarize_samples

    w = make_workload(workload, results[0]["shape"], world, dtype)
    eager_order = {}
    def runs_as(v0: dict):  # fused-auto runs the variant it picked
        v = get(workload, v0["variant"])
        picked = (v0.get("config") or {}).get("picked")
        return get(workload, picked) if v.rung == "auto" and picked else v

    # eager variants first, fused-auto last: a graph variant names its kernels' phases after its eager twin's
    order = sorted(range(len(results[0]["variants"])),
                   key=lambda j: (get(workload, results[0]["variants"][j]["variant"]).rung == "auto",
                                  runs_as(results[0]["variants"][j]).graphed))
    by_index = {}
    for j in order:
        v0 = results[0]["variants"][j]
        name = v0["variant"]
        ok = v0["error"] is None
        samples = [r["variants"][j]["samples"] for r in results] if ok else []
        entry = {"variant": name, "config": v0["config"] | ({"error": v0["error"]} if v0["error"] else {}),
                 "correctness": {"checked": v0["rel_error"] is not None,
                                 "passed": ok and v0["rel_error"] is not None and v0["rel_error"] <= TOLERANCE,
                                 "rel_error": v0["rel_error"], "tolerance": TOLERANCE,
                                 "reference": "float32, outputs poisoned with NaN"},
                 "samples_us": samples, "e2e_us": summarize_samples(samples), "phases": [], "components": [],
                 "attributed_e2e_us": None, "measurement_cost_us": None,
                 "attribution": {"available": False, "why": TIMED_PLAIN if get(workload, name).peer else
                                 "not timed with the per-kernel clock (" + (
                                     "it failed" if not ok else "no instrumented records") + ")"}}
        entry["plain_e2e_us"] = entry["e2e_us"]["iqm"]
        traced = [r["variants"][j].get("traced_samples") or [] for r in results] if ok else []
        if traced and all(traced):  # the fused kernel's traced build, timed without the clock (per rank)
            entry["traced_samples_us"] = traced
        raws = {clock: [r["variants"][j]["raw"].get(clock) for r in results] for clock in v0.get("raw", {})}
        if ok and raws and all(all(x is not None for x in rs) for rs in raws.values()):
            v = runs_as(v0)
            twin = eager_order.get(v.eager_twin) if v.graphed else None
            comm = tuple(v0.get("comm_phases", ()))
            tls = {clock: assemble_ranks(rs, twin, comm) for clock, rs in raws.items()}
            entry.update(attribute_variant(w, v.name, tls, samples, hw, v0.get("facts", {})))
            chosen = entry["attribution"]["clock"]
            if v0.get("clock_errors"):
                entry["attribution"]["clock_errors"] = v0["clock_errors"]
            entry["records"] = {"clock": chosen, "comm_phases": list(comm), "graph_phases": [list(x) for x in twin or []],
                                "ranks": [raw_to_columns(raw) for raw in raws[chosen]]}
            # per rank, the timed instrumented iterations' event E2E, beside samples_us (the plain ones'): what the
            # measurement cost is made of, kept when a document leaves its records out for size
            inst = [[float(it["e2e_us"]) for it in raw["iterations"] if not it["warmup"]] for raw in raws[chosen]]
            if all(x == x for r in inst for x in r):  # emulated ranks time with the host clock: no events
                entry["instrumented_samples_us"] = inst
            eager_order[name] = phase_order(tls[chosen][0])
        _predict_into(entry, w, hw)
        by_index[j] = entry
    entries = [by_index[j] for j in range(len(results[0]["variants"]))]
    case = case_entry(w, entries)
    case["extra"] = dict(results[0]["extra"]) | {"ladder": ladder(case)}
    return case


def phase_floors(w, variant: str, hw: HardwareProfile, splits: int | None = None) -> dict[str, float]:
    """{phase: its kernels' floor, us} from the workload's per-phase work (FLOPs, HBM bytes)."""
    model = lookup(variant).model if lookup(variant) else None
    if model is None or not hasattr(w, "phase_work"):
        return {}
    work = w.phase_work(model, splits) if w.name == "flash-decode" and splits else w.phase_work(model)
    return {ph: kernel_floor_us(f, b, hw, w.dtype) for ph, (f, b) in work.items()}


def apply_floors(tl: Timeline, floors: dict, waits: dict | None = None) -> Timeline:
    """The timeline with each phase's floor on its longest compute activity in every window (0 on the phase's
    other compute activities: their time is the phase's inefficiency); tl itself is left as it was."""
    a = tl.activities
    floor = pd.Series(np.nan, index=a.index)
    comp = a[a["comm"] == ""]
    for (step, ph), grp in comp.groupby(["step", "phase"]):
        if ph in floors:
            floor[grp.index] = 0.0
            floor[(grp["end_us"] - grp["start_us"]).idxmax()] = floors[ph]
    return replace(tl, activities=a.assign(floor_us=floor))


def attribute_variant(w, variant: str, tls_by_clock: dict, samples: list, hw: HardwareProfile, facts: dict) -> dict:
    """The rows of one variant from each clock's timelines; the cheaper clock's attribution is kept."""
    v = lookup(variant)
    plain = att.iqm(per_iteration_e2e(samples))
    floor = floor_of(w, hw)
    splits = facts.get("splits")
    loc_bytes = _locality_bytes(w, v, splits)
    floors = phase_floors(w, variant, hw, splits)
    results = {}
    for clock, tls in tls_by_clock.items():
        tls = [apply_floors(tl, floors) for tl in tls]
        a = att.attribute(tls, floor=floor, locality_bytes=loc_bytes, us_per_byte=1.0 / hw.hbm_bytes_per_us(),
                          aligned_starts=True)
        s = att.summarize(a.rows)
        results[clock] = (a, s, tls)
    costs = {clock: (s["e2e_us"] - plain) if (s["e2e_us"] is not None and plain) else None
             for clock, (_, s, _) in results.items()}
    chosen = min(results, key=lambda c: math.inf if costs[c] is None else costs[c])
    a, s, tls = results[chosen]
    out = entries_from(a, s, tls, plain, costs, chosen, loc_bytes)
    out["attribution"]["splits"] = splits
    out["attribution"]["phase_floors_us"] = floors
    return out


def entries_from(a: att.Attribution, s: dict, tls: list, plain: float | None, costs: dict, clock: str,
                 loc_bytes: float | None) -> dict:
    e2e = s["e2e_us"]
    comps = []
    for r, rows in sorted(s["per_rank"].items()):
        comps += [{"name": k, "rank": r, "value_us": rows[k], "label": att.LABELS[k]} for k in att.ROWS]
    comps += [{"name": k, "rank": None, "value_us": s["rows"][k], "label": att.LABELS[k]} for k in att.ROWS]
    cost = e2e - plain if (e2e is not None and plain is not None) else None
    gaps = a.gaps[a.gaps["step"].isin(s["kept"])].groupby("cause")["dur_us"].sum() if not a.gaps.empty else {}
    n_kept = max(1, len(s["kept"]))
    out = {
        "plain_e2e_us": plain, "attributed_e2e_us": e2e, "measurement_cost_us": cost,
        "perturbed": bool(cost is not None and plain and cost > PERTURBED * plain),
        "components": comps, "phases": _phases(tls, s),
        "attribution": {"available": True, "clock": clock, "clocks": costs, "rules": RULES,
                        "commit": _commit(), "statistic": STATISTIC,
                        "unattributed_share": s["rows"]["unattributed"] / e2e if e2e else None,
                        "kept_iterations": len(s["kept"]), "iterations": s["n"],
                        "locality_bytes": loc_bytes,
                        "gaps_us": {str(k): float(v) / n_kept for k, v in dict(gaps).items()},
                        "launch_latency_us": _finite(a.rows["launch_latency_us"].median()) if len(a.rows) else None,
                        "unmatched_collectives": int((~a.collectives["matched"]).sum()) if len(a.collectives) else 0},
    }
    return out


def _finite(x):
    return float(x) if x is not None and math.isfinite(x) else None


def _locality_bytes(w, v, splits) -> float | None:
    if v is None or v.model is None:
        return None
    if w.name == "flash-decode":
        return w.intermediate_bytes(v.model, splits or 1)
    return w.intermediate_bytes(v.model)


def _commit() -> str | None:
    """The attribution code's commit (with "+dirty" when the checkout had uncommitted changes)."""
    from taxes.provenance import collect

    p = collect()
    return p["git_commit"] and p["git_commit"] + ("+dirty" if p["git_dirty"] else "")


def _phases(tls: list, s: dict) -> list[dict]:
    """Per rank, the phases of the kept iteration whose E2E is closest to the statistic: each phase from
    its first activity's start to its last's end, from the window's start (for timeline plots)."""
    if not s["kept"]:
        return []
    out = []
    target = s["e2e_us"]
    for tl in tls:
        w = tl.windows[tl.windows["step"].isin(s["kept"])]
        if w.empty:
            continue
        row = w.iloc[((w["end_us"] - w["start_us"]) - target).abs().argmin()]
        a = tl.activities[tl.activities["step"] == row["step"]]
        for ph, g in a.groupby(a["phase"].where(a["phase"] != "", a["name"]), sort=False):
            comm = (g["comm"] != "").all()
            out.append({"rank": tl.rank, "name": str(ph)[:60], "role": "communication" if comm else "compute",
                        "start_us": float(g["start_us"].min() - row["start_us"]),
                        "end_us": float(g["end_us"].max() - row["start_us"]), "label": "measured", "parts": {}})
    return sorted(out, key=lambda p: (p["rank"], p["start_us"]))


def ladder(case: dict) -> dict:
    """The ablation ladder from plain E2E (interquartile means): bsp -> graph removes launch and host-bound
    time; -> best fused removes the others. Beside it the timeline's own launch + host_bound (bsp minus
    graph) and the graph's residual idle (graph gaps and its replay's launch), which a graph cannot remove."""
    by = {v["variant"]: v for v in case["variants"]}
    w = case["workload"]
    out = {}
    for b in [x for x in by if (lookup(x) and lookup(x).rung == "bsp")]:
        from taxes.variants import graph_twin

        g = graph_twin(w, b)
        if g not in by:
            continue
        pb, pg = by[b].get("plain_e2e_us"), by[g].get("plain_e2e_us")
        if pb is None or pg is None:
            continue
        item = {"bsp": b, "graph": g, "plain_us": pb - pg}
        rb, rg = _overall(by[b]), _overall(by[g])
        if rb and rg:
            item["timeline_us"] = (rb["launch"] + rb["host_bound"]) - (rg["launch"] + rg["host_bound"])
            item["instrumented_us"] = by[b]["attributed_e2e_us"] - by[g]["attributed_e2e_us"]
            item["plain_spread_us"] = [(by[x]["e2e_us"].get("p90") or 0) - (by[x]["e2e_us"].get("p10") or 0) for x in (b, g)]
            item["graph_residual_us"] = rg["launch"] + rg["graph_gaps"]
            item["bsp_queued_us"] = rb["queued"]
        out.setdefault("pairs", []).append(item)
    fused = {n: v.get("plain_e2e_us") for n, v in by.items() if lookup(n) and lookup(n).fused and v.get("plain_e2e_us")}
    graphs = [by[n].get("plain_e2e_us") for n in by if lookup(n) and lookup(n).rung == "graph" and by[n].get("plain_e2e_us")]
    if fused and graphs:
        best = min(fused, key=fused.get)
        out["best_fused"] = best
        out["fused_vs_graph_us"] = min(graphs) - fused[best]
    return out


def _overall(entry: dict) -> dict:
    return {c["name"]: c["value_us"] for c in entry.get("components", []) if c["rank"] is None}


def _predict_into(entry: dict, w, hw: HardwareProfile) -> None:
    from taxes.model.predict import predict
    from taxes.model.steps import options_from_config

    runs = (entry.get("config") or {}).get("picked") if entry["variant"] == "fused-auto" else None
    v = lookup(runs or entry["variant"])  # fused-auto is predicted as the variant it runs
    if v is not None and v.model:
        pred = predict(w, v.model, hw, options_from_config(entry.get("config")))
        entry["prediction"] = {"variant": v.model, "hardware": hw.name, "e2e_us": pred.e2e_us,
                               "components": pred.components, "label": "predicted"}
    fl = floor_of(w, hw)
    entry["floor"] = {"compute_us": fl.compute_us, "hbm_us": fl.hbm_us, "link_us": fl.link_us, "ideal_us": fl.ideal_us}


def reattribute(doc: dict, hw: HardwareProfile) -> dict:
    """The same measurements attributed with another hardware profile: floors, rows and predictions are
    recomputed from the stored records; measured times are untouched. Variants without stored records
    keep their E2E and say their rows are not available."""
    import copy

    out = copy.deepcopy(doc)
    for case in out["cases"]:
        w = make_workload(case["workload"], case["shape"], case["world"], case["dtype"])
        for entry in case["variants"]:
            rec = entry.get("records")
            if rec:
                twin = [tuple(x) for x in rec.get("graph_phases") or []] or None
                tls = assemble_ranks([raw_from_columns(d) for d in rec["ranks"]], twin, tuple(rec.get("comm_phases", ())))
                facts = {"splits": (entry.get("attribution") or {}).get("splits")}
                runs = (entry.get("config") or {}).get("picked") if entry["variant"] == "fused-auto" else None
                entry.update(attribute_variant(w, runs or entry["variant"], {rec["clock"]: tls}, entry["samples_us"],
                                               hw, facts))
            _predict_into(entry, w, hw)
        if case.get("extra") is not None:
            case["extra"]["ladder"] = ladder(case)
    out["metadata"]["hardware_profile"] = hw.name
    out["metadata"]["attributed_with"] = {"profile": hw.name, "source": hw.source, "rules": RULES,
                                          "commit": _commit()}
    return out
