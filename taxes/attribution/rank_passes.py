"""The passes of `taxes analyze` over one rank, run where the rank's record lives (taxes.attribution.ranks: worker
processes of this machine, or a Dask cluster's workers): `analyze_rank` reads the trace into the rank's record,
`rank_tables` gives the small tables every rank's must be seen together for (collectives, locality, spans),
`shift_rank` puts the record on the common clock, and once the collectives are matched `attribute_part`
attributes the rank's windows and says where it was late. Each pass returns new values: a record is
never changed in place. taxes.attribution.analyze runs them over every rank.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from taxes.attribution import attribute as att
from taxes.attribution import stragglers as late
from taxes.attribution.locality import rank_pairs
from taxes.traces.checks import repair_events
from taxes.traces.classify import rules
from taxes.traces.collectives import instance_keys
from taxes.traces.kineto import load_trace
from taxes.traces.kineto_timeline import to_timeline
from taxes.traces.steps import assign_steps, host_steps, iteration_windows, repeating_iterations, step_windows
from taxes.traces.stream import one_line
from taxes.traces.timeline import merge, shifted

TOP_FRAMES = 3


def analyze_rank(path: str, patterns: tuple = (), et_path: str | None = None, single: bool = True,
                 special: bool = False) -> dict:
    """Everything one rank's trace alone tells: its timeline with steps, windows and collective keys, its
    intermediates and the evidence they rest on, and its host events as flat segments (for the host
    frames and the straggler's whereabouts, once the gaps and the late instances are known)."""
    ev = load_trace(path, special)
    ev, unlaunched_graphs, repaired = repair_events(ev, path)
    info = ev.attrs["trace"]
    rank = info["rank"]
    if rank is None:
        if not single:
            raise one_line(f"{path}: cannot tell its rank (no distributedInfo.rank, no rankN in the file name)")
        rank = 0
    tl = to_timeline(ev, rank, rules(patterns), unlaunched_graphs)
    if tl.activities.empty:
        raise one_line(f"{path}: no GPU kernels in the trace (record it with ProfilerActivity.CUDA)")
    acts, extra = tl.activities, tl.extra
    launch_us = extra["launch_us"].values.astype(float)
    steps = host_steps(tl.host)
    warnings = [f"rank {rank}: {repaired}"] if repaired else []
    if len(steps):
        step_of = assign_steps(launch_us, steps)
        windows = step_windows(step_of, acts["end_us"].values, steps)
        how = "ProfilerStep#N marks"
    else:
        step_of, period = repeating_iterations(acts["name"].values, launch_us, acts["correlation"].values)
        if period:
            windows = iteration_windows(step_of, launch_us, acts["end_us"].values)
            steps = windows[["step", "host_start_us", "host_end_us"]]
            how = f"no step marks: repeating iterations of {period} launches"
        else:
            step_of = np.zeros(len(acts), dtype=np.int64)
            lo, hi = float(acts["start_us"].min()), float(acts["end_us"].max())
            windows = pd.DataFrame({"step": [0], "host_start_us": [lo], "host_end_us": [hi], "start_us": [lo], "end_us": [hi]})
            how = ("no step marks and no repeating kernel sequence: the window is the whole trace, from the first "
                   "GPU activity's start to the last one's end")
        warnings.append(f"rank {rank}: {how}")
    if info.get("inferred_launches"):
        warnings.append(f"rank {rank}: {info['inferred_launches']} launches placed, not recorded (a timing record "
                        "keeps no host calls: copies, memsets and graph replays carry no launch times); the idle "
                        "before each is measured, its split between launch and host_bound estimated")
    unlaunched = np.isnan(launch_us) & (step_of < 0)
    if unlaunched.any() and len(steps):
        warnings.append(f"rank {rank}: {int(unlaunched.sum())} GPU activities have no launch call in the trace "
                        "(launched before profiling started, or from a thread it missed): charged to no step")
    keys, sources = instance_keys(ev, acts, extra, steps, step_of)
    tl = replace(tl, activities=acts.assign(step=step_of, collective=keys), key_source=sources,
                 windows=windows[["step", "start_us", "end_us"]].assign(e2e_us=np.nan))
    pairs = rank_pairs(ev, tl.host, steps, et_path).assign(rank=rank)
    evidence = "tensor ids" if et_path else ("shapes" if ev["input_dims"].notna().any() else None)
    dev = extra["device"].dropna()
    idx = int(dev.mode().iloc[0]) if not dev.empty else 0
    names = info["devices"]
    device = names[idx] if 0 <= idx < len(names) else (names[0] if len(set(names)) == 1 and names else None)
    return {"rank": rank, "path": str(path), "info": info, "timeline": tl, "pairs": pairs, "segments": late.host_segments(ev),
            "how": how, "device": device, "warnings": warnings, "locality_evidence": evidence}


def rank_tables(res: dict) -> dict:
    """What every rank's record must be seen together for: its facts, its keyed collectives (activity ->
    key, start, end, name, step, source), its activity span, communication by rule, its intermediates."""
    tl = res["timeline"]
    a = tl.activities
    keyed = (a["comm"] != "") & (a["collective"] != "")
    comm = a.loc[keyed, ["name", "start_us", "end_us", "comm", "collective", "step"]].assign(
        source=np.asarray(tl.key_source, dtype=object)[keyed.values])
    c = a[a["comm"] != ""]
    by_rule = c.assign(dur=c["end_us"] - c["start_us"]).groupby("comm")["dur"].agg(["sum", "count"]).reset_index()
    return {**{k: res[k] for k in ("rank", "path", "info", "device", "how", "warnings", "pairs", "locality_evidence")},
            "comm": comm, "span": (float(a["start_us"].min()), float(a["end_us"].max())),
            "unkeyed": int(((a["comm"] != "") & (a["collective"] == "")).sum()),
            "comm_by_rule": pd.DataFrame({"rank": res["rank"], "rule": by_rule["comm"].values,
                                          "activities": by_rule["count"].values.astype(int), "us": by_rule["sum"].values})}


def shift_rank(res: dict, offset_us: float) -> dict:
    """The rank's record on the common clock (its timeline and host segments), shifted once: a new record,
    `res` left as it was."""
    if res.get("offset_us") is not None:
        return res
    segments = {tid: seg if tid == "names" or not offset_us else (seg[0] + offset_us, seg[1])
                for tid, seg in res["segments"].items()}
    return {**res, "offset_us": offset_us, "timeline": shifted(res["timeline"], offset_us), "segments": segments}


def attribute_part(res: dict, waits: pd.Series, locality_bytes: dict, us_per_byte: float | None,
                   late_windows: pd.DataFrame) -> dict:
    """The rank's windows attributed (its collectives' waits given), the host frames of its host-bound gaps,
    and where it spent the intervals it kept the others waiting (taxes.attribution.stragglers.where_late)."""
    tl = res["timeline"]
    rows, gaps, notes = att.attribute_rank(tl, waits, locality_bytes=locality_bytes, us_per_byte=us_per_byte)
    return {"rows": rows, "gaps": gaps, "notes": notes, "frames": host_frames(res["segments"], gaps).assign(rank=res["rank"]),
            "where": late.where_late(tl.activities, tl.extra, res["segments"], late_windows)}


def step_activities(res: dict, step, limit: int = 400) -> list[dict]:
    """The device activities of one step on this rank, from its window's start (the document's phases)."""
    tl = res["timeline"]
    w = tl.windows[tl.windows["step"] == step]
    if w.empty:
        return []
    lo, hi = float(w["start_us"].iloc[0]), float(w["end_us"].iloc[0])
    a = tl.activities
    a = a[(a["step"] == step) & (a["end_us"] > lo) & (a["start_us"] < hi)].head(limit)
    return [{"rank": int(res["rank"]), "name": _short_kernel(x.name), "role": "communication" if x.comm else "compute",
             "start_us": float(max(x.start_us, lo) - lo), "end_us": float(min(x.end_us, hi) - lo), "label": "measured",
             "parts": {}} for x in a.itertuples(index=False)]


def timeline_of(res: dict):
    return res["timeline"]


def host_frames(segments: dict, gaps: pd.DataFrame, top: int = TOP_FRAMES) -> pd.DataFrame:
    """Per step: the host events (cpu ops, annotations, Python frames) whose own time (the innermost event
    at each instant) filled the intervals where the host was elsewhere before a host-bound gap, largest
    first; "(no host event recorded)" for the time no event covers."""
    cols = ["step", "frame", "us"]
    hb = gaps[(gaps["cause"] == "host") & gaps["host_start_us"].notna()] if not gaps.empty else gaps
    if hb.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for (tid, step), g in hb.groupby(["tid", "step"], sort=False):
        ga, gb = merge(g["host_start_us"].values.astype(float), g["host_end_us"].values.astype(float))
        for name, us in late.frames_in(segments.get(tid), segments.get("names"), ga, gb).items():
            rows.append((step, name, us))
    out = pd.DataFrame(rows, columns=cols)
    out = out[out["us"] > 1e-6].groupby(["step", "frame"], as_index=False)["us"].sum()
    return out.sort_values(["step", "us"], ascending=[True, False]).groupby("step").head(top).reset_index(drop=True)


def _short_kernel(name: str) -> str:
    base = name.split("(")[0].split("<")[0]
    return base if len(base) <= 40 else base[:37] + "..."
