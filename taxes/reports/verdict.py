"""What every view of a result document shows first, read from the document: each variant's E2E, the
best variant, the baselines, the marks that change how the numbers read (EMULATED, PREDICTED, PERTURBED,
NO ROWS, DIRTY), the title, the largest costs and the summary table with its checks."""

from __future__ import annotations

import math

from taxes.method import PERTURBED, TAXES
from taxes.documents.results import rows_state
from taxes.reports.plots import overall_components
from taxes.variants import lookup

MATTER_SHARE = 0.02  # a tax worth naming in the summary: at least this share of the variant's E2E


def e2e_of(v: dict) -> float | None:
    """The E2E a view prints for a variant: the plain interquartile mean (older documents: from their
    samples), or the model's prediction."""
    if v.get("plain_e2e_us") is not None:
        return v["plain_e2e_us"]
    e = v.get("e2e_us") or {}
    return e.get("iqm", e.get("median"))


def baseline(case: dict, rung: str) -> float | None:
    """The E2E of the case's bsp (rung "bsp") or graph (rung "graph") variant."""
    v = baseline_variant(case, rung)
    return e2e_of(v) if v is not None else None


def baseline_variant(case: dict, rung: str) -> dict | None:
    for v in case["variants"]:
        x = lookup(v["variant"])
        if x is not None and x.rung == rung and v["variant"] in ("bsp", "all-bsp", "bsp-graph", "all-graph"):
            return v
    return None


def usable(v: dict) -> bool:
    """A variant whose E2E counts: it has one, and it did not fail its check or error."""
    return (e2e_of(v) is not None and e2e_of(v) > 0 and v["correctness"].get("passed") is not False
            and not (v.get("config") or {}).get("error"))


def best_variant(case: dict) -> dict | None:
    ok = [v for v in case["variants"] if usable(v)]
    return min(ok, key=e2e_of) if ok else None


def number_text(v: float | None) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def labels_of(var: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in var["components"] if c["rank"] is None}


def tax_values(v: dict) -> dict[str, float]:
    oc = overall_components(v)
    return {t: math.fsum(oc.get(p, 0.0) for p in parts) for t, parts in TAXES.items()} if oc else {}


def is_model(doc: dict) -> bool:
    return doc["metadata"].get("kind") == "model"


def is_emulated(doc: dict) -> bool:
    return bool(doc["metadata"].get("emulated"))


def perturbed(v: dict) -> bool:
    """Measuring cost more than PERTURBED of the plain E2E (the document's flag, or its numbers)."""
    if v.get("perturbed"):
        return True
    c, p = v.get("measurement_cost_us"), v.get("plain_e2e_us")
    return c is not None and bool(p) and c > PERTURBED * p


def machine(doc: dict) -> str:
    """'2 x NVIDIA H200', 'NVIDIA H100, NVIDIA H200', 'emulated CPU ranks' or the model's hardware profile."""
    m = doc["metadata"]
    if is_model(doc):
        return f"{m['hardware_profile']} (model)"
    if is_emulated(doc):
        return "emulated CPU ranks"
    gpus = [str(g) for g in (m.get("gpu_names") or [])]
    if not gpus:
        return "unnamed GPUs"
    if len(set(gpus)) == 1:
        return f"{len(gpus)} x {gpus[0]}"
    return ", ".join(gpus)


def title(doc: dict) -> str:
    """The report's title: the workload(s), the machine and the world."""
    workloads = list(dict.fromkeys(c["workload"] for c in doc["cases"])) or ["no cases"]
    n = len(doc["cases"])
    what = ", ".join(workloads) + (f" ({n} cases)" if n > 1 else "")
    return f"{what} on {machine(doc)}, world {doc['metadata']['world_size']}"


def marks(doc: dict) -> list[tuple[str, str]]:
    """(MARK, what it means) for everything that changes how the numbers read; most important first."""
    out = []
    if is_emulated(doc):
        out.append(("EMULATED", "the kernels ran under Triton's interpreter on CPU ranks: correctness only, "
                                "the times mean nothing"))
    if is_model(doc):
        out.append(("PREDICTED", "every number comes from the analytical model, nothing was measured"))
    hit = [f"{c['workload']} {shape_text(c)} {v['variant']}" for c in doc["cases"] for v in c["variants"] if perturbed(v)]
    if hit:
        out.append(("PERTURBED", f"measuring cost more than {100 * PERTURBED:g}% of plain E2E for {len(hit)} "
                                 f"variant(s): " + ", ".join(hit[:6]) + (" ..." if len(hit) > 6 else "")))
    old = sum(1 for c in doc["cases"] for v in c["variants"] if rows_state(v) == "older rules")
    if old:
        out.append(("NO ROWS", f"{old} variant(s) were measured under attribution rules since replaced: their E2E "
                               "and ratios stand, their rows are not shown"))
    if doc["metadata"].get("git_dirty"):
        out.append(("DIRTY", "made from a checkout with uncommitted changes"))
    return out


def shape_text(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def ratio_text(base: float | None, v: dict) -> str:
    e = e2e_of(v)
    return f"{base / e:.2f}x" if base and e else "-"


# What a variant's time goes to besides its work (the floor, or compute where no floor is known): each tax
# whole, and every other row on its own; the verdict names the largest, whatever its kind.
COST_NAMES = {"host_bound": "host-bound", "sync": "host synchronisation", "compile": "compilation",
              "data_loading": "data loading", "graph_gaps": "gaps inside graph replays", "queued": "queued",
              "start_skew": "ranks' start skew", "inefficiency": "kernel inefficiency", "unattributed": "unattributed"}
WORK_ROWS = ("ideal", "compute")


def costs(v: dict) -> list[tuple[str, float]]:
    """(name, us) of every cost of a variant with rows, largest first: the three taxes (each the sum of its
    rows) and every other row that is not its work (COST_NAMES); those at most 0 left out."""
    oc = overall_components(v)
    if not oc:
        return []
    in_a_tax = {row for parts in TAXES.values() for row in parts}
    out = [(tax, math.fsum(oc.get(r, 0.0) for r in parts)) for tax, parts in TAXES.items()]
    out += [(COST_NAMES.get(row, row), x) for row, x in oc.items() if row not in in_a_tax and row not in WORK_ROWS]
    return sorted(((n, x) for n, x in out if x > 0), key=lambda nx: -nx[1])


def _costs_text(v: dict | None, most: int = 3) -> str:
    """The largest costs of a variant worth naming (at least MATTER_SHARE of its E2E), largest first."""
    if v is None:
        return "-"
    if not overall_components(v):
        return "rows not available" if not (v.get("attribution") or {}).get("available", True) else "-"
    e2e = v.get("attributed_e2e_us") or e2e_of(v)
    big = [(n, x) for n, x in costs(v) if e2e and x >= MATTER_SHARE * e2e][:most]
    return "; ".join(f"{n} {number_text(x)} ({x / e2e:.0%})" for n, x in big) or "none over 2%"


def checks_by_case(doc: dict):
    """{(workload, shape text): frame of its checks} for measured documents (taxes/documents/checks.py)."""
    if doc["metadata"].get("kind") != "profile":
        return {}
    from taxes.documents.checks import checks_frame

    frame = checks_frame(doc)
    return {key: grp for key, grp in frame.groupby(["workload", "shape"], sort=False)} if not frame.empty else {}


def _checks_text(frame) -> tuple[str, bool]:
    """('all 12 hold' | '3 of 12 FAIL', failed?): the failing rows are listed under the summary."""
    if frame is None or frame.empty:
        return "-", False
    bad = frame[~frame["ok"]]
    if bad.empty:
        return f"all {len(frame)} hold", False
    return f"{len(bad)} of {len(frame)} FAIL", True


# Six columns, few long words: one table, read across its row, even 80 columns wide (its text wraps)
SUMMARY_HEADER = ["case", "best variant, its E2E us", "speed-up vs bsp / bsp-graph", "of the floor",
                  "its largest costs (share)", "checks"]


def floor_fraction(v: dict) -> float | None:
    """The floor's share of a variant's E2E (T_ideal / E2E): 1.0 is a variant at the floor."""
    ideal, e2e = (v.get("floor") or {}).get("ideal_us"), e2e_of(v)
    return ideal / e2e if ideal and e2e else None


def fraction_text(v: dict | None) -> str:
    f = floor_fraction(v) if v else None
    return "-" if f is None else f"{f:.2f}"


def summary_rows(doc: dict) -> tuple[list[str], list[list[str]], list[bool]]:
    """The verdict per case: SUMMARY_HEADER, rows of strings, and per row whether a check failed. The best
    variant comes with its E2E (its statistic named) and its largest costs, whatever their kind."""
    checks = checks_by_case(doc)
    rows, failed = [], []
    stat = "predicted" if is_model(doc) else "IQM"
    for case in doc["cases"]:
        best = best_variant(case)
        bsp, graph = baseline_variant(case, "bsp"), baseline_variant(case, "graph")
        check_text, bad = _checks_text(checks.get((case["workload"], shape_text(case))))
        name = f"{case['workload']} " + ", ".join(f"{k}={v}" for k, v in case["shape"].items())
        if best is None:
            rows.append([name, "none usable", "- / -", "-", "-", check_text])
        else:
            rows.append([name, f"{best['variant']}{' PERTURBED' if perturbed(best) else ''} {number_text(e2e_of(best))} ({stat})",
                         _speedups_text(best, bsp, graph), fraction_text(best), _costs_text(best), check_text])
        failed.append(bad)
    # a column nothing fills (no bsp, no rows, no checks) says nothing: leave it out
    keep = [i for i, h in enumerate(SUMMARY_HEADER)
            if i < 2 or any(r[i] not in ("-", "- / -", "rows not available") for r in rows)]
    return [SUMMARY_HEADER[i] for i in keep], [[r[i] for i in keep] for r in rows], failed


def _speedups_text(best: dict, bsp: dict | None, graph: dict | None) -> str:
    """'1.98x / 2.00x': the best variant against bsp, then against bsp-graph ('-' where one is missing)."""
    return f"{ratio_text(e2e_of(bsp) if bsp else None, best)} / {ratio_text(e2e_of(graph) if graph else None, best)}"


def failed_checks(doc: dict) -> list[str]:
    """One line per failing check row."""
    out = []
    for frame in checks_by_case(doc).values():
        for r in frame[~frame["ok"]].itertuples():
            err = "-" if r.error is None or r.error != r.error else f"{100 * r.error:+.1f}%"
            out.append(f"{r.check} {r.workload} {r.shape} {r.variant} ({r.where}): error {err}, limit {100 * r.limit:.1f}%")
    return out
