"""One self-contained HTML page per result document (jinja2, autoescaped), its charts embedded as data: URIs."""

from __future__ import annotations

import base64

from taxes.reports.plots import case_title, cta_waits, overall_components, predicted_vs_measured, stacked_bars, timeline
from taxes.reports.rows import LEGEND, checks_rows, meta_line, sections
from taxes.reports.analysis import trace_sections, trace_warnings
from taxes.reports.verdict import failed_checks, marks, summary_rows, title
from taxes.sanitize import printable


def _data_uri(data: bytes, fmt: str) -> str:
    mime = {"png": "image/png", "svg": "image/svg+xml"}[fmt]
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def charts(case: dict, fmt: str = "svg") -> list[tuple[str, str]]:
    """(data URI, alt text) of every chart a case has."""
    name = case_title(case)
    out = []
    if any(overall_components(v) for v in case["variants"]):
        out.append((_data_uri(stacked_bars(case, fmt), fmt), f"rows per variant: {name}"))
    if any(v.get("prediction") and overall_components(v) for v in case["variants"]):
        out.append((_data_uri(predicted_vs_measured(case, fmt), fmt), f"predicted against measured: {name}"))
    if any(v["phases"] for v in case["variants"]):
        out.append((_data_uri(timeline(case, fmt), fmt), f"per-rank timeline: {name}"))
    if any(v.get("cta_timeline") for v in case["variants"]):
        out.append((_data_uri(cta_waits(case, fmt), fmt), f"fused kernels, per CTA: {name}"))
    return out


def _environment():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("taxes.reports", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["clean"] = printable
    return env


def html_view(doc: dict, images: bool = True, trace_details: bool = False) -> dict:
    """Everything the HTML template shows of one document (with trace_details: a `taxes analyze` document's
    own tables and warnings too)."""
    header, rows, failed = summary_rows(doc)
    checks = header.index("checks") if "checks" in header else -1
    return {"title": title(doc), "marks": marks(doc), "meta": meta_line(doc), "legend": LEGEND,
            "summary": {"header": header, "rows": rows, "fail_cells": {(i, checks): "fail" for i, bad in
                                                                      enumerate(failed) if bad}},
            "failed_checks": failed_checks(doc),
            "cases": [{"title": name, "tables": [{"title": t, "header": h, "rows": r} for t, h, r in tables],
                       "charts": charts(case) if images else []}
                      for case, (name, tables) in zip(doc["cases"], sections(doc))],
            "checks": checks_rows(doc),
            "trace_tables": [{"title": t, "header": h, "rows": r} for t, h, r in trace_sections(doc)]
            if trace_details else [],
            "warnings": trace_warnings(doc) if trace_details else []}


def render_html(doc: dict | list[dict], trace_details: bool = False) -> str:
    """One self-contained page (no script, no external resource): per document the title, its marks, the
    summary, then the details with the charts embedded as SVG data: URIs; with trace_details, a `taxes
    analyze` document's own tables after them."""
    docs = doc if isinstance(doc, list) else [doc]
    views = [html_view(d, trace_details=trace_details) for d in docs]
    page_title = views[0]["title"] if len(views) == 1 else f"{len(views)} result documents"
    return _environment().get_template("report.html.j2").render(page_title=page_title, docs=views, css=_CSS)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    """A bare HTML table (escaped), for pages built elsewhere."""
    return _environment().get_template("table.html.j2").render(header=header, rows=rows, cls=None, row_classes=None,
                                                                cell_classes=None).strip()


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}td:not(:first-child){white-space:nowrap}th{background:#f3f3f3}img{max-width:100%;margin:0.5em 0}
.meta{color:#555;font-size:13px}h2{margin-top:2em;border-bottom:1px solid #ddd}
.mark{font-weight:bold;padding:0.4em 0.8em;margin:0.3em 0;border-radius:4px;background:#fff4e5;color:#8a4b00}
.mark.EMULATED,.mark.PERTURBED{background:#fde8e8;color:#a00}.fail{color:#c00;font-weight:bold}
table.summary td,table.summary th{text-align:left;white-space:normal}.summary td:nth-child(2){font-weight:bold}.failed-checks li{color:#c00}"""
