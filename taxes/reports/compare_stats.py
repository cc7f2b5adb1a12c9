"""The statistics of `taxes compare` (taxes.reports.compare says what they are and why): iteration E2Es,
blocks, the rank test, the two-level bootstrap of interquartile means, intervals and verdicts; then one
(base, new) pair of variants, and what changed per tax."""

from __future__ import annotations

import math

import numpy as np

from taxes.method import TAXES, round_sizes

N_RESAMPLES = 2000
MIN_SAMPLES = 5  # fewer iterations than this on a side: no rank test (its approximation is too rough)
TESTED = ("faster", "slower", "same")
VERDICTS = TESTED + ("no test", "not compared")
TAX_FIELDS = ("base_us", "new_us", "delta_us", "ci_low_us", "ci_high_us")
TAX_COLUMNS = [f"{tax} {f}" for tax in TAXES for f in TAX_FIELDS]
COLUMNS = ["workload", "shape", "dtype", "world", "variant", "base_variant", "new_variant",
           "base_iqm_us", "new_iqm_us", "ratio", "ci_low", "ci_high", "new_ci_low_us", "new_ci_high_us",
           "p_value", "n_base", "n_new", "significant", "verdict", "note"] + TAX_COLUMNS


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
    return round_sizes(n, rounds)


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
