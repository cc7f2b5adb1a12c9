"""Render result documents: terminal (rich), Markdown, JSON summary, self-contained HTML."""

from __future__ import annotations

import base64
import html
import json

from taxes.model import COMPONENT_TITLES, COMPONENTS, TAXES
from taxes.reports.plots import case_title, cta_waits, overall_components, predicted_vs_measured, stacked_bars, timeline

BASELINES = ("bsp", "all-bsp")  # what "speed-up vs bsp" divides: tp-mlp calls its bulk-synchronous layer all-bsp

LABEL_MARK = {"measured": "m", "derived": "d", "predicted": "p"}
LEGEND = "labels: m measured, d derived, p predicted; times in us per iteration"


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


def _labels(var: dict) -> dict[str, str]:
    return {c["name"]: c["label"] for c in var["components"] if c["rank"] is None}


def case_rows(case: dict) -> tuple[list[str], list[list[str]]]:
    """The attribution table of one case: a header and rows of strings, one column per variant."""
    variants = case["variants"]
    header = ["us per iteration"] + [v["variant"] for v in variants]
    base = next((v["e2e_us"]["median"] for v in variants if v["variant"] in BASELINES), None)
    rows = []

    def e2e_cell(v):
        e = v["e2e_us"]
        spread = f" [{_fmt(e.get('p10'))}-{_fmt(e.get('p90'))}]" if e.get("p10") is not None else ""
        return f"{_fmt(e['median'])}{spread} {LABEL_MARK[e['label']]}"

    rows.append(["E2E"] + [e2e_cell(v) for v in variants])
    has_components = any(overall_components(v) for v in variants)
    for comp in COMPONENTS if has_components else ():
        cells = []
        for v in variants:
            val = overall_components(v).get(comp)
            cells.append("-" if val is None else f"{_fmt(val)} {LABEL_MARK[_labels(v)[comp]]}")
        rows.append([COMPONENT_TITLES[comp]] + cells)
    for tax, parts in TAXES.items() if has_components else ():
        cells = []
        for v in variants:
            oc = overall_components(v)
            cells.append(_fmt(sum(oc[p] for p in parts)) if all(p in oc for p in parts) else "-")
        rows.append([f"= {tax} tax"] + cells)
    if any(v.get("prediction") for v in variants):
        def pred_cell(v):
            pr, med = v.get("prediction"), v["e2e_us"]["median"]
            if not pr:
                return "-"
            err = f" ({100 * (pr['e2e_us'] - med) / med:+.0f}%)" if med else ""
            return f"{_fmt(pr['e2e_us'])} p{err}"
        rows.append(["model E2E (error)"] + [pred_cell(v) for v in variants])
    if any(v.get("attribution") for v in variants):
        def instr_cell(v):
            a, med = v.get("attribution") or {}, v["e2e_us"]["median"]
            if not a.get("instrumented_e2e_us") or not med:
                return "-"
            return f"{_fmt(a['instrumented_e2e_us'])} ({100 * (a['instrumented_e2e_us'] / med - 1):+.1f}%)"
        rows.append(["instrumented E2E (vs plain)"] + [instr_cell(v) for v in variants])
        if any((v.get("attribution") or {}).get("cta_wait_share") is not None for v in variants):
            rows.append(["CTA time waiting (traced)"] + [
                f"{100 * v['attribution']['cta_wait_share']:.1f}%"
                if (v.get("attribution") or {}).get("cta_wait_share") is not None else "-" for v in variants])
    if base:
        rows.append(["speed-up vs bsp"] + [
            f"{base / v['e2e_us']['median']:.2f}x" if v["e2e_us"]["median"] else "-" for v in variants])
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
    """The ablation ladder beside the timeline: two measures of the launch tax that should agree."""
    lad = (case.get("extra") or {}).get("ladder") or {}
    if "launch_us" not in lad:
        return None
    rows = [["launch tax: E2E(bsp) - E2E(bsp-graph) (derived)", _fmt(lad["launch_us"])]]
    if lad.get("launch_instrumented_us") is not None:
        rows.append(["the same, instrumented runs (derived)", _fmt(lad["launch_instrumented_us"])])
    if lad.get("bsp_timeline_launch_us") is not None:
        rows.append(["launch tax: bsp timeline, idle + host-bound parts of phases", _fmt(lad["bsp_timeline_launch_us"])])
    if lad.get("graph_timeline_launch_us") is not None:
        rows.append(["launch tax: bsp-graph timeline (what a graph cannot remove)", _fmt(lad["graph_timeline_launch_us"])])
    if "bsync_and_locality_us" in lad:
        rows.append([f"E2E(bsp-graph) - E2E({lad['best_fused']}) (derived)", _fmt(lad["bsync_and_locality_us"])])
    return ["ablation ladder", "us"], rows


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
    return checks_summary_rows(frame, "check (METHOD.md; taxes check lists every row)")


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
    """Per case and variant: E2E, the components, the taxes and the speed-up over bsp."""
    cases = []
    for case in doc["cases"]:
        base = next((v["e2e_us"]["median"] for v in case["variants"] if v["variant"] in BASELINES), None)
        variants = []
        for v in case["variants"]:
            oc = overall_components(v)
            variants.append({
                "variant": v["variant"],
                "e2e_us": v["e2e_us"],
                "components_us": oc,
                "labels": _labels(v),
                "taxes_us": {t: sum(oc.get(p, 0.0) for p in parts) for t, parts in TAXES.items()},
                "speedup_vs_bsp": (base / v["e2e_us"]["median"]) if base and v["e2e_us"]["median"] else None,
                "correctness": v["correctness"],
            })
        cases.append({k: case[k] for k in ("workload", "shape", "world", "dtype")} | {"variants": variants})
    return {"metadata": doc["metadata"], "cases": cases}


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
