"""Render result documents: terminal (rich), Markdown, JSON summary, self-contained HTML."""

from __future__ import annotations

import base64
import html
import json

from taxes.attribute import TAXES
from taxes.reports.plots import (
    COMPONENT_TITLES,
    COMPONENTS,
    case_title,
    cta_waits,
    overall_components,
    predicted_vs_measured,
    stacked_bars,
    timeline,
)
from taxes.variants import lookup

LABEL_MARK = {"measured": "m", "derived": "d", "predicted": "p"}
LEGEND = ("labels: m measured, d derived, p predicted; times in us per iteration, interquartile means (the mean of "
          "the iterations ranked between the 25th and 75th percentile), [p10-p90] the spread")


def e2e_of(v: dict) -> float | None:
    """The E2E a view prints for a variant: the plain interquartile mean (older documents: from their
    samples), or the model's prediction."""
    if v.get("plain_e2e_us") is not None:
        return v["plain_e2e_us"]
    e = v.get("e2e_us") or {}
    return e.get("iqm", e.get("median"))


def baseline(case: dict, rung: str) -> float | None:
    """The E2E of the case's bsp (rung "bsp") or graph (rung "graph") variant."""
    for v in case["variants"]:
        x = lookup(v["variant"])
        if x is not None and x.rung == rung and v["variant"] in ("bsp", "all-bsp", "bsp-graph", "all-graph"):
            return e2e_of(v)
    return None


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _labels(var: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in var["components"] if c["rank"] is None}


def case_rows(case: dict) -> tuple[list[str], list[list[str]]]:
    """The attribution table of one case: a header and rows of strings, one column per variant. The first
    row is the E2E every ratio uses; rows of a measured variant add up to the instrumented E2E printed with
    them, and the measurement cost is the difference between the two."""
    variants = case["variants"]
    header = ["us per iteration"] + [v["variant"] for v in variants]
    rows = []

    def e2e_cell(v):
        e, val = v["e2e_us"], e2e_of(v)
        spread = f" [{_fmt(e.get('p10'))}-{_fmt(e.get('p90'))}]" if e.get("p10") is not None else ""
        return f"{_fmt(val)}{spread} {LABEL_MARK[e['label']]}"

    measured = any(v.get("samples_us") for v in variants)
    rows.append(["E2E" + (" (plain)" if measured else "")] + [e2e_cell(v) for v in variants])
    if any(v.get("attributed_e2e_us") is not None for v in variants):
        rows.append(["E2E the rows add up to (instrumented)"] + [
            f"{_fmt(v['attributed_e2e_us'])} m" if v.get("attributed_e2e_us") is not None else "-" for v in variants])

        def cost_cell(v):
            c, p = v.get("measurement_cost_us"), v.get("plain_e2e_us")
            if c is None or not p:
                return "-"
            return f"{c:+,.1f} ({100 * c / p:+.1f}%)" + (" PERTURBED" if v.get("perturbed") else "")
        rows.append(["measurement cost (instrumented - plain)"] + [cost_cell(v) for v in variants])
    core = ("ideal", "launch", "sync_wait", "exposed_transfer", "locality", "inefficiency", "unattributed")
    has = any(overall_components(v) for v in variants)
    present = [c for c in COMPONENTS if has and (c in core or any(abs(overall_components(v).get(c, 0.0)) > 0
                                                                  for v in variants))]
    for comp in present:
        cells = []
        for v in variants:
            val = overall_components(v).get(comp)
            cells.append("-" if val is None else f"{_fmt(val)} {LABEL_MARK[_labels(v)[comp]]}")
        rows.append([COMPONENT_TITLES[comp]] + cells)
    if present:
        for tax, parts in TAXES.items():
            cells = []
            for v in variants:
                oc = overall_components(v)
                cells.append(_fmt(sum(oc.get(p, 0.0) for p in parts)) if oc else "-")
            rows.append([f"= {tax} tax"] + cells)
    if any(not (v.get("attribution") or {}).get("available", True) for v in variants):
        rows.append(["rows"] + ["not available (older rules)" if not (v.get("attribution") or {}).get("available", True)
                                else "shown" for v in variants])
    if any(v.get("prediction") for v in variants):
        def pred_cell(v):
            pr, med = v.get("prediction"), e2e_of(v)
            if not pr:
                return "-"
            err = f" ({100 * (pr['e2e_us'] - med) / med:+.0f}%)" if med else ""
            return f"{_fmt(pr['e2e_us'])} p{err}"
        rows.append(["model E2E (error)"] + [pred_cell(v) for v in variants])
    for rung, title in (("bsp", "speed-up vs bsp"), ("graph", "speed-up vs bsp-graph")):
        base = baseline(case, rung)
        if base:
            rows.append([title] + [f"{base / e2e_of(v):.2f}x" if e2e_of(v) else "-" for v in variants])
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
    return (["floor", "us"], [["T_compute", _fmt(f["compute_us"])], ["T_hbm", _fmt(f["hbm_us"])],
                              ["T_link", _fmt(f["link_us"])], ["T_ideal = max", _fmt(f["ideal_us"])]])


def per_rank_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """Per-rank components (measured documents), one row per (variant, rank)."""
    rows = []
    for v in case["variants"]:
        ranks = sorted({c["rank"] for c in v["components"] if c["rank"] is not None})
        for r in ranks:
            vals = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] == r}
            rows.append([v["variant"], str(r)] + [_fmt(vals.get(c)) for c in COMPONENTS])
    if not rows:
        return None
    return ["variant", "rank"] + [COMPONENT_TITLES[c] for c in COMPONENTS], rows


def ladder_rows(case: dict) -> tuple[list[str], list[list[str]]] | None:
    """The ablation ladder beside the timeline: two measures of what a graph removes, which should agree."""
    lad = (case.get("extra") or {}).get("ladder") or {}
    rows = []
    for p in lad.get("pairs", []):
        rows.append([f"E2E({p['bsp']}) - E2E({p['graph']}), plain (derived)", _fmt(p["plain_us"])])
        if p.get("timeline_us") is not None:
            rows.append([f"launch + host_bound of {p['bsp']} minus {p['graph']}'s, timeline (measured)", _fmt(p["timeline_us"])])
            rows.append([f"{p['graph']}: its replay's launch and the gaps inside it (a graph keeps these)",
                         _fmt(p.get("graph_residual_us"))])
    if "fused_vs_graph_us" in lad:
        rows.append([f"E2E(best graph) - E2E({lad['best_fused']}), plain (derived)", _fmt(lad["fused_vs_graph_us"])])
    return (["ablation ladder", "us"], rows) if rows else None


def pct(x) -> str:
    """A signed fraction as a percentage; '-' for none."""
    return "-" if x is None or x != x else f"{100 * x:+.1f}%"


def checks_summary_rows(frame, title: str = "check") -> tuple[list[str], list[list[str]]]:
    """One row per check of a taxes.checks frame: its limit, how many rows hold, the worst error."""
    from taxes.checks import checks_summary

    rows = [[r.check, f"{100 * r.limit:.0f}%", f"{r.ok} of {r.of}", pct(r.worst_error)]
            for r in checks_summary(frame).itertuples()]
    return [title, "limit", "holds", "worst error"], rows


def checks_rows(doc: dict) -> tuple[list[str], list[list[str]]] | None:
    """The method's checks (taxes/checks.py) over the whole document: one row per check."""
    if doc["metadata"].get("kind") != "profile":
        return None
    from taxes.checks import checks_frame

    frame = checks_frame(doc)
    if frame.empty:
        return None
    return checks_summary_rows(frame, "check (taxes check lists every row)")


def _meta_line(doc: dict) -> str:
    m = doc["metadata"]
    gpus = ", ".join(m.get("gpu_names") or []) or "no GPU"
    commit = (m.get("git_commit") or "unknown")[:10] + (" + uncommitted changes" if m.get("git_dirty") else "")
    return (f"{m['kind']} by taxes {m['tool_version']} (commit {commit}), {m.get('date', '?')}; hardware profile "
            f"{m['hardware_profile']}; world {m['world_size']}; {gpus}; torch {m.get('torch_version')}, "
            f"triton {m.get('triton_version')}")


# ---- terminal -------------------------------------------------------------------------------------


def render_terminal(doc: dict, console) -> None:
    from rich.table import Table

    for case in doc["cases"]:
        header, rows = case_rows(case)
        table = Table(title=case_title(case), title_style="bold", show_lines=False)
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right", no_wrap=True)
        for row in rows:
            style = "bold" if row[0] in ("E2E", "speed-up vs bsp") else ("dim" if row[0].startswith("=") else None)
            table.add_row(*row, style=style)
        console.print(table)


# ---- Markdown -------------------------------------------------------------------------------------


def md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(doc: dict) -> str:
    out = ["# taxes report", "", _meta_line(doc), "", LEGEND, ""]
    for case in doc["cases"]:
        out += [f"## {case_title(case)}", "", md_table(*case_rows(case)), ""]
        fr = floor_rows(case)
        if fr:
            out += [md_table(*fr), ""]
        lr = ladder_rows(case)
        if lr:
            out += [md_table(*lr), ""]
        pr = per_rank_rows(case)
        if pr:
            out += ["Per rank:", "", md_table(*pr), ""]
    cr = checks_rows(doc)
    if cr:
        out += ["## Checks of the measurement", "", md_table(*cr), ""]
    return "\n".join(out)


# ---- JSON summary ---------------------------------------------------------------------------------


def summary(doc: dict) -> dict:
    """Per case and variant: E2E (plain and attributed), the rows, the taxes and the speed-ups."""
    cases = []
    for case in doc["cases"]:
        bsp, graph = baseline(case, "bsp"), baseline(case, "graph")
        variants = []
        for v in case["variants"]:
            oc = overall_components(v)
            e2e = e2e_of(v)
            variants.append({
                "variant": v["variant"], "e2e_us": v["e2e_us"], "plain_e2e_us": v.get("plain_e2e_us"),
                "attributed_e2e_us": v.get("attributed_e2e_us"), "measurement_cost_us": v.get("measurement_cost_us"),
                "perturbed": v.get("perturbed"), "rows_available": (v.get("attribution") or {}).get("available", bool(oc)),
                "components_us": oc, "labels": _labels(v),
                "taxes_us": {t: sum(oc.get(p, 0.0) for p in parts) for t, parts in TAXES.items()} if oc else {},
                "speedup_vs_bsp": (bsp / e2e) if bsp and e2e else None,
                "speedup_vs_bsp_graph": (graph / e2e) if graph and e2e else None,
                "correctness": v["correctness"],
            })
        cases.append({k: case[k] for k in ("workload", "shape", "world", "dtype")} | {"variants": variants})
    return {"metadata": doc["metadata"], "statistic": "interquartile mean", "cases": cases}


def render_json(doc: dict) -> str:
    return json.dumps(summary(doc), indent=1, allow_nan=False) + "\n"


# ---- HTML -----------------------------------------------------------------------------------------


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}th{background:#f3f3f3}img{max-width:100%;margin:0.5em 0}
.meta{color:#555;font-size:13px}h2{margin-top:2em;border-bottom:1px solid #ddd}"""


def render_html(doc: dict) -> str:
    """One self-contained page: tables and the plots embedded as data: URIs."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>taxes report</title><style>{_CSS}</style></head><body>",
             "<h1>taxes report</h1>", f"<p class='meta'>{html.escape(_meta_line(doc))}</p>",
             f"<p class='meta'>{html.escape(LEGEND)}</p>"]
    for case in doc["cases"]:
        title = case_title(case)
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(_html_table(*case_rows(case)))
        fr = floor_rows(case)
        if fr:
            parts.append(_html_table(*fr))
        lr = ladder_rows(case)
        if lr:
            parts.append(_html_table(*lr))
        pr = per_rank_rows(case)
        if pr:
            parts.append("<h3>Per rank</h3>" + _html_table(*pr))
        if any(overall_components(v) for v in case["variants"]):
            parts.append(_img(stacked_bars(case), f"components per variant: {title}"))
        if any(v.get("prediction") and overall_components(v) for v in case["variants"]):
            parts.append(_img(predicted_vs_measured(case), f"predicted against measured: {title}"))
        if any(v["phases"] for v in case["variants"]):
            parts.append(_img(timeline(case), f"per-rank timeline: {title}"))
        if any(v.get("cta_timeline") for v in case["variants"]):
            parts.append(_img(cta_waits(case), f"fused kernels, per CTA: {title}"))
    cr = checks_rows(doc)
    if cr:
        parts.append("<h2>Checks of the measurement</h2>" + _html_table(*cr))
    parts.append("</body></html>")
    return "\n".join(parts)
