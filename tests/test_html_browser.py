"""The HTML report in a real browser: headless Chromium (installed by .ci/run from Debian's packages) opens
the pages `taxes report --format html` writes and must find no console error, no failed resource, every
chart drawn, and the summary first. Skips where no Chromium is installed."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from _browser import Browser, chromium

from committed import committed
from taxes.documents import results
from taxes.reports import render

DATA = Path(__file__).parent / "data" / "documents"
ROOT = Path(__file__).resolve().parent.parent

CHECKS = {
    "title": "document.querySelector('h1') && document.querySelector('h1').textContent",
    "summary_first": "(() => { const s = document.querySelector('table.summary');"
                     " const d = Array.from(document.querySelectorAll('th')).find(t => t.textContent === 'us per iteration');"
                     " return !!s && !!d && !!(s.compareDocumentPosition(d) & Node.DOCUMENT_POSITION_FOLLOWING); })()",
    "summary_rows": "document.querySelectorAll('table.summary tbody tr').length",
    "summary_visible": "(() => { const t = document.querySelector('table.summary'); const r = t && t.getBoundingClientRect();"
                       " return !!r && r.width > 0 && r.height > 0; })()",
    "images": "Array.from(document.images).map(i => i.complete && i.naturalWidth > 0 && i.naturalHeight > 0)",
    "failed_checks_red": "Array.from(document.querySelectorAll('.fail')).map(e => getComputedStyle(e).color)",
    "marks": "Array.from(document.querySelectorAll('p.mark')).map(e => e.textContent.split(':')[0])",
    "scripts": "document.scripts.length",
}


@pytest.fixture(scope="module")
def browser():
    binary = chromium()
    if binary is None:
        pytest.skip("no Chromium here (.ci/run installs Debian's chromium)")
    b = Browser(binary)
    yield b
    b.close()


def _open(browser, tmp_path, doc, name="report.html"):
    path = tmp_path / name
    path.write_text(render.render_html(doc), encoding="utf-8")
    return browser.open(path.as_uri(), CHECKS)


def test_the_report_of_an_emulated_run_loads_clean_and_leads_with_its_summary(browser, tmp_path):
    doc = results.loads(gzip.decompress((DATA / "emulated_ag_gemm.json.gz").read_bytes()).decode())
    problems, v = _open(browser, tmp_path, doc)
    assert problems == []
    assert v["title"] == "ag-gemm on emulated CPU ranks, world 2"
    assert v["summary_first"] and v["summary_visible"] and v["summary_rows"] == 1
    assert v["images"] and all(v["images"])  # every chart decoded and drawn
    assert v["marks"][:2] == ["EMULATED", "PERTURBED"]
    assert v["failed_checks_red"] and set(v["failed_checks_red"]) == {"rgb(204, 0, 0)"}
    assert v["scripts"] == 0


def test_a_real_gpu_report_and_a_model_report_load_clean(browser, tmp_path, model_doc):
    gpu = results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))
    problems, v = _open(browser, tmp_path, gpu)
    assert problems == [] and v["title"] == "ag-gemm (2 cases) on 2 x NVIDIA H100 80GB HBM3, world 2"
    assert v["summary_first"] and v["summary_rows"] == 2 and v["marks"] == ["PERTURBED"]
    assert v["images"] and all(v["images"])  # its rows' charts, every one drawn
    problems, v = _open(browser, tmp_path, model_doc, "model.html")
    assert problems == [] and v["summary_rows"] == len(model_doc["cases"]) and all(v["images"])
    assert "PREDICTED" in v["marks"]


def test_a_hostile_document_runs_nothing_in_the_browser(browser, tmp_path, model_doc):
    doc = dict(model_doc, cases=model_doc["cases"][:1])
    doc["cases"][0]["variants"][0]["variant"] = "<script>console.error('ran')</script><img src=x onerror=console.error(1)>"
    doc["metadata"] = dict(doc["metadata"], hardware_profile="</title><script>console.error('title')</script>")
    problems, v = _open(browser, tmp_path, results.validate(doc))
    assert problems == [] and v["scripts"] == 0 and all(v["images"])


def test_the_client_sees_console_errors_and_broken_images(browser, tmp_path):
    """The check itself can fail: a page with an error and a missing image is reported."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><h1>x</h1><script>console.error('boom')</script>"
                    "<img src='missing.png'></body></html>")
    problems, v = browser.open(page.as_uri(), CHECKS)
    assert any("boom" in p for p in problems) and any("missing.png" in p for p in problems)
    assert v["images"] == [False]
