"""Which rank is late at collectives, what that cost the others, and where the late rank spent the time.

Arrival at a collective instance is the device start of the rank's collective, on the common clock
(taxes.attribution.attribute.match_collectives; only instances matched across ranks count). At each matched instance
the rank that arrived last kept the others waiting. Per rank:

    instances         matched instances it took part in
    times_last        at how many of them it arrived last
    caused_wait_us    the waits the other ranks paid at the instances it arrived last (their wait_us)
    suffered_wait_us  the wait it paid itself (its wait_us, summed)
    lateness_us       its arrival minus the earliest arrival, averaged over its instances
    score             caused_wait_us / every rank's caused_wait_us: its share of the job's sync wait, 0 to 1,
                      the ranks' scores adding up to 1 (0 everywhere when nobody waited). Comparable across
                      ranks and jobs: a fair share is 1 / ranks
    straggler         the rank of the largest score, when that score is at least min(0.75, 2 / ranks) (twice
                      a fair share; 3/4 with two ranks) and the wait it caused at least MIN_SHARE of the analysed
                      steps' time (jitter of a few us at each collective names nobody)
    where             where it spent the time the others waited (below)

Where: at each instance it arrived last, the interval from the earliest arrival to its own is split on the
late rank's own record: device time by the activity that ran ("device: NAME", clipped to the interval),
and device idle by the innermost host event (cpu op, annotation, Python frame) its launching thread was in
("host: NAME"; "host: (no event recorded)" where none was). Summed over those instances, largest first.
The host events are kept per rank as flat segments (host_segments): the innermost event from each
boundary to the next, so an interval's host frames are a slice, whatever the nesting.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from taxes.traces.timeline import gaps, merge

HOST_KINDS = ("cpu_op", "annotation", "python")
TOP_WHERE = 5
MIN_SHARE = 0.01
COLUMNS = ["rank", "instances", "times_last", "caused_wait_us", "suffered_wait_us", "lateness_us", "score",
           "straggler", "where"]
NO_EVENT = "host: (no event recorded)"


# ---- per rank, from its events (where its trace is read) ---------------------------------------------


def host_segments(events: pd.DataFrame) -> dict:
    """{tid: (bounds_us, owner)} plus "names": from bounds_us[k] to bounds_us[k + 1] the thread was in host
    event owner[k] (an index into names; -1: none), innermost first. ProfilerStep marks are left out: they
    hold the whole step."""
    kinds = events["kind"].values
    host = events[np.isin(kinds, HOST_KINDS)]
    host = host[~host["name"].str.startswith("ProfilerStep#").values]
    names, codes = np.unique(host["name"].values.astype(str), return_inverse=True) if len(host) else (np.empty(0, object), [])
    out = {"names": names}
    codes = np.asarray(codes)
    for tid in pd.unique(host["tid"].values):
        on = host["tid"].values == tid
        out[tid] = _flatten(host["ts"].values[on], host["end"].values[on], codes[on])
    return out


def _flatten(ts: np.ndarray, te: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nested ranges of one thread -> boundaries and the innermost range's code after each (-1: none)."""
    order = np.lexsort((-te, ts))
    ts, te, code = ts[order], te[order], code[order]
    bounds, owner, stack = [], [], []

    def close_until(t):
        while stack and te[stack[-1]] <= t:
            j = stack.pop()
            while stack and te[stack[-1]] <= te[j]:  # an enclosing range that ended first (improper nesting)
                stack.pop()
            bounds.append(te[j])
            owner.append(code[stack[-1]] if stack else -1)

    for i in range(len(ts)):
        close_until(ts[i])
        bounds.append(ts[i])
        owner.append(code[i])
        stack.append(i)
    close_until(np.inf)
    return np.asarray(bounds, dtype=float), np.asarray(owner, dtype=np.int64)


def where_late(acts: pd.DataFrame, extra: pd.DataFrame, segments: dict, windows: pd.DataFrame) -> pd.DataFrame:
    """frame, us, instances: where a rank spent the intervals [lo, hi) of `windows` (key, activity, lo_us,
    hi_us: the instances it arrived last, on its own clock), summed over them (module docstring)."""
    cols = ["frame", "us", "instances"]
    if windows.empty:
        return pd.DataFrame(columns=cols)
    s, e, names = acts["start_us"].values, acts["end_us"].values, acts["name"].values
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    longest = float((e - s).max()) if len(s) else 0.0
    keys = acts["collective"].values
    bs, be = merge(s, e)
    total: dict = {}
    for w in windows.itertuples(index=False):  # one late instance each: a few slices, never a pass over all
        lo, hi = float(w.lo_us), float(w.hi_us)
        if hi <= lo:
            continue
        cand = order[np.searchsorted(s_sorted, lo - longest, "left"):np.searchsorted(s_sorted, hi, "left")]
        cand = cand[(e[cand] > lo) & (keys[cand] != w.key)]
        for name, us in zip(names[cand], np.minimum(e[cand], hi) - np.maximum(s[cand], lo)):
            key = "device: " + _short(name)
            total[key] = total.get(key, 0.0) + float(us)
        i0, i1 = max(int(np.searchsorted(be, lo, "right")), 0), int(np.searchsorted(bs, hi, "left"))
        ga, gb = gaps((bs[i0:i1], be[i0:i1]), lo, hi)
        if not len(ga):
            continue
        tid = extra["launch_tid"].values[int(w.activity)]
        seg = segments.get(tid) if tid is not None and tid == tid else None
        for name, us in frames_in(seg, segments.get("names"), ga, gb, "host: ", NO_EVENT).items():
            total[name] = total.get(name, 0.0) + us
    out = pd.DataFrame(sorted(total.items(), key=lambda kv: -kv[1]), columns=["frame", "us"])
    return out[out["us"] > 1e-9].assign(instances=len(windows)).head(TOP_WHERE).reset_index(drop=True)


def frames_in(seg, names, ga: np.ndarray, gb: np.ndarray, prefix: str = "",
              none: str = "(no host event recorded)") -> dict:
    """{frame: us}: the innermost host event of one thread's segments (host_segments) over the intervals
    [ga, gb), its name after `prefix`; `none` for the time no event covers."""
    out: dict = {}
    if seg is None or not len(seg[0]):
        return {none: float(np.sum(np.asarray(gb) - np.asarray(ga)))} if len(ga) else {}
    bounds, owner = seg
    for a, b in zip(ga, gb):
        if a < bounds[0]:
            out[none] = out.get(none, 0.0) + float(min(b, bounds[0]) - a)
        k0 = max(int(np.searchsorted(bounds, a, "right")) - 1, 0)
        k1 = int(np.searchsorted(bounds, b, "left"))
        if k1 <= k0:
            continue
        piece = np.minimum(np.append(bounds[k0 + 1:k1], b), b) - np.maximum(bounds[k0:k1], a)
        for o, us in zip(owner[k0:k1], piece):
            if us > 0:
                name = none if o < 0 else prefix + _short(str(names[o]))
                out[name] = out.get(name, 0.0) + float(us)
    return out


def _short(name: str, n: int = 80) -> str:
    name = str(name)
    return name if len(name) <= n else name[: n - 3] + "..."


# ---- across ranks (where the per-rank tables are gathered) --------------------------------------------


def late_windows(per_rank: pd.DataFrame, per_instance: pd.DataFrame) -> pd.DataFrame:
    """rank, key, activity, lo_us, hi_us: at each matched instance, the interval from the earliest arrival
    to the last rank's own (common clock)."""
    cols = ["rank", "key", "activity", "lo_us", "hi_us"]
    if per_rank.empty or per_instance.empty:
        return pd.DataFrame(columns=cols)
    ok = per_rank[per_rank["matched"]]
    first = ok.groupby("key")["arrival_us"].min()
    last = per_instance[per_instance["matched"]].set_index("key")["slowest_rank"]
    mine = ok[ok["rank"].values == last.reindex(ok["key"]).values]
    return pd.DataFrame({"rank": mine["rank"].values, "key": mine["key"].values, "activity": mine["activity"].values,
                         "lo_us": first.reindex(mine["key"]).values, "hi_us": mine["arrival_us"].values})[cols]


def summary(per_rank: pd.DataFrame, per_instance: pd.DataFrame, where: dict | None = None,
            steps_us: float = 0.0) -> pd.DataFrame:
    """One row per rank (COLUMNS, module docstring). per_rank, per_instance: taxes.traces.collectives.instances;
    where: {rank: where_late frame}; steps_us: the analysed steps' time (the sum of their E2E)."""
    if per_rank.empty:
        return pd.DataFrame(columns=COLUMNS)
    ok = per_rank[per_rank["matched"]]
    last = per_instance[per_instance["matched"]].set_index("key")["slowest_rank"]
    ok = ok.assign(slowest=last.reindex(ok["key"]).values,
                   lateness=ok["arrival_us"] - ok.groupby("key")["arrival_us"].transform("min"))
    caused = ok[ok["rank"] != ok["slowest"]].groupby("slowest")["wait_us"].sum()
    total = float(caused.sum())
    rows = []
    for r, g in per_rank.groupby("rank"):
        mine = ok[ok["rank"] == r]
        c = float(caused.get(r, 0.0))
        w = (where or {}).get(r)
        text = "; ".join(f"{f} ({u / max(n, 1):,.1f} us per instance)" for f, u, n in
                         zip(w["frame"], w["us"], w["instances"])) if w is not None and len(w) else ""
        rows.append([int(r), len(mine), int((mine["slowest"] == r).sum()), c, float(mine["wait_us"].sum()),
                     float(mine["lateness"].mean()) if len(mine) else 0.0, c / total if total > 0 else 0.0, False, text])
    out = pd.DataFrame(rows, columns=COLUMNS)
    if total > 0:
        top = int(out["score"].idxmax())
        out.loc[top, "straggler"] = bool(out.loc[top, "score"] >= min(0.75, 2.0 / len(out))
                                         and out.loc[top, "caused_wait_us"] >= MIN_SHARE * steps_us)
    return out
