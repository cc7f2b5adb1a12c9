"""The one attribution: every rank's timeline, window by window, split into rows that add up to the window.

Both `taxes profile` and `taxes analyze` call `attribute`. Rules (docs/method.md gives each with the known
answer that checks it):

The window [lo, hi) of a step on a rank is first split by what the device did, exactly:
    busy compute   union of the step's compute activities (comm == "")                       measured
    exposed comm   union of all activities minus compute: communication nothing overlapped    measured
    idle           the rest, gap by gap, each gap split by cause (below)                      measured
then:
    start_skew        (iterations begun together after a host barrier) the part of the wait below that
                      the other ranks' later start explains: the harness's, not the program's. At the
                      window's first collective with a wait: the wait beyond the lead the program made
                      (its lead over the last arrival less the start skew), so set-up the early rank did
                      while waiting absorbs the harness's skew first; inside fused kernels, the wait up to
                      the skew
    sync_wait         per collective instance matched across ranks (same `collective` key, overlapping in
                      time): how much longer this rank's collective took than the last rank to arrive took, at most
                      the latest arrival (start) minus this rank's; of that wait, the part that held the
                      rank's next compute kernel: the last stretch of it without compute (where compute
                      resumed inside the wait, the idle before was the rank's own host's), at most the
                      collective's end minus the start of the launching call of the first compute kernel
                      after it (before it the rank's own host held the kernel); the rest is host_bound.
                      Plus the stretch of the rank's compute that ran beside a waiting collective (a
                      waiting NCCL kernel keeps its SMs: each kernel's duration less its own median where
                      it overlapped no wait, within its overlap with the waits; summed over the window,
                      never below 0). Plus, inside fused kernels, their wait for peers (wait_us, from the
                      kernel's own clocks: the longest any CTA waited, taxes.run.measure), at most the
                      kernel's time beyond its own floor, beyond the floor's unhideable link time; less
                      start_skew.
    exposed_transfer  exposed comm - its sync wait - the floor's unhideable link time
    ideal             the floor max(T_compute, T_link, T_hbm) (when a floor is given)          derived
    locality          intermediate bytes x time per byte (when given)                          derived
    inefficiency      per compute kernel with a known floor: busy - in-kernel wait - its floor   derived
                      (where none of the window's kernels has one, their time together less the floor)
    compute           compute busy time of kernels without a floor, less in-kernel waits, and, when no
                      floor is given at all, less the locality estimate                        derived
    unattributed      window - everything above, with its sign: unknown idle, and where the kernels'
                      own floors disagree with the floor and locality.

An activity launched in no window (step -2: before recording began, or outside every profiled
iteration) is charged to none: its device time is no window's compute, and no idle gap either (it
stays in unattributed).

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

from taxes.model.floor import Floor
from taxes.attribution.waits import binding_wait, harness_wait, match_collectives, own_gaps, start_skews, wait_stretch
from taxes.traces.timeline import Timeline, covered, gaps, measure, merge, union

from taxes.attribution.rows import IDLE_ROWS, LABELS, ROWS, TAXES  # noqa: E402,F401  (named here too)
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
              us_per_byte: float | None = None, launch_latency_us: float | None = None, jobs: int = 1,
              aligned_starts: bool = False, collective_reference: dict | None = None) -> Attribution:
    """Every window of every rank -> rows. floor: the step's floor (None: no ideal or inefficiency rows);
    locality_bytes: intermediate bytes per step (a number, {step: bytes} or {(rank, step): bytes});
    us_per_byte: HBM time per byte; launch_latency_us: overrides the latency estimated from each timeline;
    jobs: worker processes for the ranks (after the collectives are matched, each rank is independent);
    aligned_starts: the windows of one step are one iteration that every rank began together after a host
    barrier (taxes profile's isolated iterations): the wait that the ranks' own start skew explains is its
    row, `start_skew`, not sync wait. Ranks whose timelines say their clocks are not aligned
    (meta["clock_aligned"] False) are not matched at collectives: their sync wait is not measured.
    collective_reference: each rank's own durations of its collectives without a wait, measured in another part
    of the same run (taxes.attribution.waits.own_durations), where these timelines have too few of their own."""
    notes = []
    if len(timelines) > 1 and not all(tl.meta.get("clock_aligned", True) for tl in timelines):
        coll = match_collectives([])
        notes.append("the ranks' clocks are not aligned (records without a shared origin): sync wait and start "
                     "skew not measured")
        aligned_starts = False
    else:
        coll = match_collectives(timelines, reference=collective_reference)
    skews = start_skews(timelines) if aligned_starts and len(timelines) > 1 else {}
    args = []
    for tl in timelines:
        mine = coll[coll["rank"] == tl.rank].set_index("activity")
        waits = mine["wait_us"] if not coll.empty else pd.Series(dtype=float)
        leads = mine["lead_us"] if not coll.empty else pd.Series(dtype=float)
        args.append((tl, waits, floor, locality_bytes, us_per_byte, launch_latency_us, skews.get(tl.rank, {}),
                     leads))
    if jobs > 1 and len(timelines) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(timelines))) as pool:
            results = list(pool.map(_attribute_rank_of, args))
    else:
        results = [_attribute_rank_of(a) for a in args]
    rows = [r for r, _, _ in results]
    gap_frames = [g for _, g, _ in results]
    for _, _, n in results:
        notes += n
    rows_df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["rank", "step", "span_us", *ROWS])
    gaps_df = pd.concat(gap_frames, ignore_index=True) if gap_frames else pd.DataFrame()
    return Attribution(rows_df, gaps_df, coll, notes)


def _attribute_rank_of(args) -> tuple:
    notes: list = []
    r, g = _attribute_rank(*args, notes)
    return r, g, notes


def attribute_rank(tl: Timeline, waits: pd.Series, floor: Floor | None = None, locality_bytes: float | dict | None = None,
                   us_per_byte: float | None = None, launch_latency_us: float | None = None,
                   skew: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame, list]:
    """One rank's half of `attribute`, for callers that run ranks elsewhere (another process or machine)
    once the collectives are matched: (rows, gaps, notes) of its windows. waits: match_collectives's
    wait_us of this rank's collectives, indexed by activity; skew: {step: us} of start_skews."""
    return _attribute_rank_of((tl, waits, floor, locality_bytes, us_per_byte, launch_latency_us, skew or {}, None))


# ---- one rank -------------------------------------------------------------------------------------


def _attribute_rank(tl: Timeline, waits: pd.Series, floor, locality_bytes, us_per_byte, latency, skew: dict,
                    leads: pd.Series | None, notes):
    acts = tl.activities
    lat = launch_latency(tl) if latency is None else latency
    launch = _launch_of(tl)
    cs, free = _host_context(tl, launch)
    sync_ends = np.sort(tl.launches.loc[tl.launches["kind"] == "sync", "end_us"].values.astype(float))
    busy_hosts = {k: merge(h["start_us"], h["end_us"]) for k, h in tl.host.groupby("kind") if k in ("compile", "data")}
    by_start = _steps_by_start(acts, tl.windows)
    # step -1: the window its start falls in; any other negative step: launched in no window, charged to none
    step_of = np.where(acts["step"].values >= 0, acts["step"].values,
                       np.where(acts["step"].values == -1, by_start.values, -2))
    positions = pd.Series(np.arange(len(acts))).groupby(step_of).indices if len(acts) else {}
    foreign = positions.get(-2, np.empty(0, dtype=np.int64))  # launched in no window: busy, but no window's work
    starts_all, ends_all = acts["start_us"].values.astype(float), acts["end_us"].values.astype(float)
    comm_all = (acts["comm"] != "").values
    wait_all = np.clip(np.nan_to_num(acts["wait_us"].values.astype(float)), 0.0, None)
    floor_all = acts["floor_us"].values.astype(float)
    coll_wait = waits.reindex(acts.index).fillna(0.0).values if len(waits) else np.zeros(len(acts))
    coll_lead = leads.reindex(acts.index).fillna(0.0).values if leads is not None and len(leads) else coll_wait
    # compute slowed by a collective waiting beside it on another stream: a kernel is known by its name and its
    # occurrence in its step (a training step runs the same kernels in the same order)
    waiting = comm_all & (coll_wait > 0.0)
    stretch_all = np.zeros(len(acts))
    own_gap_all = np.zeros(len(acts))
    if waiting.any():
        names = pd.Series(acts["name"].astype(str).values)
        kernel_keys = (names + "#" + names.groupby([step_of, names.values]).cumcount().astype(str)).values
        wait_ends = np.minimum(starts_all[waiting] + coll_wait[waiting], ends_all[waiting])
        stretch_all = wait_stretch(kernel_keys, starts_all, ends_all, ~comm_all, starts_all[waiting], wait_ends)
        own_gap_all = own_gaps(kernel_keys, starts_all, ends_all, ~comm_all, starts_all[waiting], wait_ends)
    rows, gap_frames = [], []
    for w in tl.windows.itertuples(index=False):
        lo, hi = float(w.start_us), float(w.end_us)
        pos = positions.get(w.step, np.empty(0, dtype=np.int64))
        pos = pos[(ends_all[pos] > lo) & (starts_all[pos] < hi)]
        s = np.clip(starts_all[pos], lo, hi)
        e = np.clip(ends_all[pos], lo, hi)
        comm = comm_all[pos]
        all_m, comp_m = merge(s, e), merge(s[~comm], e[~comm])
        span = hi - lo
        busy = measure(all_m, lo, hi)
        compute_busy = measure(comp_m, lo, hi)
        exposed = busy - compute_busy
        # sync wait at collectives: of the wait the rank spent without compute, the part that held its next
        # compute kernel (taxes.attribution.waits.binding_wait); the rest passed while the rank's own host had not
        # yet launched its kernels, which would have idled for its host all the same: host_bound
        cw = coll_wait[pos][comm]
        wait_m = merge(s[comm], np.minimum(s[comm] + cw, e[comm]))
        sync_all = sync_coll = min(measure(union(wait_m, comp_m), lo, hi) - compute_busy, exposed)
        if (cw > 0).any():
            # a kernel that started no later than its launching call (emulated ranks: the host is the device)
            # had no host to wait for apart from itself: its wait is all held
            host_cs = np.where(cs[pos][~comm] >= starts_all[pos][~comm], np.nan, cs[pos][~comm])
            sync_coll = min(binding_wait(s[comm], e[comm], cw, comp_m, s[~comm], host_cs, own_gap_all[pos][~comm]),
                            exposed)
        own_host = max(0.0, sync_all - sync_coll)
        # a kernel waited no longer than it ran beyond its own floor: a fused kernel's wait rule (the longest
        # any CTA waited) also counts wait that other CTAs' compute covered, which the floor bounds
        kw = wait_all[pos][~comm]
        fl_k = floor_all[pos][~comm]
        kw_capped = np.where(np.isnan(fl_k), kw, np.minimum(kw, np.maximum(0.0, (e - s)[~comm] - np.nan_to_num(fl_k))))
        in_kernel_wait = float(kw_capped.sum())
        covered_wait = float(kw.sum()) - in_kernel_wait
        unhide = floor.unhideable_link_us if floor is not None else 0.0
        unhide_comm = min(unhide, max(0.0, exposed - sync_coll))
        unhide_kernel = min(unhide - unhide_comm, in_kernel_wait)
        r = {k: 0.0 for k in ROWS}
        r["sync_wait"] = sync_coll + in_kernel_wait - unhide_kernel
        # the part of that wait the harness made: the other ranks began the iteration this much later
        r["start_skew"] = harness_wait(max(0.0, float(skew.get(w.step, 0.0))), s[comm], cw, coll_lead[pos][comm],
                                        in_kernel_wait, max(0.0, r["sync_wait"]))
        r["sync_wait"] -= r["start_skew"]
        # the window's compute that ran longer beside a waiting collective: the wait's cost, not the kernels'
        # (the kernels' own stretches scaled to what the window counts, so the compute rows lose exactly it)
        st = stretch_all[pos][~comm]
        total = float(st.sum())
        stretch = min(max(0.0, total), max(0.0, compute_busy - in_kernel_wait))
        st = st * (stretch / total) if total > 0.0 else np.zeros_like(st)
        r["sync_wait"] += stretch
        r["exposed_transfer"] = exposed - sync_coll - unhide_comm - own_host
        r["host_bound"] += own_host
        loc_b = _locality_bytes_of(locality_bytes, tl.rank, w.step)
        r["locality"] = loc_b * us_per_byte if us_per_byte else 0.0
        # compute: kernels with their own floor are split into floor (in `ideal`, from the step's floor) and
        # inefficiency; the others stay `compute`
        dur = (e - s)[~comm] - kw_capped - st
        fl = floor_all[pos][~comm]
        known = ~np.isnan(fl)
        if floor is not None and known.any():
            r["ideal"] = floor.ideal_us
            r["inefficiency"] = float(np.sum(dur[known] - fl[known]))
            r["compute"] = float(np.sum(dur[~known]))
        elif floor is not None:
            # no kernel carries a floor of its own (someone else's kernels, e.g. PyTorch's fused op): as a group,
            # their time beyond the window's floor; the floor and all their time would count the work twice
            # (their busy union: such a sequence often runs kernels side by side on several streams)
            r["ideal"] = floor.ideal_us
            r["inefficiency"] = compute_busy - in_kernel_wait - stretch - floor.ideal_us
        else:
            r["compute"] = compute_busy - in_kernel_wait - r["locality"] - stretch
        # idle, gap by gap
        # the device is not idle while it runs work launched in no window (that time stays unattributed)
        fo = foreign[(ends_all[foreign] > lo) & (starts_all[foreign] < hi)]
        ga, gb = gaps(union(all_m, merge(starts_all[fo], ends_all[fo])) if len(fo) else all_m, lo, hi)
        pieces = split_gaps(ga, gb, starts_all[pos], ends_all[pos], acts["graph"].values[pos],
                            launch["le"].values[pos], launch["tid"].values[pos], cs[pos], free[pos],
                            sync_ends, busy_hosts, lat)
        for cause in np.unique(pieces["cause"]):
            r[_CAUSE_ROW[cause]] += float(pieces["dur_us"][pieces["cause"] == cause].sum())
        pieces["rank"] = np.full(len(pieces["dur_us"]), tl.rank)
        pieces["step"] = np.full(len(pieces["dur_us"]), w.step, dtype=object)
        gap_frames.append(pieces)
        r["unattributed"] += span - math.fsum(v for k, v in r.items())
        rows.append({"rank": tl.rank, "step": w.step, "start_us": lo, "end_us": hi, "span_us": span, **r,
                     "busy_us": busy, "compute_busy_us": compute_busy, "exposed_comm_us": exposed,
                     "comm_us": measure(merge(s[comm], e[comm]), lo, hi), "in_kernel_wait_us": in_kernel_wait,
                     "in_kernel_wait_covered_us": covered_wait,
                     "wait_stretch_us": stretch,
                     "locality_bytes": loc_b, "launch_latency_us": lat})
    g = pd.DataFrame({c: np.concatenate([f[c] for f in gap_frames]) if gap_frames else [] for c in GAP_COLUMNS})
    g["step"] = g["step"].infer_objects() if len(g) else g["step"]
    return pd.DataFrame(rows), g


def _locality_bytes_of(locality_bytes, rank: int, step) -> float:
    """Intermediate bytes of a window: a number for every window, or a dict keyed by step or by (rank, step)."""
    if isinstance(locality_bytes, dict):
        if (rank, step) in locality_bytes:
            return float(locality_bytes[(rank, step)])
        return float(locality_bytes.get(step, 0.0))
    return float(locality_bytes or 0.0)


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


GAP_COLUMNS = ("rank", "step", "cause", "dur_us", "start_us", "end_us", "host_start_us", "host_end_us", "tid")
_PIECE_ORDER = ("unknown", "graph", "sync", "compile", "data", "host", "launch", "queued")


def split_gaps(ga, gb, starts, ends, graph, le, tid, cs_all, free_all, sync_ends, busy_hosts: dict,
               lat: float) -> pd.DataFrame:
    """Every idle gap [ga, gb) of a window split into (cause, length) pieces (the module docstring's
    rules), all gaps at once, as columns (numpy arrays): cause, dur_us, start_us and end_us (the gap), host_start_us and
    host_end_us (where the host was elsewhere: [cs - share, cs), for the host's share), tid (of the next
    activity's launch). Pieces of one gap follow each other in the order sync | compile, data, host,
    launch, queued."""
    ga, gb = np.asarray(ga, dtype=float), np.asarray(gb, dtype=float)
    if ga.size == 0:
        return {c: np.empty(0, dtype=object if c in ("cause", "tid") else float) for c in GAP_COLUMNS[2:]}
    order = np.argsort(starts, kind="stable")
    s_sorted = starts[order]
    j = np.searchsorted(s_sorted, gb, side="left")
    has_next = (j < len(order))
    has_next[has_next] = s_sorted[j[has_next]] <= gb[has_next] + 1e-9
    x = order[np.minimum(j, len(order) - 1)] if len(order) else np.zeros(len(ga), dtype=np.int64)
    # graph: X and the activity that ended at the gap's start belong to one graph replay
    in_graph = np.zeros(len(ga), dtype=bool)
    if len(order):
        gx = graph[x]
        e_order = np.argsort(ends, kind="stable")
        e_sorted, g_by_end = ends[e_order], graph[e_order]
        lo_i = np.searchsorted(e_sorted, ga - 1e-9, side="left")
        hi_i = np.searchsorted(e_sorted, ga + 1e-9, side="right")
        for k in np.flatnonzero(has_next & (gx >= 0) & (hi_i > lo_i)):
            in_graph[k] = bool(np.any(g_by_end[lo_i[k]:hi_i[k]] == gx[k]))
    length = gb - ga
    lex = le[x] if len(order) else np.full(len(ga), np.nan)
    unknown = ~has_next | (~in_graph & np.isnan(lex))
    graph_gap = has_next & in_graph
    ok = ~unknown & ~graph_gap
    if math.isnan(lat):  # no latency estimate: a launch that returned before the device idled waited on nothing
        queued = np.where(lex <= ga, length, 0.0)
    else:
        queued = np.clip(gb - np.maximum(ga, lex + LATENCY_SPREAD * lat), 0.0, None)
    queued = np.where(ok, np.nan_to_num(queued), 0.0)
    waited = length - queued
    csx = cs_all[x] if len(order) else np.full(len(ga), np.nan)
    share = np.where(ok, np.minimum(waited, np.clip(np.nan_to_num(csx - free_all[x] if len(order) else 0.0), 0.0, None)), 0.0)
    k = np.searchsorted(sync_ends, np.nan_to_num(csx), side="right")
    synced = ok & (share > 0) & (k > 0) & (np.where(k > 0, sync_ends[np.maximum(k - 1, 0)] if len(sync_ends) else -np.inf, -np.inf) > ga)
    rest = np.where(synced, 0.0, share)
    parts = {"sync": np.where(synced, share, 0.0)}
    for kind, cause in (("compile", "compile"), ("data", "data")):
        m = busy_hosts.get(kind)
        part = np.zeros(len(ga))
        live = ok & (rest > 0)
        if m is not None and live.any():
            part[live] = np.minimum(rest[live], covered(m, (csx - share)[live], csx[live]))
        parts[cause] = part
        rest = rest - part
    parts["host"] = rest
    parts["launch"] = np.where(ok, waited - share, 0.0)
    parts["queued"] = queued
    parts["unknown"] = np.where(unknown, length, 0.0)
    parts["graph"] = np.where(graph_gap, length, 0.0)
    tids = tid[x] if len(order) else np.full(len(ga), np.nan)
    values = np.stack([parts[c] for c in _PIECE_ORDER], axis=1)  # gap x cause, in piece order
    g_idx, c_idx = np.nonzero(values > 0)  # row-major: gap by gap, each gap's pieces in order
    has = share[g_idx] > 0
    return {"cause": np.asarray(_PIECE_ORDER, dtype=object)[c_idx], "dur_us": values[g_idx, c_idx],
            "start_us": ga[g_idx], "end_us": gb[g_idx],
            "host_start_us": np.where(has, csx[g_idx] - share[g_idx], np.nan),
            "host_end_us": np.where(has, csx[g_idx], np.nan), "tid": np.asarray(tids, dtype=object)[g_idx]}


# ---- across iterations ----------------------------------------------------------------------------


def kept_iterations(e2e_us) -> list[int]:
    """The iterations whose E2E ranks in the middle half (the interquartile set: n // 4 dropped at each end,
    so any four or more iterations are trimmed)."""
    n = len(e2e_us)
    order = sorted(range(n), key=lambda i: (e2e_us[i], i))
    return sorted(order[n // 4:n - n // 4])


def iqm(values) -> float | None:
    """The interquartile mean: the mean of the values ranked between the 25th and 75th percentile. Robust
    like a median, and additive: the interquartile mean of sums is the sum of the same iterations' means.
    scipy's trim_mean(x, 0.25) cuts int(n / 4) = n // 4 values at each end: the iterations kept_iterations keeps."""
    from scipy.stats import trim_mean  # here: most commands never take a mean of iterations

    vals = np.asarray(list(values), dtype=float)
    return float(trim_mean(vals, 0.25)) if len(vals) else None


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
    # the kept steps by hand, not trim_mean: every row is averaged over the same steps, so the rows add up to e2e_us
    keep_idx = kept_iterations(list(ov["span_us"]))
    kept_steps = [ov["step"].iloc[i] for i in keep_idx]
    ko = ov[ov["step"].isin(kept_steps)]
    out = {"e2e_us": float(ko["span_us"].mean()), "rows": {k: float(ko[k].mean()) for k in ROWS},
           "kept": [int(s) if isinstance(s, (int, np.integer)) else s for s in kept_steps], "n": len(ov)}
    per = rows[rows["step"].isin(kept_steps)]
    out["per_rank"] = {int(r): {k: float(g[k].mean()) for k in ROWS + ("span_us",)} for r, g in per.groupby("rank")}
    return out
