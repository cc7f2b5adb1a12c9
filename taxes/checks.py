"""The measurement's own checks: does a result document meet them? (docs/method.md)

Functions from a result document to a pandas DataFrame, one row per check and case (and variant), with the
value, the reference, the signed error, the limit and whether it holds. Nothing here measures: every value
is read or derived from what the document stores, so the checks of a committed document can be redone on
any machine.

- closure: the overall rows add up to attributed_e2e_us (the E2E printed above them); limit 0.1%.
- measurement: measurement cost / plain E2E (interquartile means); limit 3% (over it: perturbed).
- unattributed: unattributed / attributed E2E, with its sign; limit 5% either way. A miss is a finding
  about the method, never a reason to move time into a tax.
- ladder: per bsp variant and its graph twin, launch + host_bound from the timeline (bsp minus graph)
  against the plain E2E ladder (bsp minus graph); limit 20% of the ladder's. A ladder <= 0 fails.
"""

from __future__ import annotations

import math

import pandas as pd

from taxes.results import rows_state

LIMITS = {"closure": 0.001, "measurement": 0.03, "unattributed": 0.05, "ladder": 0.20}
COLUMNS = ["check", "workload", "shape", "variant", "where", "value", "reference", "error", "limit", "ok", "cause"]


def _shape(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def _overall(var: dict) -> dict:
    return {c["name"]: c["value_us"] for c in var.get("components", []) if c["rank"] is None}


def _row(check, case, variant, where, value, reference, error, signed: bool = True) -> dict:
    limit = LIMITS[check]
    ok = error is not None and math.isfinite(error) and (abs(error) <= limit if signed else error <= limit)
    return {"check": check, "workload": case["workload"], "shape": _shape(case), "variant": variant, "where": where,
            "value": value, "reference": reference, "error": error, "limit": limit, "ok": bool(ok), "cause": ""}


def case_checks(case: dict) -> list[dict]:
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
            rows.append(_row("measurement", case, v["variant"], f"clock {att.get('clock')}", e2e, plain, cost / plain,
                             signed=False))
        rows.append(_row("unattributed", case, v["variant"], "overall", oc.get("unattributed"), e2e,
                         oc.get("unattributed", 0.0) / e2e))
    for pair in ((case.get("extra") or {}).get("ladder") or {}).get("pairs", []):
        if "timeline_us" not in pair:
            continue
        ladder, timeline = pair["plain_us"], pair["timeline_us"]
        err = (timeline - ladder) / ladder if ladder > 0 else None
        r = _row("ladder", case, pair["bsp"], f"{pair['bsp']} - {pair['graph']}: launch + host_bound", timeline, ladder, err)
        r["cause"] = ladder_cause(pair) if not r["ok"] else ""
        rows.append(r)
    return rows


def ladder_cause(pair: dict) -> str:
    """Why the timeline and the plain ladder disagree, where the document shows it: the instrumented runs'
    own ladder (the runs the timeline comes from) and the plain runs' spread."""
    inst = pair.get("instrumented_us")
    if inst is None or inst <= 0:
        return "unexplained"
    agree = (pair["timeline_us"] - inst) / inst
    spread = max(pair.get("plain_spread_us") or [0.0])
    if abs(agree) <= LIMITS["ladder"]:
        return (f"the timeline agrees with the instrumented runs' ladder ({inst:.1f} us, {100 * agree:+.1f}%); the plain "
                f"ladder differs from it by {pair['plain_us'] - inst:+.1f} us: run-to-run variance (the plain runs' "
                f"p10-p90 spread is up to {spread:.1f} us) or measurement cost")
    return f"unexplained: the instrumented runs' ladder is {inst:.1f} us ({100 * agree:+.1f}% from the timeline)"


def checks_frame(doc: dict) -> pd.DataFrame:
    """Every check of every case, one row each (COLUMNS); `ok` is boolean even when there are no rows, so
    frames of several documents concatenate into one whose `ok` still negates as booleans."""
    rows = [row for case in doc["cases"] for row in case_checks(case)]
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
        out.append({"check": check, "limit": LIMITS[check], "ok": int(grp["ok"].sum()), "of": len(grp),
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
