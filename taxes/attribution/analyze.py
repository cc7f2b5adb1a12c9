"""`taxes analyze`: the taxes of any PyTorch program, per rank and per step, read off torch.profiler traces.

Each rank's Kineto trace becomes one taxes.traces.timeline.Timeline (taxes.traces.kineto, its recorder's quirks repaired
by taxes.traces.checks); its steps and windows come from taxes.traces.steps, its collective instance keys from
taxes.traces.collectives, its intermediates from taxes.attribution.locality; then the one attribution (taxes.attribution.attribute)
splits every (rank, step) window into rows that add up to it. What only traces need is added here: the
trace's own facts (GPU -> hardware profile, versions, world size), warm-up and outlier steps, the host
frames where the host was elsewhere, collective instances and stragglers (taxes.attribution.stragglers), what-if
projections (taxes.attribution.whatif), plain step times and the measurement cost, and the rows a trace cannot
support, said to be not measured. docs/analyze.md states every rule.

Per rank, the passes of taxes.attribution.rank_passes run where the rank's record lives (taxes.attribution.ranks:
worker processes of this machine, or a Dask cluster's workers); only their small tables come back here,
where the ranks are seen together. The result document is made from the Analysis by
taxes.documents.analysis_document.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd

from taxes.attribution import attribute as att
from taxes.attribution import stragglers as late
from taxes.attribution.rank_passes import analyze_rank, attribute_part, rank_tables, shift_rank, step_activities, timeline_of
from taxes.attribution.ranks import runner
from taxes.attribution.whatif import project
from taxes.errors import TaxesError
from taxes.traces.classify import rules
from taxes.traces.collectives import check_one_job, instances
from taxes.traces.kineto import name_rank
from taxes.traces.steps import flag_steps
from taxes.traces.stream import check_regular, one_line, read_side_file
from taxes.traces.timeline import merge
from taxes.method import PERTURBED, STATISTIC  # noqa: F401  (the analysis document reads them from here)

RULES = "one-timeline rules 4 (taxes.attribution.attribute), trace rules 2 (taxes.attribution.analyze)"
MAX_SIDE_FILE_BYTES = 64 << 20  # --plain files
# Rows a trace cannot give without more evidence: what to record (or give) to get them.
NO_FLOOR = ("no floor is known for an arbitrary program's kernels (taxes profile measures it for its own "
            "workloads)")
NOT_MEASURED_WHY = {
    "ideal": NO_FLOOR,
    "inefficiency": NO_FLOOR,
}
LOCALITY_EVIDENCE = ("record an execution trace (torch.profiler.ExecutionTraceObserver, saved as NAME.et.json beside "
                     "NAME.json, or --et) or record shapes (record_shapes=True)")
SYNC_EVIDENCE = ("record the collectives' identity (the full record keeps the launching collective op; NCCL "
                 "kernels are also matched by their order) or name only NCCL's kernels as communication")
LOCALITY_PRICE = "pass --hardware NAME (taxes hardware list): the GPU has no built-in profile to price bytes with"


@dataclass(frozen=True)
class Analysis:
    """What `analyze` found; every frame has a rank column, times in us on the common clock."""

    ranks: dict  # rank -> trace path
    world_size: int
    hardware: str | None  # the profile that priced locality and graph gaps (None: unknown GPU, none given)
    hardware_source: str  # how it was chosen
    info: dict  # rank -> the trace's own metadata
    devices: dict  # rank -> GPU name
    timelines: dict  # rank -> Timeline (empty when the ranks were analysed on a cluster, unless asked for)
    decomposition: pd.DataFrame  # per (rank, step): span_us, comm_us, the attribution rows, flags, host frames
    gaps: pd.DataFrame  # every idle gap piece (taxes.attribution.attribute.GAP_COLUMNS)
    collectives: pd.DataFrame  # per (instance, rank): key, arrival, wait, matched, name, step, source
    instances: pd.DataFrame  # per instance: skew, slowest rank, matched
    stragglers: pd.DataFrame  # per rank (taxes.attribution.stragglers.COLUMNS)
    locality: pd.DataFrame  # producer -> consumer pairs
    host_frames: pd.DataFrame  # per (rank, step): the top host frames where the host was elsewhere
    flags: dict  # step -> "warm-up" | "outlier"
    kept_steps: list  # steps every rank has, not flagged
    summary: dict  # taxes.attribution.attribute.summarize over the kept steps
    what_if: pd.DataFrame  # rank, step, change, projected_us, removed_us (predicted)
    windows_how: dict  # rank -> how its windows were found
    plain: dict = field(default_factory=dict)  # plain_e2e_us, attributed_e2e_us, measurement_cost_us
    warnings: tuple = ()
    not_measured: dict = field(default_factory=dict)  # row -> why, and what to record to get it
    comm_by_rule: pd.DataFrame = field(default_factory=pd.DataFrame)  # rank, rule, activities, us
    phases: list = field(default_factory=list)  # the device activities of the step closest to the statistic


def _execution_traces(paths: list[str], given) -> dict:
    """{trace path: execution trace path}: given as {trace path: et} (each must be a readable file), or
    found beside the trace as NAME.et.json[.gz] for NAME.json[.gz]."""
    out = {}
    for p in paths:
        stem = str(p)
        for suffix in (".json.gz", ".json"):
            if stem.endswith(suffix):
                stem = stem[: -len(suffix)]
                break
        for cand in (stem + ".et.json", stem + ".et.json.gz"):
            if os.path.isfile(cand):
                out[str(p)] = cand
    for k, v in (given or {}).items():
        if k not in paths:
            raise one_line(f"execution trace {v}: no trace {k} to go with it")
        check_regular(v, "execution trace")
        out[k] = str(v)
    return out


def analyze(paths, hardware: str | None = None, plain_steps: dict | None = None, comm_patterns=(),
            execution_traces: dict | None = None, jobs: int | None = None, scheduler: str | None = None,
            special_files: bool = False, keep_timelines: bool | None = None) -> Analysis:
    """Load one trace per rank and attribute every step of every rank (module docstring).

    hardware: a profile name or path (None: from the traces' GPU name); plain_steps: {rank: [us per step]}
    measured without the profiler; comm_patterns: extra regular expressions for communication kernels;
    execution_traces: {trace path: execution trace path} (also found as NAME.et.json beside
    NAME.json); jobs: worker processes (default: one per core, at most one per trace); scheduler: a Dask
    scheduler's address: the ranks are read and attributed on its workers instead; special_files: read
    FIFOs and devices as traces; keep_timelines: bring every rank's timeline back (default: with the local
    pool, where they are at hand; on a cluster only when asked, e.g. for a Perfetto trace)."""
    from taxes.model.hardware import get_profile, profile_for_gpu

    paths = [str(p) for p in paths]
    if not paths:
        raise TaxesError("no trace files given")
    if len(set(paths)) < len(paths):
        dup = next(p for p in paths if paths.count(p) > 1)
        raise one_line(f"{dup}: given twice")
    for p in paths:
        name_rank(p)  # a rank number beyond the schema's bound in a file name: refused before any reading
    ets = _execution_traces(paths, {str(k): v for k, v in (execution_traces or {}).items()})
    rules(comm_patterns)  # a bad or dangerous pattern fails before any parsing
    if hardware is not None:
        hw = get_profile(hardware)  # a bad name fails before any parsing
    single = len(paths) == 1
    with runner(scheduler, jobs, len(paths)) as run:
        handles = run.start(analyze_rank, [(p, tuple(comm_patterns), ets.get(p), single, special_files) for p in paths])
        tables = run.each(rank_tables, handles)
        by_rank: dict = {}
        order: dict = {}
        for i, t in enumerate(tables):
            r = t["rank"]
            if r in by_rank:
                raise one_line(f"{t['path']}: rank {r} again (also {by_rank[r]['path']})")
            by_rank[r] = t
            order[r] = i
        by_rank = dict(sorted(by_rank.items()))
        ranks = list(by_rank)
        handles = [handles[order[r]] for r in ranks]
        warnings = [w for t in by_rank.values() for w in t["warnings"]]
        infos = {r: t["info"] for r, t in by_rank.items()}
        devices = {r: t["device"] for r, t in by_rank.items()}
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
        spans = {r: None if offsets[r] is None else (t["span"][0] + offsets[r], t["span"][1] + offsets[r])
                 for r, t in by_rank.items()}
        warnings += check_one_job(infos, devices, spans)
        handles = run.then(shift_rank, handles, [(offsets[r] or 0.0,) for r in ranks])
        world = max([i.get("world_size") or 0 for i in infos.values()] + [max(by_rank) + 1])  # both bounded by the reader
        missing = first_missing(ranks, world)
        if missing:
            have = ", ".join(map(str, ranks[:20])) + ("..." if len(ranks) > 20 else "")
            more = world - len(ranks) - len(missing)
            warnings.append(f"traces of rank(s) {', '.join(map(str, missing))}{f'... ({more} more)' if more else ''} "
                            f"of world {world} are missing: "
                            + (f"sync wait and skew compare only ranks {have}" if len(ranks) > 1 else
                               f"sync wait needs two ranks and reads 0 (only rank {have} given)"))
        comm = {r: t["comm"].assign(start_us=t["comm"]["start_us"] + (offsets[r] or 0.0),
                                    end_us=t["comm"]["end_us"] + (offsets[r] or 0.0)) for r, t in by_rank.items()}
        matched = att.match_collectives([SimpleNamespace(rank=r, activities=c) for r, c in comm.items()])
        coll, inst = instances(matched, comm)
        late_at = late.late_windows(coll, inst)
        pairs = pd.concat([t["pairs"] for t in by_rank.values()], ignore_index=True)
        not_measured = dict(NOT_MEASURED_WHY)
        unpriced = [r for r, t in by_rank.items() if t["locality_evidence"] is None or hw is None]
        if unpriced:
            lacking = [r for r in unpriced if by_rank[r]["locality_evidence"] is None]
            not_measured["locality"] = (f"no tensor identity or shapes in the trace of rank(s) {_ranks_text(lacking)}: "
                                        f"{LOCALITY_EVIDENCE}" if lacking else LOCALITY_PRICE)
        loc_bytes = {(int(r), int(s)): float(b) for (r, s), b in pairs.groupby(["rank", "step"])["moved_bytes"].sum().items()} \
            if not pairs.empty else {}
        if not pairs.empty and pairs["source"].str.contains("heuristic").any():
            warnings.append("locality from recorded shapes (heuristic): record an execution trace for tensor identity")
        us_per_byte = 1.0 / hw.hbm_bytes_per_us() if hw is not None else None
        waits = {r: coll[coll["rank"] == r].set_index("activity")["wait_us"] if not coll.empty else pd.Series(dtype=float)
                 for r in ranks}
        parts = run.each(attribute_part, handles,
                         [(waits[r], {k: v for k, v in loc_bytes.items() if k[0] == r}, us_per_byte,
                           late_at[late_at["rank"] == r]) for r in ranks], heavy=True)
        rows = pd.concat([p["rows"] for p in parts], ignore_index=True)
        gaps = pd.concat([p["gaps"] for p in parts], ignore_index=True)
        frames = pd.concat([p["frames"] for p in parts], ignore_index=True)
        where = {r: p["where"] for r, p in zip(ranks, parts)}
        if unpriced:
            rows.loc[rows["rank"].isin(unpriced), "locality"] = np.nan
        unkeyed = sum(t["unkeyed"] for t in by_rank.values())
        if len(ranks) > 1 and unkeyed and (inst.empty or not inst["matched"].any()):
            # nothing to wait at: the waits, if any, are inside exposed transfer, not zero
            not_measured["sync_wait"] = (f"no collective matched across ranks ({unkeyed} communication activities carry "
                                         f"no collective identity): {SYNC_EVIDENCE}")
            rows["sync_wait"] = np.nan
        for k in NOT_MEASURED_WHY:
            rows[k] = np.nan
        common = sorted(set.intersection(*[set(rows.loc[rows["rank"] == r, "step"]) for r in ranks])) if len(rows) else []
        e2e = rows[rows["step"].isin(common)].groupby("step")["span_us"].max()
        flags = flag_steps(e2e)
        for s, f in sorted(flags.items()):
            warnings.append(f"step {s} is a {f} step ({e2e[s]:,.1f} us, over 3x the median): left out of the statistics")
        kept = [s for s in common if s not in flags]
        rows = _with_extras(rows, flags, frames)
        summary = att.summarize(rows, kept) if kept else {"e2e_us": None, "rows": {}, "per_rank": {}, "kept": [], "n": 0}
        if not inst.empty and (~inst["matched"]).any():
            n = int((~inst["matched"]).sum())
            warnings.append(f"{n} collective instance(s) could not be matched across ranks (missing on a rank, or not "
                            "overlapping in time): listed, and given no sync wait")
        if not inst.empty and (inst["source"] == "kernel-order").any():
            n = int((inst["source"] == "kernel-order").sum())
            warnings.append(f"{n} collective instance(s) identified by their kernels' order on each rank (the record "
                            "names no collective): right when every rank issues one order of collectives, as DDP does")
        if unkeyed:
            warnings.append(f"{unkeyed} communication activities carry no collective identity (no process group and "
                            "sequence number, no launching collective op): their time is exposed transfer, never sync wait")
        plain = _plain(plain_steps, summary)
        step = _phase_step(rows, kept, summary)
        phases = [x for lst in run.each(step_activities, handles, [(step,)] * len(ranks)) for x in lst] \
            if step is not None else []
        keep = (scheduler is None) if keep_timelines is None else keep_timelines
        timelines = dict(zip(ranks, run.each(timeline_of, handles))) if keep else {}
    what_if = project(rows, gaps, _graph_gap_us(hw, gaps))
    what_if = what_if[what_if["projected_us"].notna()].reset_index(drop=True)  # fusion without a locality row
    return Analysis(
        ranks={r: t["path"] for r, t in by_rank.items()}, world_size=world, hardware=hw.name if hw else None,
        hardware_source=source, info=infos, devices=devices, timelines=timelines, decomposition=rows, gaps=gaps,
        collectives=coll, instances=inst, stragglers=late.summary(coll, inst, where, float(e2e.sum())), locality=pairs, host_frames=frames,
        flags=flags, kept_steps=kept, summary=summary, what_if=what_if,
        windows_how={r: t["how"] for r, t in by_rank.items()}, plain=plain, warnings=tuple(warnings),
        not_measured=not_measured, phases=phases,
        comm_by_rule=pd.concat([t["comm_by_rule"] for t in by_rank.values()], ignore_index=True))


def _ranks_text(ranks: list, n: int = 20) -> str:
    return ", ".join(map(str, ranks[:n])) + ("..." if len(ranks) > n else "")


def first_missing(present: list[int], world: int, limit: int = 20) -> list[int]:
    """The first `limit` ranks below `world` not in `present` (sorted), walking the gaps between the ranks
    given: the work follows the ranks given and the limit, never the world size a trace claims."""
    out, expect = [], 0
    for r in present + [world]:
        while expect < min(r, world) and len(out) < limit:
            out.append(expect)
            expect += 1
        if len(out) >= limit:
            break
        expect = r + 1
    return out


def _clock_offsets(infos: dict) -> dict:
    """us to add to each rank's timestamps to put every rank on one clock (exact integer arithmetic on
    baseTimeNanoseconds and the origin of absolute timestamps); None for a trace with neither."""
    absolute = {r: i["base_ns"] + i["origin_us"] * 1000 for r, i in infos.items()}
    known = {r: ns for r, ns in absolute.items() if ns}
    first = min(known.values()) if known else 0
    return {r: ((ns - first) / 1000.0 if ns else (0.0 if not known else None)) for r, ns in absolute.items()}


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


def read_plain(path, special: bool = False) -> dict:
    """A --plain file: {"<rank>": [us per step, ...]}, at most MAX_SIDE_FILE_BYTES read; one-line errors."""
    data = read_side_file(path, "plain step times", MAX_SIDE_FILE_BYTES, special)
    try:
        data = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise one_line(f"{path}: not JSON of plain step times ({{\"<rank>\": [us, ...]}})") from None
    if not isinstance(data, dict) or not data:
        raise one_line(f"{path}: plain step times must be an object {{\"<rank>\": [us, ...]}}")
    out = {}
    for k, v in data.items():
        if not (str(k).isascii() and str(k).isdigit() and len(str(k)) <= 5 and int(k) <= 65535) or not isinstance(v, list):
            raise one_line(f"{path}: plain step times must map rank numbers (0 to 65535) to lists of us (found "
                           f"{str(k)[:20]!r})")
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
    from taxes.traces.timeline import measure

    lo = acts["start_us"].min() if lo is None else lo
    hi = acts["end_us"].max() if hi is None else hi
    comm = (acts["comm"] != "").values
    s, e = acts["start_us"].values, acts["end_us"].values
    all_m, comp_m, comm_m = merge(s, e), merge(s[~comm], e[~comm]), merge(s[comm], e[comm])
    busy, comp, comm_us = measure(all_m, lo, hi), measure(comp_m, lo, hi), measure(comm_m, lo, hi)
    exposed = busy - comp
    return {"span_us": float(hi - lo), "busy_us": busy, "idle_us": float(hi - lo) - busy, "compute_us": comp,
            "comm_us": comm_us, "exposed_comm_us": exposed, "overlap_us": comm_us - exposed}


def _phase_step(rows: pd.DataFrame, kept: list, summary: dict):
    """The kept step whose E2E (slowest rank's span) is closest to the statistic: the document's phases."""
    if not kept or summary.get("e2e_us") is None:
        return None
    ov = rows[rows["step"].isin(kept)].groupby("step")["span_us"].max()
    return (ov - summary["e2e_us"]).abs().idxmin()
