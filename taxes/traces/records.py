"""Our own runs' records as timelines: the raw records of every rank (activities, launch calls, host
stamps), the columns they are stored in inside a result document, and their assembly into one Timeline per
rank on one clock.

`assemble` places each activity in the iteration whose host span holds its launch; its window is the
event-timed E2E ending where the iteration's last activity ended. `on_one_clock` moves every rank's records
onto the shared clock (each recorder's origin on CLOCK_MONOTONIC); `raw_to_columns` / `raw_from_columns` are
the stored form (taxes.documents.profile_document keeps them so a document can be re-attributed).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from taxes.traces.timeline import Timeline, shared_clock_offset_ns, timeline


def assemble(rank: int, raw: dict, graph_phases: list | None = None, comm_phases: tuple = ()) -> Timeline:
    """Raw records -> a Timeline of the timed (not warm-up) iterations.

    An activity belongs to the iteration whose host span [step start, step end] holds its launch call (a
    graph's kernels: the replay's launch), and without a launch record, to the iteration its start falls
    in (each iteration starts on a synchronised device). Its phase is the launching call it was issued in,
    or, for a graph replay, the phase of the same kernel name at the same occurrence in graph_phases (the
    eager twin's [(name, phase)] in order). Timed iterations recorded without launch records (the cheap
    clock) take their launches from the warm-up: the k-th activity in issue order (correlation ids grow with
    every call) was launched by the same call as in the last warm-up iteration, that call's host stamps
    place it, and the warm-up's offsets of the launch call inside it place the launch. Communication:
    activities of comm_phases, and peer copies. Windows: [last end - e2e, last end] (e2e from events)."""
    acts = raw["activities"].copy()
    launches = raw["launches"].copy()
    host = raw["host"].copy()
    if acts.empty:
        return timeline(rank, acts, launches, host, [])
    for c, d in (("tid", 0), ("correlation", -1)):
        if c not in launches.columns:
            launches[c] = d
    tid = launches["tid"].mode().iloc[0] if len(launches) else 0
    host["tid"] = tid  # our stamps are taken on the launching thread
    its = list(raw["iterations"])
    spans = host[host["kind"] == "step"].set_index("name")
    hs = np.array([spans.at[f"step {it['step']}", "start_us"] for it in its], dtype=float)
    he = np.array([spans.at[f"step {it['step']}", "end_us"] for it in its], dtype=float)
    steps = np.array([it["step"] for it in its])
    la = launches[launches["kind"].isin(("launch", "graph"))].sort_values("start_us").drop_duplicates("correlation")
    ls = la.set_index("correlation")["start_us"].reindex(acts["correlation"].values).values
    i = np.clip(np.searchsorted(hs, ls, side="right") - 1, 0, len(its) - 1)
    by_launch = ~np.isnan(ls) & (ls >= hs[i]) & (ls <= he[i])
    acts["step"] = np.where(by_launch, steps[i], -2)
    calls = host[host["kind"] == "call"].sort_values("start_us")
    acts["phase"] = _call_names(calls, ls)
    synth = _place_from_warmup(acts, la, calls, its, hs, he, tid)
    if len(synth):
        launches = pd.concat([launches, synth], ignore_index=True)
    if graph_phases:
        _phases_by_occurrence(acts, graph_phases)
    if "comm" not in acts.columns:
        acts["comm"] = ""
    acts["comm"] = np.where(acts["phase"].isin(comm_phases) & (acts["comm"] == ""), "nccl", acts["comm"])
    acts["collective"] = np.where(acts["comm"] != "", acts["phase"] + ":" + acts["step"].astype(str), "")
    acts["floor_us"] = np.nan
    acts["wait_us"] = 0.0
    windows = []
    for k, it in enumerate(its):
        mine = acts["step"] == it["step"]
        if it["warmup"] or not mine.any():
            continue
        end = float(acts.loc[mine, "end_us"].max())
        e2e = it["e2e_us"] if not math.isnan(it["e2e_us"]) else end - hs[k]
        start = end - e2e
        if not math.isnan(it["e2e_us"]):
            # the start event cannot precede the host stamp taken just before it was recorded: where the
            # window ending at the last activity would begin earlier, the end event came late (the host
            # recorded it after the last activity ended) and that lateness is the window's tail
            start = min(max(start, float(hs[k])), float(acts.loc[mine, "start_us"].min()))
        windows.append({"step": it["step"], "start_us": start, "end_us": start + e2e, "e2e_us": e2e})
        comp = acts[mine & (acts["comm"] == "")]
        for ph, wait in it["waits"].items():
            sel = comp[comp["phase"] == ph]
            if not sel.empty:
                acts.loc[(sel["end_us"] - sel["start_us"]).idxmax(), "wait_us"] = wait
    keep = acts["step"].isin([w["step"] for w in windows])
    return timeline(rank, acts[keep], launches, host, windows,
                    {"clock": raw.get("clock"), "iterations": len(windows),
                     "launches": "from the warm-up's sequence and host stamps" if len(synth) else "recorded"})


def _call_names(calls: pd.DataFrame, when) -> np.ndarray:
    """The name of the launching call holding each time in `when` ("" outside every call, or NaN)."""
    when = np.asarray(when, dtype=float)
    if calls.empty:
        return np.full(len(when), "", dtype=object)
    cs, ce = calls["start_us"].values, calls["end_us"].values
    j = np.clip(np.searchsorted(cs, when, side="right") - 1, 0, len(cs) - 1)
    inside = ~np.isnan(when) & (when >= cs[j]) & (when <= ce[j])
    return np.where(inside, calls["name"].values[j], "").astype(object)


def _place_from_warmup(acts: pd.DataFrame, la: pd.DataFrame, calls: pd.DataFrame, its: list, hs: np.ndarray,
                       he: np.ndarray, tid) -> pd.DataFrame:
    """For iterations recorded without launch records (see assemble): assign their activities (step,
    phase) from the last warm-up iteration's launch sequence, and return launch records placed for them.

    The candidates of iteration k start between its host start and the next iteration's; in issue order
    (correlation ids), the first ones whose names run as the template's are the iteration's (what a barrier
    launches afterwards is not). A placed launch starts and returns where it did in the template, relative to
    its call's start, but returns no later than its call did or its activity started."""
    la = la.set_index("correlation")
    template, rows = None, []
    for k, it in enumerate(its):  # the template: the last iteration whose activities were placed by their launch
        mine = acts[acts["step"] == it["step"]].sort_values("correlation")
        if len(mine):
            template = _sequence(mine, la, calls, hs[k], he[k])
    if template is None:
        return pd.DataFrame(rows)
    free = acts["step"] == -2
    starts = acts["start_us"].values
    for k, it in enumerate(its):
        if it["warmup"] or (acts["step"] == it["step"]).any():
            continue  # a warm-up (not in the timeline), or its launches were recorded
        hi = hs[k + 1] if k + 1 < len(its) else np.inf
        cand = acts[free & (starts >= hs[k]) & (starts < hi)].sort_values("correlation")
        mycalls = calls[(calls["start_us"] >= hs[k]) & (calls["end_us"] <= he[k])]
        done = set()
        for (idx, row), pos in zip(cand.iterrows(), _match(list(cand["name"]), template)):
            if pos is None:
                continue
            call_k, kind, off_s, off_e = template[pos][1:]
            if call_k >= len(mycalls):
                continue
            cs, ce = float(mycalls["start_us"].iloc[call_k]), float(mycalls["end_us"].iloc[call_k])
            acts.at[idx, "step"] = it["step"]
            acts.at[idx, "phase"] = mycalls["name"].iloc[call_k]
            corr = row["correlation"]
            if corr in done:
                continue
            end = min(cs + off_e, ce, row["start_us"])
            rows.append({"name": "launch (placed)", "kind": kind, "start_us": min(cs + off_s, end), "end_us": end,
                         "correlation": corr, "tid": tid})
            done.add(corr)
    return pd.DataFrame(rows)


def _sequence(mine: pd.DataFrame, la: pd.DataFrame, calls: pd.DataFrame, h0: float, h1: float) -> list:
    """[(activity name, call index in the iteration, launch kind, launch start - call start, launch end -
    call start)] in issue order."""
    mycalls = calls[(calls["start_us"] >= h0) & (calls["end_us"] <= h1)]
    cs = mycalls["start_us"].values
    out = []
    for name, corr in zip(mine["name"], mine["correlation"]):
        rec = la.loc[corr]
        c = int(np.clip(np.searchsorted(cs, rec["start_us"], side="right") - 1, 0, max(0, len(cs) - 1)))
        base = cs[c] if len(cs) else rec["start_us"]
        out.append((name, c, rec["kind"], float(rec["start_us"] - base), float(rec["end_us"] - base)))
    return out


def _match(names: list, template: list) -> list:
    """Position in the template of each name, in order: the template's sequence when the names begin with
    it (what follows is not the iteration's), else the next unused entry of the same name (None: none)."""
    want = [t[0] for t in template]
    if names[:len(want)] == want:
        return list(range(len(want))) + [None] * (len(names) - len(want))
    out, used = [], set()
    for n in names:
        pos = next((p for p, t in enumerate(template) if t[0] == n and p not in used), None)
        if pos is not None:
            used.add(pos)
        out.append(pos)
    return out


def _phases_by_occurrence(acts: pd.DataFrame, eager: list) -> None:
    """Graph replays: the k-th activity named X in a replay gets the phase of the k-th X in the eager
    sequence (the same kernels in the same order)."""
    by_name: dict = {}
    for name, phase in eager:
        by_name.setdefault(name, []).append(phase)
    for step, grp in acts[acts["graph"] >= 0].groupby("step"):
        seen: dict = {}
        for i in grp.sort_values("start_us").index:
            name = acts.at[i, "name"]
            k = seen.get(name, 0)
            seen[name] = k + 1
            phases = by_name.get(name, [])
            if k < len(phases):
                acts.at[i, "phase"] = phases[k]


# ---- one clock for every rank --------------------------------------------------------------------


def shifted(raw: dict, dt: float, dc: int = 0) -> dict:
    """A raw record with its times moved by dt us (its shared origin moved back by as much, so it still
    says where its time 0 lies) and its correlation ids by dc (ids restart per recorder)."""
    out = dict(raw)
    for key in ("activities", "launches", "host"):
        f = raw[key].copy()
        if not f.empty:
            f["start_us"] = f["start_us"] + dt
            f["end_us"] = f["end_us"] + dt
            for c in ("correlation", "graph"):
                if c in f:
                    f[c] = f[c].where(f[c] < 0, f[c] + dc)
        out[key] = f
    if raw.get("shared_origin_us") is not None:
        out["shared_origin_us"] = raw["shared_origin_us"] - dt
    return out


def on_one_clock(raws: list[dict]) -> tuple[list[dict], bool]:
    """Every rank's raw records with their times on one clock: each recorder counts from its own origin,
    which it placed on the host's shared clock when it started (taxes.traces.timeline.shared_clock_offset_ns); the
    records are moved so every rank counts from the earliest origin. Returns (records, aligned): records
    without a known origin (older documents) are left as they are, and `aligned` is False, when there are
    several ranks: their arrivals cannot be compared, and sync wait is not measured."""
    origins = [r.get("shared_origin_us") for r in raws]
    if any(o is None for o in origins):
        return list(raws), len(raws) <= 1
    first = min(origins)
    return [shifted(r, o - first) if o != first else r for r, o in zip(raws, origins)], True


def assemble_ranks(raws: list[dict], graph_phases: list | None = None, comm_phases: tuple = ()) -> list[Timeline]:
    """Every rank's raw records of one variant -> Timelines in rank order, on one clock (on_one_clock);
    each says in meta["clock_aligned"] whether its times can be compared with the other ranks'."""
    raws, aligned = on_one_clock(raws)
    tls = [assemble(r, raw, graph_phases=graph_phases, comm_phases=comm_phases) for r, raw in enumerate(raws)]
    return [replace(tl, meta={**tl.meta, "clock_aligned": aligned}) for tl in tls]


def phase_order(tl: Timeline) -> list:
    """[(activity name, phase)] of the first window, in start order: a graph twin's kernels are named so."""
    if tl.windows.empty:
        return []
    first = tl.windows["step"].iloc[0]
    a = tl.activities[tl.activities["step"] == first].sort_values("start_us")
    return list(zip(a["name"], a["phase"]))



# ---- stored form of the raw records ----------------------------------------------------------------

_RAW_COLUMNS = {"activities": ("name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm"),
                "launches": ("name", "kind", "start_us", "end_us", "correlation", "tid"),
                "host": ("name", "kind", "start_us", "end_us")}


def raw_to_columns(raw: dict) -> dict:
    """One rank's raw records as JSON columns (times in us from the first host stamp, to the nanosecond):
    what a document keeps so that assemble and the attribution can be redone later."""
    frames = {k: raw[k] for k in _RAW_COLUMNS}
    starts = [float(f["start_us"].min()) for f in frames.values() if len(f)]
    base = min(starts) if starts else 0.0
    origin = raw.get("shared_origin_us")
    out = {"base_us": base, "clock": raw.get("clock"),
           "shared_origin_us": None if origin is None else round(float(origin) + base, 3), "iterations": [
        {"step": int(it["step"]), "e2e_us": None if it["e2e_us"] != it["e2e_us"] else float(it["e2e_us"]),
         "waits": {k: float(v) for k, v in it["waits"].items()}, "warmup": bool(it["warmup"]),
         **({"waits_held": {k: float(v) for k, v in it["waits_held"].items()}} if "waits_held" in it else {}),
         **({"ctas": {k: [[int(x) for x in row] for row in v] for k, v in it["ctas"].items()}} if "ctas" in it else {})}
        for it in raw["iterations"]]}
    for key, cols in _RAW_COLUMNS.items():
        f = frames[key]
        col = {}
        for c in cols:
            if c not in f:
                continue
            v = f[c]
            if c.endswith("_us"):
                col[c] = [round(float(x) - base, 3) for x in v]
            elif c in ("stream", "correlation", "graph", "tid"):
                col[c] = [int(x) for x in v]
            else:
                col[c] = [str(x) for x in v]
        out[key] = col
    return out


def raw_from_columns(d: dict) -> dict:
    """The inverse of raw_to_columns (times stay relative to the first host stamp)."""
    out = {"clock": d.get("clock"), "shared_origin_us": d.get("shared_origin_us"), "iterations": [
        {"step": it["step"], "e2e_us": math.nan if it.get("e2e_us") is None else it["e2e_us"],
         "waits": dict(it.get("waits") or {}), "warmup": bool(it.get("warmup")),
         **({"waits_held": dict(it["waits_held"])} if "waits_held" in it else {}),
         **({"ctas": dict(it["ctas"])} if "ctas" in it else {})} for it in d.get("iterations", [])]}
    for key in _RAW_COLUMNS:
        out[key] = pd.DataFrame(d.get(key) or {})
    return out
