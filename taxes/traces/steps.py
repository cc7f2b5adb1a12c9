"""A trace's steps: which window each device activity belongs to, and which steps the statistics keep.

An activity belongs to the step whose host span [start, end) holds its launch call (half-open: a launch at
the instant one step ends and the next begins belongs to the later). An activity whose launch is not in
the trace (launched before profiling started, or by a thread the profiler missed) belongs to no step: its
device time is not charged to the step it happens to run in.

Each step gets a window on its rank, tiling time with no overlap:
    start = max(host step start, previous window's end)
    end   = max(host step end, end of the step's last activity)

Without ProfilerStep#N marks, repeating iterations are detected from the launch order: the period p is
the spacing of the kernel names that occur once per iteration (their occurrences are evenly p apart),
accepted when at least 90% of the sequence repeats with it and it repeats at least 3 times. Iteration k
is then the k-th run of p launches (graph replays count as one launch). With no such period the window is
the whole trace: from the first activity's start to the last one's end, and a warning says why.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

OUTLIER_FACTOR = 3.0  # a step longer than this many times the median is an outlier (or warm-up)
MIN_REPEATS = 3
MIN_MATCH = 0.9


def host_steps(host: pd.DataFrame) -> pd.DataFrame:
    """The host's step ranges (kind "step", named "step N"): step, host_start_us, host_end_us."""
    h = host[host["kind"] == "step"]
    if h.empty:
        return pd.DataFrame(columns=["step", "host_start_us", "host_end_us"])
    num = pd.to_numeric(h["name"].str.replace("step ", "", regex=False), errors="coerce")
    h = h.assign(step=num).dropna(subset=["step"]).sort_values("start_us").drop_duplicates("step")
    return pd.DataFrame({"step": h["step"].astype(int).values, "host_start_us": h["start_us"].values.astype(float),
                         "host_end_us": h["end_us"].values.astype(float)}).sort_values("step").reset_index(drop=True)


def assign_steps(launch_us: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step of each launch time (NaN: no launch in the trace): the step whose host span [start, end)
    holds it; -2 for none (not charged to any window)."""
    launch_us = np.asarray(launch_us, dtype=float)
    out = np.full(len(launch_us), -2, dtype=np.int64)
    if steps.empty or not len(launch_us):
        return out
    order = np.lexsort((steps["host_end_us"].values, steps["host_start_us"].values))
    starts = steps["host_start_us"].values[order]
    ends = steps["host_end_us"].values[order]
    ids = steps["step"].values[order]
    pos = np.searchsorted(starts, np.nan_to_num(launch_us, nan=-np.inf), side="right") - 1
    inside = ~np.isnan(launch_us) & (pos >= 0) & (launch_us < ends[np.clip(pos, 0, None)])
    out[inside] = ids[np.clip(pos, 0, None)][inside]
    return out


def step_windows(step_of: np.ndarray, end_us: np.ndarray, steps: pd.DataFrame) -> pd.DataFrame:
    """The windows (module docstring): step, host_start_us, host_end_us, start_us, end_us."""
    dev_end = pd.Series(end_us[step_of >= 0]).groupby(step_of[step_of >= 0]).max()
    rows, prev_end = [], -math.inf
    for s in steps.sort_values("host_start_us").itertuples(index=False):
        w0 = max(s.host_start_us, prev_end)
        w1 = max(s.host_end_us, dev_end.get(s.step, -math.inf), w0)
        rows.append((s.step, s.host_start_us, s.host_end_us, w0, w1))
        prev_end = w1
    return pd.DataFrame(rows, columns=["step", "host_start_us", "host_end_us", "start_us", "end_us"])


def repeating_iterations(names: np.ndarray, launch_us: np.ndarray, launch_key: np.ndarray) -> tuple[np.ndarray, int]:
    """Without step marks: (iteration index per activity, -2 for none; the period in launches, 0 if none).
    names: activity names; launch_us: their launch times (NaN: not launched in the trace); launch_key: an id
    of the launch (a graph replay's kernels share one)."""
    out = np.full(len(names), -2, dtype=np.int64)
    launched = ~np.isnan(launch_us)
    if launched.sum() < MIN_REPEATS:
        return out, 0
    idx = np.flatnonzero(launched)
    frame = pd.DataFrame({"i": idx, "t": launch_us[idx], "key": launch_key[idx], "name": names[idx]})
    frame = frame.sort_values(["t", "i"], kind="stable")
    # one symbol per launch: its first activity's name (a replay: the graph's first kernel)
    per_launch = frame.groupby("key", sort=False).agg(t=("t", "first"), name=("name", "first")).sort_values("t")
    codes = pd.factorize(per_launch["name"].values)[0]
    n = len(codes)
    pos = pd.Series(np.arange(n)).groupby(codes)
    best = 0
    for _, p in pos:
        p = p.values
        d = np.diff(p)
        if len(p) < MIN_REPEATS or not (d == d[0]).all():
            continue
        period = int(d[0])
        if (best == 0 or period < best) and (codes[:-period] == codes[period:]).mean() >= MIN_MATCH:
            best = period
    if not best:
        return out, 0
    first = _first_full_period(codes, best)
    complete = (n - first) // best
    if complete < MIN_REPEATS:
        return out, 0
    it = np.full(n, -2, dtype=np.int64)
    it[first:first + complete * best] = np.arange(complete * best) // best  # a trailing partial run: no step
    by_key = pd.Series(it, index=per_launch.index)
    out[frame["i"].values] = by_key.reindex(frame["key"].values).values
    return out, best


def _first_full_period(codes: np.ndarray, period: int) -> int:
    """Where the repetition starts: the first offset from which the next period repeats exactly."""
    for off in range(min(period, len(codes) - 2 * period + 1)):
        if (codes[off:off + period] == codes[off + period:off + 2 * period]).all():
            return off
    return 0


def iteration_windows(step_of: np.ndarray, launch_us: np.ndarray, end_us: np.ndarray) -> pd.DataFrame:
    """Windows of detected iterations: from the first launch of each to the next one's (or, for the last,
    its last activity's end), never before the previous window's end."""
    ids = np.unique(step_of[step_of >= 0])
    first_launch = pd.Series(launch_us[step_of >= 0]).groupby(step_of[step_of >= 0]).min()
    last_end = pd.Series(end_us[step_of >= 0]).groupby(step_of[step_of >= 0]).max()
    rows, prev_end = [], -math.inf
    for j, s in enumerate(ids):
        h0 = float(first_launch[s])
        h1 = float(first_launch[ids[j + 1]]) if j + 1 < len(ids) else float(last_end[s])
        w0 = max(h0, prev_end)
        w1 = max(h1, float(last_end[s]), w0)
        rows.append((int(s), h0, h1, w0, w1))
        prev_end = w1
    return pd.DataFrame(rows, columns=["step", "host_start_us", "host_end_us", "start_us", "end_us"])


def flag_steps(e2e_by_step: pd.Series) -> dict:
    """{step: "warm-up" | "outlier"} for steps whose E2E (slowest rank's span) exceeds OUTLIER_FACTOR x the
    median over steps; the leading run of such steps is warm-up. Flagged steps stay out of the statistics."""
    if len(e2e_by_step) < 2:
        return {}
    med = float(np.median(e2e_by_step.values))
    out = {}
    leading = True
    for step, v in e2e_by_step.sort_index().items():
        slow = med > 0 and v > OUTLIER_FACTOR * med
        if slow:
            out[step] = "warm-up" if leading else "outlier"
        else:
            leading = False
    return out
