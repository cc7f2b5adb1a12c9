"""Statistics and fits over raw readings: pure functions of plain numbers, tested on CPU.

Readings are lists of numbers as the devices gave them; a reading of 0 or less, NaN or inf is a failed
one and is left out. A figure that cannot come out of its readings raises CalibrationError with one line
saying why; one outside what any machine could measure (a broken timer, a unit slip) is refused the same
way, never saved.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from taxes.errors import TaxesError


class CalibrationError(TaxesError):
    """A figure cannot be derived from its readings (one line saying why)."""


def valid_values(xs) -> list[float]:
    """The finite, positive readings (a timer reading of 0 or less, NaN or inf is a failed reading)."""
    out = []
    for x in xs or []:
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0:
            out.append(float(x))
    return out


def median_reading(xs, what: str) -> float:
    vals = valid_values(xs)
    if not vals:
        raise CalibrationError(f"{what}: no valid reading")
    return statistics.median(vals)


def plausible(value: float, lo: float, hi: float, what: str) -> float:
    """Reject a figure outside what any machine could measure (a broken timer, a unit slip)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise CalibrationError(f"{what} = {value:.4g} is outside the plausible range [{lo:g}, {hi:g}]")
    return float(value)


def fit_latency_bandwidth(x_bytes, t_us, what: str = "curve", min_points: int = 3) -> dict:
    """Fit t = base_us + x / bytes_per_us to (x, t) points.

    Least squares on log residuals (log fit - log t): a 4 KiB point's 20 us and a 256 MiB point's 1 ms
    weigh alike, so the small sizes set the latency and the large ones the bandwidth, and a point 5x too
    slow counts as much as one 5x too fast. Solved by scipy's least_squares from the linear fit of
    relative residuals. Then, one at a time, the point with the worst residual is dropped while it lies far beyond
    the others' (more than 4 robust standard deviations of theirs, and more than 5%), at most a quarter
    of the points. Returns base_us, bytes_per_us, rel_rms (of the kept points, log residuals ~ relative),
    used and dropped x values."""
    x = np.asarray(list(x_bytes), dtype=float)
    t = np.asarray(list(t_us), dtype=float)
    if x.shape != t.shape:
        raise CalibrationError(f"{what}: {x.size} sizes but {t.size} times")
    ok = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    distinct = len(set(x[ok].tolist()))
    if distinct < min_points:
        raise CalibrationError(f"{what}: {distinct} usable sizes; a latency and a bandwidth need at least {min_points}")

    def residuals(base, slope, mask):
        f = base + slope * x[mask]
        return np.log(f / t[mask]) if np.all(f > 0) else None

    def solve(mask):
        from scipy.optimize import least_squares

        xs, ts = x[mask], t[mask]
        coef, *_ = np.linalg.lstsq(np.stack([np.ones(xs.size), xs], axis=1) / ts[:, None], np.ones(xs.size), rcond=None)
        base, slope = float(coef[0]), float(coef[1])
        if residuals(base, slope, mask) is None:  # start from a line through the points that stays positive
            base, slope = float(ts.min()) / 2, max(slope, 1e-12)
        # solved for multiples of the start (a latency of tens of us and a slope of 1e-5 us per byte are
        # scaled alike); a fit time at or below zero has no log: the floor keeps its residual finite and huge
        fit = least_squares(lambda u: np.log(np.maximum(u[0] * base + u[1] * slope * xs, 1e-300) / ts), [1.0, 1.0],
                            ftol=1e-15, xtol=1e-15, gtol=1e-15, method="lm")
        return float(fit.x[0]) * base, float(fit.x[1]) * slope

    keep, drop = ok.copy(), []
    base, slope = solve(keep)
    for _ in range(int(ok.sum()) // 4):
        idx = np.flatnonzero(keep)
        rel = residuals(base, slope, keep)
        if rel is None:
            break
        worst = int(np.argmax(np.abs(rel)))
        others = np.delete(rel, worst)
        spread = 1.4826 * float(np.median(np.abs(others - np.median(others))))
        trial = keep.copy()
        trial[idx[worst]] = False
        if abs(rel[worst]) <= max(4 * spread, 0.05) or len(set(x[trial].tolist())) < min_points:
            break
        keep = trial
        drop.append(float(x[idx[worst]]))
        base, slope = solve(keep)
    if slope <= 0 or slope * float(x[keep].max()) < 0.05 * abs(base):
        raise CalibrationError(f"{what}: times do not grow with size (by 5% or more), so there is no bandwidth to fit")
    if base < 0:
        raise CalibrationError(f"{what}: the fitted latency is negative ({base:.3g} us): the points do not follow "
                               "latency + size / bandwidth")
    resid = residuals(base, slope, keep)
    if resid is None:
        raise CalibrationError(f"{what}: the fit predicts a non-positive time")
    return {"base_us": base, "bytes_per_us": 1.0 / slope, "rel_rms": float(np.sqrt(np.mean(resid ** 2))),
            "used": sorted(set(x[keep].tolist())), "dropped": sorted(drop)}


def clock_offset_ns(t0, t1, t2) -> tuple[float, float]:
    """A follower GPU's clock minus the leader's, from ping-pong stamps (NTP's rule).

    Round i: the leader stamps t0 (its clock) and signals; the follower stamps t1 (its clock) on seeing
    it and signals back; the leader stamps t2 on seeing that. If both directions take equally long,
    offset = t1 - (t0 + t2) / 2; the error is at most half the round trip, so only the rounds with the
    shortest round trips (the fastest tenth) are used. Returns (offset, bound on its error), in ns."""
    rows = [(b - a, c - (a + b) / 2) for a, c, b in zip(t0, t1, t2)
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b, c)) and b > a]
    if not rows:
        raise CalibrationError("clock offset: no ping-pong round with a positive round trip")
    rows.sort()
    best = rows[: max(1, len(rows) // 10)]
    return float(statistics.median(o for _, o in best)), rows[0][0] / 2


def skew_spreads_us(stamps_ns: list[list[float]], offsets_ns: list[float]) -> list[float]:
    """Per reading, the spread (max - min) of the ranks' start stamps with each clock corrected by its
    offset from rank 0's; stamps_ns[r][k] is rank r's stamp of reading k."""
    if len(stamps_ns) != len(offsets_ns) or len(stamps_ns) < 2:
        raise CalibrationError("rank skew: need stamps and a clock offset for every rank (2 or more)")
    n = min(len(s) for s in stamps_ns)
    out = []
    for k in range(n):
        vals = [stamps_ns[r][k] - offsets_ns[r] for r in range(len(stamps_ns))]
        if all(math.isfinite(v) and stamps_ns[r][k] > 0 for r, v in enumerate(vals)):
            out.append((max(vals) - min(vals)) / 1e3)
    if not out:
        raise CalibrationError("rank skew: no reading with a stamp from every rank")
    return out


def launch_figures(prefilled_us, graph_us) -> dict:
    """Kernel floor and per-kernel graph gap from device times per near-empty kernel.

    prefilled: back-to-back eager kernels with the host ahead; graph: the same kernels replayed as a CUDA
    graph. The model runs eager kernels back to back at the floor and graph kernels at floor + gap, so
    floor = the smaller of the two and gap = graph - floor (0 when a graph runs kernels faster than a
    pre-filled stream, which is the usual case)."""
    pre = median_reading(prefilled_us, "device time per kernel, pre-filled stream")
    graph = median_reading(graph_us, "device time per kernel in a CUDA graph")
    floor = min(pre, graph)
    return {"kernel_floor_us": floor, "launch_graph_us": graph - floor, "prefilled_period_us": pre,
            "graph_period_us": graph}


def first_launch_figures(first: dict) -> dict:
    """{kind: us from a start event on a drained device to the kernel's start} from idle-launch readings
    ({kind: {"idle_us": [start event to the launch's end], "device_us": [the same call's device time, host
    ahead]}}): the medians' difference, 0 where noise makes it negative. Kinds without both readings are
    left out."""
    out = {}
    for kind, r in (first or {}).items():
        idle, device = valid_values(r.get("idle_us")), valid_values(r.get("device_us"))
        if idle and device:
            out[kind] = plausible(max(0.0, statistics.median(idle) - statistics.median(device)), 0, 1e4,
                                  f"{kind} first launch us")
    return out


def fit_saturating_rate(ctas, gbps, what: str = "peer copy by CTAs") -> dict:
    """Fit rate(c) = min(c x per_cta, most) to (CTA count, GB/s) points: a few CTAs each add their own rate
    until the link (or the memory system) is full. Least squares on log residuals (scipy's least_squares),
    so a 1-CTA point and a 64-CTA point weigh alike. Returns per_cta_gbps, max_gbps and rel_rms (the log
    residuals' root mean square)."""
    from scipy.optimize import least_squares

    pts = [(float(c), float(g)) for c, g in zip(ctas, gbps) if isinstance(c, (int, float)) and c > 0
           and isinstance(g, (int, float)) and math.isfinite(g) and g > 0]
    if len({c for c, _ in pts}) < 2:
        raise CalibrationError(f"{what}: {len(pts)} usable CTA counts; a per-CTA rate and a ceiling need at least 2")
    c = np.array([p[0] for p in pts])
    g = np.array([p[1] for p in pts])

    def residuals(params):
        per_cta, most = np.exp(params)
        return np.log(np.minimum(c * per_cta, most) / g)

    start = np.log([float(np.max(g / c)), float(np.max(g))])
    bounds = (np.log([1e-6, 1e-6]), np.log([1e7, 1e7]))  # GB/s: no machine is outside them
    fit = least_squares(residuals, start, bounds=bounds, method="trf")
    per_cta, most = (float(x) for x in np.exp(fit.x))
    return {"per_cta_gbps": per_cta, "max_gbps": min(most, float(np.max(c)) * per_cta),
            "rel_rms": float(np.sqrt(np.mean(fit.fun ** 2)))}
