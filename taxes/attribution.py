"""Attribution: a measured timeline split into the floor, the three taxes, kernel inefficiency and the rest.

Plain arithmetic on what the harness measured (docs/method.md, ../shared/METHOD.md), per rank and
iteration, then averaged over the iterations between the 10th and 90th percentile of E2E (means of
parts that add up still add up; medians would not):

bsp variants, from device events around every phase (start/end us from the iteration's start event)
and, for eager phases, the host clock when the phase's call returned (issued_us, same origin):
    host-bound part   = of a phase, the time before its call returned: the device had nothing of it
                        to run yet (an NCCL collective's or a Triton launcher's host path)   (derived)
    launch            = idle before the first phase, between phases and after the last (until
                        the end event), plus each phase's host-bound part   (measured; derived
                        when host-bound parts are in it)
    sync_wait         = per collective, its duration (less its host-bound part) minus the
                        shortest any rank saw                                        (derived)
    exposed_transfer  = the rest of the collectives, minus the link time no schedule
                        could hide (the floor's unhideable link time)              (derived)
    locality          = intermediate bytes / calibrated HBM bandwidth, taken out of the
                        compute phases, but no more than their time above the local floor
                        max(T_compute, T_hbm): traffic under a phase running at its floor
                        cost nothing                                                (derived)
    ideal             = the floor max(T_compute, T_link, T_hbm) from calibrated peaks (derived)
    inefficiency      = compute phases + unhideable link - locality - ideal, >= 0   (derived)
    unattributed      = E2E - all of the above (negative when the floor is above what was
                        measured)                                                   (derived)
fused variants, from device events around each launch and the traced build's per-CTA clocks:
    launch            = idle as above + each traced launch's phase time outside its kernel span
                        (+ the host-bound part of untraced eager phases)
    sync_wait         = the CTAs' mean time spinning on flags beyond the unhideable link time
    exposed_transfer  = 0 (a fused kernel has no separate transfer: waiting is the tax)
    locality, ideal, inefficiency, unattributed as above.
E2E = ideal + launch + sync_wait + exposed_transfer + locality + inefficiency + unattributed, exactly.
"""

from __future__ import annotations

import math
import statistics

from taxes.model import COMPONENTS, Floor
from taxes.workloads import is_fused

# each bulk-synchronous variant and its CUDA-graph twin (tp-mlp calls its rungs all-bsp and all-graph)
GRAPH_OF = {"bsp": "bsp-graph", "all-bsp": "all-graph"}
LABELS = {"ideal": "derived", "sync_wait": "derived", "exposed_transfer": "derived", "locality": "derived",
          "launch": "measured", "inefficiency": "derived", "unattributed": "derived"}


def trimmed_iterations(e2e_us: list[float], lo: float = 0.1, hi: float = 0.9) -> list[int]:
    """Indices of iterations whose E2E lies between the lo and hi quantiles (all of them when few)."""
    n = len(e2e_us)
    if n < 5:
        return list(range(n))
    order = sorted(e2e_us)
    a, b = order[int(lo * (n - 1))], order[int(math.ceil(hi * (n - 1)))]
    return [i for i, x in enumerate(e2e_us) if a <= x <= b]


def gaps_us(phases: list[dict], e2e_us: float | None = None) -> float:
    """Device idle before the first phase and between phases (phases sorted by start; overlap is not idle),
    and with e2e_us after the last phase until the iteration's end event (a graph's exit, the host's
    last call): the device had nothing queued there either."""
    t, idle = 0.0, 0.0
    for ph in sorted(phases, key=lambda p: p["start_us"]):
        idle += max(0.0, ph["start_us"] - t)
        t = max(t, ph["end_us"])
    if e2e_us is not None:
        idle += max(0.0, e2e_us - t)
    return idle


def host_bound_us(ph: dict) -> float:
    """The part of a phase before its call returned on the host (0 without a host stamp: graphs, older
    documents): the device reached the phase's start event but had none of its work queued yet."""
    issued = ph.get("issued_us")
    if issued is None:
        return 0.0
    return min(max(0.0, issued - ph["start_us"]), max(0.0, ph["end_us"] - ph["start_us"]))


def capped_locality_us(locality_us: float, compute_us: float, floor: Floor) -> float:
    """The locality tax charged to compute phases that ran compute_us: at most their time above the
    local floor (a phase at its floor hid the intermediate traffic under its own work)."""
    return min(locality_us, max(0.0, compute_us - floor.work_us))


def _close(parts: dict, e2e: float, floor: Floor, compute_us: float, unhideable_us: float) -> dict:
    """Add ideal, inefficiency and unattributed so that the parts sum to e2e."""
    parts["ideal"] = floor.ideal_us
    parts["inefficiency"] = max(0.0, compute_us + unhideable_us - floor.ideal_us)
    parts["unattributed"] = e2e - math.fsum(v for k, v in parts.items() if k != "unattributed")
    return {c: parts.get(c, 0.0) for c in COMPONENTS}


def bsp_iteration(ranks: list[dict], floor: Floor, locality_us: float) -> list[dict]:
    """One iteration of a bsp variant on every rank -> per rank {component: us}.

    ranks[r] = {"e2e_us", "phases": [{"name", "role", "start_us", "end_us", "issued_us" (optional)}]},
    phases in issue order and the same sequence on every rank (the j-th communication phase is the same
    collective everywhere)."""
    def busy(ph):
        return ph["end_us"] - ph["start_us"] - host_bound_us(ph)

    comm_durs = [[busy(ph) for ph in r["phases"] if ph["role"] != "compute"] for r in ranks]
    n_comm = min(len(c) for c in comm_durs) if comm_durs else 0
    fastest = [min(c[j] for c in comm_durs) for j in range(n_comm)]
    out = []
    for r, durs in zip(ranks, comm_durs):
        comm = math.fsum(durs)
        sync = math.fsum(max(0.0, d - f) for d, f in zip(durs, fastest))
        unhideable = min(floor.unhideable_link_us, comm - sync)
        compute = math.fsum(busy(ph) for ph in r["phases"] if ph["role"] == "compute")
        loc = capped_locality_us(locality_us, compute, floor)
        launch = gaps_us(r["phases"], r["e2e_us"]) + math.fsum(host_bound_us(ph) for ph in r["phases"])
        parts = {"launch": launch, "sync_wait": sync, "exposed_transfer": comm - sync - unhideable, "locality": loc}
        out.append(_close(parts, r["e2e_us"], floor, compute - loc, unhideable))
    return out


def fused_iteration(rank: dict, floor: Floor, locality_us: float) -> dict:
    """One iteration of a fused variant on one rank -> {component: us}.

    rank = {"e2e_us", "phases": [...], "traced": {phase name: {"span_us", "wait_us"}}}: for each traced
    phase, its kernel's span (first CTA start to last CTA end) and the CTAs' mean time spent waiting."""
    phases, traced = rank["phases"], rank.get("traced", {})
    launch = gaps_us(phases, rank["e2e_us"])
    wait = 0.0
    busy = 0.0
    for ph in phases:
        dur = ph["end_us"] - ph["start_us"]
        tr = traced.get(ph["name"])
        if tr is not None:
            span = min(tr["span_us"], dur)
            launch += dur - span  # the launch itself: phase time before the first CTA started
            wait += min(tr["wait_us"], span)
            busy += span
        else:
            host = host_bound_us(ph)
            launch += host
            busy += dur - host
    unhideable = min(floor.unhideable_link_us, wait)
    compute = busy - wait
    loc = capped_locality_us(locality_us, compute, floor)
    parts = {"launch": launch, "sync_wait": wait - unhideable, "exposed_transfer": 0.0, "locality": loc}
    return _close(parts, rank["e2e_us"], floor, compute - loc, unhideable)


def mean_components(per_iteration: list[dict], keep: list[int]) -> dict:
    return {c: math.fsum(it[c] for i, it in enumerate(per_iteration) if i in keep) / max(1, len(keep))
            for c in COMPONENTS}


def attribute(iterations: list[list[dict]], fused: bool, floor: Floor, locality_us: float) -> dict:
    """iterations[i][r]: rank r's record of iteration i (see bsp_iteration / fused_iteration).

    Returns {"per_rank": [{component: us}], "e2e_us": [per rank, mean of the kept iterations],
    "overall_rank": the slowest rank, "kept": iterations used}. Overall is the slowest rank's split,
    since E2E is the slowest rank's time."""
    n_ranks = len(iterations[0])
    split = [[fused_iteration(it[r], floor, locality_us) for r in range(n_ranks)] if fused
             else bsp_iteration(it, floor, locality_us) for it in iterations]
    e2e_iter = [max(rk["e2e_us"] for rk in it) for it in iterations]
    keep = set(trimmed_iterations(e2e_iter))
    per_rank = [mean_components([s[r] for s in split], list(keep)) for r in range(n_ranks)]
    e2e = [math.fsum(iterations[i][r]["e2e_us"] for i in keep) / len(keep) for r in range(n_ranks)]
    slowest = max(range(n_ranks), key=lambda r: e2e[r])
    host = any(ph.get("issued_us") is not None for it in iterations for rk in it for ph in rk["phases"])
    return {"per_rank": per_rank, "e2e_us": e2e, "overall_rank": slowest, "kept": sorted(keep), "host_bound": host}


def component_entries(result: dict) -> list[dict]:
    """The result document's `components` list: per rank, then overall (rank null). The launch tax is
    measured (device idle between events) unless host-bound parts of phases are in it: then derived."""
    labels = dict(LABELS, launch="derived") if result.get("host_bound") else LABELS
    rows = []
    for r, comp in enumerate(result["per_rank"]):
        rows += [{"name": c, "rank": r, "value_us": comp[c], "label": labels[c]} for c in COMPONENTS]
    overall = result["per_rank"][result["overall_rank"]]
    rows += [{"name": c, "rank": None, "value_us": overall[c], "label": labels[c]} for c in COMPONENTS]
    return rows


def trace_summary(cta_rows: list[tuple[float, float, float]]) -> dict:
    """Per-CTA (start ns, end ns, wait ns) of one traced kernel -> span and mean CTA wait in us, and the
    share of CTA-time spent waiting."""
    starts = [r[0] for r in cta_rows]
    ends = [r[1] for r in cta_rows]
    span_ns = max(ends) - min(starts)
    waits = [max(0, r[2]) for r in cta_rows]
    cta_time = math.fsum(max(0, e - s) for s, e, _ in cta_rows)
    return {"span_us": span_ns / 1e3, "wait_us": statistics.fmean(waits) / 1e3,
            "wait_share": math.fsum(waits) / cta_time if cta_time > 0 else 0.0}


def ladder(e2e_median_us: dict[str, float]) -> dict:
    """The ablation ladder: bsp -> bsp-graph removes the launch tax; -> best fused removes the others."""
    out = {}
    # tp-mlp names its rungs all-bsp, all-graph and all-fused*
    bsp = e2e_median_us.get("bsp", e2e_median_us.get("all-bsp"))
    graph = e2e_median_us.get("bsp-graph", e2e_median_us.get("all-graph"))
    fused = {v: t for v, t in e2e_median_us.items() if is_fused(v) and t is not None}
    if bsp is not None and graph is not None:
        out["launch_us"] = bsp - graph
    if graph is not None and fused:
        best = min(fused, key=fused.get)
        out["best_fused"] = best
        out["bsync_and_locality_us"] = graph - fused[best]
    return out
