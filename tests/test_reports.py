"""Reports: verdict first (title, marks, summary), one E2E per variant with its statistic named, the JSON
report that loads back, self-contained HTML, and every loadable document renders.
"""

from __future__ import annotations

import copy
import html.parser
import io
import json
import math
import re

import numpy as np
import pytest
from _util import assert_one_line, assert_self_contained_html

from committed import committed
from taxes.documents import results
from taxes.errors import TaxesError
from taxes.method import PERTURBED, TAXES
from taxes.model.predict import COMPONENT_TITLES, COMPONENTS
from taxes.reports import plots, render
from taxes.reports import rows as report_rows
from taxes.reports import verdict as report_verdict


def _md_tables(text: str) -> list[list[list[str]]]:
    """Markdown tables in text, each a list of rows of cells (the separator row dropped)."""
    tables, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            if not all(re.fullmatch(r"-+:?", c) for c in cells):
                cur.append(cells)
        elif cur:
            tables.append(cur)
            cur = []
    return tables


def _number(cell: str) -> float:
    return float(cell.split()[0].replace(",", ""))


def _iqm(values) -> float:
    """The interquartile mean, written out here (docs/method.md): sorted, a quarter (n // 4) dropped at
    each end, the rest averaged."""
    x = np.sort(np.asarray(values, dtype=float))
    k = len(x) // 4
    return float(x[k:len(x) - k].mean())


@pytest.fixture
def gpu_doc():
    """A real document from 2 x H100 with rows: ag-gemm at M=1024 and 8192, every variant, four of them
    perturbed by measuring at M=1024."""
    return results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))


# ---- verdict first ---------------------------------------------------------------------------------


def test_markdown_report_leads_with_title_marks_and_summary(model_doc):
    text = render.render_markdown(model_doc)
    lines = text.splitlines()
    assert lines[0] == "# ag-gemm, gemm-rs, flash-decode (3 cases) on h200-sxm (model), world 2"
    assert any(line.startswith("> **PREDICTED**") for line in lines[:6])
    first_table = _md_tables(text)[0]
    assert first_table[0] == [h for h in report_verdict.SUMMARY_HEADER if h != "checks"]  # a model has no checks
    assert text.index("## Summary") < min(text.index(f"## {plots.case_title(c)}") for c in model_doc["cases"])
    for case, row in zip(model_doc["cases"], first_table[1:]):
        e2e = {v["variant"]: v["e2e_us"]["median"] for v in case["variants"]}
        best = min(e2e, key=e2e.get)
        name, time_us, stat = row[1].split(" ")
        assert name == best and _number(time_us) == pytest.approx(e2e[best], abs=0.051) and stat == "(predicted)"
        bsp = e2e.get("bsp") or e2e.get("all-bsp")
        assert float(row[2].split(" / ")[0].rstrip("x")) == pytest.approx(bsp / e2e[best], abs=0.0051)


def test_markdown_report_details_per_case(model_doc):
    text = render.render_markdown(model_doc)
    tables = _md_tables(text)
    attribution = [t for t in tables if t[0][0] == "us per iteration"]
    assert len(attribution) == len(model_doc["cases"])
    for case, table in zip(model_doc["cases"], attribution):
        assert all(len(row) == len(table[0]) for row in table)  # a well-formed table
        assert table[0][1:] == [v["variant"] for v in case["variants"]]
        rows = {row[0]: row[1:] for row in table}
        assert report_rows.E2E_ROW not in rows  # a model has no interquartile mean: its row says predicted
        for v, cell in zip(case["variants"], rows[report_rows.E2E_ROW_MODEL]):
            assert _number(cell) == pytest.approx(v["e2e_us"]["median"], abs=0.051)
            assert cell.endswith(" p")
        for comp in COMPONENTS:
            values = [_number(c) for c in rows[COMPONENT_TITLES[comp]]]
            expected = [next(c["value_us"] for c in v["components"] if c["name"] == comp) for v in case["variants"]]
            assert values == pytest.approx(expected, abs=0.051)
        bsp = case["variants"][0]["e2e_us"]["median"]
        for v, cell in zip(case["variants"], rows["speed-up vs bsp"]):
            assert float(cell.rstrip("x")) == pytest.approx(bsp / v["e2e_us"]["median"], abs=0.0051)
    floors = [t for t in tables if t[0] == ["floor", "us"]]
    assert len(floors) == len(model_doc["cases"])
    for case, f in zip(model_doc["cases"], floors):
        fl = case["variants"][0]["floor"]
        vals = {r[0]: _number(r[1]) for r in f[1:]}
        assert vals["T_ideal = max"] == pytest.approx(max(fl["compute_us"], fl["hbm_us"], fl["link_us"]), abs=0.051)


def test_measured_variants_show_one_e2e_named_and_what_their_rows_add_up_to(emulated_doc):
    text = render.render_markdown(emulated_doc)
    case = emulated_doc["cases"][0]
    table = next(t for t in _md_tables(text) if t[0][0] == "us per iteration")
    rows = {row[0]: row[1:] for row in table}
    assert [r[0] for r in table].count(report_rows.E2E_ROW) == 1  # one E2E per variant, its statistic named
    for v, e2e, added, cost in zip(case["variants"], rows[report_rows.E2E_ROW], rows["rows add up to (instrumented E2E)"],
                                   rows["measurement cost (instrumented - plain)"]):
        per_iter = np.max(np.asarray(v["samples_us"]), axis=0)
        assert _number(e2e) == pytest.approx(_iqm(per_iter), abs=0.051)  # the interquartile mean of the samples
        lo, hi = re.search(r"\[([\d,.]+)-([\d,.]+)\]", e2e).groups()
        assert float(lo.replace(",", "")) == pytest.approx(np.quantile(per_iter, 0.1), abs=0.51)
        assert float(hi.replace(",", "")) == pytest.approx(np.quantile(per_iter, 0.9), abs=0.51)
        assert _number(added) == pytest.approx(v["attributed_e2e_us"], abs=0.051)
        overall = math.fsum(c["value_us"] for c in v["components"] if c["rank"] is None)
        assert _number(added) == pytest.approx(overall, abs=0.1)  # the rows below do add up to it
        share = (v["attributed_e2e_us"] - v["plain_e2e_us"]) / v["plain_e2e_us"]
        assert _number(cost) == pytest.approx(v["attributed_e2e_us"] - v["plain_e2e_us"], abs=0.051)
        assert cost.endswith("PERTURBED") == (share > PERTURBED)
    assert "[p10-p90] their 10th and 90th percentiles" in text


@pytest.mark.parametrize("view", ["md", "terminal", "html", "json"])
def test_emulated_and_perturbed_runs_are_marked_in_every_view(emulated_doc, view):
    perturbed = [v["variant"] for v in emulated_doc["cases"][0]["variants"]
                 if v["measurement_cost_us"] > PERTURBED * v["plain_e2e_us"]]
    assert perturbed  # the fixture has some: interpreted fused kernels cost more to trace
    if view == "json":
        rep = json.loads(render.render_json(emulated_doc))["report"]
        assert rep["marks"][:2] == ["EMULATED", "PERTURBED"]
        assert [v["variant"] for v in rep["cases"][0]["variants"] if v["perturbed"]] == perturbed
        return
    if view == "md":
        text = render.render_markdown(emulated_doc)
    elif view == "html":
        text = render.render_html(emulated_doc)
    else:
        from taxes.console import render_text

        text = render_text(lambda c: render.render_terminal(emulated_doc, c))
    head = text[:text.index('id="summary"' if view == "html" else "ummary")]  # before the summary
    assert "EMULATED" in head and "times mean nothing" in head and "PERTURBED" in head
    for name in perturbed:
        assert f"M=64,N=64,K=32 {name}" in head


def test_a_real_document_leads_with_its_verdict(gpu_doc):
    from taxes.console import render_text

    text = render_text(lambda c: render.render_terminal(gpu_doc, c))
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines[0] == "ag-gemm (2 cases) on 2 x NVIDIA H100 80GB HBM3, world 2"
    assert any(line.startswith("PERTURBED:") for line in lines[:5])
    assert not any(line.startswith("NO ROWS:") for line in lines)
    summary = text[:text.index("us per iteration")]
    for case in gpu_doc["cases"]:
        iqm = {v["variant"]: _iqm(np.max(np.asarray(v["samples_us"]), axis=0)) for v in case["variants"]}
        best = min(iqm, key=iqm.get)
        shape = ", ".join(f"{k}={v}" for k, v in case["shape"].items())
        row = next(line for line in summary.splitlines() if shape in line and line.lstrip().startswith("│"))
        cells = [c.strip() for c in re.split(r"[│┃]", row) if c.strip()]
        words = cells[1].split(" ")
        perturbed = next(v for v in case["variants"] if v["variant"] == best).get("perturbed", False)
        assert words[0] == best and words[-1] == "(IQM)" and ("PERTURBED" in words) == perturbed, cells[1]
        assert _number(words[-2]) == pytest.approx(iqm[best], abs=0.051)
        vs_bsp, vs_graph = cells[2].split(" / ")
        assert float(vs_bsp.rstrip("x")) == pytest.approx(iqm["bsp"] / iqm[best], abs=0.0051)
        assert float(vs_graph.rstrip("x")) == pytest.approx(iqm["bsp-graph"] / iqm[best], abs=0.0051)
        ideal = next(v for v in case["variants"] if v["variant"] == best)["floor"]["ideal_us"]
        assert float(cells[3]) == pytest.approx(ideal / iqm[best], abs=0.0051)  # of the floor


def test_every_case_table_gives_each_variant_its_fraction_of_the_floor(gpu_doc):
    md = render.render_markdown(gpu_doc)
    tables = [t for t in _md_tables(md) if t[0][0] == "us per iteration"]
    assert len(tables) == len(gpu_doc["cases"])
    for case, table in zip(gpu_doc["cases"], tables):
        row = next(r for r in table if r[0].startswith("of the floor"))
        for v, cell in zip(case["variants"], row[1:]):
            iqm = _iqm(np.max(np.asarray(v["samples_us"]), axis=0))
            assert float(cell) == pytest.approx(v["floor"]["ideal_us"] / iqm, abs=0.0051), v["variant"]
            assert 0 < float(cell) <= 1.0  # measured runs are never faster than their floor here


def test_failed_checks_lead_and_are_coloured(emulated_doc):
    from rich.console import Console

    buf = io.StringIO()
    render.render_terminal(emulated_doc, Console(file=buf, width=300, color_system="standard", force_terminal=True))
    out = buf.getvalue()
    first_detail = out.index("us per iteration")
    red = re.findall(r"\x1b\[[0-9;]*31m([^\x1b]*)", out[:first_detail])
    assert any("FAIL" in s for s in red), "the summary's failed checks are red"
    assert any(s.startswith("FAILED check: measurement") for s in red)
    md = render.render_markdown(emulated_doc)
    assert md.index("**FAILED** measurement") < md.index("us per iteration")
    html = render.render_html(emulated_doc)
    assert re.search(r'<td class="fail">\d+ of \d+ FAIL', html)
    assert html.index('class="fail">FAILED check') < html.index("us per iteration")


# ---- JSON: the document and its report, loaded back ------------------------------------------------


def test_json_report_is_the_document_with_its_report_and_loads_back(model_doc, tmp_path):
    out = render.render_json(model_doc)
    back = results.loads(out)  # validates against taxes/schema/result-v1.json
    assert {k: v for k, v in back.items() if k != "report"} == model_doc
    rep = back["report"]
    assert rep["statistic"] == "interquartile mean" and rep["marks"][0] == "PREDICTED"
    for case, src in zip(rep["cases"], model_doc["cases"]):
        assert case["workload"] == src["workload"] and case["shape"] == src["shape"]
        e2e = {v["variant"]: v["e2e_us"]["median"] for v in src["variants"]}
        assert case["best_variant"] == min(e2e, key=e2e.get)
        for var, sv in zip(case["variants"], src["variants"]):
            comps = {c["name"]: c["value_us"] for c in sv["components"]}
            assert var["components_us"] == comps and var["statistic"] == "predicted"
            assert math.fsum(var["components_us"].values()) == pytest.approx(var["e2e_us"], rel=1e-12)
            assert var["taxes_us"]["bulk-synchronous"] == pytest.approx(comps["sync_wait"] + comps["exposed_transfer"])
            assert var["taxes_us"]["data-locality"] == comps["locality"]
            assert set(var["taxes_us"]) == set(TAXES)
            assert var["speedup_vs_bsp"] == pytest.approx(e2e["bsp"] / sv["e2e_us"]["median"])
    path = tmp_path / "r.json"
    path.write_text(out)
    again = render.render_json(results.load(path))  # a report of a report: the same
    assert json.loads(again) == json.loads(out)


# ---- HTML ------------------------------------------------------------------------------------------


def test_html_report_is_self_contained(model_doc):
    doc = dict(model_doc, cases=model_doc["cases"][:2])
    text = render.render_html(doc)
    assert_self_contained_html(text, n_images=2 * 2)  # components and timeline per case
    assert text.count("<table") == 1 + 2 * 2  # the summary, then attribution and floor per case
    for case in doc["cases"]:
        for v in case["variants"]:
            assert f"<th>{v['variant']}</th>" in text
    assert text.index('id="summary"') < text.index("us per iteration")


def test_html_report_of_several_documents_is_one_page(model_doc, emulated_doc):
    text = render.render_html([model_doc, emulated_doc])
    assert text.count('<section class="document">') == 2
    assert "<title>2 result documents</title>" in text
    assert text.count('id="summary"') == 2


def test_html_escapes_document_text(model_doc):
    doc = dict(model_doc, cases=model_doc["cases"][:1])
    doc["metadata"] = dict(doc["metadata"], hardware_profile="<script>alert(1)</script>\x1b[2J")
    text = render.render_html(doc)
    assert "<script>" not in text and "&lt;script&gt;" in text and "\x1b" not in text


# ---- documents load() accepts but the renderers cannot draw ----------------------------------------


def _set(path, value):
    def f(doc):
        node = doc
        for k in path[:-1]:
            node = node[k]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return f


_DELETE = object()


@pytest.mark.parametrize("mutations", [
    [_set(("metadata", "git_commit"), 123456)],
    [_set(("metadata", "gpu_names"), 2)],
    [_set(("metadata", "gpu_names"), [0, 1])],
    [_set(("cases", 0, "variants", 0, "floor"), "none")],
    [_set(("cases", 0, "variants", 0, "floor", "hbm_us"), "fast")],
    [_set(("cases", 0, "variants", 0, "e2e_us", "p10"), 1.0), _set(("cases", 0, "variants", 0, "e2e_us", "p90"), _DELETE)],
    [_set(("cases", 0, "extra"), {"ladder": {"pairs": [{"bsp": 1}], "fused_vs_graph_us": "x"}})],
], ids=["git_commit-int", "gpu_names-int", "gpu_names-ints", "floor-string", "floor-value-string", "p10-without-p90",
        "ladder-junk"])
def test_every_loadable_document_renders(model_doc, mutations):
    """A document is either rejected by validation with one line, or it renders."""
    for m in mutations:
        m(model_doc)
    try:
        doc = results.loads(json.dumps(model_doc))
    except TaxesError as e:
        assert_one_line(str(e))
        return
    render.render_markdown(doc)
    render.render_html(doc)
    render.render_json(doc)


def test_a_peer_timed_plain_is_not_called_older_rules():
    # one H100 ag-gemm document: PyTorch's fused_all_gather_matmul (torch-async-tp) is timed plain by design;
    # the report must say so, not that the document predates the rules, and --strict must not count it
    from taxes.documents.checks import provenance_problems
    from taxes.documents.results import TIMED_PLAIN, rows_state

    doc = results.load(committed("reports/profile/ag_gemm-h100-x1.json.gz"))
    states = {v["variant"]: rows_state(v) for c in doc["cases"] for v in c["variants"]}
    assert states.pop("torch-async-tp") == "timed plain" and set(states.values()) == {"shown"}
    text = render.render_markdown(doc)
    assert "NO ROWS" not in text and "older rules" not in text
    rows_line = next(line for line in text.splitlines() if line.startswith("| rows |"))
    assert rows_line.count("shown") == 5 and "timed plain" in rows_line
    assert provenance_problems(doc) == []
    older = copy.deepcopy(doc)  # the same variant marked as measured under older rules is still reported so
    older["cases"][0]["variants"][0]["attribution"] = {"available": False, "why": results.NO_ROWS}
    assert "NO ROWS" in render.render_markdown(older) and provenance_problems(older)
    assert TIMED_PLAIN in json.dumps(doc)
