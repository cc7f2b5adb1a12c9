"""Compare two result documents (two commits, two machines) or two variants of one document.

Per case (workload, shape, dtype, world) and variant: the ratio of the interquartile means of E2E new /
base (the statistic every view prints), a confidence interval of that ratio that counts the drift between
blocks of a run, a rank test, and a verdict, so that noise, including the noise between two runs of the
same code, is not called a regression; and per tax, what changed in microseconds, with its interval.

Here: parsing the command's numbers, matching the documents, the cells and the views; the statistics in
taxes.reports.compare_stats. The statistics (docs/ci.md says the same for users):
- Samples: a document holds per-rank, per-iteration times (`samples_us`); one iteration's E2E is the
  slowest rank's time in it, and the statistic compared is the interquartile mean of those E2E values
  (the mean of the iterations ranked between the 25th and 75th percentile: taxes.attribution.attribute.iqm).
- Blocks: `taxes profile` times every variant in `rounds` interleaved blocks of iterations (metadata
  rounds and iterations). Two runs of the same code differ by more than the iterations of one block
  suggest (clocks, placement, the host's state drift between blocks and between runs); the spread between
  a run's own blocks is the part of that drift a single document shows. A document without blocks is one
  block.
- Ratio: IQM(new E2E) / IQM(base E2E); above 1 is slower.
- Confidence interval: a two-level (block, then iteration) percentile bootstrap. Each side is resampled on
  its own, n_resamples times (seeded): blocks with replacement, then iterations with replacement within
  each chosen block; the ratio of the two resampled interquartile means is taken each time, and the
  interval is its (1-c)/2 and (1+c)/2 quantiles. With one block it is the plain bootstrap of the
  iterations.
- Rank test: two-sided Mann-Whitney U (scipy.stats.mannwhitneyu) on the two sets of iteration E2Es
  (fewer than MIN_SAMPLES iterations on a side gets no test at all).
- Significant: p < 1 - c AND the interval excludes 1 (both must agree).
- Verdict: "slower" when significant and the whole interval lies above 1 + threshold: the slowdown is
  confidently larger than the threshold, not merely its point estimate (back-to-back runs of one commit
  differ by a few percent that no single run can see; a threshold met only by the point estimate would
  fail builds on that). "faster" mirrors it (the interval below 1 / (1 + threshold)). "same" otherwise; a
  significant change whose point estimate is beyond the threshold but whose interval is not says so in
  its note. Two more verdicts for rows that get no test: "no test" (a side has no per-iteration samples,
  e.g. model documents or documents holding only e2e_us summaries: the ratio of the recorded values is
  shown, never called significant) and "not compared" (a side errored, failed its correctness check or
  has no time at all).
- Taxes: where both sides have rows, each tax (taxes.method.TAXES: the sum of its rows) of new minus
  base, in us, from the documents' rows (interquartile means). Its interval: where both documents keep
  their per-iteration rows (taxes.documents.iterations), the bootstrap of iterations on each side, the statistic
  taken as the document takes it (the iterations whose E2E ranks in the middle half, their mean), new
  minus base each time.
"""

from __future__ import annotations

import json
import math
from xml.etree import ElementTree as ET

import numpy as np
import pandas as pd

from taxes.method import STATISTIC, TAXES
from taxes.errors import TaxesError
from taxes.reports.compare_stats import (
    COLUMNS,
    N_RESAMPLES,
    TAX_COLUMNS,
    TAX_FIELDS,
    VERDICTS,
    compare_pair,
    tax_changes,
)
from taxes.reports.markdown_table import md_table
from taxes.sanitize import one_line, printable


# ---- parsing the command's numbers ----------------------------------------------------------------


def _number(text: str, what: str) -> float:
    try:
        value = float(str(text).strip().rstrip("%").strip())
    except ValueError:
        raise TaxesError(f"{what} {text!r}: not a number (e.g. 5% or 5)") from None
    if not math.isfinite(value):
        raise TaxesError(f"{what} {text!r}: not a finite number")
    return value


def parse_threshold(text: str) -> float:
    """'5%' or '5' -> 0.05: a percentage (never a fraction), 0 or more."""
    value = _number(text, "--fail-above")
    if value < 0:
        raise TaxesError(f"--fail-above {text!r}: a slowdown threshold cannot be negative")
    return value / 100.0


def parse_confidence(text: str) -> float:
    """'95%', '95' or '0.95' -> 0.95; a number of 1 or more is a percentage. Between 50% and 100%."""
    value = _number(text, "--confidence")
    if str(text).strip().endswith("%") or value >= 1:
        value /= 100.0
    if not 0.5 <= value < 1:
        raise TaxesError(f"--confidence {text!r}: must lie between 50% and 100% (e.g. 95%)")
    return value


def parse_variant_pair(text: str) -> tuple[str, str]:
    names = [n.strip() for n in str(text).split(",")]
    if len(names) != 2 or not all(names):
        raise TaxesError(f"--variants {text!r}: give two variant names, BASE,NEW (e.g. bsp,fused-push)")
    return names[0], names[1]


# ---- matching documents ---------------------------------------------------------------------------


def _shape_text(case: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in case["shape"].items())


def _case_key(case: dict) -> tuple:
    return case["workload"], tuple(sorted(case["shape"].items())), case["dtype"], case["world"]


def _case_label(case: dict) -> str:
    return f"{case['workload']} {_shape_text(case)} {case['dtype']} world {case['world']}"


def _index(doc: dict, name: str) -> dict[tuple, tuple[dict, dict[str, dict]]]:
    """Case key -> (case, {variant name: variant entry}); a case or variant listed twice is an error."""
    out: dict[tuple, tuple[dict, dict[str, dict]]] = {}
    for case in doc["cases"]:
        key = _case_key(case)
        if key in out:
            raise TaxesError(one_line(f"{name}: case {_case_label(case)} appears twice; a comparison needs each case once"))
        variants: dict[str, dict] = {}
        for var in case["variants"]:
            if var["variant"] in variants:
                raise TaxesError(one_line(f"{name}: variant {var['variant']} appears twice in case {_case_label(case)}"))
            variants[var["variant"]] = var
        out[key] = (case, variants)
    return out


def check_variants(base: dict, new: dict, pair: tuple[str, str], base_name: str = "BASE", new_name: str = "NEW") -> None:
    """Each name of --variants BASE_VARIANT,NEW_VARIANT must be a variant of its document."""
    for name, doc, variant in ((base_name, base, pair[0]), (new_name, new, pair[1])):
        known = list(dict.fromkeys(v["variant"] for c in doc["cases"] for v in c["variants"]))
        if variant not in known:
            raise TaxesError(one_line(f"--variants: {name} has no variant {variant!r} (it has: {', '.join(known) or 'none'})"))


def compare_documents(base: dict, new: dict, *, variants: tuple[str, str] | None = None, threshold: float = 0.0,
                      confidence: float = 0.95, seed: int = 0, n_resamples: int = N_RESAMPLES,
                      base_name: str = "BASE", new_name: str = "NEW") -> pd.DataFrame:
    """One row per (workload, shape, dtype, world, variant) found in both documents (COLUMNS), in
    base's order. With variants=(A, B): base's variant A against new's variant B in every case found
    in both (base and new may be the same document). df.attrs holds the settings and `unmatched`:
    one line per case or variant found on one side only."""
    base_ix, new_ix = _index(base, base_name), _index(new, new_name)
    rng = np.random.default_rng(seed)
    known_rows: dict = {}  # per-iteration rows by variant entry, for the taxes
    rows, unmatched = [], []
    for key, (case, base_vars) in base_ix.items():
        label = _case_label(case)
        if key not in new_ix:
            unmatched.append(f"only in {base_name}: {label}")
            continue
        new_vars = new_ix[key][1]
        if variants:
            pairs = [(variants[0], variants[1])]
        else:
            pairs = [(v, v) for v in base_vars if v in new_vars]
            unmatched += [f"only in {base_name}: {label} {v}" for v in base_vars if v not in new_vars]
            unmatched += [f"only in {new_name}: {label} {v}" for v in new_vars if v not in base_vars]
        for a, b in pairs:
            missing = [f"no {v} in {n}" for v, n, have in ((a, base_name, base_vars), (b, new_name, new_vars)) if v not in have]
            if missing:
                unmatched.append(f"{label}: {', '.join(missing)}")
                continue
            stats = compare_pair(base_vars[a], new_vars[b], threshold=threshold, confidence=confidence, rng=rng,
                                 n_resamples=n_resamples, base_timing=base.get("metadata"),
                                 new_timing=new.get("metadata"))
            if stats["verdict"] != "not compared":
                stats |= tax_changes((base, case, base_vars[a]), (new, new_ix[key][0], new_vars[b]),
                                     confidence=confidence, rng=rng, n_resamples=n_resamples, known=known_rows)
            # names come from the documents: one printable line each, safe in every output format
            rows.append({"workload": case["workload"], "shape": one_line(_shape_text(case)), "dtype": one_line(case["dtype"]),
                         "world": case["world"], "variant": one_line(b if a == b else f"{b} vs {a}"),
                         "base_variant": one_line(a), "new_variant": one_line(b), **dict.fromkeys(TAX_COLUMNS, math.nan),
                         **stats, "note": one_line(stats["note"])})
    unmatched += [f"only in {new_name}: {_case_label(case)}" for key, (case, _) in new_ix.items() if key not in base_ix]
    unmatched = [one_line(u) for u in unmatched]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(base=base_name, new=new_name, threshold=threshold, confidence=confidence, seed=seed,
                    n_resamples=n_resamples, variants=list(variants) if variants else None, unmatched=unmatched)
    return df


def regressions(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that fail a run: significant slowdowns beyond the threshold."""
    return df[df["verdict"] == "slower"]


# ---- cells ----------------------------------------------------------------------------------------


def _us(v) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:,.1f}"


def change_text(v) -> str:
    return "-" if not np.isfinite(v) else f"{(v - 1) * 100:+.1f}%"


def _ci(row) -> str:
    if not np.isfinite(row["ci_low"]):
        return "-"
    return f"{(row['ci_low'] - 1) * 100:+.1f}% .. {(row['ci_high'] - 1) * 100:+.1f}%"


def _p(v) -> str:
    return "-" if not np.isfinite(v) else ("<0.001" if v < 0.001 else f"{v:.3f}")


def row_name(row) -> str:
    return f"{row['workload']} {row['shape']} {row['dtype']} world={row['world']} {row['variant']}"


def table_rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and string cells shared by the terminal and Markdown tables."""
    conf = df.attrs.get("confidence", 0.95)
    header = ["workload", "shape", "dtype", "world", "variant", "base us (IQM)", "new us (IQM)", "change",
              f"{conf:.0%} CI of change", "p", "verdict", "note"]
    rows = [[r["workload"], r["shape"], r["dtype"], str(r["world"]), r["variant"], _us(r["base_iqm_us"]),
             _us(r["new_iqm_us"]), change_text(r["ratio"]), _ci(r), _p(r["p_value"]), r["verdict"], r["note"]]
            for _, r in df.iterrows()]
    return header, rows


def _delta(v) -> str:
    return "-" if v is None or not np.isfinite(v) else f"{v:+,.1f}"


def tax_rows(df: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per row with rows on both sides, one line per tax: base, new, new - base (us) and its interval."""
    conf = df.attrs.get("confidence", 0.95)
    header = ["workload", "shape", "dtype", "world", "variant", "tax", "base us", "new us", "change us",
              f"{conf:.0%} CI of change us"]
    rows = []
    for _, r in df.iterrows():
        for tax in TAXES:
            if not np.isfinite(r[f"{tax} delta_us"]):
                continue
            lo, hi = r[f"{tax} ci_low_us"], r[f"{tax} ci_high_us"]
            ci = f"{_delta(lo)} .. {_delta(hi)}" if np.isfinite(lo) else "-"
            rows.append([r["workload"], r["shape"], r["dtype"], str(r["world"]), r["variant"], tax,
                         _us(r[f"{tax} base_us"]), _us(r[f"{tax} new_us"]), _delta(r[f"{tax} delta_us"]), ci])
    return header, rows


def tax_text(row) -> str:
    """'bulk-synchronous +12.0 us (CI +8.1 .. +15.2); ...' for one row, or '' without rows."""
    parts = []
    for tax in TAXES:
        d = row[f"{tax} delta_us"]
        if np.isfinite(d):
            lo, hi = row[f"{tax} ci_low_us"], row[f"{tax} ci_high_us"]
            parts.append(f"{tax} {_delta(d)} us" + (f" (CI {_delta(lo)} .. {_delta(hi)})" if np.isfinite(lo) else ""))
    return "; ".join(parts)


def summary_line(df: pd.DataFrame) -> str:
    counts = df["verdict"].value_counts()
    parts = [f"{counts.get(v, 0)} {v}" for v in VERDICTS if counts.get(v, 0)]
    n_unmatched = len(df.attrs.get("unmatched", []))
    return (f"{len(df)} rows: {', '.join(parts) or 'nothing to compare'}"
            + (f"; {n_unmatched} unmatched" if n_unmatched else ""))


def method_line(df: pd.DataFrame) -> str:
    a = df.attrs
    conf, thr = a.get("confidence", 0.95), a.get("threshold", 0.0)
    return (f"change = IQM(new) / IQM(base) - 1 of per-iteration E2E (slowest rank; IQM: the interquartile mean, "
            f"as every view prints it); significant when the "
            f"Mann-Whitney p < {1 - conf:.2g} and the {conf:.0%} bootstrap CI (blocks of the run, then iterations; "
            f"{a.get('n_resamples', N_RESAMPLES)} resamples, seed {a.get('seed', 0)}) excludes 0; "
            + (f"slower/faster only when the whole CI lies beyond {thr:+.1%}" if thr else "every significant change is called")
            + "; per tax: new - base of the rows, its CI the bootstrap of iterations where both documents keep 5 or more")


# ---- renderers ------------------------------------------------------------------------------------

_STYLE = {"slower": "bold red", "faster": "green", "same": "", "no test": "yellow", "not compared": "dim"}


def render_terminal(df: pd.DataFrame, console) -> None:
    """A table (folded to the console's width, never cut), then the summary, the method and the unmatched
    cases; every string from the documents printed as text (taxes.console)."""
    from taxes.console import print_table, text

    a = df.attrs
    header, rows = table_rows(df)
    print_table(console, f"taxes compare: {a.get('new', 'NEW')} against {a.get('base', 'BASE')}", header, rows,
                left=5, row_styles=[_STYLE[r[10]] or None for r in rows])
    header, rows = tax_rows(df)
    if rows:
        print_table(console, "per tax: what changed, new - base", header, rows, left=6)
    console.print(text(summary_line(df)))
    console.print(text(method_line(df), "dim"))
    for line in a.get("unmatched", []):
        console.print(text("unmatched: " + line, "yellow"))


def render_markdown(df: pd.DataFrame) -> str:
    """A section fit for a CI job summary: the headline, the table, the method, the unmatched cases."""
    from taxes.sanitize import markdown

    a = df.attrs
    bad = regressions(df)
    thr = a.get("threshold", 0.0)
    if len(bad):
        headline = f"**{len(bad)} significant slowdown{'s' if len(bad) > 1 else ''} beyond {thr:+.1%}:** " + \
                   ", ".join(markdown(f"{row_name(r)} ({change_text(r['ratio'])})") for _, r in bad.iterrows())
    else:
        headline = f"No significant slowdown beyond {thr:+.1%}." if thr else "No significant slowdown."
    header, rows = table_rows(df)
    out = [f"## taxes compare: {markdown(a.get('new', 'NEW'))} against {markdown(a.get('base', 'BASE'))}", "",
           headline, "",
           markdown(summary_line(df)), "",
           md_table(header, rows, range(5, 10), {(i, 10) for i, r in enumerate(rows) if r[10] in ("slower", "faster")}),
           ""]
    header, rows = tax_rows(df)
    if rows:
        out += ["Per tax: what changed, new - base:", "", md_table(header, rows, range(6, 10)), ""]
    out += [f"<sub>{markdown(method_line(df))}</sub>", ""]
    unmatched = a.get("unmatched", [])
    if unmatched:
        out += [f"<details><summary>{len(unmatched)} unmatched</summary>", ""]
        out += [f"- {markdown(line)}" for line in unmatched] + ["", "</details>", ""]
    return "\n".join(out)


def render_junit(df: pd.DataFrame) -> str:
    """JUnit XML: one testcase per row; a failure for each significant slowdown beyond the threshold,
    skipped for rows without a test."""
    a = df.attrs
    counts = df["verdict"].value_counts()
    n_fail, n_skip = int(counts.get("slower", 0)), int(counts.get("no test", 0) + counts.get("not compared", 0))
    attrs = {"name": "taxes compare", "tests": str(len(df)), "failures": str(n_fail), "errors": "0",
             "skipped": str(n_skip), "time": "0"}
    suites = ET.Element("testsuites", {k: v for k, v in attrs.items() if k != "skipped"})
    suite = ET.SubElement(suites, "testsuite", attrs)
    props = ET.SubElement(suite, "properties")
    for key in ("base", "new", "threshold", "confidence", "seed", "n_resamples"):  # base, new: file names as given
        ET.SubElement(props, "property", {"name": key, "value": printable(a.get(key))})
    for _, r in df.iterrows():
        tc = ET.SubElement(suite, "testcase", {"classname": f"taxes.reports.compare.{r['workload']}",
                                               "name": f"{r['shape']} {r['dtype']} world={r['world']} {r['variant']}",
                                               "time": "0"})
        detail = (f"base {_us(r['base_iqm_us'])} us, new {_us(r['new_iqm_us'])} us (IQM), change {change_text(r['ratio'])}"
                  f" (CI {_ci(r)}), p {_p(r['p_value'])}, n {r['n_base']}/{r['n_new']}: {r['verdict']}"
                  + (f"; per tax: {tax_text(r)}" if tax_text(r) else ""))
        if r["verdict"] == "slower":
            ET.SubElement(tc, "failure", {"type": "regression", "message": f"slower by {change_text(r['ratio'])}, beyond "
                                          f"{a.get('threshold', 0.0):+.1%}"}).text = detail
        elif r["verdict"] in ("no test", "not compared"):
            ET.SubElement(tc, "skipped", {"message": r["note"] or r["verdict"]})
        ET.SubElement(tc, "system-out").text = detail
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _plain(v):
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def render_json(df: pd.DataFrame) -> str:
    """Every row and setting, NaN as null; each row's taxes under "taxes": {tax: {base_us, new_us, delta_us,
    ci_low_us, ci_high_us}}."""
    a = df.attrs
    doc = {"schema": "taxes.compare", "schema_version": 1, "statistic": STATISTIC,
           **{k: a.get(k) for k in ("base", "new", "threshold", "confidence", "seed", "n_resamples", "variants")},
           "regressions": int(len(regressions(df))),
           "rows": [{k: _plain(v) for k, v in r.items() if k not in TAX_COLUMNS}
                    | {"taxes": {tax: {f: _plain(r[f"{tax} {f}"]) for f in TAX_FIELDS} for tax in TAXES}}
                    for r in df.to_dict("records")],
           "unmatched": list(a.get("unmatched", []))}
    return json.dumps(doc, indent=1, allow_nan=False) + "\n"


def render_benchmark_json(df: pd.DataFrame) -> str:
    """github-action-benchmark's customSmallerIsBetter: [{name, unit, value, range?, extra?}], one
    entry per row whose new side has a time (the new interquartile mean, us)."""
    out = []
    for _, r in df.iterrows():
        if not np.isfinite(r["new_iqm_us"]):  # the new side errored, failed or holds no time
            continue
        entry = {"name": row_name(r), "unit": "us", "value": round(float(r["new_iqm_us"]), 3)}
        if np.isfinite(r["new_ci_low_us"]):
            half = (r["new_ci_high_us"] - r["new_ci_low_us"]) / 2
            entry["range"] = f"± {half:.1f}"
        entry["extra"] = (f"base {_us(r['base_iqm_us'])} us; change {change_text(r['ratio'])} (CI {_ci(r)}); "
                          f"p {_p(r['p_value'])}; {r['verdict']}" + (f"; {r['note']}" if r["note"] else "")
                          + (f"; {tax_text(r)}" if tax_text(r) else ""))
        out.append(entry)
    return json.dumps(out, indent=1, allow_nan=False) + "\n"
