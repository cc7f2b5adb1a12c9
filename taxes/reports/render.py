"""Render result documents: terminal (rich, taxes.reports.terminal), Markdown (taxes.reports.markdown), JSON
(the document with its report: here), HTML (jinja2, taxes.reports.html); a caller picks one by format here.

Every view reads the same way, verdict first:
1. a title naming the workload(s) and the machine (GPU names, world), and marks that change how to read
   the numbers: EMULATED (the kernels ran under Triton's interpreter: times mean nothing), PREDICTED (a
   model document), PERTURBED (measuring cost more than PERTURBED, 3%, of a variant's plain E2E);
2. the summary, one table even 80 columns wide: per case the best variant with its E2E, its speed-up
   against bsp and against bsp-graph, its fraction of the floor, its largest costs whatever their kind (a
   tax, host-bound time, inefficiency, ...), and the measurement's checks, failed ones in colour and listed
   under it;
3. the details per case: one E2E per variant, its statistic named (the interquartile mean of the plain
   iterations, `plain_e2e_us`, else `e2e_us.iqm`; a model's prediction), [p10-p90] its spread; measured
   variants add what their rows add up to (`attributed_e2e_us`, the instrumented iterations) and the
   measurement cost between the two; then the rows, the taxes, the model, the speed-ups, correctness;
   floors, the ablation ladder, per-rank rows, and the checks.

What every view shows first is read in taxes.reports.verdict, the tables after it in taxes.reports.rows
and taxes.reports.analysis.

Strings from documents reach every output through taxes.sanitize (terminal, Markdown) or jinja2's
autoescape (HTML).
"""

from __future__ import annotations

from taxes.method import STATISTIC
from taxes.reports.plots import overall_components
from taxes.reports.verdict import (
    baseline,
    best_variant,
    checks_by_case,
    costs,
    e2e_of,
    labels_of,
    marks,
    perturbed,
    shape_text,
    tax_values,
    title,
)

# The views by format, for the command line, which picks one of them per run
from taxes.reports.html import render_html  # noqa: F401
from taxes.reports.markdown import render_markdown  # noqa: F401
from taxes.reports.terminal import render_terminal  # noqa: F401

# ---- JSON: the document and its report --------------------------------------------------------------


def summary(doc: dict) -> dict:
    """What the views show, as data: the title, the marks, and per case and variant the E2E (its
    statistic named), the rows, the taxes, the speed-ups and the verdict."""
    cases = []
    checks = checks_by_case(doc)
    for case in doc["cases"]:
        bsp, graph = baseline(case, "bsp"), baseline(case, "graph")
        best = best_variant(case)
        variants = []
        for v in case["variants"]:
            oc = overall_components(v)
            e2e = e2e_of(v)
            variants.append({
                "variant": v["variant"], "e2e_us": e2e,
                "statistic": "predicted" if v["e2e_us"].get("label") == "predicted" else STATISTIC,
                "p10_us": v["e2e_us"].get("p10"), "p90_us": v["e2e_us"].get("p90"),
                "attributed_e2e_us": v.get("attributed_e2e_us"), "measurement_cost_us": v.get("measurement_cost_us"),
                "perturbed": perturbed(v), "rows_available": (v.get("attribution") or {}).get("available", bool(oc)),
                "components_us": oc, "labels": labels_of(v), "taxes_us": tax_values(v),
                "speedup_vs_bsp": (bsp / e2e) if bsp and e2e else None,
                "speedup_vs_bsp_graph": (graph / e2e) if graph and e2e else None,
                "correct": v["correctness"].get("passed"),
            })
        frame = checks.get((case["workload"], shape_text(case)))
        cases.append({k: case[k] for k in ("workload", "shape", "world", "dtype")} | {
            "best_variant": best["variant"] if best else None,
            "best_largest_costs_us": [{"cost": n, "us": x} for n, x in costs(best)] if best else [],
            "checks_failed": int((~frame["ok"]).sum()) if frame is not None else 0,
            "checks": int(len(frame)) if frame is not None else 0,
            "variants": variants})
    return {"title": title(doc), "marks": [m for m, _ in marks(doc)], "statistic": STATISTIC, "cases": cases}


def render_json(doc: dict) -> str:
    """The document itself (valid against taxes/schema/result-v1.json, so it loads back) with its report
    under "report"."""
    from taxes.documents.results import dumps

    out = {k: v for k, v in doc.items() if k != "report"} | {"report": summary(doc)}
    return dumps(out)
