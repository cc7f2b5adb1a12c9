"""Compare two result documents (two commits, two machines) or two variants of one document.

Per case (workload, shape, dtype, world) and variant: the ratio of the interquartile means of E2E new /
base (the statistic every view prints), a confidence interval of that ratio that counts the drift between
blocks of a run, a rank test, and a verdict, so that noise, including the noise between two runs of the
same code, is not called a regression; and per tax, what changed in microseconds, with its interval.

The statistics (docs/ci.md says the same for users):
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
- Taxes: where both sides have rows, each tax (taxes.attribution.attribute.TAXES: the sum of its rows) of new minus
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

from taxes.attribution.attribute import TAXES
from taxes.errors import TaxesError
from taxes.sanitize import one_line, printable

N_RESAMPLES = 2000
MIN_SAMPLES = 5  # fewer iterations than this on a side: no rank test (its approximation is too rough)
TESTED = ("faster", "slower", "same")
VERDICTS = TESTED + ("no test", "not compared")
STATISTIC = "interquartile mean"
TAX_FIELDS = ("base_us", "new_us", "delta_us", "ci_low_us", "ci_high_us")
TAX_COLUMNS = [f"{tax} {f}" for tax in TAXES for f in TAX_FIELDS]
COLUMNS = ["workload", "shape", "dtype", "world", "variant", "base_variant", "new_variant",
           "base_iqm_us", "new_iqm_us", "ratio", "ci_low", "ci_high", "new_ci_low_us", "new_ci_high_us",
           "p_value", "n_base", "n_new", "significant", "verdict", "note"] + TAX_COLUMNS


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


# ---- statistics -----------------------------------------------------------------------------------


def iteration_e2e_us(samples_us: list[list[float]]) -> np.ndarray:
    """Per-iteration E2E: the slowest rank's time in each iteration (ranks must agree on the count)."""
    if len({len(s) for s in samples_us}) > 1:
        raise ValueError("ranks hold different numbers of iterations")
    if not samples_us:
        return np.zeros(0)
    return np.asarray(samples_us, dtype=float).max(axis=0)


def blocks_of(n: int, timing: dict | None) -> list[int]:
    """The sizes of the blocks a run timed its n iterations in: `rounds` interleaved blocks of
    iterations // rounds (the first iterations % rounds one more), as taxes profile times them, when the
    document says so and n matches; else one block."""
    rounds, iterations = (timing or {}).get("rounds"), (timing or {}).get("iterations")
    if not isinstance(rounds, int) or not isinstance(iterations, int) or iterations != n or not 2 <= rounds <= n:
        return [n]
    return [n // rounds + (1 if r < n % rounds else 0) for r in range(rounds)]


def rank_test_p(a, b) -> float:
    """Two-sided Mann-Whitney U p-value (scipy.stats.mannwhitneyu: exact for small samples without ties,
    else the normal approximation with tie correction and continuity correction). 1.0 when the pooled
    values are all equal (no evidence of a shift) or a side is empty."""
    from scipy.stats import mannwhitneyu

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) == 0 or len(b) == 0 or np.ptp(np.concatenate([a, b])) == 0:
        return 1.0
    return float(min(1.0, mannwhitneyu(a, b, alternative="two-sided").pvalue))


WORK_PER_SIDE = 10_000_000  # resampled values per side and row: bounds time and memory on huge documents
CHUNK_VALUES = 4_000_000  # resampled values held at once


def resamples_for(n_values: int, n_resamples: int) -> int:
    """How many resamples a side of n_values gets: n_resamples, fewer (at least 100) when that would
    resample more than WORK_PER_SIDE values."""
    return max(min(n_resamples, 100), min(n_resamples, WORK_PER_SIDE // max(1, n_values)))


def iqm(values: np.ndarray) -> float:
    """The interquartile mean (taxes.attribution.attribute.iqm): n // 4 values dropped at each end, the rest averaged."""
    from scipy.stats import trim_mean

    return float(trim_mean(np.asarray(values, dtype=float), 0.25))


def _trimmed_means(vals: np.ndarray) -> np.ndarray:
    """Per row of vals (NaN: no value), the interquartile mean of its values."""
    s = np.sort(vals, axis=1)  # NaN last
    k = (~np.isnan(s)).sum(axis=1)
    lo, hi = k // 4, k - k // 4
    cs = np.concatenate([np.zeros((len(s), 1)), np.nancumsum(s, axis=1)], axis=1)
    rows = np.arange(len(s))
    return (cs[rows, hi] - cs[rows, lo]) / (hi - lo)


def bootstrap_iqms(x_us: np.ndarray, n_resamples: int, rng: np.random.Generator,
                   blocks: list[int] | None = None) -> np.ndarray:
    """Interquartile means of n_resamples two-level resamples of x (blocks with replacement, then
    iterations with replacement within each chosen block; the resample has as many blocks as x). One block:
    the plain bootstrap of x. Computed in chunks, so memory stays bounded whatever the size of x. By hand:
    scipy.stats.bootstrap resamples iterations alone, with no blocks."""
    blocks = blocks or [len(x_us)]
    width = max(blocks)
    per = max(1, CHUNK_VALUES // (len(blocks) * width))
    return np.concatenate([_iqms(x_us, min(per, n_resamples - i), rng, blocks)
                           for i in range(0, n_resamples, per)])


def _iqms(x_us: np.ndarray, n: int, rng: np.random.Generator, blocks: list[int]) -> np.ndarray:
    if len(blocks) == 1:
        idx = rng.integers(0, len(x_us), size=(n, len(x_us)))
        return _trimmed_means(x_us[idx])
    k, width = len(blocks), max(blocks)
    starts = np.concatenate([[0], np.cumsum(blocks)[:-1]])
    sizes = np.asarray(blocks)
    chosen = rng.integers(0, k, size=(n, k))  # which blocks
    pos = np.floor(rng.random((n, k, width)) * sizes[chosen][..., None]).astype(int)  # which iterations
    vals = x_us[starts[chosen][..., None] + pos]
    vals[np.arange(width)[None, None, :] >= sizes[chosen][..., None]] = np.nan  # a shorter block draws fewer
    return _trimmed_means(vals.reshape(n, -1))


def bootstrap_kept_means(span_us: np.ndarray, value_us: np.ndarray, n_resamples: int,
                         rng: np.random.Generator) -> np.ndarray:
    """For n_resamples resamples of iterations (with replacement): the mean of value over the iterations
    whose span ranks in the middle half (as a document's rows are averaged: taxes.attribution.attribute.summarize)."""
    n = len(span_us)
    lo, hi = n // 4, n - n // 4
    out = []
    per = max(1, CHUNK_VALUES // max(1, n))
    for i in range(0, n_resamples, per):
        idx = rng.integers(0, n, size=(min(per, n_resamples - i), n))
        order = np.argsort(span_us[idx], axis=1, kind="stable")[:, lo:hi]
        out.append(np.take_along_axis(value_us[idx], order, axis=1).mean(axis=1))
    return np.concatenate(out)


def interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    lo, hi = np.quantile(values, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(lo), float(hi)


def verdict_of(ci_low: float, ci_high: float, significant: bool, threshold: float) -> str:
    """slower / faster only when significant and the whole interval lies beyond the threshold."""
    if significant and ci_low > 1 + threshold:
        return "slower"
    if significant and ci_high < 1 / (1 + threshold):
        return "faster"
    return "same"


# ---- one pair of variants -------------------------------------------------------------------------


def variant_state(var: dict) -> tuple[str, str]:
    """(state, note): state is samples, summary (a recorded E2E but no samples), or unusable (error,
    failed, ragged, empty)."""
    error = (var.get("config") or {}).get("error")
    if error:
        text = " ".join(str(error).split())
        return "error", "error: " + (text if len(text) <= 80 else text[:77] + "...")
    if var["correctness"].get("passed") is False:
        return "failed", "failed its correctness check"
    samples = var["samples_us"]
    if any(samples):
        if len({len(s) for s in samples}) > 1:
            return "ragged", "ranks hold different numbers of iterations"
        return "samples", ""
    if var["e2e_us"].get("iqm") is not None or var["e2e_us"].get("median") is not None:
        return "summary", "no samples"
    return "empty", "no samples and no recorded E2E"


def _iqm_of(var: dict, state: str) -> float:
    """The E2E a side is compared by: the interquartile mean of its iterations; from a summary, its
    recorded interquartile mean (older documents and predictions: their median, the value they record)."""
    if state == "samples":
        return iqm(iteration_e2e_us(var["samples_us"]))
    if state == "summary":
        e = var["e2e_us"]
        return float(e["iqm"] if e.get("iqm") is not None else e["median"])
    return math.nan


def compare_pair(base_var: dict, new_var: dict, *, threshold: float, confidence: float,
                 rng: np.random.Generator, n_resamples: int = N_RESAMPLES, base_timing: dict | None = None,
                 new_timing: dict | None = None) -> dict:
    """The statistics of one (base, new) pair of variant entries, as a row without the case keys.
    base_timing / new_timing: each document's metadata (rounds, iterations), for the blocks."""
    (bs, bnote), (ns, nnote) = variant_state(base_var), variant_state(new_var)
    row = dict.fromkeys(COLUMNS[7:20], math.nan)
    row.update(n_base=0, n_new=0, significant=False, note="")
    base_med, new_med = _iqm_of(base_var, bs), _iqm_of(new_var, ns)
    row.update(base_iqm_us=base_med, new_iqm_us=new_med)
    usable = ("samples", "summary")
    if bs not in usable or ns not in usable:
        notes = [f"{side}: {note}" for side, st, note in (("base", bs, bnote), ("new", ns, nnote)) if st not in usable]
        return row | {"verdict": "not compared", "note": "; ".join(notes)}
    if not base_med > 0:
        return row | {"verdict": "not compared", "note": "base E2E is not positive"}
    row["ratio"] = new_med / base_med
    labels = (base_var["e2e_us"]["label"], new_var["e2e_us"]["label"])
    label_note = f" (base {labels[0]}, new {labels[1]})" if labels[0] != labels[1] else ""
    if bs != "samples" or ns != "samples":
        return row | {"verdict": "no test", "note": "no samples: no test" + label_note}
    base, new = iteration_e2e_us(base_var["samples_us"]), iteration_e2e_us(new_var["samples_us"])
    row.update(n_base=len(base), n_new=len(new))
    if min(len(base), len(new)) < MIN_SAMPLES:
        return row | {"verdict": "no test", "note": f"fewer than {MIN_SAMPLES} iterations: no test" + label_note}
    reps = resamples_for(max(len(base), len(new)), n_resamples)
    base_meds = bootstrap_iqms(base, reps, rng, blocks_of(len(base), base_timing))
    new_meds = bootstrap_iqms(new, reps, rng, blocks_of(len(new), new_timing))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = new_meds / base_meds
    if not np.all(np.isfinite(ratios)):  # a resampled base E2E of 0: no interval to speak of
        return row | {"verdict": "no test", "note": "base samples hold zeros: no test" + label_note}
    row["ci_low"], row["ci_high"] = interval(ratios, confidence)
    row["new_ci_low_us"], row["new_ci_high_us"] = interval(new_meds, confidence)
    row["p_value"] = rank_test_p(base, new)
    significant = row["p_value"] < 1 - confidence and not (row["ci_low"] <= 1 <= row["ci_high"])
    row["significant"] = bool(significant)
    row["verdict"] = verdict_of(row["ci_low"], row["ci_high"], significant, threshold)
    notes = [label_note.strip(" ()")] if label_note else []
    if reps < n_resamples:
        notes.append(f"{reps} resamples (many iterations)")
    if row["verdict"] == "same" and significant and not 1 / (1 + threshold) <= row["ratio"] <= 1 + threshold:
        notes.append(f"significant, but its interval reaches inside {threshold:+.1%}: not called")
    row["note"] = "; ".join(notes)
    return row


# ---- per tax --------------------------------------------------------------------------------------


def _taxes_of(var: dict) -> dict[str, float] | None:
    """Each tax of a variant (the sum of its overall rows), or None without rows."""
    oc = {c["name"]: c["value_us"] for c in var.get("components") or [] if c["rank"] is None}
    return {tax: math.fsum(oc.get(r, 0.0) for r in parts) for tax, parts in TAXES.items()} if oc else None


def tax_changes(base: tuple[dict, dict, dict], new: tuple[dict, dict, dict], *, confidence: float,
                rng: np.random.Generator, n_resamples: int = N_RESAMPLES, known: dict | None = None) -> dict:
    """Per tax: base and new (us, the documents' rows), new - base, and the interval of that change where
    both documents keep per-iteration rows (taxes.documents.iterations); base and new are (document, case, variant).
    TAX_COLUMNS, NaN where a value is not known. known: per-iteration rows already made, by variant entry
    (a variant compared twice is attributed again once)."""
    from taxes.documents.iterations import iteration_rows

    out = dict.fromkeys(TAX_COLUMNS, math.nan)
    before, after = _taxes_of(base[2]), _taxes_of(new[2])
    if before is None or after is None:
        return out
    known = {} if known is None else known
    for side in (base, new):
        if id(side[2]) not in known:
            known[id(side[2])] = iteration_rows(*side)
    rows = [known[id(side[2])] for side in (base, new)]
    for tax, parts in TAXES.items():
        out.update({f"{tax} base_us": before[tax], f"{tax} new_us": after[tax], f"{tax} delta_us": after[tax] - before[tax]})
        if any(r is None or len(r) < MIN_SAMPLES for r in rows):
            continue
        reps = resamples_for(max(len(r) for r in rows), n_resamples)
        means = [bootstrap_kept_means(r["span_us"].to_numpy(float), r[list(parts)].sum(axis=1).to_numpy(float), reps, rng)
                 for r in rows]
        out[f"{tax} ci_low_us"], out[f"{tax} ci_high_us"] = interval(means[1] - means[0], confidence)
    return out


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


def _md_table(header: list[str], rows: list[list[str]], numbers: range = range(5, 10), verdict: int | None = 10) -> str:
    """Cells through taxes.sanitize.markdown; the verdict's emphasis (**slower**) is added after."""
    from taxes.sanitize import markdown

    lines = ["| " + " | ".join(markdown(h) for h in header) + " |",
             "|" + "|".join("---:" if i in numbers else "---" for i in range(len(header))) + "|"]
    for row in rows:
        cells = [markdown(c) for c in row]
        if verdict is not None and row[verdict] in ("slower", "faster"):
            cells[verdict] = f"**{cells[verdict]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
           markdown(summary_line(df)), "", _md_table(header, rows), ""]
    header, rows = tax_rows(df)
    if rows:
        out += ["Per tax: what changed, new - base:", "", _md_table(header, rows, range(6, 10), None), ""]
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
