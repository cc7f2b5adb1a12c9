"""The one attribution: every rank's timeline, window by window, split into rows that add up to the window.

Both `taxes profile` and `taxes analyze` call `attribute`. Rules (docs/method.md gives each with the known
answer that checks it):

The window [lo, hi) of a step on a rank is first split by what the device did, exactly:
    busy compute   union of the step's compute activities (comm == "")                       measured
    exposed comm   union of all activities minus compute: communication nothing overlapped    measured
    idle           the rest, gap by gap, each gap split by cause (below)                      measured
then:
    sync_wait         per collective instance matched across ranks (same `collective` key, overlapping in
                      time): latest arrival (start) minus this rank's, at most the activity's duration; the
                      exposed part of [start, start + wait). Plus, inside fused kernels, the time their
                      CTAs spent waiting on peers (wait_us, from their own clocks), beyond the floor's
                      unhideable link time.
    exposed_transfer  exposed comm - its sync wait - the floor's unhideable link time
    ideal             the floor max(T_compute, T_link, T_hbm) (when a floor is given)          derived
    locality          intermediate bytes x time per byte (when given)                          derived
    inefficiency      per compute kernel with a known floor: busy - in-kernel wait - its floor   derived
    compute           compute busy time of kernels without a floor, less in-kernel waits, and, when no
                      floor is given at all, less the locality estimate                        derived
    unattributed      window - everything above, with its sign: unknown idle, and where the kernels'
                      own floors disagree with the floor and locality.

Idle gap [a, b) before activity X, whose launch call returned at Le (a graph replay's kernels carry the
graph launch's), made inside a launching host call that began at Cs (a profiled step, a top-level CPU op;
the launch itself where none holds it); the host had last left a launching call, or begun the step, at F:
    graph_gaps    X and the activity that ended at a belong to one graph replay
    unknown       no launch record for X (it stays in unattributed)
    queued        the part after Le + 4 median launch latencies (the rank's median time from a launch's return
                  to its start on an idle device; with no estimate: the whole gap when the launch returned
                  before the device went idle): X was queued in time and waited on something else
    of the rest, the host's share is min(rest, Cs - F): what the gap would lose had the host entered the
    launching call as soon as it was free. It is
        sync          when a host synchronisation returned after the device went idle (the host waited for
                      the device, then refilled it),
        compile, data_loading   for the part of [Cs - share, Cs) the host spent in such ranges,
        host_bound    otherwise (Python, allocation, a spin)
    launch        the remainder: the launch path (the call and the launch latency) the device waited for.
A host spin before a launch therefore moves host_bound by its length and leaves launch unchanged, and a
graph replay removes both (docs/method.md: the known answers).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from taxes.floor import Floor
from taxes.timeline import Timeline, covered, gaps, measure, merge, union

IDLE_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued")
ROWS = ("ideal", "compute") + IDLE_ROWS + ("sync_wait", "exposed_transfer", "locality", "inefficiency",
                                           "unattributed")
LABELS = {"ideal": "derived", "compute": "derived", "launch": "measured", "host_bound": "measured",
          "sync": "measured", "compile": "measured", "data_loading": "measured", "graph_gaps": "measured",
          "queued": "measured", "sync_wait": "measured", "exposed_transfer": "derived", "locality": "derived",
          "inefficiency": "derived", "unattributed": "derived"}
TAXES = {"bulk-synchronous": ("sync_wait", "exposed_transfer"), "data-locality": ("locality",),
         "kernel-launch": ("launch",)}
_CAUSE_ROW = {"graph": "graph_gaps", "unknown": "unattributed", "sync": "sync", "compile": "compile",
              "data": "data_loading", "host": "host_bound", "launch": "launch", "queued": "queued"}
SYNC_CALLS = ("Synchronize", "cudaMemcpy\0", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2")  # blocking host calls


@dataclass
class Attribution:
    """Per (rank, step): `rows` (ROWS add up to span_us, plus busy/comm measures), `gaps` (every idle gap
    with its cause split), `collectives` (per instance and rank: arrival, wait, matched)."""

    rows: pd.DataFrame
    gaps: pd.DataFrame
    collectives: pd.DataFrame
    notes: list = field(default_factory=list)


def attribute(timelines: list[Timeline], floor: Floor | None = None, locality_bytes: float | dict | None = None,
              us_per_byte: float | None = None, launch_latency_us: float | None = None) -> Attribution:
    """Every window of every rank -> rows. floor: the step's floor (None: no ideal or inefficiency rows);
    locality_bytes: intermediate bytes per step (a number, or {step: bytes}); us_per_byte: HBM time per
    byte; launch_latency_us: overrides the latency estimated from each timeline."""
    coll = match_collectives(timelines)
    rows, gap_frames, notes = [], [], []
    for tl in timelines:
        waits = coll[coll["rank"] == tl.rank].set_index("activity")["wait_us"] if not coll.empty else pd.Series(dtype=float)
        r, g = _attribute_rank(tl, waits, floor, locality_bytes, us_per_byte, launch_latency_us, notes)
        rows.append(r)
        gap_frames.append(g)
    rows_df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "step", "span_us", *ROWS])
    gaps_df = pd.concat(gap_frames, ignore_index=True) if gap_frames else pd.DataFrame()
    return Attribution(rows_df, gaps_df, coll, notes)


# ---- collectives across ranks ---------------------------------------------------------------------


def match_collectives(timelines: list[Timeline], tolerance_us: float = 1.0) -> pd.DataFrame:
    """One row per (collective instance, rank): key, rank, activity (its index in that rank's activities),
    arrival_us, end_us, wait_us (latest arrival minus own, at most the activity's duration), n_ranks,
    matched. An instance is matched when every rank that has it ran it at overlapping times (each rank's
    end no earlier than the latest arrival, within tolerance_us): a collective cannot finish before its
    last rank arrives. Unmatched instances get no wait; they are listed, not guessed."""
    parts = []
    for tl in timelines:
        a = tl.activities
        sel = a[(a["comm"] != "") & (a["collective"] != "")]
        if sel.empty:
            continue
        # a collective on one rank may span several activities (e.g. NCCL's kernel and a copy): its arrival
        # is the first start, its end the last end
        g = sel.reset_index().groupby("collective").agg(activity=("index", "first"), arrival_us=("start_us", "min"),
                                                        end_us=("end_us", "max"))
        parts.append(g.reset_index().rename(columns={"collective": "key"}).assign(rank=tl.rank))
    cols = ["key", "rank", "activity", "arrival_us", "end_us", "wait_us", "n_ranks", "matched"]
    if not parts:
        return pd.DataFrame(columns=cols)
    df = pd.concat(parts, ignore_index=True)
    latest = df.groupby("key")["arrival_us"].transform("max")
    earliest_end = df.groupby("key")["end_us"].transform("min")
    df["n_ranks"] = df.groupby("key")["rank"].transform("count")
    df["matched"] = (df["n_ranks"] > 1) & (earliest_end >= latest - tolerance_us)
    wait = np.minimum(latest - df["arrival_us"], df["end_us"] - df["arrival_us"])
    df["wait_us"] = np.where(df["matched"], np.clip(wait, 0.0, None), 0.0)
    return df[cols]


# ---- one rank -------------------------------------------------------------------------------------


def _attribute_rank(tl: Timeline, waits: pd.Series, floor, locality_bytes, us_per_byte, latency, notes):
    acts = tl.activities
    lat = launch_latency(tl) if latency is None else latency
    launch = _launch_of(tl)
    cs, free = _host_context(tl, launch)
    sync_ends = np.sort(tl.launches.loc[tl.launches["kind"] == "sync", "end_us"].values.astype(float))
    busy_hosts = {k: merge(h["start_us"], h["end_us"]) for k, h in tl.host.groupby("kind") if k in ("compile", "data")}
    by_start = _steps_by_start(acts, tl.windows)
    step_of = pd.Series(np.where(acts["step"].values >= 0, acts["step"].values, by_start.values), index=acts.index)
    rows, gap_rows = [], []
    for w in tl.windows.itertuples(index=False):
        lo, hi = float(w.start_us), float(w.end_us)
        mine = acts[(step_of == w.step).values]
        mine = mine[(mine["end_us"] > lo) & (mine["start_us"] < hi)]
        s = mine["start_us"].clip(lo, hi).values
        e = mine["end_us"].clip(lo, hi).values
        comm = (mine["comm"] != "").values
        all_m, comp_m = merge(s, e), merge(s[~comm], e[~comm])
        span = hi - lo
        busy = measure(all_m, lo, hi)
        compute_busy = measure(comp_m, lo, hi)
        exposed = busy - compute_busy
        # sync wait at collectives: the exposed part of [arrival, arrival + wait)
        cw = waits.reindex(mine.index[comm]).fillna(0.0).values if len(waits) else np.zeros(int(comm.sum()))
        wait_m = merge(s[comm], np.minimum(s[comm] + cw, e[comm]))
        sync_coll = min(measure(union(wait_m, comp_m), lo, hi) - compute_busy, exposed)
        in_kernel_wait = float(mine.loc[~comm, "wait_us"].fillna(0.0).clip(lower=0.0).sum())
        unhide = floor.unhideable_link_us if floor is not None else 0.0
        unhide_comm = min(unhide, max(0.0, exposed - sync_coll))
        unhide_kernel = min(unhide - unhide_comm, in_kernel_wait)
        r = {k: 0.0 for k in ROWS}
        r["sync_wait"] = sync_coll + in_kernel_wait - unhide_kernel
        r["exposed_transfer"] = exposed - sync_coll - unhide_comm
        loc_b = locality_bytes.get(w.step, 0.0) if isinstance(locality_bytes, dict) else (locality_bytes or 0.0)
        r["locality"] = loc_b * us_per_byte if us_per_byte else 0.0
        # compute: kernels with their own floor are split into floor (in `ideal`, from the step's floor) and
        # inefficiency; the others stay `compute`
        dur = (e - s)[~comm] - mine.loc[~comm, "wait_us"].fillna(0.0).clip(lower=0.0).values
        fl = mine.loc[~comm, "floor_us"].values
        known = ~np.isnan(fl)
        if floor is not None:
            r["ideal"] = floor.ideal_us
            r["inefficiency"] = float(np.sum(dur[known] - fl[known]))
            r["compute"] = float(np.sum(dur[~known]))
        else:
            r["compute"] = compute_busy - in_kernel_wait - r["locality"]
        # idle, gap by gap
        ga, gb = gaps(all_m, lo, hi)
        pieces = _split_gaps(ga, gb, mine, launch.loc[mine.index], cs[acts.index.get_indexer(mine.index)],
                             free[acts.index.get_indexer(mine.index)], sync_ends, busy_hosts, lat)
        for g, (cause, length) in enumerate(pieces):
            r[_CAUSE_ROW[cause]] += length
            gap_rows.append((tl.rank, w.step, cause, length))
        r["unattributed"] += span - math.fsum(v for k, v in r.items())
        rows.append({"rank": tl.rank, "step": w.step, "start_us": lo, "end_us": hi, "span_us": span, **r,
                     "busy_us": busy, "compute_busy_us": compute_busy, "exposed_comm_us": exposed,
                     "comm_us": measure(merge(s[comm], e[comm]), lo, hi), "in_kernel_wait_us": in_kernel_wait,
                     "locality_bytes": loc_b, "launch_latency_us": lat})
    return pd.DataFrame(rows), pd.DataFrame(gap_rows, columns=["rank", "step", "cause", "dur_us"])


def _steps_by_start(acts: pd.DataFrame, windows: pd.DataFrame) -> pd.Series:
    """Without a step column: an activity belongs to the window its start falls in (-1: none)."""
    out = np.full(len(acts), -1, dtype=np.int64)
    for w in windows.itertuples(index=False):
        inside = (acts["start_us"] >= w.start_us) & (acts["start_us"] < w.end_us)
        out[inside.values] = w.step
    return pd.Series(out, index=acts.index)


def _launch_of(tl: Timeline) -> pd.DataFrame:
    """Per activity: its launch call's start, end and thread (NaN without one)."""
    la = tl.launches[tl.launches["kind"].isin(("launch", "graph"))]
    la = la[la["correlation"] >= 0].drop_duplicates("correlation").set_index("correlation")
    j = la.reindex(tl.activities["correlation"].values)
    return pd.DataFrame({"ls": j["start_us"].values.astype(float), "le": j["end_us"].values.astype(float),
                         "tid": j["tid"].values}, index=tl.activities.index)


def _host_context(tl: Timeline, launch: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per activity: cs, the start of the launching host call (kind "call", nested calls merged into the
    outermost, on the launch's thread) that holds its launch (the launch's own start where none does),
    and free, when the host last left a launching call (or began the step) before cs: the host's time in
    [free, cs) was spent on something other than launching."""
    cs = launch["ls"].values.copy()
    free = np.full(len(cs), np.nan)
    tids = launch["tid"].values
    for tid in pd.unique(tids[~np.isnan(cs)]):
        on = (tids == tid) & ~np.isnan(cs)
        h = tl.host[tl.host["tid"] == tid]
        calls = h[h["kind"] == "call"]
        la = tl.launches[(tl.launches["tid"] == tid) & tl.launches["kind"].isin(("launch", "graph"))]
        s, e = merge(np.concatenate([calls["start_us"].values, la["start_us"].values]),
                     np.concatenate([calls["end_us"].values, la["end_us"].values]))
        t = cs[on]
        if s.size:
            i = np.searchsorted(s, t, side="right") - 1
            inside = (i >= 0) & (t < e[np.maximum(i, 0)])
            t = np.where(inside, s[np.maximum(i, 0)], t)
        cs[on] = t
        marks = np.sort(np.concatenate([e, h.loc[h["kind"] == "step", "start_us"].values.astype(float)]))
        k = np.searchsorted(marks, t, side="right") - 1
        free[on] = np.where(k >= 0, marks[np.maximum(k, 0)], t)
    return cs, np.minimum(free, cs)


def launch_latency(tl: Timeline) -> float:
    """The median time from a launch call's return to its activity's start, over eager launches that reached
    an idle device (the device had finished everything before the call returned); NaN with fewer than three."""
    acts = tl.activities
    if acts.empty:
        return math.nan
    la = _launch_of(tl)
    prev_end = np.concatenate([[-np.inf], np.maximum.accumulate(acts["end_us"].values)[:-1]])
    le, st = la["le"].values, acts["start_us"].values
    lat = st - le
    ok = (acts["graph"].values < 0) & ~np.isnan(le) & (prev_end <= le) & (lat >= 0)
    return float(statistics.median(lat[ok])) if ok.sum() >= 3 else math.nan


LATENCY_SPREAD = 4.0  # a start later than this many median latencies after its launch returned waited on something else


def _split_gaps(ga, gb, acts: pd.DataFrame, launch: pd.DataFrame, cs_all: np.ndarray, free_all: np.ndarray,
                sync_ends: np.ndarray, busy_hosts: dict, lat: float):
    """Yield (cause, length) pieces of every idle gap (see the module docstring)."""
    if ga.size == 0:
        return
    starts = acts["start_us"].values
    order = np.argsort(starts, kind="stable")
    s_sorted = starts[order]
    ends = acts["end_us"].values
    graph = acts["graph"].values
    pos = {i: k for k, i in enumerate(acts.index)}
    for a, b in zip(ga, gb):
        j = np.searchsorted(s_sorted, b, side="left")
        if j >= len(order) or s_sorted[j] > b + 1e-9:
            yield "unknown", b - a  # nothing starts where the gap ends (a window's tail)
            continue
        x = order[j]
        idx = acts.index[x]
        prev = np.flatnonzero(np.abs(ends - a) <= 1e-9)
        if graph[x] >= 0 and prev.size and np.any(graph[prev] == graph[x]):
            yield "graph", b - a
            continue
        le = launch.at[idx, "le"]
        if math.isnan(le):
            yield "unknown", b - a
            continue
        if math.isnan(lat):  # no latency estimate: a launch that returned before the device idled waited on nothing
            queued = b - a if le <= a else 0.0
        else:
            queued = max(0.0, b - max(a, le + LATENCY_SPREAD * lat))
        waited = b - a - queued
        cs, free = cs_all[pos[idx]], free_all[pos[idx]]
        host = min(waited, max(0.0, cs - free))  # what the gap would lose had the host launched as soon as it was free
        if host > 0:
            k = np.searchsorted(sync_ends, cs, side="right")
            if k > 0 and sync_ends[k - 1] > a:  # the host waited for the device to drain, then refilled it
                yield "sync", host
            else:
                rest = host
                for kind, cause in (("compile", "compile"), ("data", "data")):
                    m = busy_hosts.get(kind)
                    if m is not None and rest > 0:
                        part = min(rest, float(covered(m, [cs - host], [cs])[0]))
                        if part > 0:
                            yield cause, part
                            rest -= part
                if rest > 0:
                    yield "host", rest
        if waited > host:
            yield "launch", waited - host
        if queued > 0:
            yield "queued", queued


# ---- across iterations ----------------------------------------------------------------------------


def kept_iterations(e2e_us) -> list[int]:
    """The iterations whose E2E ranks in the middle half (the interquartile set: n // 4 dropped at each end,
    so any four or more iterations are trimmed)."""
    n = len(e2e_us)
    order = sorted(range(n), key=lambda i: (e2e_us[i], i))
    return sorted(order[n // 4:n - n // 4])


def iqm(values) -> float | None:
    """The interquartile mean: the mean of the values ranked between the 25th and 75th percentile. Robust
    like a median, and additive: the interquartile mean of sums is the sum of the same iterations' means."""
    vals = list(values)
    keep = kept_iterations(vals)
    return statistics.fmean(vals[i] for i in keep) if keep else None


def overall(rows: pd.DataFrame) -> pd.DataFrame:
    """Per step, the slowest rank's rows (E2E is the slowest rank's time)."""
    if rows.empty:
        return rows
    i = rows.groupby("step")["span_us"].idxmax()
    return rows.loc[i.values].reset_index(drop=True)


def summarize(rows: pd.DataFrame, steps: list | None = None) -> dict:
    """The rows of the kept (interquartile) steps, averaged: {"e2e_us", "rows": {row: us}, "per_rank":
    {rank: {row: us}}, "kept": [steps], "n": steps}. e2e_us is the interquartile mean of the slowest
    rank's span, and the rows add up to it."""
    if steps is not None:
        rows = rows[rows["step"].isin(steps)]
    ov = overall(rows)
    if ov.empty:
        return {"e2e_us": None, "rows": {}, "per_rank": {}, "kept": [], "n": 0}
    keep_idx = kept_iterations(list(ov["span_us"]))
    kept_steps = [ov["step"].iloc[i] for i in keep_idx]
    ko = ov[ov["step"].isin(kept_steps)]
    out = {"e2e_us": float(ko["span_us"].mean()), "rows": {k: float(ko[k].mean()) for k in ROWS},
           "kept": [int(s) if isinstance(s, (int, np.integer)) else s for s in kept_steps], "n": len(ov)}
    per = rows[rows["step"].isin(kept_steps)]
    out["per_rank"] = {int(r): {k: float(g[k].mean()) for k in ROWS + ("span_us",)} for r, g in per.groupby("rank")}
    return out
