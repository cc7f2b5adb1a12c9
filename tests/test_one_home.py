"""One home per shared value: the method's TAXES, STATISTIC and PERTURBED live in taxes/method.py,
the JSON constant refusal in taxes/sanitize.py, the Markdown table writer in taxes/reports/markdown_table.py.
Every user follows the one value: moved, the document builder, `taxes analyze`, the checks and every
report move with it."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

from taxes.attribution import analyze as A
from taxes.console import render_text
from taxes import method
from taxes.documents.analysis_document import analysis_document
from taxes.documents import checks, profile_document, results
from taxes.model.hardware import get_profile
from taxes.reports import render, verdict
from taxes.workloads import make_workload

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("taxes", "cli", "kernels", "benchmarks")
HOMES = {"PERTURBED": "taxes/method.py", "STATISTIC": "taxes/method.py",
         "TAXES": "taxes/method.py", "reject_constant": "taxes/sanitize.py",
         "md_table": "taxes/reports/markdown_table.py"}
COPIES = {"_reject_constant": "reject_constant", "_md_table": "md_table"}  # old spellings of the same thing
SMALL = 0.005  # below the 1% measurement cost planted here; the default (3%) is above it
COST_SHARE = 0.01


def _definitions(path: Path) -> set[str]:
    """The names of HOMES (or COPIES) a module binds by assignment or def, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        else:
            continue
        out |= {COPIES.get(n, n) for n in names if n in HOMES or n in COPIES}
    return out


def test_each_shared_value_is_defined_in_its_home_only():
    where: dict[str, list[str]] = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for name in _definitions(path):
                where.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert {name: [home] for name, home in HOMES.items()} == where


def test_the_definition_scan_sees_a_copy(tmp_path):
    copy = tmp_path / "copy.py"
    copy.write_text("PERTURBED = 0.03\n\ndef _md_table(header, rows):\n    return ''\n", encoding="utf-8")
    assert _definitions(copy) == {"PERTURBED", "md_table"}


# ---- every user follows PERTURBED --------------------------------------------------------------------


@pytest.fixture
def small_perturbed(monkeypatch):
    """PERTURBED set to SMALL in its home and wherever a module imported the home's value under its name
    (a copy defined elsewhere is not the same object, and stays as it was: the test below then fails)."""
    home = method.PERTURBED
    followers = sorted(m.__name__ for m in list(sys.modules.values())
                       if m is not None and m.__name__.startswith("taxes") and getattr(m, "PERTURBED", None) is home)
    for name in followers:
        monkeypatch.setattr(sys.modules[name], "PERTURBED", SMALL)
    return followers


def _builder_entry() -> dict:
    """A variant entry from the document builder (taxes.documents.profile_document) whose instrumented E2E
    (what its rows add up to) is its plain E2E plus COST_SHARE of it: two simulated ranks of ag-gemm."""
    from sim import Launch, run

    hw = get_profile("h200-sxm")
    w = make_workload("ag-gemm", {"M": 64, "N": 64, "K": 32}, 2, "bf16")

    def timelines():
        return {"cuda events": [run([Launch(dur_us=50.0, pre_us=5.0), Launch(dur_us=30.0)], rank=r) for r in (0, 1)]}

    first = profile_document.attribute_variant(w, "bsp", timelines(), [[100.0] * 4] * 2, hw, {})
    plain = first["attributed_e2e_us"] / (1 + COST_SHARE)
    return profile_document.attribute_variant(w, "bsp", timelines(), [[plain] * 4] * 2, hw, {})


def _analysis_document(tmp_path: Path) -> dict:
    """A `taxes analyze` document of two ranks' traces whose plain steps took 1 / (1 + COST_SHARE) of the
    traced ones."""
    from _analyze_data import write_tp

    paths = [str(p) for p in write_tp(tmp_path / "traces")]
    traced = A.analyze(paths).plain["attributed_e2e_us"]
    plain = {r: [traced / (1 + COST_SHARE)] * 8 for r in (0, 1)}
    return results.loads(results.dumps(analysis_document(A.analyze(paths, plain_steps=plain))))


def _measurement_checks(doc: dict):
    frame = checks.checks_frame(doc)
    return frame[frame["check"] == "measurement"]


def _views(doc: dict) -> dict[str, str]:
    """The head of every report (before its summary), where the marks are, and the JSON report's marks."""
    md = render.render_markdown(doc)
    page = render.render_html(doc)
    term = render_text(lambda c: render.render_terminal(doc, c))
    return {"markdown": md[:md.index("## Summary")], "html": page[page.index("<body"):page.index('id="summary"')],
            "terminal": term[:term.index("ummary")],
            "json": " ".join(json.loads(render.render_json(doc))["report"]["marks"])}


def test_a_one_percent_cost_is_not_perturbed_at_the_default():
    assert method.PERTURBED > COST_SHARE  # what the next test moves below the planted cost
    entry = _builder_entry()
    assert entry["measurement_cost_us"] == pytest.approx(COST_SHARE * entry["plain_e2e_us"])
    assert entry["perturbed"] is False


def test_every_user_follows_the_one_perturbed_value(tmp_path, small_perturbed):
    assert {"taxes.documents.profile_document", "taxes.attribution.analyze", "taxes.documents.checks",
            "taxes.reports.verdict"} <= set(small_perturbed)
    # the document builder
    entry = _builder_entry()
    assert entry["measurement_cost_us"] == pytest.approx(COST_SHARE * entry["plain_e2e_us"])
    assert entry["perturbed"] is True
    # the analyze path
    doc = _analysis_document(tmp_path)
    v = doc["cases"][0]["variants"][0]
    assert v["measurement_cost_us"] == pytest.approx(COST_SHARE * v["plain_e2e_us"])
    assert v["perturbed"] is True
    # the checks: the measurement limit is the one value, and the variant fails it
    rows = _measurement_checks(doc)
    assert len(rows) == 1 and rows["limit"].tolist() == [SMALL] and not rows["ok"].any()
    # every report, from the numbers alone (the document's own flag cleared)
    v["perturbed"] = False
    assert verdict.perturbed(v)
    for view, head in _views(doc).items():
        assert "PERTURBED" in head, view
    assert f"more than {100 * SMALL:g}% of plain E2E" in _views(doc)["markdown"]


def test_the_same_document_is_not_perturbed_at_the_default(tmp_path):
    doc = _analysis_document(tmp_path)
    v = doc["cases"][0]["variants"][0]
    assert v["measurement_cost_us"] == pytest.approx(COST_SHARE * v["plain_e2e_us"])
    assert v["perturbed"] is False
    rows = _measurement_checks(doc)
    assert rows["limit"].tolist() == [method.PERTURBED] and rows["ok"].all()
    for view, head in _views(doc).items():
        assert "PERTURBED" not in head, view
