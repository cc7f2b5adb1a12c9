"""A new user's first reports, of analysed traces: the verdict, the measured versions, every section through
JSON, the summary at 80 columns, and the bars, colours and titles of its charts.
"""

from __future__ import annotations

import copy
import html.parser
import io
import re

import pytest

from committed import committed
from taxes.documents import results
from taxes.method import TAXES
from taxes.reports import plots, render
from taxes.reports import rows as report_rows
from taxes.reports import verdict as report_verdict
from taxes.sanitize import markdown as md_escape


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
