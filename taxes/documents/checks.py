"""The measurement's own checks: does a result document meet them? (docs/method.md)

Functions from a result document to a pandas DataFrame, one row per check and case (and variant), with the
value, the reference, the signed error, the limit and whether it holds. Nothing here measures: every value
is read or derived from what the document stores, so the checks of a committed document can be redone on
any machine.

- closure: the overall rows add up to attributed_e2e_us (the E2E printed above them); limit 0.1%.
- measurement: measurement cost / plain E2E (interquartile means); limit PERTURBED, 3% (over it: perturbed). Its
  cause is named: how far apart the plain iterations' own rounds lie (a cost inside that is the run's noise),
  and with several ranks the quickest rank's own change, against the change of the ranks' spread.
- unattributed: unattributed / attributed E2E, with its sign; limit 5% either way. A miss is a finding
  about the method, never a reason to move time into a tax; its cause is named where the rows show it
  (the locality estimate, priced from bytes, is time the kernels already spent).
- ladder: per bsp variant and its graph twin, launch + host_bound from the timeline (bsp minus graph)
  against the plain E2E ladder (bsp minus graph); limit 20% of the ladder's. A ladder <= 0 fails.
"""

from __future__ import annotations

import math

import pandas as pd

from taxes.method import PERTURBED, round_sizes
from taxes.documents.results import rows_state

COLUMNS = ["check", "workload", "shape", "variant", "where", "value", "reference", "error", "limit", "ok", "cause"]


def limits() -> dict[str, float]:
    """Each check's limit; the measurement's is the method's PERTURBED, so a perturbed variant fails it."""
    return {"closure": 0.001, "measurement": PERTURBED, "unattributed": 0.05, "ladder": 0.20}


def _shape(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def _overall(var: dict) -> dict:
    return {c["name"]: c["value_us"] for c in var.get("components", []) if c["rank"] is None}


def _row(check, case, variant, where, value, reference, error, signed: bool = True) -> dict:
    limit = limits()[check]
    ok = error is not None and math.isfinite(error) and (abs(error) <= limit if signed else error <= limit)
    return {"check": check, "workload": case["workload"], "shape": _shape(case), "variant": variant, "where": where,
            "value": value, "reference": reference, "error": error, "limit": limit, "ok": bool(ok), "cause": ""}


def case_checks(case: dict, rounds: int = 1) -> list[dict]:
    """rounds: how many interleaved rounds the iterations were taken in (the document's metadata)."""
    rows = []
    by_name = {v["variant"]: v for v in case["variants"]}
    for v in case["variants"]:
        att = v.get("attribution") or {}
        e2e = v.get("attributed_e2e_us")
        if not att.get("available") or not e2e:
            continue
        oc = _overall(v)
        total = math.fsum(oc.values())
        rows.append(_row("closure", case, v["variant"], "overall rows", total, e2e, total / e2e - 1))
        plain, cost = v.get("plain_e2e_us"), v.get("measurement_cost_us")
        if plain and cost is not None:
            r = _row("measurement", case, v["variant"], f"clock {att.get('clock')}", e2e, plain, cost / plain,
                     signed=False)
            r["cause"] = measurement_cause(v, rounds) if not r["ok"] else ""
            rows.append(r)
        r = _row("unattributed", case, v["variant"], "overall", oc.get("unattributed"), e2e,
                 oc.get("unattributed", 0.0) / e2e)
        r["cause"] = unattributed_cause(oc, e2e, floors_beyond_step(v)) if not r["ok"] else ""
        rows.append(r)
    for pair in ((case.get("extra") or {}).get("ladder") or {}).get("pairs", []):
        if "timeline_us" not in pair:
            continue
        ladder, timeline = pair["plain_us"], pair["timeline_us"]
        err = (timeline - ladder) / ladder if ladder > 0 else None
        r = _row("ladder", case, pair["bsp"], f"{pair['bsp']} - {pair['graph']}: launch + host_bound", timeline, ladder, err)
        r["cause"] = ladder_cause(pair, case) if not r["ok"] else ""
        rows.append(r)
    return rows


def round_spread(var: dict, rounds: int) -> tuple[float, list[float]] | None:
    """How far apart the plain iterations' rounds lie: (max - min of the rounds' IQMs, the IQMs), E2E per
    iteration the slowest rank's; None for one round or too few iterations. The rounds split the iterations
    as the harness took them (taxes.method.round_sizes)."""
    plain = var.get("samples_us") or []
    if rounds < 2 or not plain or not all(plain):
        return None
    from taxes.attribution.attribute import iqm

    e2e = [max(x) for x in zip(*plain)]
    n = len(e2e)
    sizes = round_sizes(n, rounds)
    if min(sizes) < 4:
        return None
    at, means = 0, []
    for k in sizes:
        means.append(iqm(e2e[at:at + k]))
        at += k
    return max(means) - min(means), means


def measurement_cause(var: dict, rounds: int = 1) -> str:
    """Why a measurement cost is over the limit: the run's own noise first (how far apart the plain rounds
    lie), then, where the records are kept, where the clock's time went (measurement_split)."""
    noise = ""
    spread = round_spread(var, rounds)
    cost = var.get("measurement_cost_us")
    if spread is not None:
        width, means = spread
        noise = (f"the plain iterations' own rounds lie {width:.1f} us apart (IQMs "
                 + ", ".join(f"{m:.1f}" for m in means) + " us)")
        if cost is not None and width >= abs(cost):
            noise += f", more than the {cost:+.1f} us measured: the cost is within the run's own noise"
    split = measurement_split(var)
    return "; ".join(x for x in (noise, split) if x)


def measurement_split(var: dict) -> str:
    """Where measuring cost its time, from the per-rank E2E of the plain and the instrumented iterations (the
    document keeps both): an iteration's E2E is its slowest rank's, and with several ranks the slowest is the
    one that began first after the barrier, so E2E holds the ranks' spread (slowest minus quickest rank, most
    of it the barrier's exit skew). The cost splits into what the quickest rank's own E2E moved (the clock's
    cost on that rank's device and host) and what the spread moved (the harness, under the clock)."""
    plain = var.get("samples_us") or []
    ranks = ((var.get("records") or {}).get("ranks")) or []
    inst = var.get("instrumented_samples_us") or \
        [[it.get("e2e_us") for it in r.get("iterations", []) if not it.get("warmup")] for r in ranks]
    if not plain or len(inst) != len(plain) or not all(inst) or any(x is None for r in inst for x in r):
        return ""
    from taxes.attribution.attribute import iqm

    def stats(per_rank):
        its = list(zip(*per_rank))
        return iqm([min(x) for x in its]), iqm([max(x) - min(x) for x in its])

    (q_plain, s_plain), (q_inst, s_inst) = stats(plain), stats(inst)
    # a fused kernel's traced build timed without the clock (the document keeps it per rank): the cost splits
    # into what the build's stamps cost and what the clock costs
    traced = var.get("traced_samples_us") or []
    clock_part, parts = q_inst - q_plain, ""
    if traced and len(traced) == len(plain) and all(traced) and len({len(r) for r in traced}) == 1:
        q_traced = stats(traced)[0]
        clock_part = q_inst - q_traced
        parts = (f" (the traced build alone, without the clock, {q_traced - q_plain:+.1f} us; the clock "
                 f"{clock_part:+.1f} us)")
    kernels = _kernels_per_iteration(ranks[0]) if ranks else 0
    per = ""
    if kernels:
        each = clock_part / kernels
        why = ("about what CUPTI's timing of each kernel costs" if abs(each) <= 2.0 else
               "more than CUPTI's timing of each kernel explains")
        per = (f" ({each:+.1f} us of the clock for each of the {kernels} kernels an iteration runs: {why}, about "
               "1 us a kernel on an H100)")
    if len(plain) < 2:
        return f"the E2E moved {q_inst - q_plain:+.1f} us under the clock{parts}{per}"
    return (f"the quickest rank's E2E moved {q_inst - q_plain:+.1f} us under the clock{parts}{per}; the ranks' "
            f"spread (slowest minus quickest) went from {s_plain:.1f} to {s_inst:.1f} us")


def _kernels_per_iteration(rank: dict) -> int:
    """Device activities per timed iteration in one rank's stored records (0 when unknown)."""
    from taxes.traces.records import assemble, raw_from_columns

    try:
        tl = assemble(0, raw_from_columns(rank))
    except Exception:  # records of an older form: no count, no figure
        return 0
    return round(len(tl.activities) / len(tl.windows)) if len(tl.windows) else 0


def floors_beyond_step(var: dict) -> float:
    """How much more the variant's phases' own floors add up to than its step's floor, us per iteration (0 when
    the document keeps no phase floors): each phase is priced at its own bound (compute or HBM), the step at
    the larger of its totals, as if its memory-bound phases overlapped its compute-bound ones. The rows count
    each kernel's time as its phase's floor plus inefficiency, so that much of it is in no row."""
    floors = (var.get("attribution") or {}).get("phase_floors_us") or {}
    ideal = (var.get("floor") or {}).get("ideal_us")
    if not floors or ideal is None:
        return 0.0
    return max(0.0, math.fsum(floors.values()) - ideal)


def unattributed_cause(rows: dict, e2e_us: float, floors_beyond_us: float = 0.0) -> str:
    """Why the rows do not add up to the E2E without an unattributed remainder, where the document shows it.
    Two derived rows price the same time differently from the kernels: the locality estimate is priced from
    bytes, never capped, and the intermediate's HBM traffic it prices is time the kernels already spent
    (inside ideal + inefficiency): counted twice, it leaves unattributed at minus its size; and the phases'
    own floors beyond the step's floor (floors_beyond_step) are kernel time in no row: plus their excess."""
    un, loc = rows.get("unattributed", 0.0), rows.get("locality", 0.0)
    rest = un + loc - floors_beyond_us
    close = abs(rest) <= max(0.01 * e2e_us, 0.5)
    floors = (f"the phases' own floors add up to {floors_beyond_us:.1f} us more than the step's floor (each priced at "
              "its own bound, the step at the larger of its totals)")
    if un < 0 and loc > 0:
        what = (f"the locality estimate ({loc:.1f} us, priced from bytes) is kernel time the rows already count"
                + (f", and {floors}" if floors_beyond_us > 0 else ""))
        if close:
            how = "the second less the first" if floors_beyond_us > 0 else "minus it"
            return f"{what}: unattributed is {how} to {rest:+.1f} us"
        return f"{what}; {rest:+.1f} us beyond {'them' if floors_beyond_us > 0 else 'it'} unexplained"
    if floors_beyond_us > 0 and close:
        return f"{floors}: unattributed is that, less the locality estimate ({loc:.1f} us), to {rest:+.1f} us"
    return "unexplained"


def ladder_cause(pair: dict, case: dict | None = None) -> str:
    """Why the timeline and the plain ladder disagree, where the document shows it. Both decompose exactly
    into measured parts: the instrumented runs' ladder (the runs the timeline comes from) is the change of
    every row from bsp to its graph, so beyond launch + host_bound it is the change of the others (the graph
    moved them too); the plain ladder is the instrumented one less the change of measurement cost (bsp's
    minus the graph's)."""
    inst = pair.get("instrumented_us")
    if inst is None:
        return "unexplained"
    by = {v["variant"]: v for v in (case or {}).get("variants", [])}
    b, g = by.get(pair["bsp"]), by.get(pair["graph"])
    if inst <= 0 and pair["plain_us"] <= 0:
        moved = _other_rows_moved(b, g)
        return (f"the graph is no faster than {pair['bsp']} here (plain ladder {pair['plain_us']:+.1f} us, instrumented "
                f"{inst:+.1f} us): there was no launch time for it to remove"
                + (f"; the timeline's {pair['timeline_us']:.1f} us of launch + host_bound is offset by the other rows "
                   f"({pair['bsp']} minus {pair['graph']}: {moved})" if moved else ""))
    if inst <= 0:
        return "unexplained"
    agree = (pair["timeline_us"] - inst) / inst
    spread = max(pair.get("plain_spread_us") or [0.0])
    costs = ""
    if b and g and b.get("measurement_cost_us") is not None and g.get("measurement_cost_us") is not None:
        costs = (f"; the measurement costs ({pair['bsp']} {b['measurement_cost_us']:+.1f} us, {pair['graph']} "
                 f"{g['measurement_cost_us']:+.1f} us) make the plain ladder {pair['plain_us'] - inst:+.1f} us from it")
    if abs(agree) <= limits()["ladder"]:
        tail = costs or (f"; the plain ladder differs from it by {pair['plain_us'] - inst:+.1f} us: run-to-run variance "
                         "or measurement cost")
        return (f"the timeline agrees with the instrumented runs' ladder ({inst:.1f} us, {100 * agree:+.1f}%){tail} "
                f"(the plain runs' p10-p90 spread is up to {spread:.1f} us)")
    moved = _other_rows_moved(b, g)
    if not moved:
        return f"unexplained: the instrumented runs' ladder is {inst:.1f} us ({100 * agree:+.1f}% from the timeline)"
    return (f"the graph moved other rows too ({pair['bsp']} minus {pair['graph']}: {moved}): with launch + host_bound "
            f"they make the instrumented runs' ladder ({inst:.1f} us){costs}")


def _other_rows_moved(b: dict | None, g: dict | None, top: int = 3) -> str:
    """The rows other than launch and host_bound that changed most from a bsp variant to its graph (bsp minus
    graph, us), from their overall rows; '' without rows."""
    if not b or not g:
        return ""
    rb, rg = _overall(b), _overall(g)
    if not rb or not rg:
        return ""
    d = {k: rb.get(k, 0.0) - rg.get(k, 0.0) for k in set(rb) | set(rg) if k not in ("launch", "host_bound")}
    big = sorted((k for k in d if abs(d[k]) >= 0.05), key=lambda k: -abs(d[k]))[:top]
    return ", ".join(f"{k} {d[k]:+.1f} us" for k in big)


def checks_frame(doc: dict) -> pd.DataFrame:
    """Every check of every case, one row each (COLUMNS); `ok` is boolean even when there are no rows, so
    frames of several documents concatenate into one whose `ok` still negates as booleans."""
    rounds = int((doc.get("metadata") or {}).get("rounds") or 1)
    rows = [row for case in doc["cases"] for row in case_checks(case, rounds)]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"ok": bool})


def all_checks(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """The checks of several documents as one frame (COLUMNS, `ok` boolean)."""
    frames = [f for f in frames if not f.empty]
    if not frames:
        return checks_frame({"cases": []})
    return pd.concat(frames, ignore_index=True).astype({"ok": bool})


def checks_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per check: how many rows hold, of how many, and the worst error (signed)."""
    out = []
    for check, grp in frame.groupby("check", sort=False):
        errs = grp["error"].dropna()
        worst = errs.loc[errs.abs().idxmax()] if len(errs) else None
        out.append({"check": check, "limit": limits()[check], "ok": int(grp["ok"].sum()), "of": len(grp),
                    "worst_error": worst})
    return pd.DataFrame(out, columns=["check", "limit", "ok", "of", "worst_error"])


def provenance_problems(doc: dict) -> list[str]:
    """What makes a document unfit for --strict: a dirty tree, or measured variants without rows."""
    meta = doc.get("metadata", {})
    out = []
    if meta.get("git_dirty"):
        out.append("made from a checkout with uncommitted changes")
    if meta.get("kind") == "profile" and meta.get("source") != "trace":
        # a peer (someone else's implementation) is timed plain by design: it has no rows to miss
        missing = [v["variant"] for c in doc["cases"] for v in c["variants"]
                   if v.get("samples_us") and rows_state(v) not in ("shown", "timed plain")]
        if missing:
            out.append(f"{len(missing)} variant(s) without rows ({', '.join(sorted(set(missing))[:4])})")
    return out
