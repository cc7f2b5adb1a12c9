"""The known-answer rows (taxes.run.planted says what each case plants and how its truth is known): every
rank's measurements of a case combined into its rows, each planted amount against what the rows recovered."""

from __future__ import annotations

import statistics

from taxes.attribution import attribute as att
from taxes.attribution.waits import own_durations
from taxes.run.measure import FUSED_WAIT_RULES, waits_by_rule
from taxes.traces.records import assemble_ranks, phase_order

TOLERANCE = 0.10
TOLERANCE_US = 2.0


def attributed(per_rank: list[dict], graph_phases: list | None = None, reference: dict | None = None) -> dict:
    """Combine every rank's measurement of one runner (on one clock): the rows of every rank, and per rank
    its own statistics ("by_rank": rank -> {rows, e2e_us (its own instrumented span), plain_us (its own
    plain samples), busy_us, launch_path_us}, each the interquartile mean over that rank's iterations);
    beside them the overall view (per iteration the slowest rank: rows, e2e_us, plain_us); "reference": each
    rank's own durations of its collectives where it waited for nobody (taxes.attribution.waits.own_durations),
    which `reference` supplies from another runner's iterations of the same run where these have too few."""
    tls = assemble_ranks([m["raw"] for m in per_rank], graph_phases, comm_phases=per_rank[0]["comm"])
    m0 = per_rank[0]
    a = att.attribute(tls, locality_bytes=m0["locality_bytes"] or None, us_per_byte=m0["us_per_byte"],
                      aligned_starts=True, collective_reference=reference)
    s = att.summarize(a.rows)
    plains = [m.get("plain") or [] for m in per_rank]
    plain = att.iqm([max(v) for v in zip(*plains)]) if all(plains) else None
    by_rank = {}
    for tl, m, own in zip(tls, per_rank, plains):
        rows = a.rows[a.rows["rank"] == tl.rank]
        sr = att.summarize(rows)
        kept = rows[rows["step"].isin(sr["kept"])]
        by_rank[tl.rank] = {"rows": sr["rows"], "e2e_us": sr["e2e_us"], "plain_us": att.iqm(own) if own else None,
                            "busy_us": float(kept["busy_us"].mean()) if len(kept) else 0.0,
                            "launch_path_us": _launch_path(tl, sr["kept"]), "tl": tl}
    kept = a.rows[a.rows["step"].isin(s["kept"])]
    return {"rows": s["rows"], "per_rank": s["per_rank"], "e2e_us": s["e2e_us"], "plain_us": plain,
            "busy_us": float(kept.groupby("step")["busy_us"].max().mean()) if len(kept) else 0.0,
            "launch_path_us": by_rank[tls[0].rank]["launch_path_us"] if tls else 0.0,
            "launch_latency_us": float(a.rows["launch_latency_us"].median()) if len(a.rows) else None,
            "by_rank": by_rank, "notes": a.notes, "reference": own_durations(a.collectives)}


def graph_row(eager: dict, graph: dict, plain_ladder: float | None = None) -> dict:
    """The graph case: what a graph removed, E2E(eager) - E2E(graph) of the instrumented runs (the
    conditions the timelines were recorded in: launch calls recorded in every iteration make eager launches
    dearer, not graphs), against launch + host_bound of the eager timeline minus the graph's."""
    eager_lh = eager["rows"]["launch"] + eager["rows"]["host_bound"]
    graph_lh = graph["rows"]["launch"] + graph["rows"]["host_bound"]
    return row("graph", "the launch case replayed from a CUDA graph", eager["e2e_us"] - graph["e2e_us"],
               eager_lh - graph_lh,
               "the ladder E2E(eager) - E2E(graph) of the instrumented runs (events) against launch + host_bound "
               "of the eager timeline minus the graph's; plain_planted_us: the same ladder of the plain runs",
               plain_planted_us=plain_ladder, graph_gaps_us=graph["rows"]["graph_gaps"],
               graph_launch_us=graph["rows"]["launch"])


def _launch_path(tl, steps: list) -> float:
    """Per iteration (mean over `steps`), the launching calls' own time the device waited through: from each
    call's start until its first device activity started (the call, its launch, the launch latency), and
    from its last activity's end until the call returned, where it returned later (API records join calls
    to their activities). Per call, independent of the attribution's interval rules."""
    host = tl.host
    calls = host[host["kind"] == "call"].sort_values("start_us")
    spans = host[host["kind"] == "step"].set_index("name")
    la = tl.launches[tl.launches["kind"].isin(("launch", "graph"))]
    by_corr = tl.activities.groupby("correlation")
    first_start, last_end = by_corr["start_us"].min(), by_corr["end_us"].max()
    totals = []
    for s in steps:
        if f"step {s}" not in spans.index:
            continue
        h0, h1 = spans.at[f"step {s}", "start_us"], spans.at[f"step {s}", "end_us"]
        total = 0.0
        for c in calls[(calls["start_us"] >= h0) & (calls["end_us"] <= h1)].itertuples():
            corr = la.loc[(la["start_us"] >= c.start_us) & (la["start_us"] <= c.end_us), "correlation"]
            starts = first_start.reindex(corr.values).dropna()
            if len(starts):
                total += float(starts.min() - c.start_us)
                total += max(0.0, c.end_us - float(last_end.reindex(corr.values).max()))
        totals.append(total)
    return statistics.fmean(totals) if totals else 0.0


def row(tax: str, case: str, planted: float, recovered: float, method: str, **extra) -> dict:
    err = recovered - planted
    ok = abs(err) <= max(TOLERANCE * abs(planted), TOLERANCE_US)
    return {"tax": tax, "case": case, "planted_us": planted, "recovered_us": recovered,
            "error_pct": 100 * err / planted if planted else None, "ok": bool(ok), "method": method, **extra}


def known_answers(results: list[dict]) -> list[dict]:
    """Every rank's measurements -> the known-answer rows."""
    rows = single_rank_rows(results) if "base" in results[0] else []
    if len(results) > 1:
        rows += late_rows(results)
    return rows


def _each_rank(results: list[dict], case: str, tax: str, check) -> dict:
    """A case that concerns each rank alone (no collective): check(by_rank) -> (planted, recovered, extra)
    per rank; the row shows the rank that missed by the most (relative to its tolerance), and holds every
    rank's values; it is ok when every rank's is."""
    per = []
    for r in range(len(results)):
        planted, recovered, extra = check(r)
        one = row(tax, case, planted, recovered, "", **extra)
        slack = abs(recovered - planted) / max(TOLERANCE * abs(planted), TOLERANCE_US)
        per.append((slack, r, one))
    worst = max(per, key=lambda t: t[0])[2]
    out = dict(worst, rank=max(per, key=lambda t: t[0])[1], ok=all(p[2]["ok"] for p in per))
    if len(results) > 1:
        out["per_rank"] = [{"rank": r, "planted_us": o["planted_us"], "recovered_us": o["recovered_us"], "ok": o["ok"]}
                           for _, r, o in per]
    return out


def single_rank_rows(results: list[dict]) -> list[dict]:
    """The launch, host-bound, locality and graph cases, each rank against its own truth."""
    cache: dict = {}

    def A(key):
        if key not in cache:
            cache[key] = attributed([r[key] for r in results])["by_rank"]
        return cache[key]

    def B(key, r):
        return A(key)[r]

    rows = []

    def launch_case(r):
        base, extra = B("base", r), B("extra", r)
        d_busy = extra["busy_us"] - base["busy_us"]
        return (extra["e2e_us"] - base["e2e_us"] - d_busy, extra["rows"]["launch"] - base["rows"]["launch"],
                {"plain_planted_us": (extra["plain_us"] or 0) - (base["plain_us"] or 0) - d_busy})

    r0 = _each_rank(results, "extra small kernels", "launch", launch_case)
    r0["method"] = ("change of the rank's instrumented E2E (events) less the added kernels' busy time (per-kernel "
                    "clock), against the change of its launch row")
    rows.append(r0)

    def spin_case(r):
        per_spin, n = results[r]["spin"]["spun_us"], results[r]["spin"]["spins_per_iteration"]
        return n * per_spin, B("spin", r)["rows"]["host_bound"] - B("base", r)["rows"]["host_bound"], {}

    r1 = _each_rank(results, "host spin before each launch", "host_bound", spin_case)
    n_spins, per_spin = results[0]["spin"]["spins_per_iteration"], results[0]["spin"]["spun_us"]
    r1["method"] = (f"{n_spins} spins of {per_spin:.1f} us (median, as the spin measured itself) per iteration, "
                    "against the change of the host_bound row")
    rows.append(r1)

    def longer_case(r):
        spun, more = B("spin", r), B("spin_more", r)
        base = B("base", r)
        n = results[r]["spin"]["spins_per_iteration"]
        added = n * (results[r]["spin_more"]["spun_us"] - results[r]["spin"]["spun_us"])
        # the change of E2E (events) less the change of busy time (the per-kernel clock) and the spins' added
        # length (as they timed themselves): what else the device waited for, which no rule decided
        other = (more["e2e_us"] - spun["e2e_us"]) - (more["busy_us"] - spun["busy_us"]) - added
        # judged on host_bound against the spins' added length: the launching calls' own time moves by tens
        # of us between two blocks when several ranks share the host (131 us of 380 on 2 H100s), so its
        # change, near zero by design, is no scale to judge the launch row by; it is reported beside
        return (added, more["rows"]["host_bound"] - spun["rows"]["host_bound"],
                {"launch_path_us": [spun["launch_path_us"], more["launch_path_us"]], "other_idle_change_us": other,
                 "launch_row_change_us": more["rows"]["launch"] - spun["rows"]["launch"],
                 "launch_path_change_us": more["launch_path_us"] - spun["launch_path_us"],
                 "spins_added_us": added,
                 "against_no_spin": {"launch_row_change_us": spun["rows"]["launch"] - base["rows"]["launch"],
                                     "launch_path_change_us": spun["launch_path_us"] - base["launch_path_us"]}})

    r2 = _each_rank(results, "a longer host spin lands in host_bound, not launch", "host_bound", longer_case)
    r2["method"] = (f"the host_bound row with spins of {per_spin:.1f} and {results[0]['spin_more']['spun_us']:.1f} us, "
                    "against the spins' added length (as they timed themselves); beside it the launch row's change "
                    "and the change of the launching calls' own time the device waited through (API records: each "
                    "call's start until its kernel started, and its kernel's end until it returned); "
                    "other_idle_change_us: the change of E2E (events) less that of busy time (per-kernel clock) "
                    "and the spins' added length")
    rows.append(r2)

    def locality_case(r):
        un, fu = B("unfused", r), B("fused", r)
        return un["busy_us"] - fu["busy_us"], un["rows"]["locality"], {"bytes": results[r]["unfused"]["intermediate_bytes"]}

    r3 = _each_rank(results, "one extra HBM round trip", "locality", locality_case)
    r3["method"] = (f"change of kernel busy time (per-kernel clock) against "
                    f"{results[0]['unfused']['intermediate_bytes'] / 2**20:.0f} MiB x the time per byte of a device "
                    "copy timed in the same run")
    rows.append(r3)

    def graph_case(r):
        eager, graph = B("extra", r), B("graph", r)
        lh = (eager["rows"]["launch"] + eager["rows"]["host_bound"]) - (graph["rows"]["launch"] + graph["rows"]["host_bound"])
        return (eager["e2e_us"] - graph["e2e_us"], lh,
                {"plain_planted_us": (eager["plain_us"] or 0) - (graph["plain_us"] or 0),
                 "graph_gaps_us": graph["rows"]["graph_gaps"], "graph_launch_us": graph["rows"]["launch"]})

    r4 = _each_rank(results, "the launch case replayed from a CUDA graph", "graph", graph_case)
    r4["method"] = ("the ladder E2E(eager) - E2E(graph) of the instrumented runs (events) against launch + host_bound "
                    "of the eager timeline minus the graph's; plain_planted_us: the same ladder of the plain runs")
    rows.append(r4)
    return rows


def late_rows(results: list[dict]) -> list[dict]:
    """Per runner, delay and length: the waiting ranks' change of sync wait against the same run without a
    delay (recovered), against the change of their own plain E2E (events around each iteration, no clock
    on: the truth, measured without the rule)."""
    rows = []
    keys = [k for k in results[0] if k.endswith(" 0") and k.split(" ")[-2:-1] in (["device"], ["host"])
            and isinstance(results[0][k], dict) and "how" in results[0][k]]
    # each rank's own durations of its collectives where it waited for nobody, from the runner's runs without
    # a delay: the late rank is last in every iteration of a delayed run, and in the host-delay runner's run
    # without a delay it is still a few us late (its gate), so the device-delay runner's comes first
    references: dict = {}
    for base_key in sorted(keys, key=lambda k: k.split(" ")[2] != "device"):
        wl, variant = base_key.split(" ")[:2]
        own = attributed([r[base_key] for r in results], _twin(results, base_key))["reference"]
        references[(wl, variant)] = own | references.get((wl, variant), {})
    for base_key in keys:
        wl, variant, how0 = base_key.split(" ")[:3]
        base_twin = _twin(results, base_key)
        reference = references[(wl, variant)]
        base = attributed([r[base_key] for r in results], base_twin, reference)
        late = results[0][base_key]["late"]
        waiting = [r for r in range(len(results)) if r != late]
        skew = statistics.fmean(base["by_rank"][r]["rows"]["start_skew"] for r in range(len(results)))
        for key in [k for k in results[0] if k.startswith(f"{wl} {variant} {how0} ") and k != base_key]:
            m1 = results[late][key]
            how, x = m1["how"], m1["x_us"]
            twin = _twin(results, key)
            # the late rank is last in every iteration, so the waiting ranks' own durations without a wait come
            # from the same run's iterations without a delay
            run = attributed([r[key] for r in results], twin, reference)
            by_rule = {rule: _rule_change(results, {base_key: base_twin, key: twin}, rule, stamps_only=True)
                       for rule in FUSED_WAIT_RULES}
            # the held rule from the stamps where they were kept, else as older runs recorded it
            held = by_rule["held"] if by_rule["held"] is not None else \
                _rule_change(results, {base_key: base_twin, key: twin}, "held")
            per = []
            for r in waiting:
                truth = (run["by_rank"][r]["plain_us"] or 0.0) - (base["by_rank"][r]["plain_us"] or 0.0)
                # the same truth in the instrumented iterations themselves (their events, not the rows):
                # where it and the plain one differ, measuring moved the program, not the rule
                seen = run["by_rank"][r]["e2e_us"] - base["by_rank"][r]["e2e_us"]
                rec = run["by_rank"][r]["rows"]["sync_wait"] - base["by_rank"][r]["rows"]["sync_wait"]
                one = row("sync_wait", "", truth, rec, "")
                per.append({"rank": r, "planted_us": truth, "recovered_us": rec, "ok": one["ok"],
                            "instrumented_planted_us": seen, "rule_ok": row("sync_wait", "", seen, rec, "")["ok"],
                            "start_skew_change_us": run["by_rank"][r]["rows"]["start_skew"]
                            - base["by_rank"][r]["rows"]["start_skew"]})
                if held is not None:  # a fused kernel's wait by the other rule, from the same iterations
                    per[-1]["recovered_held_us"] = held[r]
                if all(v is not None for v in by_rule.values()):  # every rule, from the CTAs' stored stamps
                    per[-1]["recovered_by_rule_us"] = {rule: v[r] for rule, v in by_rule.items()}
            planted = statistics.fmean(p["planted_us"] for p in per)
            recovered = statistics.fmean(p["recovered_us"] for p in per)
            seen = statistics.fmean(p["instrumented_planted_us"] for p in per)
            delay = _delay_us(run["by_rank"][late]["tl"]) if how == "device" else m1["spun_us"]
            out = row("sync_wait", f"{wl} {variant}: rank {late} late by {x:g} us ({how})", planted, recovered,
                      "the waiting ranks' change of plain E2E (events, no per-kernel clock) against the change of "
                      "their sync_wait row, each against the same run without a delay; instrumented_planted_us: "
                      "the same change of E2E in the instrumented iterations (events), which rule_ok holds the "
                      "rows to",
                      workload=wl, variant=variant, shape=m1["shape"], delay=how, delay_asked_us=x,
                      iteration_start="aligned: after the host barrier, a spin kernel and a one-element "
                                      "all-reduce on every rank before the start event (taxes.run.harness.AlignedStart)",
                      delay_measured_us=delay, per_rank=per, harness_start_skew_us=skew,
                      late_rank_e2e_change_us=(run["by_rank"][late]["plain_us"] or 0.0)
                      - (base["by_rank"][late]["plain_us"] or 0.0),
                      instrumented_planted_us=seen, measuring_moved_us=seen - planted)
            out["ok"] = all(p["ok"] for p in per)
            out["rule_ok"] = all(p["rule_ok"] for p in per)
            rows.append(out)
    return rows


def _rule_change(results: list[dict], twins: dict, rule: str, stamps_only: bool = False) -> dict | None:
    """{rank: change of sync_wait} from the run without a delay to the run with one (twins: {key: its eager
    twin's phases}, the run without first) had the fused kernels' waits been taken by `rule`
    (taxes.run.measure.FUSED_WAIT_RULES): from each call's stored CTA stamps ("ctas"), or for "held" from
    the waits recorded by it ("waits_held") in runs that kept no stamps (unless stamps_only); None where
    the records hold neither."""
    def swapped(m):
        its = m["raw"]["iterations"]
        if its and all("ctas" in it for it in its):
            waits = [waits_by_rule(it["ctas"], rule) for it in its]
        elif its and rule == "held" and not stamps_only and all("waits_held" in it for it in its):
            waits = [it["waits_held"] for it in its]
        else:
            return None
        return dict(m, raw=dict(m["raw"], iterations=[dict(it, waits=w) for it, w in zip(its, waits)]))

    runs = []
    for k, twin in twins.items():
        ms = [swapped(r[k]) for r in results]
        if any(m is None for m in ms):
            return None
        runs.append(attributed(ms, twin)["by_rank"])
    return {r: runs[1][r]["rows"]["sync_wait"] - runs[0][r]["rows"]["sync_wait"] for r in runs[0]}


def _twin(results: list[dict], key: str) -> list | None:
    """A graphed runner's kernels named after its eager twin's steps, measured with the same delay: the
    late rank's [(kernel name, step)] in order (it holds the delay kernel the others lack)."""
    m = results[0][key]
    if not m.get("eager_twin"):
        return None
    twin_key = " ".join([m["workload"], m["eager_twin"]] + key.split(" ")[2:])
    if twin_key not in results[0]:
        return None
    late = m["late"]
    tls = assemble_ranks([r[twin_key]["raw"] for r in results], comm_phases=results[0][twin_key]["comm"])
    return phase_order(tls[late])


def _delay_us(tl) -> float | None:
    """The planted spin kernel's mean length per iteration, from the per-kernel clock."""
    a = tl.activities[tl.activities["phase"] == "delay"]
    return float((a["end_us"] - a["start_us"]).mean()) if len(a) else None


def summary(rows: list[dict]) -> str:
    ok = sum(r["ok"] for r in rows)
    return f"{ok} of {len(rows)} planted taxes recovered within {100 * TOLERANCE:.0f}% (or {TOLERANCE_US:g} us)"
