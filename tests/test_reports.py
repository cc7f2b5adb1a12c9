"""Reports: verdict first (title, marks, summary), one E2E per variant with its statistic named, the JSON
report that loads back, self-contained HTML, and charts that stay readable (PNG and SVG)."""

from __future__ import annotations

import copy
import gzip
import html.parser
import io
import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest
from _util import assert_one_line, assert_self_contained_html, assert_valid_png, assert_valid_svg, profile_doc

from committed import committed
from taxes.documents import results
from taxes.errors import TaxesError
from taxes.method import PERTURBED, TAXES
from taxes.model.predict import COMPONENT_TITLES, COMPONENTS
from taxes.reports import plots, render
from taxes.reports import rows as report_rows
from taxes.reports import verdict as report_verdict
from taxes.sanitize import markdown as md_escape

DATA = Path(__file__).parent / "data" / "documents"
ROOT = Path(__file__).resolve().parent.parent


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
def emulated_doc():
    """A real document: `taxes profile ag-gemm --emulate` (M=64,N=64,K=32, 8 iterations), with rows."""
    return results.loads(gzip.decompress((DATA / "emulated_ag_gemm.json.gz").read_bytes()).decode())


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
    back = results.loads(out)  # validates against taxes/documents/schema/result-v1.json
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


# ---- charts ----------------------------------------------------------------------------------------


def _texts(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(r)) for ax in fig.axes for t in ax.texts if t.get_text()]


def _overlaps(boxes) -> list:
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]


def test_stacked_bars_label_the_e2e_the_tables_print_and_clip_nothing(emulated_doc):
    import matplotlib.pyplot as plt

    case = emulated_doc["cases"][0]
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    for bar in ax.patches:
        y0, y1 = sorted((bar.get_y(), bar.get_y() + bar.get_height()))
        assert lo <= y0 and y1 <= hi, "a bar reaches past the axes"
    labels = _texts(fig)
    assert not _overlaps(labels)
    assert [lo <= t.get_position()[1] <= hi for t in ax.texts] == [True] * len(ax.texts)
    for (text, _), v in zip(labels, case["variants"]):
        assert text.split("\n")[0] == f"{report_verdict.e2e_of(v):,.0f} us (IQM)"  # the E2E of the tables, not the rows'
    plt.close(fig)
    assert_valid_png(plots.stacked_bars(case))
    assert_valid_svg(plots.stacked_bars(case, "svg"))


def test_negative_rows_hang_below_the_floor(model_doc):
    import matplotlib.pyplot as plt

    case = copy.deepcopy(model_doc["cases"][0])
    for c in case["variants"][0]["components"]:
        if c["name"] == "unattributed":
            c["value_us"] = -50.0
    floor = case["variants"][0]["floor"]["ideal_us"]
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    neg = [b for b in ax.patches if b.get_height() < 0]
    assert len(neg) == 1 and neg[0].get_y() == pytest.approx(floor) and ax.get_ylim()[0] <= floor - 50.0
    plt.close(fig)


def test_timeline_names_never_overlap():
    import matplotlib.pyplot as plt

    doc = profile_doc(random.Random(5), n_iter=3)
    case = doc["cases"][0]
    for v in case["variants"]:  # many short phases with long names, as a real trace has
        v["phases"] = [{"rank": r, "name": f"a_rather_long_kernel_name_{i}", "role": "compute", "start_us": 3.0 * i,
                        "end_us": 3.0 * i + 2.5 + (40 if i == 7 else 0), "label": "measured", "parts": {}}
                       for r in (0, 1) for i in range(8)]
    fig = plots.timeline_figure(case)
    labels = _texts(fig)
    assert labels and not _overlaps(labels)
    assert any(t.startswith("a_rather_long") for t, _ in labels)  # the long phase keeps its name
    plt.close(fig)
    assert_valid_png(plots.timeline(case))
    assert_valid_svg(plots.timeline(case, "svg"))


def test_timeline_png_of_model(model_doc):
    assert_valid_png(plots.timeline(model_doc["cases"][2]))


def test_sweep_lines_are_told_apart():
    import matplotlib.pyplot as plt

    from taxes.model.hardware import BUILTIN
    from taxes.model.predict import sweep
    from taxes.workloads import make_workload

    values = [1024, 2048, 4096, 8192]
    names = ["bsp", "bsp-graph", "fused-pull", "fused-push", "fused-push-graph"]
    preds = sweep(make_workload("ag-gemm", {}, 2), "M", values, BUILTIN["h100-sxm"], tuple(names))
    e2e = {v: [ps[i].e2e_us for ps in preds] for i, v in enumerate(names)}
    e2e["copy-of-bsp"] = list(e2e["bsp"])  # a series lying exactly on another
    taxes = {"bsp": {t: [ps[0].taxes_us()[t] for ps in preds] for t in TAXES}}
    ratio = [ps[0].e2e_us / min(ps[2].e2e_us, ps[3].e2e_us) for ps in preds]
    fig = plots.sweep_figure("M", values, e2e, taxes, ratio, "sweep")
    lines = fig.axes[0].get_lines()
    styles = [(ln.get_marker(), ln.get_linestyle()) for ln in lines]
    assert len(set(styles)) == len(styles), "two lines look the same"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(e.startswith("bsp = ") and "copy-of-bsp" in e.split(" = ") for e in legend)  # named together
    assert all(any(n in entry for entry in legend) for n in e2e)  # every variant is named
    plt.close(fig)
    assert_valid_png(plots.sweep_lines("M", values, e2e, taxes, ratio, "sweep"))
    assert_valid_svg(plots.sweep_lines("M", values, e2e, taxes, None, "no ratio panel", "svg"))


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


# ---- a new user's first reports --------------------------------------------------------------------


@pytest.fixture
def traced_paths(tmp_path):
    """Two ranks' traces of a tensor-parallel step (tests/_analyze_data.py builds them event by event)."""
    from _analyze_data import write_tp

    return write_tp(tmp_path / "traces")


def _analyze_document(paths) -> dict:
    from taxes.attribution import analyze as A
    from taxes.documents import analysis_document as D

    return results.loads(results.dumps(D.analysis_document(A.analyze([str(p) for p in paths]))))


def _host_bound_step(doc: dict) -> dict:
    """The analysed step made three-quarters host-bound: the rows of the slowest rank per step (rank null)
    set to compute 100, host-bound 740, sync wait 60 and exposed transfer 100 us (1,000 us)."""
    v = doc["cases"][0]["variants"][0]
    made = {"compute": 100.0, "host_bound": 740.0, "sync_wait": 60.0, "exposed_transfer": 100.0}
    for c in v["components"]:
        if c["rank"] is None:
            c["value_us"] = made.get(c["name"], 0.0)
    v["attributed_e2e_us"] = v["plain_e2e_us"] = 1000.0
    v["samples_us"] = [[1000.0] * len(s) for s in v["samples_us"]]
    v["e2e_us"] = results.summarize_samples(v["samples_us"])
    return doc


def test_the_verdict_names_the_largest_cost_whatever_its_kind(traced_paths):
    """Defect: a step 74% host-bound headlined 'best variant: trace' and bulk-sync 16%; the host-bound time
    appeared only in lower tables."""
    doc = _host_bound_step(_analyze_document(traced_paths))
    header, rows, _ = report_verdict.summary_rows(doc)
    verdict = " | ".join(rows[0])
    assert "host-bound 740.0 (74%); bulk-synchronous 160.0 (16%)" in verdict, verdict  # the largest first
    md = render.render_markdown(doc)
    assert md.index("host-bound 740.0 (74%)") < md.index("us per iteration")  # in the verdict, before the details


def test_the_measured_versions_are_shown_never_none(traced_paths):
    """Defect: the metadata line of an analysed trace printed 'torch None, triton None'."""
    doc = _analyze_document(traced_paths)
    line = report_rows.meta_line(doc)
    assert "None" not in line
    assert "CUDA 12.8, NCCL 2.21.5, torch and triton not recorded in the traces" in line
    doc["metadata"].update(torch_version="2.6.0", triton_version="3.2.0")
    assert report_rows.meta_line(doc).endswith("torch 2.6.0, triton 3.2.0, CUDA 12.8, NCCL 2.21.5")


class _Sections(html.parser.HTMLParser):
    """Every <h3> section of a page with the rows of the table that follows it."""

    def __init__(self):
        super().__init__()
        self.sections, self._in, self._row, self._cell = {}, None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "h3":
            self._in = "title"
            self._title = ""
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""
        elif tag == "tr" and self._in == "table":
            self._row = []

    def handle_endtag(self, tag):
        if tag == "h3":
            self._in = "table"
            self.sections[self._title] = []
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.sections[self._title].append(self._row)
            self._row = None
        elif tag == "table":
            self._in = None

    def handle_data(self, data):
        if self._in == "title":
            self._title += data
        elif self._cell is not None:
            self._cell += data


def _sections_of(page: str) -> dict:
    p = _Sections()
    p.feed(page)
    return p.sections


def test_every_section_of_analyze_survives_json_then_report(traced_paths, tmp_path):
    """Defect: `analyze --format json` then `taxes report --format html` lost the stragglers, host frames,
    what-if, collective-instance and intermediates sections that `analyze --format html` shows."""
    from click.testing import CliRunner

    from taxes.cli.main import cli

    run = CliRunner()
    traces = [str(p) for p in traced_paths]
    for args in (["--format", "html", "-o", str(tmp_path / "analyze.html")],
                 ["--format", "json", "-o", str(tmp_path / "doc.json")]):
        res = run.invoke(cli, ["analyze", *traces, *args])
        assert res.exit_code == 0, res.output
    res = run.invoke(cli, ["report", str(tmp_path / "doc.json"), "--format", "html", "-o", str(tmp_path / "report.html")])
    assert res.exit_code == 0, res.output
    shown = _sections_of((tmp_path / "analyze.html").read_text())
    reported = _sections_of((tmp_path / "report.html").read_text())
    for name in ("stragglers", "where the host was", "what if", "collective instances", "intermediates"):
        assert any(t.startswith(name) for t in shown), name  # what analyze shows ...
    assert shown == reported  # ... every section, every row, after the document went through JSON
    md = run.invoke(cli, ["report", str(tmp_path / "doc.json"), "--format", "md"]).output
    assert all(f"### {md_escape(t)}" in md for t in shown if t != "Per rank")


def test_the_summary_stays_one_table_at_80_columns():
    """Defect: at 80 columns the one-row summary became five tables, so the verdict was split."""
    from rich.console import Console

    doc = results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))
    buf = io.StringIO()
    render.render_terminal(doc, Console(file=buf, width=80, color_system=None, highlight=False))
    text = buf.getvalue()
    summary = text[:text.index("FAILED check") if "FAILED check" in text else text.index("us per iteration")]
    assert summary.count("summary") == 1 and "(1 of" not in summary
    assert all(len(line) <= 80 for line in summary.splitlines())
    header, rows, _ = report_verdict.summary_rows(doc)
    words = " ".join(" ".join(re.split(r"[│┃]", line)) for line in summary.splitlines()).split()
    for cell in [*header, *(c for r in rows for c in r)]:  # every word of every cell, none cut
        for w in cell.split():
            assert w in words, w


def test_bars_stand_on_the_floor_drawn_as_a_line():
    """Defect: bars started at 0, so a 174 us floor filled 80% of the height and variants differed by
    slivers."""
    import matplotlib.pyplot as plt

    case = results.load(committed("reports/profile/flash_decode-h100-x1-B1-S131072.json.gz"))["cases"][0]
    floor = case["variants"][0]["floor"]["ideal_us"]
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    assert (floor - lo) / (hi - lo) < 0.1  # the floor takes a tenth of the height at most
    assert any(list(line.get_ydata()) == pytest.approx([floor, floor]) for line in ax.lines)  # and is a line across
    assert all(b.get_y() == pytest.approx(floor) for b in ax.patches[:len(case["variants"])])  # the bars stand on it
    plt.close(fig)


def test_rows_take_at_most_8_colours_grouped_by_tax(emulated_doc):
    """Defect: up to 15 legend entries in similar pinks."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    case = copy.deepcopy(emulated_doc["cases"][0])
    for v in case["variants"]:  # every row present
        for c in v["components"]:
            c["value_us"] = 1.0 + (c["value_us"] if c["value_us"] > 0 else 0.0)
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    colours = {to_hex(b.get_facecolor()) for b in ax.patches}
    assert len(colours) <= 8, colours
    for tax, parts in TAXES.items():  # the rows of one tax share its colour
        assert len({plots.COLORS[p] for p in parts}) == 1, tax
    looks = {(to_hex(h.get_facecolor()), h.get_hatch()) for h in ax.get_legend().get_patches()}
    assert len(looks) == len(ax.get_legend().get_patches())  # yet every entry looks different
    plt.close(fig)


def test_chart_titles_are_whole():
    """Defect: titles were cut ('Hkv...')."""
    import matplotlib.pyplot as plt

    case = results.load(committed("reports/profile/flash_decode-h100-x1-B1-S131072.json.gz"))["cases"][0]
    full = plots.case_title(case)
    for figure, title in ((plots.stacked_bars_figure, full), (plots.timeline_figure, f"timeline: {full}"),
                          (plots.predicted_vs_measured_figure, f"measured (left) and predicted (right, lighter): {full}")):
        fig = figure(case)
        assert " ".join(fig.axes[0].get_title().split()) == title
        plt.close(fig)
