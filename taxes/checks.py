"""The measurement's own checks (../shared/METHOD.md, issue 5): does a result document meet them?

Functions from a result document to a pandas DataFrame, one row per check and case (and variant or
phase), with the measured value, the limit and whether it holds. Nothing here measures: every value is
read or derived from what the document stores, so the checks of a committed document can be redone on
any machine.

- unattributed: |unattributed| / E2E of the overall (slowest) rank, per variant; limit 5%.
- instrumented: (instrumented E2E - plain E2E) / plain E2E (medians), per variant; limit 2% either way.
- launch: the launch tax the ablation ladder removes, E2E(bsp) - E2E(bsp-graph), against the timeline's,
  launch(bsp) - launch(bsp-graph) (the graph's residual gaps are what a graph cannot remove, METHOD.md),
  per case; limit 20% of the ladder's. Both from the same runs: the timeline exists only in the
  instrumented ones, whose event records are host time between eager launches that the plain runs
  lack (the instrumented check measures that), so the ladder here is of instrumented E2E medians; the
  plain runs' ladder is shown beside it. A ladder <= 0 (the graph no faster) fails.
- profiler: per eager phase and rank, the device events' busy time (the phase less its host-bound part)
  against the span of the kernels CUPTI recorded for it in the same iterations; limit 5% of CUPTI's.
"""

from __future__ import annotations

import pandas as pd

from taxes.attribution import GRAPH_OF

LIMITS = {"unattributed": 0.05, "instrumented": 0.02, "launch": 0.20, "profiler": 0.05}
COLUMNS = ["check", "workload", "shape", "variant", "where", "value", "reference", "error", "limit", "ok"]


def _shape(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def _overall(var: dict) -> dict:
    return {c["name"]: c["value_us"] for c in var.get("components", []) if c["rank"] is None}


def _row(check, case, variant, where, value, reference, error) -> dict:
    limit = LIMITS[check]
    return {"check": check, "workload": case["workload"], "shape": _shape(case), "variant": variant, "where": where,
            "value": value, "reference": reference, "error": error, "limit": limit,
            "ok": error is not None and abs(error) <= limit}


def case_checks(case: dict) -> list[dict]:
    rows = []
    by_name = {v["variant"]: v for v in case["variants"]}
    for v in case["variants"]:
        att = v.get("attribution") or {}
        med = v["e2e_us"].get("median")
        if not att or not med:
            continue
        oc = _overall(v)
        # reference: the E2E the overall components add up to (the instrumented runs' mean)
        rows.append(_row("unattributed", case, v["variant"], "overall", oc.get("unattributed"), sum(oc.values()),
                         att.get("unattributed_share")))
        ins = att.get("instrumented_e2e_us")
        if ins is not None:
            rows.append(_row("instrumented", case, v["variant"], "E2E", ins, med, ins / med - 1))
    for bsp, graph in GRAPH_OF.items():
        b, g = by_name.get(bsp), by_name.get(graph)
        if not (b and g and b.get("attribution") and g.get("attribution")):
            continue
        ib, ig = b["attribution"].get("instrumented_e2e_us"), g["attribution"].get("instrumented_e2e_us")
        if ib is None or ig is None:
            continue
        ladder = ib - ig  # the same (instrumented) runs the timeline comes from
        plain = b["e2e_us"]["median"] - g["e2e_us"]["median"]
        timeline = _overall(b).get("launch", 0.0) - _overall(g).get("launch", 0.0)
        err = (timeline - ladder) / ladder if ladder > 0 else None
        rows.append(_row("launch", case, bsp, f"{bsp} - {graph} (plain runs' ladder {plain:.1f} us)", timeline,
                         ladder, err))
    for r, per_variant in enumerate((case.get("extra") or {}).get("profiler_check") or []):
        for variant, phases in per_variant.items():
            for phase, d in phases.items():
                ev = d.get("events_busy_us", d["events_us"])
                cupti = d["cupti_us"]
                rows.append(_row("profiler", case, variant, f"rank {r} {phase}", ev, cupti,
                                 (ev - cupti) / cupti if cupti > 0 else None))
    return rows


def checks_frame(doc: dict) -> pd.DataFrame:
    """Every check of every case, one row each (COLUMNS)."""
    rows = [row for case in doc["cases"] for row in case_checks(case)]
    return pd.DataFrame(rows, columns=COLUMNS)


def checks_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per check: how many rows hold, of how many, and the worst error (signed)."""
    out = []
    for check, grp in frame.groupby("check", sort=False):
        errs = grp["error"].dropna()
        worst = errs.loc[errs.abs().idxmax()] if len(errs) else None
        out.append({"check": check, "limit": LIMITS[check], "ok": int(grp["ok"].sum()), "of": len(grp),
                    "worst_error": worst})
    return pd.DataFrame(out, columns=["check", "limit", "ok", "of", "worst_error"])
