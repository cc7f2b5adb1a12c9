"""Reports: Markdown, JSON summary, self-contained HTML, and the PNG plots."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
from _util import assert_one_line, assert_self_contained_html, assert_valid_png, profile_doc

from taxes import results
from taxes.errors import TaxesError
from taxes.model import COMPONENT_TITLES, COMPONENTS, TAXES
from taxes.reports import plots, render


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


def test_markdown_report(model_doc):
    text = render.render_markdown(model_doc)
    assert text.startswith("# taxes report")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert len(headings) == len(model_doc["cases"])
    tables = _md_tables(text)
    attribution = [t for t in tables if t[0][0] == "us per iteration"]
    assert len(attribution) == len(model_doc["cases"])
    for case, heading, table in zip(model_doc["cases"], headings, attribution):
        assert case["workload"] in heading
        assert all(f"{k}={v}" in heading for k, v in case["shape"].items())
        assert all(len(row) == len(table[0]) for row in table)  # a well-formed table
        assert table[0][1:] == [v["variant"] for v in case["variants"]]
        rows = {row[0]: row[1:] for row in table}
        for v, cell in zip(case["variants"], rows["E2E"]):
            assert _number(cell) == pytest.approx(v["e2e_us"]["median"], abs=0.051)
            assert cell.endswith(" p")  # predicted
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


def test_markdown_report_of_measured_document_shows_ranks_and_correctness():
    doc = profile_doc(random.Random(11), n_iter=9)
    text = render.render_markdown(doc)
    assert "Per rank:" in text
    per_rank = [t for t in _md_tables(text) if t[0][:2] == ["variant", "rank"]]
    assert len(per_rank) == len(doc["cases"])
    assert len(per_rank[0]) == 1 + 2 * 2  # header + variants x ranks
    assert "correct (rel. error)" in text and "yes (1.0e-03)" in text
    e2e_row = next(t for t in _md_tables(text) if t[0][0] == "us per iteration")[1]
    e = doc["cases"][0]["variants"][0]["e2e_us"]
    assert e2e_row[0] == "E2E (plain)" and e2e_row[1].endswith(" m")
    assert e2e_row[1].startswith(f"{doc['cases'][0]['variants'][0]['plain_e2e_us']:,.1f}")
    assert f"{e['p10']:,.1f}" in e2e_row[1] and f"{e['p90']:,.1f}" in e2e_row[1]


def test_json_summary(model_doc):
    out = render.render_json(model_doc)
    data = json.loads(out)
    assert data["metadata"] == model_doc["metadata"]
    assert len(data["cases"]) == len(model_doc["cases"])
    for case, src in zip(data["cases"], model_doc["cases"]):
        assert case["workload"] == src["workload"] and case["shape"] == src["shape"]
        bsp = src["variants"][0]["e2e_us"]["median"]
        for var, sv in zip(case["variants"], src["variants"]):
            comps = {c["name"]: c["value_us"] for c in sv["components"]}
            assert var["components_us"] == comps
            assert set(var["labels"].values()) == {"predicted"}
            assert math.fsum(var["components_us"].values()) == pytest.approx(var["e2e_us"]["median"], rel=1e-12)
            assert var["taxes_us"]["bulk-synchronous"] == pytest.approx(comps["sync_wait"] + comps["exposed_transfer"])
            assert var["taxes_us"]["data-locality"] == comps["locality"]
            assert var["taxes_us"]["kernel-launch"] == comps["launch"]
            assert set(var["taxes_us"]) == set(TAXES)
            assert var["speedup_vs_bsp"] == pytest.approx(bsp / sv["e2e_us"]["median"])


def test_html_report_is_self_contained(model_doc):
    doc = dict(model_doc, cases=model_doc["cases"][:2])
    text = render.render_html(doc)
    assert_self_contained_html(text, n_images=2 * 2)  # components and timeline per case
    assert text.count("<table>") == 2 * 2  # attribution and floor per case
    for case in doc["cases"]:
        for v in case["variants"]:
            assert f"<th>{v['variant']}</th>" in text


def test_html_escapes_document_text(model_doc):
    doc = dict(model_doc, cases=model_doc["cases"][:1])
    doc["metadata"] = dict(doc["metadata"], hardware_profile="<script>alert(1)</script>")
    text = render.render_html(doc)
    assert "<script>" not in text and "&lt;script&gt;" in text


# ---- plots -----------------------------------------------------------------------------------------


def test_stacked_bars_png(model_doc):
    assert_valid_png(plots.stacked_bars(model_doc["cases"][0]))


def test_timeline_png_of_measured_ranks():
    doc = profile_doc(random.Random(5), n_iter=3)
    img = assert_valid_png(plots.timeline(doc["cases"][0]))
    assert img.shape[0] > 100


def test_timeline_png_of_model(model_doc):
    assert_valid_png(plots.timeline(model_doc["cases"][2]))


def test_sweep_png():
    from taxes.hardware import BUILTIN
    from taxes.model import sweep
    from taxes.workloads import make_workload

    values = [1024, 2048, 4096, 8192]
    preds = sweep(make_workload("ag-gemm", {}, 2), "M", values, BUILTIN["h100-sxm"])
    e2e = {v: [ps[i].e2e_us for ps in preds] for i, v in enumerate(["bsp", "bsp-graph", "fused-pull", "fused-push"])}
    taxes = {"bsp": {t: [ps[0].taxes_us()[t] for ps in preds] for t in TAXES}}
    ratio = [ps[0].e2e_us / min(ps[2].e2e_us, ps[3].e2e_us) for ps in preds]
    assert_valid_png(plots.sweep_lines("M", values, e2e, taxes, ratio, "sweep"))
    assert_valid_png(plots.sweep_lines("M", values, e2e, taxes, None, "no ratio panel"))


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
], ids=["git_commit-int", "gpu_names-int", "gpu_names-ints", "floor-string", "floor-value-string", "p10-without-p90"])
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
