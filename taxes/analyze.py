"""`taxes analyze`: the taxes of any PyTorch program, per rank and per step, read off torch.profiler traces.

Each rank's Kineto trace becomes one taxes.timeline.Timeline (taxes.kineto, ranks parsed in parallel
processes); its steps and windows come from taxes.steps, its collective instance keys from
taxes.collectives, its intermediates from taxes.locality; then the one attribution (taxes.attribute)
splits every (rank, step) window into rows that add up to it. What only traces need is added here: the
trace's own facts (GPU -> hardware profile, versions, world size), warm-up and outlier steps, the host
frames where the host was elsewhere, collective instances and stragglers, what-if projections
(taxes.whatif), plain step times and the measurement cost. docs/analyze.md states every rule.
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from taxes import attribute as att
from taxes.classify import rules
from taxes.collectives import check_one_job, instance_keys, instances, stragglers
from taxes.errors import TaxesError
from taxes.kineto import load_trace, to_timeline
from taxes.trace_checks import check_events
from taxes.locality import rank_pairs
from taxes.steps import assign_steps, flag_steps, host_steps, iteration_windows, repeating_iterations, step_windows
from taxes.timeline import covered, merge
from taxes.tracestream import one_line
from taxes.whatif import project

TRACE_WORKLOAD = "trace"  # the workload name of an analysed trace in the result document
STATISTIC = "interquartile mean"
RULES = "one-timeline rules 2 (taxes.attribute), trace rules 2 (taxes.analyze)"
PERTURBED = 0.03
TOP_FRAMES = 3


@dataclass(frozen=True)
class Analysis:
    """What `analyze` found; every frame has a rank column, times in us on the common clock."""

    ranks: dict  # rank -> trace path
    world_size: int
    hardware: str | None  # the profile that priced locality and graph gaps (None: unknown GPU, none given)
    hardware_source: str  # how it was chosen
    info: dict  # rank -> the trace's own metadata
    devices: dict  # rank -> GPU name
    timelines: dict  # rank -> Timeline
    decomposition: pd.DataFrame  # per (rank, step): span_us, comm_us, the attribution rows, flags, host frames
    gaps: pd.DataFrame  # every idle gap piece (taxes.attribute.GAP_COLUMNS)
    collectives: pd.DataFrame  # per (instance, rank): key, arrival, wait, matched, name, step, source
    instances: pd.DataFrame  # per instance: skew, slowest rank, matched
    stragglers: pd.DataFrame  # per rank
    locality: pd.DataFrame  # producer -> consumer pairs
    host_frames: pd.DataFrame  # per (rank, step): the top host frames where the host was elsewhere
    flags: dict  # step -> "warm-up" | "outlier"
    kept_steps: list  # steps every rank has, not flagged
    summary: dict  # taxes.attribute.summarize over the kept steps
    what_if: pd.DataFrame  # rank, step, change, projected_us, removed_us (predicted)
    windows_how: dict  # rank -> how its windows were found
    plain: dict = field(default_factory=dict)  # plain_e2e_us, attributed_e2e_us, measurement_cost_us
    warnings: tuple = ()


# ---- one rank (runs in a worker process) --------------------------------------------------------------


def analyze_rank(path: str, patterns: tuple = (), et_path: str | None = None, single: bool = True) -> dict:
    """Everything one rank's trace alone tells: its timeline with steps, windows and collective keys, its
    intermediates, and the host frames of its host-bound gaps."""
    ev = load_trace(path)
    check_events(ev, path)  # refuse what would attribute to nothing or count an event twice
    info = ev.attrs["trace"]
    rank = info["rank"]
    if rank is None:
        if not single:
            raise one_line(f"{path}: cannot tell its rank (no distributedInfo.rank, no rankN in the file name)")
        rank = 0
    tl = to_timeline(ev, rank, rules(patterns))
    if tl.activities.empty:
        raise one_line(f"{path}: no GPU kernels in the trace (record it with ProfilerActivity.CUDA)")
    acts, extra = tl.activities, tl.extra
    launch_us = extra["launch_us"].values.astype(float)
    steps = host_steps(tl.host)
    warnings = []
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
    acts["step"] = step_of
    tl.windows = windows[["step", "start_us", "end_us"]].assign(e2e_us=np.nan)
    keys, sources = instance_keys(ev, acts, extra, steps, step_of)
    acts["collective"] = keys
    tl.key_source = sources
    pairs = rank_pairs(ev, tl.host, steps, et_path).assign(rank=rank)
    local = att.attribute([tl])  # the idle gaps are rank-local: the host frames need them here, beside the events
    frames = host_frames(ev, local.gaps).assign(rank=rank)
    dev = extra["device"].dropna()
    idx = int(dev.mode().iloc[0]) if not dev.empty else 0
    names = info["devices"]
    device = names[idx] if 0 <= idx < len(names) else (names[0] if len(set(names)) == 1 and names else None)
    return {"rank": rank, "path": str(path), "info": info, "timeline": tl, "pairs": pairs, "frames": frames,
            "how": how, "device": device, "warnings": warnings}


def host_frames(events: pd.DataFrame, gaps: pd.DataFrame, top: int = TOP_FRAMES) -> pd.DataFrame:
    """Per step: the host events (cpu ops, annotations, Python frames) whose own time (less their nested
    events') filled the intervals where the host was elsewhere before a host-bound gap, largest first."""
    cols = ["step", "frame", "us"]
    if gaps.empty:
        return pd.DataFrame(columns=cols)
    hb = gaps[(gaps["cause"] == "host") & gaps["host_start_us"].notna()]
    if hb.empty:
        return pd.DataFrame(columns=cols)
    kinds = events["kind"].values
    host_ev = events[np.isin(kinds, ("cpu_op", "annotation", "python"))]
    host_ev = host_ev[~host_ev["name"].str.startswith("ProfilerStep#").values]
    rows = []
    for tid, g in hb.groupby("tid"):
        g = g.sort_values("host_start_us")
        m = merge(g["host_start_us"].values, g["host_end_us"].values)
        mine = host_ev[host_ev["tid"].values == tid]
        cov = covered(m, mine["ts"].values, mine["end"].values)
        keep = cov > 0
        mine, cov = mine[keep], cov[keep]
        order = np.lexsort((-mine["end"].values, mine["ts"].values))
        ts, te, nm = mine["ts"].values[order], mine["end"].values[order], mine["name"].values[order]
        cv = cov[order]
        own = cv.copy()  # an event's own share: its overlap less that of the events directly inside it
        stack: list = []
        top_level = np.zeros(len(ts), dtype=bool)
        for i in range(len(ts)):
            while stack and te[stack[-1]] <= ts[i]:
                stack.pop()
            if stack:
                own[stack[-1]] -= cv[i]
            else:
                top_level[i] = True
            stack.append(i)
        # the step of each event: that of the first host-bound interval it overlaps
        ends = g["host_end_us"].values
        k = np.minimum(np.searchsorted(ends, ts, side="right"), len(g) - 1)
        step = g["step"].values[k]
        total = pd.Series(m[1] - m[0]).groupby(g["step"].values[np.minimum(np.searchsorted(ends, m[0], side="right"),
                                                                            len(g) - 1)]).sum()
        covered_by_events = pd.Series(cv[top_level]).groupby(step[top_level]).sum() if len(ts) else pd.Series(dtype=float)
        for s, tot in total.items():
            rest = float(tot - covered_by_events.get(s, 0.0))
            if rest > 1e-6:
                rows.append((s, "(no host event recorded)", rest))
        if len(ts):
            per = pd.DataFrame({"step": step, "frame": nm, "us": own})
            per = per[per["us"] > 1e-9].groupby(["step", "frame"], as_index=False)["us"].sum()
            rows += list(per.itertuples(index=False, name=None))
    out = pd.DataFrame(rows, columns=cols)
    if out.empty:
        return out
    out = out.groupby(["step", "frame"], as_index=False)["us"].sum()
    return out.sort_values(["step", "us"], ascending=[True, False]).groupby("step").head(top).reset_index(drop=True)


# ---- all ranks ----------------------------------------------------------------------------------------


def _run_ranks(paths: list[str], patterns: tuple, ets: dict, jobs: int | None) -> list[dict]:
    single = len(paths) == 1
    args = [(p, tuple(patterns), ets.get(str(p)), single) for p in paths]
    jobs = _jobs(jobs, len(paths))
    if jobs <= 1:
        return [analyze_rank(*a) for a in args]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_star, args))


def _jobs(jobs: int | None, n: int) -> int:
    """Worker processes: as asked, else one per core; never more than there are ranks."""
    return max(1, min(jobs or os.cpu_count() or 1, n))


def _star(a):
    return analyze_rank(*a)


def _execution_traces(paths: list[str], given) -> dict:
    """{trace path: execution trace path}: given as {trace path: et}, or found beside the trace as
    NAME.et.json[.gz] for NAME.json[.gz]."""
    out = {}
    for p in paths:
        stem = str(p)
        for suffix in (".json.gz", ".json"):
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        for cand in (stem + ".et.json", stem + ".et.json.gz"):
            if os.path.exists(cand):
                out[str(p)] = cand
    for k, v in (given or {}).items():
        if k not in paths:
            raise one_line(f"execution trace {v}: no trace {k} to go with it")
        out[k] = str(v)
    return out


def analyze(paths, hardware: str | None = None, plain_steps: dict | None = None, comm_patterns=(),
            execution_traces: dict | None = None, jobs: int | None = None) -> Analysis:
    """Load one trace per rank and attribute every step of every rank (module docstring).

    hardware: a profile name or path (None: from the traces' GPU name); plain_steps: {rank: [us per step]}
    measured without the profiler; comm_patterns: extra regular expressions for communication kernels;
    execution_traces: {trace path: execution trace path} (also found as NAME.et.json beside
    NAME.json); jobs: worker processes (default: one per core, at most one per trace)."""
    from taxes.hardware import get_profile, profile_for_gpu

    paths = [str(p) for p in paths]
    if not paths:
        raise TaxesError("no trace files given")
    if len(set(paths)) < len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise one_line(f"{dup}: given twice")
    ets = _execution_traces(paths, {str(k): v for k, v in (execution_traces or {}).items()})
    if hardware is not None:
        hw = get_profile(hardware)  # a bad name fails before any parsing
    results = _run_ranks(paths, tuple(comm_patterns), ets, jobs)
    by_rank: dict = {}
    for res in results:
        r = res["rank"]
        if r in by_rank:
            raise one_line(f"{res['path']}: rank {r} again (also {by_rank[r]['path']})")
        by_rank[r] = res
    by_rank = dict(sorted(by_rank.items()))
    warnings = [w for res in by_rank.values() for w in res["warnings"]]
    infos = {r: res["info"] for r, res in by_rank.items()}
    devices = {r: res["device"] for r, res in by_rank.items()}
    # the traces' own facts
    if hardware is not None:
        source = "given (--hardware)"
    else:
        names = {d for d in devices.values() if d}
        name = next(iter(names), None)
        chosen = profile_for_gpu(name) if name else None
        if chosen:
            hw = get_profile(chosen)
            source = f"from the traces' GPU name ({name}): built-in {hw.source} profile"
        else:
            hw = None
            source = f"unknown GPU ({name or 'none recorded'})"
            warnings.append(f"unknown GPU {name or '(none recorded)'!r}: locality is not priced and the graphs "
                            "what-if uses the trace's own graph gaps; pass --hardware NAME (taxes hardware list)")
    offsets = _clock_offsets(infos)
    spans = {}
    for r, res in by_rank.items():
        a = res["timeline"].activities
        spans[r] = None if offsets[r] is None else (float(a["start_us"].min()) + offsets[r], float(a["end_us"].max()) + offsets[r])
    warnings += check_one_job(infos, devices, spans)
    timelines = {}
    for r, res in by_rank.items():
        tl = res["timeline"]
        _shift(tl, offsets[r] or 0.0)
        timelines[r] = tl
    world = max([i.get("world_size") or 0 for i in infos.values()] + [max(by_rank) + 1])
    missing = [r for r in range(world) if r not in by_rank]
    if missing:
        have = ", ".join(map(str, by_rank))
        warnings.append(f"traces of rank(s) {', '.join(map(str, missing[:20]))}{'...' if len(missing) > 20 else ''} "
                        f"of world {world} are missing: " + (f"sync wait and skew compare only ranks {have}"
                                                             if len(by_rank) > 1 else
                                                             f"sync wait needs two ranks and reads 0 (only rank {have} given)"))
    pairs = pd.concat([res["pairs"] for res in by_rank.values()], ignore_index=True)
    loc_bytes = {(int(r), int(s)): float(b) for (r, s), b in pairs.groupby(["rank", "step"])["moved_bytes"].sum().items()} \
        if not pairs.empty else {}
    if not pairs.empty and pairs["source"].str.contains("heuristic").any():
        warnings.append("locality from recorded shapes (heuristic): record an execution trace for tensor identity")
    us_per_byte = 1.0 / hw.hbm_bytes_per_us() if hw is not None else None
    a = att.attribute(list(timelines.values()), locality_bytes=loc_bytes, us_per_byte=us_per_byte,
                      jobs=_jobs(jobs, len(timelines)))
    rows = a.rows
    common = sorted(set.intersection(*[set(rows.loc[rows["rank"] == r, "step"]) for r in timelines])) if len(rows) else []
    e2e = rows[rows["step"].isin(common)].groupby("step")["span_us"].max()
    flags = flag_steps(e2e)
    for s, f in sorted(flags.items()):
        warnings.append(f"step {s} is a {f} step ({e2e[s]:,.1f} us, over 3x the median): left out of the statistics")
    kept = [s for s in common if s not in flags]
    frames = pd.concat([res["frames"] for res in by_rank.values()], ignore_index=True)
    rows = _with_extras(rows, flags, frames)
    summary = att.summarize(rows, kept) if kept else {"e2e_us": None, "rows": {}, "per_rank": {}, "kept": [], "n": 0}
    coll, inst = instances(a.collectives, timelines)
    if not inst.empty and (~inst["matched"]).any():
        n = int((~inst["matched"]).sum())
        warnings.append(f"{n} collective instance(s) could not be matched across ranks (missing on a rank, or not "
                        "overlapping in time): listed, and given no sync wait")
    unkeyed = sum(int(((tl.activities["comm"] != "") & (tl.activities["collective"] == "")).sum()) for tl in timelines.values())
    if unkeyed:
        warnings.append(f"{unkeyed} communication activities carry no collective identity (no process group and "
                        "sequence number, no launching collective op): their time is exposed transfer, never sync wait")
    graph_gap = _graph_gap_us(hw, a.gaps)
    plain = _plain(plain_steps, summary)
    return Analysis(
        ranks={r: res["path"] for r, res in by_rank.items()}, world_size=world, hardware=hw.name if hw else None,
        hardware_source=source, info=infos, devices=devices, timelines=timelines, decomposition=rows, gaps=a.gaps,
        collectives=coll, instances=inst, stragglers=stragglers(coll, inst), locality=pairs, host_frames=frames,
        flags=flags, kept_steps=kept, summary=summary, what_if=project(rows, a.gaps, graph_gap),
        windows_how={r: res["how"] for r, res in by_rank.items()}, plain=plain, warnings=tuple(warnings))


def _clock_offsets(infos: dict) -> dict:
    """us to add to each rank's timestamps to put every rank on one clock (exact integer arithmetic on
    baseTimeNanoseconds and the origin of absolute timestamps); None for a trace with neither."""
    absolute = {r: i["base_ns"] + i["origin_us"] * 1000 for r, i in infos.items()}
    known = {r: ns for r, ns in absolute.items() if ns}
    first = min(known.values()) if known else 0
    return {r: ((ns - first) / 1000.0 if ns else (0.0 if not known else None)) for r, ns in absolute.items()}


def _shift(tl, dt: float) -> None:
    if not dt:
        return
    for f, cols in ((tl.activities, ("start_us", "end_us")), (tl.launches, ("start_us", "end_us")),
                    (tl.host, ("start_us", "end_us")), (tl.windows, ("start_us", "end_us"))):
        for c in cols:
            f[c] = f[c] + dt
    tl.extra["launch_us"] = tl.extra["launch_us"] + dt


def _graph_gap_us(hw, gaps: pd.DataFrame) -> float:
    """The gap a CUDA graph leaves between its kernels: the hardware profile's, else the median of the
    trace's own graph gaps, else 0."""
    if hw is not None:
        return float(hw.launch_graph_us)
    g = gaps[gaps["cause"] == "graph"]["dur_us"] if not gaps.empty else pd.Series(dtype=float)
    return float(g.median()) if len(g) else 0.0


def _plain(plain_steps: dict | None, summary: dict) -> dict:
    """plain_e2e_us (the interquartile mean of the plain steps' E2E, the slowest rank per step),
    attributed_e2e_us (what the rows add up to) and measurement_cost_us (their difference)."""
    attributed = summary.get("e2e_us")
    if not plain_steps:
        return {"plain_e2e_us": None, "attributed_e2e_us": attributed, "measurement_cost_us": None}
    series = [list(v) for _, v in sorted(plain_steps.items())]
    for s in series:
        if not s or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0
                            for x in s):
            raise TaxesError("plain step times must be positive finite numbers (us), at least one per rank")
    per_iter = [max(v) for v in zip(*series)]
    plain = att.iqm(per_iter)
    cost = attributed - plain if attributed is not None else None
    return {"plain_e2e_us": plain, "attributed_e2e_us": attributed, "measurement_cost_us": cost,
            "plain_iterations": len(per_iter)}


def read_plain(path) -> dict:
    """A --plain file: {"<rank>": [us per step, ...]}; one-line errors."""
    try:
        text = Path(path).read_bytes()[: 64 << 20].decode("utf-8")
        data = json.loads(text)
    except OSError as e:
        raise one_line(f"{path}: cannot read the plain step times ({e.strerror or e})") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise one_line(f"{path}: not JSON of plain step times ({{\"<rank>\": [us, ...]}})") from None
    if not isinstance(data, dict) or not data:
        raise one_line(f"{path}: plain step times must be an object {{\"<rank>\": [us, ...]}}")
    out = {}
    for k, v in data.items():
        if not str(k).isdigit() or not isinstance(v, list):
            raise one_line(f"{path}: plain step times must map rank numbers to lists of us (found {str(k)[:20]!r})")
        out[int(k)] = v
    return out


def _with_extras(rows: pd.DataFrame, flags: dict, frames: pd.DataFrame) -> pd.DataFrame:
    rows = rows.copy()
    rows["flag"] = rows["step"].map(lambda s: flags.get(s, ""))
    if not frames.empty:
        text = frames.groupby(["rank", "step"]).apply(
            lambda g: "; ".join(f"{f} ({u:,.1f} us)" for f, u in zip(g["frame"], g["us"])), include_groups=False)
        rows["host_frames"] = [text.get((r, s), "") for r, s in zip(rows["rank"], rows["step"])]
    else:
        rows["host_frames"] = ""
    return rows


def timeline_figures(acts: pd.DataFrame, lo: float | None = None, hi: float | None = None) -> dict[str, float]:
    """Busy, idle, communication and overlap of a set of GPU activities inside [lo, hi] (default: from the
    first activity's start to the last one's end, HTA's span). All streams together."""
    from taxes.timeline import measure

    lo = acts["start_us"].min() if lo is None else lo
    hi = acts["end_us"].max() if hi is None else hi
    comm = (acts["comm"] != "").values
    s, e = acts["start_us"].values, acts["end_us"].values
    all_m, comp_m, comm_m = merge(s, e), merge(s[~comm], e[~comm]), merge(s[comm], e[comm])
    busy, comp, comm_us = measure(all_m, lo, hi), measure(comp_m, lo, hi), measure(comm_m, lo, hi)
    exposed = busy - comp
    return {"span_us": float(hi - lo), "busy_us": busy, "idle_us": float(hi - lo) - busy, "compute_us": comp,
            "comm_us": comm_us, "exposed_comm_us": exposed, "overlap_us": comm_us - exposed}


# ---- the result document ----------------------------------------------------------------------------


def analysis_document(an: Analysis) -> dict:
    """A taxes.result document: one case (workload 'trace') with one variant. samples_us: each rank's span
    per kept step; components: the attribution rows (taxes.attribute.ROWS) per rank and overall (rank null:
    per step the slowest rank's rows), interquartile means over the kept steps, adding up to
    attributed_e2e_us; plain_e2e_us and measurement_cost_us when plain step times were given. The full
    frames go under the top-level key trace_analysis (docs/analyze.md: the JSON contract)."""
    from taxes import results

    ranks = sorted(an.ranks)
    d = an.decomposition.set_index(["rank", "step"])
    samples = [[float(d.loc[(r, s), "span_us"]) for s in an.kept_steps] for r in ranks]
    s = an.summary
    comps = []
    for r, vals in sorted(s.get("per_rank", {}).items()):
        comps += [{"name": k, "rank": int(r), "value_us": float(vals[k]), "label": att.LABELS[k]} for k in att.ROWS]
    comps += [{"name": k, "rank": None, "value_us": float(s["rows"][k]), "label": att.LABELS[k]} for k in att.ROWS
              if k in s.get("rows", {})]
    info0 = an.info[ranks[0]]
    meta = results.collect_metadata("profile", an.world_size, an.hardware or "none", source="trace",
                                    hardware_source=an.hardware_source, statistic=STATISTIC,
                                    traces={str(r): an.ranks[r] for r in ranks}, warnings=list(an.warnings))
    meta.update({"torch_version": info0.get("torch_version"), "triton_version": info0.get("triton_version"),
                 "cuda_version": info0.get("cuda_version") or info0.get("hip_version"),
                 "nccl_version": info0.get("nccl_version"), "gpu_names": [an.devices[r] or "unknown" for r in ranks],
                 "windows": {str(r): an.windows_how[r] for r in ranks},
                 "trace_record": info0.get("record")})
    plain = an.plain
    cost, p = plain.get("measurement_cost_us"), plain.get("plain_e2e_us")
    variant = {
        "variant": "trace", "config": {"kept_steps": [int(x) for x in an.kept_steps],
                                       "flagged_steps": {str(k): v for k, v in an.flags.items()}},
        "correctness": {"checked": False, "passed": None, "rel_error": None, "tolerance": None, "reference": None},
        "samples_us": samples, "e2e_us": results.summarize_samples(samples, "measured"),
        "plain_e2e_us": p, "attributed_e2e_us": plain.get("attributed_e2e_us"), "measurement_cost_us": cost,
        "perturbed": bool(cost is not None and p and cost > PERTURBED * p),
        "phases": _phases(an), "components": comps,
        "attribution": {"available": True, "clock": "torch.profiler", "rules": RULES, "statistic": STATISTIC,
                        "kept_iterations": len(s.get("kept", [])), "iterations": s.get("n", 0),
                        "unattributed_share": (s["rows"]["unattributed"] / s["e2e_us"]) if s.get("e2e_us") else None,
                        "unmatched_collectives": int((~an.instances["matched"]).sum()) if len(an.instances) else 0},
    }
    case = {"workload": TRACE_WORKLOAD, "shape": {"steps": max(1, len(an.kept_steps))}, "world": an.world_size,
            "dtype": "n/a", "variants": [variant]}
    doc = results.new_document(meta)
    doc["cases"].append(case)
    doc["trace_analysis"] = _frames_for_json(an)
    return doc


def _phases(an: Analysis, limit: int = 400) -> list[dict]:
    """The device activities of the kept step closest to the statistic, per rank, from its window's start."""
    if not an.kept_steps or an.summary.get("e2e_us") is None:
        return []
    ov = an.decomposition[an.decomposition["step"].isin(an.kept_steps)].groupby("step")["span_us"].max()
    step = int((ov - an.summary["e2e_us"]).abs().idxmin())
    out = []
    for r, tl in sorted(an.timelines.items()):
        w = tl.windows[tl.windows["step"] == step]
        if w.empty:
            continue
        lo, hi = float(w["start_us"].iloc[0]), float(w["end_us"].iloc[0])
        a = tl.activities
        a = a[(a["step"] == step) & (a["end_us"] > lo) & (a["start_us"] < hi)].head(limit)
        for x in a.itertuples(index=False):
            out.append({"rank": int(r), "name": _short_kernel(x.name), "role": "communication" if x.comm else "compute",
                        "start_us": float(max(x.start_us, lo) - lo), "end_us": float(min(x.end_us, hi) - lo),
                        "label": "measured", "parts": {}})
    return out


def _short_kernel(name: str) -> str:
    base = name.split("(")[0].split("<")[0]
    return base if len(base) <= 40 else base[:37] + "..."


def _records(frame: pd.DataFrame) -> list[dict]:
    return json.loads(frame.to_json(orient="records", double_precision=15)) if len(frame) else []


def _frames_for_json(an: Analysis) -> dict:
    keep = ["rank", "step", "start_us", "end_us", "span_us", "comm_us", "busy_us", "exposed_comm_us", *att.ROWS,
            "locality_bytes", "launch_latency_us", "flag", "host_frames"]
    d = an.decomposition[[c for c in keep if c in an.decomposition.columns]]
    gaps = an.gaps.groupby(["rank", "step", "cause"])["dur_us"].agg(["sum", "count"]).reset_index() if len(an.gaps) \
        else pd.DataFrame(columns=["rank", "step", "cause", "sum", "count"])
    comm_by_rule = []
    for r, tl in sorted(an.timelines.items()):
        a = tl.activities[tl.activities["comm"] != ""]
        if len(a):
            g = a.assign(dur=a["end_us"] - a["start_us"]).groupby("comm")["dur"].agg(["sum", "count"]).reset_index()
            comm_by_rule += [{"rank": int(r), "rule": x.comm, "kernels": int(x.count), "us": float(x.sum)}
                             for x in g.itertuples(index=False)]
    return {"decomposition": _records(d), "gaps_by_cause": _records(gaps), "what_if": [
        {"rank": int(x.rank), "step": int(x.step), "change": x.change, "projected_us": float(x.projected_us),
         "removed_us": float(x.removed_us), "label": "predicted"} for x in an.what_if.itertuples(index=False)],
        "collectives": _records(an.collectives.drop(columns=["activity"], errors="ignore")),
        "instances": _records(an.instances), "stragglers": _records(an.stragglers),
        "communication_by_rule": comm_by_rule, "locality": _records(an.locality),
        "host_frames": _records(an.host_frames), "flagged_steps": {str(k): v for k, v in an.flags.items()},
        "kept_steps": [int(x) for x in an.kept_steps], "windows": {str(r): h for r, h in an.windows_how.items()},
        "hardware_source": an.hardware_source, "warnings": list(an.warnings)}
