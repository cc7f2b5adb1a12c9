"""The details of a result document as tables (header, rows of strings), the same for every view: per
case the attribution table (one E2E per variant, its statistic named, the rows, the taxes, the model, the
speed-ups, correctness), the floor, the ablation ladder, the per-rank rows; the checks; the metadata line."""

from __future__ import annotations

import math

from taxes.method import TAXES
from taxes.documents.results import rows_state
from taxes.reports.plots import COMPONENT_TITLES, COMPONENTS, case_title, overall_components
from taxes.reports.verdict import (
    baseline,
    e2e_of,
    floor_fraction,
    fraction_text,
    labels_of,
    number_text,
    perturbed,
    ratio_text,
    tax_values,
)
from taxes.sanitize import printable

LABEL_MARK = {"measured": "m", "derived": "d", "predicted": "p"}
E2E_ROW = "E2E: interquartile mean [p10-p90]"
E2E_ROW_MODEL = "E2E: predicted"
LEGEND = ("labels: m measured, d derived, p predicted; times in us per iteration; E2E is the interquartile mean "
          "(the mean of the iterations ranked between the 25th and 75th percentile) of the plain iterations, "
          "[p10-p90] their 10th and 90th percentiles")
LEGEND_MODEL = "labels: p predicted, d derived; times in us per iteration, predicted from shapes and the hardware profile"
ROWS_CELL = {"shown": "shown", "older rules": "not available (older rules)",
             "timed plain": "none (someone else's implementation, timed plain)",
             "none": "none (failed, or no instrumented records)"}



def case_rows(case: dict) -> tuple[list[str], list[list[str]]]:
    """The attribution table of one case: a header and rows of strings, one column per variant. The first
    row is the E2E every ratio uses, its statistic named; rows of a measured variant add up to the
    instrumented E2E printed below it, and the measurement cost is the difference between the two."""
    variants = case["variants"]
    header = ["us per iteration"] + [v["variant"] for v in variants]
    rows = []

    def e2e_cell(v):
        e, val = v["e2e_us"], e2e_of(v)
        spread = f" [{number_text(e.get('p10'))}-{number_text(e.get('p90'))}]" if e.get("p10") is not None and e.get("p90") is not None else ""
        return f"{number_text(val)}{spread} {LABEL_MARK[e['label']]}"

    predicted = all(v["e2e_us"]["label"] == "predicted" for v in variants) and variants
    rows.append([E2E_ROW_MODEL if predicted else E2E_ROW] + [e2e_cell(v) for v in variants])
    if any(v.get("attributed_e2e_us") is not None for v in variants):
        rows.append(["rows add up to (instrumented E2E)"] + [
            f"{number_text(v['attributed_e2e_us'])} m" if v.get("attributed_e2e_us") is not None else "-" for v in variants])

        def cost_cell(v):
            c, p = v.get("measurement_cost_us"), v.get("plain_e2e_us")
            if c is None or not p:
                return "-"
            return f"{c:+,.1f} ({100 * c / p:+.1f}%)" + (" PERTURBED" if perturbed(v) else "")
        rows.append(["measurement cost (instrumented - plain)"] + [cost_cell(v) for v in variants])
    core = ("ideal", "launch", "sync_wait", "exposed_transfer", "locality", "inefficiency", "unattributed")
    has = any(overall_components(v) for v in variants)
    present = [c for c in COMPONENTS if has and (c in core or any(abs(overall_components(v).get(c, 0.0)) > 0
                                                                  for v in variants))]
    for comp in present:
        cells = []
        for v in variants:
            val = overall_components(v).get(comp)
            cells.append("-" if val is None else f"{number_text(val)} {LABEL_MARK.get(labels_of(v).get(comp), '?')}")
        rows.append([COMPONENT_TITLES[comp]] + cells)
    if present:
        for tax in TAXES:
            rows.append([f"= {tax} tax"] + [number_text(tax_values(v)[tax]) if overall_components(v) else "-" for v in variants])
    if any(rows_state(v) != "shown" for v in variants):
        rows.append(["rows"] + [ROWS_CELL[rows_state(v)] for v in variants])
    if any(v.get("prediction") for v in variants):
        def pred_cell(v):
            pr, med = v.get("prediction"), e2e_of(v)
            if not pr:
                return "-"
            err = f" ({100 * (pr['e2e_us'] - med) / med:+.0f}%)" if med else ""
            return f"{number_text(pr['e2e_us'])} p{err}"
        rows.append(["model E2E (error)"] + [pred_cell(v) for v in variants])
    for rung, name in (("bsp", "speed-up vs bsp"), ("graph", "speed-up vs bsp-graph")):
        base = baseline(case, rung)
        if base:
            rows.append([name] + [ratio_text(base, v) for v in variants])
    if any(floor_fraction(v) is not None for v in variants):
        rows.append(["of the floor (T_ideal / E2E)"] + [fraction_text(v) for v in variants])
    if any(v["correctness"].get("checked") for v in variants):
        rows.append(["correct (rel. error)"] + [_correct_cell(v["correctness"]) for v in variants])
    return header, rows


def _correct_cell(c: dict) -> str:
    if not c.get("checked"):
        return "not checked"
    err = c.get("rel_error")
    word = "yes" if c.get("passed") else "NO"
    return f"{word} ({err:.1e})" if err is not None else word


def floor_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    if not all("floor" in v for v in case["variants"]) or not case["variants"]:
        return None
    f = case["variants"][0]["floor"]
    return (["floor", "us"], [["T_compute", number_text(f["compute_us"])], ["T_hbm", number_text(f["hbm_us"])],
                              ["T_link", number_text(f["link_us"])], ["T_ideal = max", number_text(f["ideal_us"])]])


def per_rank_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """Per-rank components (measured documents), one row per (variant, rank)."""
    rows = []
    for v in case["variants"]:
        ranks = sorted({c["rank"] for c in v["components"] if c["rank"] is not None})
        for r in ranks:
            vals = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] == r}
            rows.append([v["variant"], str(r)] + [number_text(vals.get(c)) for c in COMPONENTS])
    if not rows:
        return None
    return ["variant", "rank"] + [COMPONENT_TITLES[c] for c in COMPONENTS], rows


def ladder_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """The ablation ladder beside the timeline: two measures of what a graph removes, which should agree."""
    lad = (case.get("extra") or {}).get("ladder") or {}
    rows = []
    for p in lad.get("pairs", []) if isinstance(lad.get("pairs"), list) else []:
        if not isinstance(p, dict) or not {"bsp", "graph", "plain_us"} <= set(p):
            continue
        rows.append([f"E2E({p['bsp']}) - E2E({p['graph']}), plain (derived)", number_text(finite_number(p["plain_us"]))])
        if p.get("timeline_us") is not None:
            rows.append([f"launch + host_bound of {p['bsp']} minus {p['graph']}'s, timeline (measured)",
                         number_text(finite_number(p["timeline_us"]))])
            rows.append([f"{p['graph']}: its replay's launch and the gaps inside it (a graph keeps these)",
                         number_text(finite_number(p.get("graph_residual_us")))])
    if "fused_vs_graph_us" in lad:
        rows.append([f"E2E(best graph) - E2E({lad.get('best_fused')}), plain (derived)", number_text(finite_number(lad["fused_vs_graph_us"]))])
    return (["ablation ladder", "us"], rows) if rows else None


def finite_number(x) -> float | None:
    """A number from a free-form part of a document (case.extra), or None."""
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def pct(x) -> str:
    """A signed fraction as a percentage; '-' for none."""
    return "-" if x is None or x != x else f"{100 * x:+.1f}%"


def checks_summary_rows(frame, title: str = "check") -> tuple[list[str], list[list[str]]]:
    """One row per check of a taxes.documents.checks frame: its limit, how many rows hold, the worst error."""
    from taxes.documents.checks import checks_summary

    rows = [[r.check, f"{100 * r.limit:.1f}%", f"{r.ok} of {r.of}" + ("" if r.ok == r.of else " FAIL"),
             pct(r.worst_error)] for r in checks_summary(frame).itertuples()]
    return [title, "limit", "holds", "worst error"], rows


def checks_rows(doc: dict) -> tuple[list[str], list[list[str]]] | None:
    """The method's checks (taxes/documents/checks.py) over the whole document: one row per check."""
    if doc["metadata"].get("kind") != "profile":
        return None
    from taxes.documents.checks import checks_frame

    frame = checks_frame(doc)
    if frame.empty:
        return None
    return checks_summary_rows(frame, "check (taxes check lists every row)")


VERSIONS = (("torch", "torch_version"), ("triton", "triton_version"), ("CUDA", "cuda_version"), ("NCCL", "nccl_version"))


def versions_text(meta: dict) -> str:
    """The versions the measurement ran under, those the document records ('torch 2.6.0, CUDA 12.4'), and
    which it does not record; never 'None'."""
    known = [f"{name} {meta[key]}" for name, key in VERSIONS if meta.get(key) not in (None, "")]
    missing = [name for name, key in VERSIONS if meta.get(key) in (None, "")]
    where = "the traces" if meta.get("source") == "trace" else "the document"
    return ", ".join(known + ([f"{' and '.join(missing)} not recorded in {where}"] if missing else []))


def meta_line(doc: dict) -> str:
    m = doc["metadata"]
    gpus = ", ".join(str(g) for g in (m.get("gpu_names") or [])) or "no GPU"
    commit = str(m.get("git_commit") or "unknown")[:10] + (" + uncommitted changes" if m.get("git_dirty") else "")
    return printable(f"{m['kind']} by taxes {m['tool_version']} (commit {commit}), {m.get('date', '?')}; hardware "
                     f"profile {m['hardware_profile']}; world {m['world_size']}; {gpus}; {versions_text(m)}"
                     + (f"; iterations start: {m['iteration_start'].get('mode')}"
                        if isinstance(m.get("iteration_start"), dict) else ""))


def sections(doc: dict) -> list[tuple[str, list[tuple[str | None, list[str], list[list[str]]]]]]:
    """The details after the summary: per case (title, [(table title, header, rows)])."""
    out = []
    for case in doc["cases"]:
        tables = [(None, *case_rows(case))]
        for title_, fn in (("floor", floor_rows), ("ablation ladder", ladder_rows), ("per rank", per_rank_rows)):
            t = fn(case)
            if t:
                tables.append((title_, *t))
        out.append((case_title(case), tables))
    return out
