"""`taxes compare`: documents that cannot be tested, the real committed report, the renderers (step summary,
JUnit XML, benchmark JSON, tables), parsing and bad input, and the statistic and taxes every view prints.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pytest
from _compare_data import document, independent_iqm, noisy_samples, run, save, two_docs, variant
from _util import assert_one_line
from committed import committed
from hypothesis import given
from hypothesis import strategies as st

from taxes.reports import compare as cmp
from taxes.documents import results
from taxes.errors import TaxesError


AG_GEMM = committed("reports/profile/ag_gemm-h100-x2.json.gz")  # two measured shapes with every iteration's samples
FLASH_DECODE = Path(__file__).resolve().parent / "data" / "summary_only_flash_decode.json"  # medians only, no samples


# ---- documents that cannot be tested ---------------------------------------------------------------


def test_failed_errored_and_empty_variants_are_shown_not_compared(tmp_path):
    rng = np.random.default_rng(2)
    s = lambda m: noisy_samples(rng, m, 30)  # noqa: E731
    base = document([("ag-gemm", {"M": 2048}, [variant("bsp", s(100)), variant("fused-pull", s(100)),
                                                variant("fused-push", s(100)), variant("bsp-graph", s(100))])])
    new = document([("ag-gemm", {"M": 2048}, [variant("bsp", s(300), passed=False),
                                               variant("fused-pull", [], error="Timeout\nwaiting for flag"),
                                               variant("fused-push", []), variant("bsp-graph", s(100))])])
    df = cmp.compare_documents(base, new, threshold=0.05).set_index("variant")
    assert list(df.loc[["bsp", "fused-pull", "fused-push"], "verdict"]) == ["not compared"] * 3
    assert "correctness" in df.loc["bsp", "note"] and "new:" in df.loc["bsp", "note"]
    assert "Timeout waiting for flag" in df.loc["fused-pull", "note"]
    assert "no samples and no recorded E2E" in df.loc["fused-push", "note"]
    assert df.loc["bsp-graph", "verdict"] == "same"
    assert not df.loc[["bsp", "fused-pull", "fused-push"], "ratio"].notna().any()
    b, n = save(tmp_path, "b.json", base), save(tmp_path, "n.json", new)
    for fmt in cmp_formats():
        code, out, err = run([b, n, "--fail-above", "5%", "--format", fmt])
        assert code == 0 and "Traceback" not in err, (fmt, err)
    bench = json.loads(run([b, n, "--format", "benchmark-json"])[1])
    assert [e["name"].split()[-1] for e in bench] == ["bsp-graph"]  # failed / errored / empty new sides have no value


def cmp_formats():
    from taxes.cli.compare_cmd import COMPARE_FORMATS

    return COMPARE_FORMATS


def test_summary_only_documents_get_a_ratio_and_no_test(tmp_path):
    doc = results.load(FLASH_DECODE)
    slow = copy.deepcopy(doc)
    for case in slow["cases"]:
        for var in case["variants"]:
            var["e2e_us"]["median"] *= 2
    df = cmp.compare_documents(doc, slow, threshold=0.05)
    n_variants = sum(len(c["variants"]) for c in doc["cases"])
    assert len(df) == n_variants
    assert set(df["verdict"]) == {"no test"} and not df["significant"].any()
    assert np.allclose(df["ratio"], 2.0) and df["p_value"].isna().all() and df["ci_low"].isna().all()
    assert (df["note"] == "no samples: no test").all()
    code, out, err = run([FLASH_DECODE, save(tmp_path, "slow.json", slow), "--fail-above", "5%", "--format", "junit"])
    assert code == 0
    suite = ET.fromstring(out).find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == str(n_variants)


def test_model_document_against_a_measured_one_has_no_test(model_doc):
    rng = np.random.default_rng(4)
    measured = copy.deepcopy(model_doc)
    for case in measured["cases"]:
        for var in case["variants"]:
            var["samples_us"] = noisy_samples(rng, var["e2e_us"]["median"], 20)
            var["e2e_us"] = results.summarize_samples(var["samples_us"])
    df = cmp.compare_documents(model_doc, results.validate(measured))
    assert len(df) == sum(len(c["variants"]) for c in model_doc["cases"])
    assert set(df["verdict"]) == {"no test"}
    assert df["note"].str.contains("base predicted, new measured").all()


def test_unmatched_cases_and_variants_are_listed(tmp_path):
    rng = np.random.default_rng(8)
    s = lambda: noisy_samples(rng, 100, 20)  # noqa: E731
    base = document([("ag-gemm", {"M": 2048}, [variant("bsp", s()), variant("fused-pull", s())]),
                     ("gemm-rs", {"M": 1024}, [variant("bsp", s())])])
    new = document([("ag-gemm", {"M": 2048}, [variant("bsp", s()), variant("fused-push", s())]),
                    ("flash-decode", {}, [variant("bsp", s())])])
    df = cmp.compare_documents(base, new, base_name="B", new_name="N")
    assert list(df["variant"]) == ["bsp"]
    unmatched = df.attrs["unmatched"]
    assert len(unmatched) == 4
    assert any(u.startswith("only in B:") and "fused-pull" in u for u in unmatched)
    assert any(u.startswith("only in N:") and "fused-push" in u for u in unmatched)
    assert any(u.startswith("only in B:") and "gemm-rs" in u for u in unmatched)
    assert any(u.startswith("only in N:") and "flash-decode" in u for u in unmatched)
    code, out, err = run([save(tmp_path, "b.json", base), save(tmp_path, "n.json", new), "--format", "md"])
    assert code == 0 and "4 unmatched" in out and out.count("\n- only in ") == 4
    js = json.loads(run([tmp_path / "b.json", tmp_path / "n.json", "--format", "json"])[1])
    assert len(js["unmatched"]) == 4 and len(js["rows"]) == 1


# ---- the real committed report ---------------------------------------------------------------------


def test_real_report_against_itself_is_all_same(tmp_path):
    doc = results.load(AG_GEMM)
    n_variants = sum(len(c["variants"]) for c in doc["cases"])
    code, out, err = run([AG_GEMM, AG_GEMM, "--fail-above", "5%", "--format", "json"])
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == n_variants
    assert all(r["verdict"] == "same" and r["ratio"] == 1.0 and r["p_value"] == 1.0 for r in rows)
    assert all(r["ci_low"] <= 1.0 <= r["ci_high"] for r in rows)
    iqms = [independent_iqm(doc, i, v["variant"]) for i, c in enumerate(doc["cases"]) for v in c["variants"]]
    assert [r["base_iqm_us"] for r in rows] == pytest.approx(iqms)  # the statistic every view prints


def test_real_report_bsp_against_fused_push_within_itself():
    doc = results.load(AG_GEMM)
    df = cmp.compare_documents(doc, doc, variants=("bsp", "fused-push"), threshold=0.05)
    assert len(df) == len(doc["cases"]) and (df["variant"] == "fused-push vs bsp").all()
    for i, r in df.iterrows():
        assert r["ratio"] == pytest.approx(independent_iqm(doc, i, "fused-push") / independent_iqm(doc, i, "bsp"))
        assert r["ci_low"] <= r["ratio"] <= r["ci_high"]
        if r["verdict"] == "slower":
            assert r["ratio"] > 1.05 and r["ci_low"] > 1 and r["p_value"] < 0.05
        elif r["verdict"] == "faster":
            assert r["ratio"] < 1 / 1.05 and r["ci_high"] < 1 and r["p_value"] < 0.05
    code, out, err = run([AG_GEMM, "--variants", "bsp,fused-push", "--fail-above", "5%"])
    assert code == (1 if (df["verdict"] == "slower").any() else 0), err
    verdicts, per_tax = out.split("per tax: what changed", 1)
    assert verdicts.count("fused-push vs bsp") == len(df)
    assert per_tax.count("fused-push vs bsp") == 3 * len(df)  # one line per tax and case
    # reversed, every call flips
    rev = cmp.compare_documents(doc, doc, variants=("fused-push", "bsp"), threshold=0.05)
    flip = {"slower": "faster", "faster": "slower", "same": "same"}
    assert list(rev["verdict"]) == [flip[v] for v in df["verdict"]]


# ---- outputs ---------------------------------------------------------------------------------------


def test_github_step_summary_is_appended(tmp_path):
    base, new = two_docs(np.random.default_rng(9), 1.2)
    b, n = save(tmp_path, "b.json", base), save(tmp_path, "n.json", new)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    env = {"GITHUB_STEP_SUMMARY": str(summary)}
    code, out, err = run([b, n, "--format", "junit", "-o", tmp_path / "junit.xml", "--fail-above", "5%"], env=env)
    assert code == 1 and out == ""
    text = summary.read_text()
    assert text.startswith("earlier step\n") and text.count("## taxes compare") == 1
    assert "4 significant slowdowns beyond +5.0%" in text
    assert len([line for line in text.splitlines() if line.startswith("| ag-gemm") or line.startswith("| flash-decode")]) == 4
    run([b, n], env=env)
    assert summary.read_text().count("## taxes compare") == 2
    code, out, err = run([b, n])  # unset: nothing written anywhere else
    assert code == 0 and sorted(os.listdir(tmp_path)) == ["b.json", "junit.xml", "n.json", "summary.md"]


def test_junit_xml_parses_and_counts_failures(tmp_path):
    rng = np.random.default_rng(12)
    base = document([("ag-gemm", {"M": 2048}, [variant(v, noisy_samples(rng, 100, 40)) for v in ("bsp", "bsp-graph", "fused-push")])])
    new = document([("ag-gemm", {"M": 2048}, [variant("bsp", noisy_samples(rng, 130, 40)),
                                               variant("bsp-graph", noisy_samples(rng, 100, 40)),
                                               variant("fused-push", [], error="hung")])])
    df = cmp.compare_documents(base, new, threshold=0.05)
    root = ET.fromstring(cmp.render_junit(df))
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(df) == int(suite.get("tests")) == int(root.get("tests"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert int(suite.get("failures")) == len(failed) == (df["verdict"] == "slower").sum() == 1
    assert failed[0].endswith(" bsp") and skipped[0].endswith(" fused-push") and suite.get("skipped") == "1"
    assert "beyond +5.0%" in cases[0].find("failure").get("message")
    code, out, err = run([save(tmp_path, "b.json", base), save(tmp_path, "n.json", new), "--format", "junit",
                          "--fail-above", "5%"])
    assert code == 1 and ET.fromstring(out).find("testsuite").get("failures") == "1"


def test_benchmark_json_is_custom_smaller_is_better():
    doc = results.load(AG_GEMM)
    df = cmp.compare_documents(doc, doc, variants=("bsp", "fused-push"))
    entries = json.loads(cmp.render_benchmark_json(df))
    assert isinstance(entries, list) and len(entries) == len(df)
    for e, (_, r) in zip(entries, df.iterrows()):
        assert {"name", "unit", "value"} <= set(e) <= {"name", "unit", "value", "range", "extra"}
        assert isinstance(e["name"], str) and e["unit"] == "us" and isinstance(e["value"], (int, float))
        assert e["value"] == pytest.approx(r["new_iqm_us"], abs=1e-3)
        assert re.fullmatch(r"± \d+\.\d", e["range"]) and isinstance(e["extra"], str)
        half = float(e["range"].split()[1])
        assert half == pytest.approx((r["new_ci_high_us"] - r["new_ci_low_us"]) / 2, abs=0.051)
    assert len({e["name"] for e in entries}) == len(entries)  # the action keys its history by name


def test_table_and_markdown_and_output_file(tmp_path):
    base, new = two_docs(np.random.default_rng(13), 1.0)
    b, n = save(tmp_path, "b.json", base), save(tmp_path, "n.json", new)
    code, out, err = run([b, n])
    assert code == 0 and out.count("│ ag-gemm") == 2 and "4 rows:" in out
    md = tmp_path / "c.md"
    code, out, err = run([b, n, "--format", "md", "-o", md])
    assert code == 0 and out == "" and str(md) in err
    text = md.read_text()
    assert "No significant slowdown" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 4 and len({line.count("|") for line in table}) == 1
    txt = tmp_path / "c.txt"
    assert run([b, n, "-o", txt])[0] == 0 and "taxes compare" in txt.read_text()
    code, out, err = run([b, n, "--format", "json", "-o", txt])  # an existing file is kept without --force
    assert code == 2 and "--force" in err and "taxes compare" in txt.read_text()
    assert run([b, n, "--format", "json", "-o", txt, "--force"])[0] == 0
    assert len(json.loads(txt.read_text())["rows"]) == 4


def test_names_from_a_document_cannot_break_the_outputs(tmp_path):
    rng = np.random.default_rng(14)
    odd = "[bold]fused<&>\x01\n\"x\"[/bold]"
    base = document([("ag-gemm", {"M": 2048}, [variant(odd, noisy_samples(rng, 100, 20))])])
    new = document([("ag-gemm", {"M": 2048}, [variant(odd, noisy_samples(rng, 150, 20))])])
    b, n = save(tmp_path, "b.json", base), save(tmp_path, "n.json", new)
    code, out, err = run([b, n])
    assert code == 0 and "[bold]fused<&>" in out  # shown as written, not read as rich markup
    suite = ET.fromstring(run([b, n, "--format", "junit"])[1]).find("testsuite")
    assert "[bold]fused<&>" in suite.find("testcase").get("name") and suite.get("failures") == "1"
    md = run([b, n, "--format", "md"])[1]
    assert sum(line.startswith("| ag-gemm") for line in md.splitlines()) == 1
    assert json.loads(run([b, n, "--format", "benchmark-json"])[1])[0]["name"].startswith("ag-gemm")


# ---- parsing and bad input -------------------------------------------------------------------------


@given(st.floats(0, 1000, allow_nan=False))
def test_threshold_accepts_percent_with_or_without_sign(pct):
    assert cmp.parse_threshold(f"{pct!r}%") == cmp.parse_threshold(repr(pct)) == pytest.approx(pct / 100)


def test_confidence_forms():
    assert cmp.parse_confidence("95%") == cmp.parse_confidence("95") == cmp.parse_confidence("0.95") == pytest.approx(0.95)
    for bad in ("1", "100%", "0.3", "x", "nan", "-95"):
        with pytest.raises(TaxesError):
            cmp.parse_confidence(bad)


BAD = {
    "missing file": ["{missing}", "{good}"],
    "directory": ["{dir}", "{good}"],
    "not a result document": ["{good}", "{bad}"],
    "no paths": [],
    "three paths": ["{good}", "{good}", "{good}"],
    "one path without --variants": ["{good}"],
    "variant not in the document": ["{good}", "--variants", "bsp,fused-psh"],
    "variant not in BASE": ["{good}", "{good}", "--variants", "nope,bsp"],
    "one variant name": ["{good}", "--variants", "bsp"],
    "same variant twice in one document": ["{good}", "--variants", "bsp,bsp"],
    "threshold not a number": ["{good}", "{good}", "--fail-above", "five"],
    "threshold negative": ["{good}", "{good}", "--fail-above", "-5%"],
    "threshold infinite": ["{good}", "{good}", "--fail-above", "inf"],
    "confidence out of range": ["{good}", "{good}", "--confidence", "40%"],
    "negative seed": ["{good}", "{good}", "--seed", "-1"],
    "unknown format": ["{good}", "{good}", "--format", "xml"],
    "output into a missing directory": ["{good}", "{good}", "-o", "{nodir}"],
    "a case twice": ["{twice}", "{good}"],
    "output exists, no --force": ["{good}", "{good}", "--format", "md", "-o", "{good}"],
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_exits_2_with_one_line(tmp_path, case):
    rng = np.random.default_rng(1)
    good = document([("ag-gemm", {"M": 2048}, [variant("bsp", noisy_samples(rng, 100, 10))])])
    files = {"good": save(tmp_path, "good.json", good), "dir": tmp_path, "missing": tmp_path / "nope.json",
             "nodir": tmp_path / "no" / "out.md", "bad": tmp_path / "bad.json"}
    files["bad"].write_text('{"schema": "taxes.result", "cases": [')
    twice = dict(good, cases=good["cases"] * 2)
    files["twice"] = save(tmp_path, "twice.json", twice)
    before = sorted(os.listdir(tmp_path))
    code, out, err = run([a.format(**files) for a in BAD[case]])
    assert code == 2, (code, err)
    assert err.startswith("taxes: error: ") and err.count("\n") == 1, err
    assert_one_line(err.rstrip("\n"))
    assert "Traceback" not in err and "internal error" not in err and out == ""
    assert sorted(os.listdir(tmp_path)) == before


# ---- the statistic every view prints, and each tax --------------------------------------------------


def test_the_statistic_compared_is_the_interquartile_mean(tmp_path):
    """Defect: compare printed a median where every view says interquartile mean."""
    rng = np.random.default_rng(12)
    skewed = [list(100 + rng.exponential(40, 41)) for _ in range(2)]  # median and IQM differ by several us
    doc = document([("ag-gemm", {"M": 2048}, [variant("bsp", skewed)])])
    per_iteration = np.max(np.asarray(skewed), axis=0)
    iqm = independent_iqm(doc, 0, "bsp")
    assert abs(iqm - float(np.median(per_iteration))) > 1.0  # the two statistics tell apart here
    path = save(tmp_path, "d.json", doc)
    code, out, err = run([path, path, "--format", "json"])
    assert code == 0, err
    rep = json.loads(out)
    assert rep["statistic"] == "interquartile mean" and rep["rows"][0]["base_iqm_us"] == pytest.approx(iqm)
    assert rep["rows"][0]["base_iqm_us"] == pytest.approx(results.load(path)["cases"][0]["variants"][0]["e2e_us"]["iqm"])
    code, out, err = run([path, path, "--format", "md"])
    assert "base us (IQM)" in out and "IQM(new) / IQM(base)" in out and "median" not in out
    code, out, err = run([path, path])
    assert f"{iqm:,.1f}" in out and "median" not in out


def _tax(var: dict, tax: str) -> float:
    """A tax of a variant written out from its rows (rank null), as docs/method.md defines it."""
    parts = {"bulk-synchronous": ("sync_wait", "exposed_transfer"), "data-locality": ("locality",),
             "kernel-launch": ("launch",)}[tax]
    return sum(c["value_us"] for c in var["components"] if c["rank"] is None and c["name"] in parts)


def test_each_tax_changes_with_its_interval():
    """Defect: compare showed E2E only, no per-tax change."""
    doc = results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))  # keeps every rank's records
    df = cmp.compare_documents(doc, doc, variants=("bsp", "bsp-graph"))
    assert len(df) == 2
    for i, r in df.iterrows():
        by = {v["variant"]: v for v in doc["cases"][i]["variants"]}
        for tax in ("bulk-synchronous", "data-locality", "kernel-launch"):
            delta = _tax(by["bsp-graph"], tax) - _tax(by["bsp"], tax)
            assert r[f"{tax} base_us"] == pytest.approx(_tax(by["bsp"], tax))
            assert r[f"{tax} delta_us"] == pytest.approx(delta)
            assert r[f"{tax} ci_low_us"] <= delta + 1e-9 and delta - 1e-9 <= r[f"{tax} ci_high_us"]
        # a CUDA graph removes the launch tax: the change and its whole interval below zero
        assert r["kernel-launch ci_high_us"] < 0
        # the same bytes through HBM either way: no change, and an interval of no width
        assert r["data-locality ci_low_us"] == pytest.approx(0, abs=1e-9) == r["data-locality ci_high_us"]
    header, rows = cmp.tax_rows(df)
    assert header[5:] == ["tax", "base us", "new us", "change us", "95% CI of change us"] and len(rows) == 6
    md = cmp.render_markdown(df)
    assert "Per tax: what changed, new - base" in md and "| kernel-launch |" in md
    row = json.loads(cmp.render_json(df))["rows"][0]
    assert set(row["taxes"]) == {"bulk-synchronous", "data-locality", "kernel-launch"}
    assert row["taxes"]["kernel-launch"]["ci_high_us"] < 0


def test_a_document_against_itself_changes_no_tax():
    doc = results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))
    doc["cases"] = doc["cases"][:1]
    df = cmp.compare_documents(doc, doc)
    with_rows = [results.rows_state(v) == "shown" for v in doc["cases"][0]["variants"]]
    assert sum(with_rows) == 5  # torch-async-tp is timed plain: no rows, no tax to compare
    for tax in ("bulk-synchronous", "data-locality", "kernel-launch"):
        assert list(df[f"{tax} delta_us"].notna()) == with_rows
        d = df[df[f"{tax} delta_us"].notna()]
        assert (d[f"{tax} delta_us"] == 0).all()
        assert ((d[f"{tax} ci_low_us"] <= 0) & (d[f"{tax} ci_high_us"] >= 0)).all()


def test_iteration_rows_are_what_the_documents_rows_average():
    """The per-iteration rows an interval resamples average, over the kept iterations, to the document's
    own rows: the intervals are of the statistic the document shows."""
    from taxes.attribution.attribute import ROWS, kept_iterations
    from taxes.documents.iterations import iteration_rows

    doc = results.load(committed("reports/profile/ag_gemm-h100-x2.json.gz"))
    case = doc["cases"][0]
    for v in case["variants"][:2]:
        rows = iteration_rows(doc, case, v)
        kept = rows.iloc[kept_iterations(list(rows["span_us"]))]
        overall = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None}
        assert {r: kept[r].mean() for r in ROWS} == pytest.approx(overall, abs=1e-6)
        assert kept["span_us"].mean() == pytest.approx(v["attributed_e2e_us"])
