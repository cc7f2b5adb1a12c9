"""`taxes analyze`: the three taxes per rank and per profiled step, read off torch.profiler traces.

Input: Kineto Chrome traces (.json or .json.gz, one per rank) of any PyTorch program. Each rank's GPU
activity (kernels, memcpy, memset, on every stream) is joined to the host call that launched it
(correlation id, else the ac2g flow events), assigned to the ProfilerStep#N annotation in which it was
launched, and each step's span on each rank is split into parts that add up to it exactly:

    span = compute + locality + sync_wait + exposed_transfer + launch + other_idle + unattributed

docs/analyze.md states every rule and its limits. Times are microseconds, kept as floats (Kineto writes
nanosecond digits); data flows trace files -> events -> activities -> per-rank parts -> result document.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from taxes.errors import TaxesError

from taxes.kineto import (  # noqa: F401  (the readers analyze builds on, and its tests use)
    MAX_TRACE_BYTES,
    NCCL_MARKS,
    _error,
    _short,
    gpu_activities,
    is_communication,
    load_trace,
    profiler_steps,
    trace_rank,
)

TRACE_WORKLOAD = "trace"  # the workload name of an analysed trace in the result document

PARTS = ("compute", "locality", "sync_wait", "exposed_transfer", "launch", "other_idle", "unattributed")

PART_LABELS = {"compute": "derived", "locality": "derived", "sync_wait": "derived", "exposed_transfer": "derived",
               "launch": "measured", "other_idle": "measured", "unattributed": "measured"}

TAX_PARTS = {"bulk-synchronous": ("sync_wait", "exposed_transfer"), "data-locality": ("locality",),
             "kernel-launch": ("launch",)}

GAP_TAX = {"launch": "launch", "graph": "launch", "other": "other_idle", "unknown": "unattributed"}


# Bytes per element of the "Input type" strings torch.profiler writes.
DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "int": 4, "long int": 8, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}

# Ops whose output has the broadcast shape of their tensor inputs and the first input's dtype.
_ELEMENTWISE = {
    "relu", "gelu", "silu", "sigmoid", "tanh", "add", "sub", "mul", "div", "neg", "exp", "pow", "rsqrt", "sqrt",
    "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "rms_norm",
    "_fused_rms_norm", "dropout", "native_dropout", "clone", "contiguous", "where", "masked_fill", "scale",
}


def assign_steps(acts: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """The step each activity belongs to: the step whose host span [start, end) holds its launch call
    (or, with no launch in the trace, its own start). Half-open, so that a launch at the instant one step
    ends and the next begins belongs to exactly one step, the later. -1: outside every step."""
    when = acts["launch_us"].fillna(acts["start_us"]).values
    if steps.empty:
        return pd.Series(np.zeros(len(acts), dtype=int), index=acts.index)
    order = np.lexsort((steps["host_end_us"].values, steps["host_start_us"].values))  # ties: the longest last
    starts = steps["host_start_us"].values[order]
    ends = steps["host_end_us"].values[order]
    pos = np.searchsorted(starts, when, side="right") - 1  # the last step that began at or before `when`
    inside = (pos >= 0) & (when < ends[np.clip(pos, 0, None)])
    step_ids = steps["step"].values[order]
    return pd.Series(np.where(inside, step_ids[np.clip(pos, 0, None)], -1), index=acts.index)


def step_windows(acts: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Each step's window on this rank's clock, tiling time with no overlap:
    start = max(host step start, previous window's end); end = max(host step end, end of the step's
    last activity). With no ProfilerStep the whole trace is step 0, from the first launch (or activity)
    to the last activity's end."""
    if steps.empty:
        lo = np.nanmin(np.concatenate([acts["start_us"].values, acts["launch_us"].values]))
        return pd.DataFrame({"step": [0], "host_start_us": [lo], "host_end_us": [acts["end_us"].max()],
                             "start_us": [lo], "end_us": [acts["end_us"].max()]})
    dev_end = acts[acts["step"] >= 0].groupby("step")["end_us"].max()
    rows, prev_end = [], -math.inf
    for s in steps.itertuples(index=False):
        w0 = max(s.host_start_us, prev_end)
        w1 = max(s.host_end_us, dev_end.get(s.step, -math.inf), w0)
        rows.append((s.step, s.host_start_us, s.host_end_us, w0, w1))
        prev_end = w1
    return pd.DataFrame(rows, columns=["step", "host_start_us", "host_end_us", "start_us", "end_us"])


# ---- interval arithmetic (sorted, merged intervals as two arrays) ---------------------------------


def merge_intervals(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as disjoint sorted intervals."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return s[first], np.maximum.reduceat(e, first)


def measure(merged: tuple[np.ndarray, np.ndarray], lo: float = -math.inf, hi: float = math.inf) -> float:
    """Total length of merged intervals inside [lo, hi]."""
    ms, me = merged
    return float(np.sum(np.clip(me, lo, hi) - np.clip(ms, lo, hi))) if ms.size else 0.0


def _union(*merged) -> tuple[np.ndarray, np.ndarray]:
    return merge_intervals(np.concatenate([m[0] for m in merged]), np.concatenate([m[1] for m in merged]))


def timeline_figures(acts: pd.DataFrame, lo: float | None = None, hi: float | None = None) -> dict[str, float]:
    """Busy, idle, communication and overlap of a set of GPU activities inside [lo, hi] (default: from
    the first activity's start to the last one's end, HTA's span). All streams together."""
    lo = acts["start_us"].min() if lo is None else lo
    hi = acts["end_us"].max() if hi is None else hi
    comm = acts["kind"].values == "communication"
    all_m = merge_intervals(acts["start_us"], acts["end_us"])
    comp_m = merge_intervals(acts["start_us"][~comm], acts["end_us"][~comm])
    comm_m = merge_intervals(acts["start_us"][comm], acts["end_us"][comm])
    busy = measure(all_m, lo, hi)
    comp = measure(comp_m, lo, hi)
    comm_us = measure(comm_m, lo, hi)
    exposed = busy - comp
    return {"span_us": float(hi - lo), "busy_us": busy, "idle_us": float(hi - lo) - busy, "compute_us": comp,
            "comm_us": comm_us, "exposed_comm_us": exposed, "overlap_us": comm_us - exposed}


# ---- across ranks: collectives --------------------------------------------------------------------


def match_collectives(acts_by_rank: dict[int, pd.DataFrame], offsets_us: dict[int, float]) -> pd.DataFrame:
    """NCCL kernels matched across ranks by name and order (the k-th kernel of a name on one rank is the
    k-th on every rank). sync_wait_us = this rank's duration minus the shortest any rank saw for it;
    skew_us = its start minus the earliest start on one clock (aligned_start_us: start_us, on the rank's
    own clock, moved by the traces' base times)."""
    frames = []
    for rank, acts in acts_by_rank.items():
        c = acts[acts["kind"] == "communication"][["name", "step", "start_us", "dur_us"]].copy()
        c["seq"] = c.groupby("name").cumcount()
        c["rank"] = rank
        c["aligned_start_us"] = c["start_us"] + offsets_us[rank]
        frames.append(c)
    cols = ["rank", "step", "name", "seq", "start_us", "aligned_start_us", "dur_us", "n_ranks", "min_dur_us",
            "sync_wait_us", "skew_us"]
    if not frames or all(f.empty for f in frames):
        return pd.DataFrame(columns=cols)
    c = pd.concat(frames, ignore_index=True)
    key = c.groupby(["name", "seq"])
    c["n_ranks"] = key["rank"].transform("size")
    c["min_dur_us"] = key["dur_us"].transform("min")
    c["sync_wait_us"] = c["dur_us"] - c["min_dur_us"]
    c["skew_us"] = c["aligned_start_us"] - key["aligned_start_us"].transform("min")
    return c[cols].sort_values(["rank", "start_us"]).reset_index(drop=True)


# ---- one rank: data locality from recorded shapes -------------------------------------------------


def _tensors(dims, types) -> list[tuple[tuple, str | None]]:
    """(shape, dtype) of each tensor argument; a tensor list contributes its elements (dtype unknown)."""
    out = []
    if not isinstance(dims, list) or not isinstance(types, list):
        return out
    for d, t in zip(dims, types):
        if t in DTYPE_BYTES and isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append((tuple(d), t))
        elif t == "TensorList" and isinstance(d, list):
            out += [(tuple(x), None) for x in d if isinstance(x, list) and all(isinstance(v, int) for v in x)]
    return out


def _outputs(name: str, ins: list[tuple[tuple, str | None]]) -> list[tuple[tuple, str | None]]:
    """The tensor an op writes, where its inputs' shapes tell: in-place and out-variant ops (name ending
    in '_', every c10d collective) write their first tensor argument; matmuls and elementwise ops by
    their shape rules. Unknown ops: nothing (no pair is claimed)."""
    base = name.split("::")[-1]
    if not ins:
        return []
    if name.startswith("c10d::") or base.endswith("_"):
        return ins[:1]
    try:
        if base in ("mm", "matmul", "bmm") and len(ins) >= 2 and len(ins[0][0]) >= 2 and len(ins[1][0]) >= 2:
            return [(ins[0][0][:-1] + ins[1][0][-1:], ins[0][1])]
        if base == "addmm" and len(ins) >= 3:
            return [((ins[1][0][0], ins[2][0][-1]), ins[1][1])]
        if base == "linear" and len(ins) >= 2 and len(ins[1][0]) == 2:
            return [(ins[0][0][:-1] + (ins[1][0][0],), ins[0][1])]
        if base in _ELEMENTWISE:
            return [(tuple(np.broadcast_shapes(*[t[0] for t in ins])), ins[0][1])]
    except (ValueError, IndexError):
        return []
    return []


def _top_level_ops(events: pd.DataFrame) -> pd.DataFrame:
    """cpu_ops not nested in another cpu_op of the same thread."""
    ops = events[events["kind"] == "cpu_op"].sort_values(["tid", "ts", "dur"], ascending=[True, True, False])
    if ops.empty:
        return ops
    reach = ops.groupby("tid")["end"].transform(lambda e: e.cummax().shift(fill_value=-math.inf))
    return ops[ops["ts"].values >= reach.values]


def locality_pairs(events: pd.DataFrame, acts: pd.DataFrame, steps: pd.DataFrame, hbm_bytes_per_us: float) -> pd.DataFrame:
    """Intermediates written by one op and read by the next op of the same thread and step.

    The ops are the top-level host ops that launched GPU work, in launch order; a launch outside any op
    (a Triton kernel, a graph replay) stands in the sequence as an op with no shapes, so nothing is
    claimed across it. bytes = the tensor's size; locality_us = (written + read) bytes / HBM bandwidth,
    half charged to the writer's kind (compute or communication), half to the reader's."""
    cols = ["step", "producer", "consumer", "shape", "dtype", "bytes", "locality_us", "write_kind", "read_kind"]
    launched = acts[acts["launch_us"].notna()]
    if launched.empty:
        return pd.DataFrame(columns=cols)
    per_launch = launched.groupby(["launch_tid", "launch_us"]).agg(
        comm=("kind", lambda k: bool((k == "communication").any())))
    ops = _top_level_ops(events)
    ops_by_tid = {tid: (g["ts"].values, g["end"].values, g) for tid, g in ops.groupby("tid")}
    items = []  # (tid, time, key, name, dims, types, comm)
    for (tid, t_launch), row in per_launch.iterrows():
        starts, ends, mine = ops_by_tid.get(tid, (np.empty(0), np.empty(0), None))
        pos = np.searchsorted(starts, t_launch, side="right") - 1
        if pos >= 0 and t_launch <= ends[pos]:
            op = mine.iloc[pos]
            items.append((tid, op["ts"], ("op", tid, op["ts"]), op["name"], op["input_dims"], op["input_type"], row["comm"]))
        else:
            items.append((tid, t_launch, ("launch", tid, t_launch), "(launch outside any op)", None, None, row["comm"]))
    seq = (pd.DataFrame(items, columns=["tid", "time", "key", "name", "dims", "types", "comm"])
           .groupby("key", sort=False).agg(tid=("tid", "first"), time=("time", "first"), name=("name", "first"),
                                           dims=("dims", "first"), types=("types", "first"), comm=("comm", "max"))
           .sort_values(["tid", "time"]))
    fake = pd.DataFrame({"launch_us": seq["time"].values, "start_us": seq["time"].values})
    seq["step"] = assign_steps(fake, steps).values if not steps.empty else 0
    rows = []
    for _, group in seq.groupby("tid"):
        g = group.to_dict("records")
        for a, b in zip(g, g[1:]):
            if a["step"] != b["step"] or a["step"] < 0:
                continue
            found = _intermediate(_outputs(a["name"], _tensors(a["dims"], a["types"])), _tensors(b["dims"], b["types"]))
            if found:
                shape, dtype = found
                nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPE_BYTES[dtype]
                rows.append((a["step"], a["name"], b["name"], "x".join(map(str, shape)), dtype, nbytes,
                             2 * nbytes / hbm_bytes_per_us, "communication" if a["comm"] else "compute",
                             "communication" if b["comm"] else "compute"))
    return pd.DataFrame(rows, columns=cols)


def _intermediate(outs, ins) -> tuple[tuple, str] | None:
    for shape, dtype in outs:
        for s, t in ins:
            if s == shape and (t is None or dtype is None or t == dtype) and (dtype or t) in DTYPE_BYTES:
                return shape, dtype or t
    return None


# ---- one rank: the decomposition of each step ------------------------------------------------------


def decompose_rank(acts: pd.DataFrame, windows: pd.DataFrame, waits: pd.DataFrame,
                   locality: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per step: the parts of the window's span, and the idle gaps with their causes.

    waits: this rank's collectives (start_us, sync_wait_us): the wait is taken as the collective's first
    sync_wait_us (an NCCL kernel spins until its peers arrive)."""
    comm = acts["kind"].values == "communication"
    all_m = merge_intervals(acts["start_us"], acts["end_us"])
    comp_m = merge_intervals(acts["start_us"][~comm], acts["end_us"][~comm])
    comm_m = merge_intervals(acts["start_us"][comm], acts["end_us"][comm])
    w = waits[waits["sync_wait_us"] > 0]
    wait_comp_m = _union(merge_intervals(w["start_us"], w["start_us"] + w["sync_wait_us"]), comp_m)
    by_start = acts.groupby("start_us")["launch_us"].min()  # the earliest launch among activities starting there
    starts = by_start.index.values
    graph = acts[acts["in_graph"]]
    graph_at = {"end": graph.groupby("end_us")["correlation"].agg(set).to_dict(),
                "start": graph.groupby("start_us")["correlation"].agg(set).to_dict()}
    loc = locality.groupby("step") if not locality.empty else None
    rows, gap_rows = [], []
    for win in windows.itertuples(index=False):
        lo, hi = win.start_us, win.end_us
        span = hi - lo
        busy = measure(all_m, lo, hi)
        compute_busy = measure(comp_m, lo, hi)
        exposed_comm = busy - compute_busy
        sync = min(measure(wait_comp_m, lo, hi) - compute_busy, exposed_comm)
        transfer = exposed_comm - sync
        loc_comp = loc_comm = 0.0
        if loc is not None and win.step in loc.groups:
            pairs = loc.get_group(win.step)
            half = pairs["locality_us"] / 2
            loc_comp = float(half[pairs["write_kind"] == "compute"].sum() + half[pairs["read_kind"] == "compute"].sum())
            loc_comm = float(half[pairs["write_kind"] == "communication"].sum()
                             + half[pairs["read_kind"] == "communication"].sum())
        locality_comp = min(loc_comp, compute_busy)  # an estimate never takes more than the time it comes from
        locality_comm = min(loc_comm, transfer)
        idle = {"launch": 0.0, "other_idle": 0.0, "unattributed": 0.0}
        for a, b in _gaps(all_m, lo, hi):
            cause, nxt = _gap_cause(a, b, starts, by_start.values, graph_at)
            idle[GAP_TAX[cause]] += b - a
            gap_rows.append((win.step, a, b, b - a, cause, nxt))
        parts = {"compute": compute_busy - locality_comp, "locality": locality_comp + locality_comm,
                 "sync_wait": sync, "exposed_transfer": transfer - locality_comm,
                 "launch": idle["launch"], "other_idle": idle["other_idle"]}
        parts["unattributed"] = span - math.fsum(parts.values())  # the unknown-cause gaps, plus float residue
        rows.append({"step": win.step, "start_us": lo, "end_us": hi, "span_us": span, **parts,
                     "busy_us": busy, "idle_us": span - busy, "comm_us": measure(comm_m, lo, hi),
                     "exposed_comm_us": exposed_comm, "locality_estimate_us": loc_comp + loc_comm})
    gaps = pd.DataFrame(gap_rows, columns=["step", "start_us", "end_us", "dur_us", "cause", "next_launch_us"])
    return pd.DataFrame(rows), gaps


def _gaps(merged, lo: float, hi: float) -> list[tuple[float, float]]:
    ms, me = merged
    keep = (me > lo) & (ms < hi)
    s, e = np.clip(ms[keep], lo, hi), np.clip(me[keep], lo, hi)
    edges_lo = np.concatenate([[lo], e])
    edges_hi = np.concatenate([s, [hi]])
    return [(float(a), float(b)) for a, b in zip(edges_lo, edges_hi) if b > a]


def _gap_cause(a: float, b: float, starts, launch_at_start, graph_at: dict) -> tuple[str, float]:
    """Why the device sat idle in [a, b): 'launch' when the next activity's launch call began after a
    (the host was late), 'graph' between two kernels of one CUDA graph replay, 'other' when the host had
    launched it in time (a dependency or sync held it), 'unknown' when the trace lacks its launch."""
    i = np.searchsorted(starts, b, side="left")  # the activity that ends the gap (for a trailing gap: the next one)
    if i >= len(starts):
        return "launch", math.nan  # nothing more was ever launched
    launch = launch_at_start[i]
    if math.isnan(launch):
        return "unknown", launch
    if launch > a:
        return "launch", launch
    if graph_at["end"].get(a, set()) & graph_at["start"].get(starts[i], set()):
        return "graph", launch
    return "other", launch


# ---- all ranks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Analysis:
    """What `analyze` found; every frame has a rank column, times in us."""

    ranks: dict  # rank -> trace path
    world_size: int
    hardware: str
    info: dict  # rank -> the trace's own metadata (load_trace's attrs)
    activities: pd.DataFrame  # GPU activities with their launch and step
    steps: pd.DataFrame  # per rank and step: host span and the analysed window
    decomposition: pd.DataFrame  # per rank and step: span and its parts (PARTS add up to span_us)
    gaps: pd.DataFrame  # per idle gap: where, how long, its cause
    collectives: pd.DataFrame  # per NCCL kernel: matched across ranks, sync wait, skew
    locality: pd.DataFrame  # per detected intermediate: producer, consumer, bytes, time
    warnings: tuple


def load_ranks(paths) -> dict[int, pd.DataFrame]:
    """Every trace, keyed by rank; a rank is taken from the file, and two files of one rank are refused."""
    paths = [Path(p) for p in paths]
    if not paths:
        raise _error("no trace files given")
    loaded: dict[int, pd.DataFrame] = {}
    for p in paths:
        ev = load_trace(p)
        rank = ev.attrs["trace"]["rank"]
        if rank is None:
            if len(paths) > 1:
                raise _error(f"{p}: cannot tell its rank (no distributedInfo.rank, no rankN in the file name)")
            rank = 0
        if rank in loaded:
            raise _error(f"{p}: rank {rank} again (also {loaded[rank].attrs['trace']['path']})")
        loaded[rank] = ev
    return dict(sorted(loaded.items()))


def analyze(paths, hardware: str = "h200-sxm") -> Analysis:
    """Load one trace per rank and decompose every profiled step of every rank."""
    from taxes.hardware import get_profile

    hw = get_profile(hardware)
    hbm = hw.hbm_bytes_per_us() * hw.hbm_efficiency
    loaded = load_ranks(paths)
    warnings = []
    world = max([ev.attrs["trace"]["world_size"] or 0 for ev in loaded.values()] + [max(loaded) + 1])
    missing = [r for r in range(world) if r not in loaded]
    if missing:
        have = ", ".join(map(str, loaded))
        warnings.append(f"traces of rank(s) {', '.join(map(str, missing))} of world {world} are missing: "
                        + (f"sync wait and skew compare only ranks {have}" if len(loaded) > 1 else
                           f"sync wait and skew need two ranks and read 0 (only rank {have} given)"))
    acts_by_rank, windows_by_rank, steps_by_rank = {}, {}, {}
    for rank, ev in loaded.items():
        acts = gpu_activities(ev)
        if acts.empty:
            raise _error(f"{ev.attrs['trace']['path']}: no GPU kernels in the trace (record it with "
                             "ProfilerActivity.CUDA)")
        steps = profiler_steps(ev)
        if steps.empty:
            warnings.append(f"rank {rank}: no ProfilerStep#N annotations; the whole trace is one step")
        acts["step"] = assign_steps(acts, steps).values
        if acts["launch_us"].isna().any():
            n = int(acts["launch_us"].isna().sum())
            warnings.append(f"rank {rank}: {n} GPU activities have no launch call in the trace; gaps before "
                            "them are unattributed")
        acts_by_rank[rank], steps_by_rank[rank] = acts, steps
        windows_by_rank[rank] = step_windows(acts, steps)
    offsets = _clock_offsets({r: ev.attrs["trace"] for r, ev in loaded.items()})
    coll = match_collectives(acts_by_rank, offsets)
    if not coll.empty and (coll["n_ranks"] < len(loaded)).any():
        warnings.append("some NCCL kernels are not found on every rank (different counts per rank); their "
                        "sync wait compares only the ranks that have them")
    decomp, gaps, loc, steps_out = [], [], [], []
    for rank, ev in loaded.items():
        acts = acts_by_rank[rank]
        pairs = locality_pairs(ev, acts, steps_by_rank[rank], hbm)
        d, g = decompose_rank(acts, windows_by_rank[rank], coll[coll["rank"] == rank], pairs)
        for frame, out in ((d, decomp), (g, gaps), (pairs, loc), (windows_by_rank[rank], steps_out)):
            out.append(frame.assign(rank=rank))
    decomposition = _rank_first(pd.concat(decomp, ignore_index=True))
    steps_frame = _rank_first(pd.concat(steps_out, ignore_index=True))
    steps_frame["span_us"] = steps_frame["end_us"] - steps_frame["start_us"]
    return Analysis(
        ranks={r: ev.attrs["trace"]["path"] for r, ev in loaded.items()}, world_size=world, hardware=hw.name,
        info={r: ev.attrs["trace"] for r, ev in loaded.items()},
        activities=_rank_first(pd.concat([a.assign(rank=r) for r, a in acts_by_rank.items()], ignore_index=True)),
        steps=steps_frame, decomposition=decomposition, gaps=_rank_first(pd.concat(gaps, ignore_index=True)),
        collectives=coll, locality=_rank_first(pd.concat(loc, ignore_index=True)), warnings=tuple(warnings))


def _rank_first(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[["rank"] + [c for c in frame.columns if c != "rank"]]


def _clock_offsets(info: dict[int, dict]) -> dict[int, float]:
    """us to add to each rank's timestamps to put every rank on one clock (exact integer arithmetic on
    baseTimeNanoseconds, so sub-us digits survive)."""
    absolute_ns = {r: i["base_ns"] + i["origin_us"] * 1000 for r, i in info.items()}
    first = min(absolute_ns.values())
    return {r: (ns - first) / 1000.0 for r, ns in absolute_ns.items()}


def common_steps(an: Analysis) -> list[int]:
    """Steps every analysed rank has."""
    per_rank = an.decomposition.groupby("rank")["step"].apply(set)
    return sorted(set.intersection(*per_rank)) if len(per_rank) else []


def taxes_frame(an: Analysis) -> pd.DataFrame:
    """Per rank and step: span, compute and the three taxes (each the sum of its parts)."""
    d = an.decomposition
    out = d[["rank", "step", "span_us", "compute"]].copy()
    for tax, parts in TAX_PARTS.items():
        out[tax] = d[list(parts)].sum(axis=1)
    return out


def median_step(an: Analysis) -> int | None:
    """The step whose slowest rank's span is the median over steps (the lower middle for an even count)."""
    steps = common_steps(an)
    if not steps:
        return None
    d = an.decomposition[an.decomposition["step"].isin(steps)]
    e2e = d.groupby("step")["span_us"].max().sort_values(kind="stable")
    return int(e2e.index[(len(e2e) - 1) // 2])


# ---- the result document --------------------------------------------------------------------------


def analysis_document(an: Analysis) -> dict:
    """A taxes.result document: one case (workload 'trace') with one variant. samples_us: each rank's
    span per common step; components and phases: the median step (its per-rank parts add up to each
    rank's span, its overall parts are the slowest rank's). The full per-step frames go under the
    top-level key trace_analysis."""
    from taxes import results

    steps = common_steps(an)
    ranks = sorted(an.ranks)
    d = an.decomposition.set_index(["rank", "step"])
    samples = [[float(d.loc[(r, s), "span_us"]) for s in steps] for r in ranks]
    med = median_step(an)
    components, phases = [], []
    if med is not None:
        slowest = max(ranks, key=lambda r: d.loc[(r, med), "span_us"])
        for r in ranks + [None]:
            row = d.loc[(slowest if r is None else r, med)]
            components += [{"name": p, "rank": r, "value_us": float(row[p]), "label": PART_LABELS[p]} for p in PARTS]
        phases = _phases(an, med)
    info0 = an.info[ranks[0]]
    devices = []
    for r in ranks:
        acts = an.activities[an.activities["rank"] == r]
        dev = acts["device"].dropna()
        names = an.info[r]["devices"]
        idx = int(dev.mode().iloc[0]) if not dev.empty else r
        devices.append(names[idx] if 0 <= idx < len(names) else "unknown")
    meta = results.collect_metadata("profile", an.world_size, an.hardware, source="trace",
                                    traces={str(r): an.ranks[r] for r in ranks}, warnings=list(an.warnings))
    meta.update({"torch_version": None, "triton_version": None, "cuda_version": info0["cuda_version"],
                 "nccl_version": info0["nccl_version"], "gpu_names": devices})
    variant = {
        "variant": "trace", "config": {"median_step": med, "steps": steps},
        "correctness": {"checked": False, "passed": None, "rel_error": None, "tolerance": None, "reference": None},
        "samples_us": samples, "e2e_us": results.summarize_samples(samples, "measured"),
        "phases": phases, "components": components,
    }
    case = {"workload": TRACE_WORKLOAD, "shape": {"steps": max(1, len(steps))}, "world": an.world_size,
            "dtype": _main_dtype(an), "variants": [variant]}
    doc = results.new_document(meta)
    doc["cases"].append(case)
    doc["trace_analysis"] = _frames_for_json(an)
    return doc


def _phases(an: Analysis, step: int, limit: int = 400) -> list[dict]:
    """The median step's GPU activities per rank, times from the rank's window start."""
    out = []
    coll = an.collectives.set_index(["rank", "start_us"])["sync_wait_us"] if not an.collectives.empty else None
    for r in sorted(an.ranks):
        win = an.steps[(an.steps["rank"] == r) & (an.steps["step"] == step)].iloc[0]
        acts = an.activities[(an.activities["rank"] == r) & (an.activities["end_us"] > win["start_us"])
                             & (an.activities["start_us"] < win["end_us"])]
        for a in acts.head(limit).itertuples(index=False):
            start = max(a.start_us, win["start_us"]) - win["start_us"]
            end = min(a.end_us, win["end_us"]) - win["start_us"]
            parts = {}
            if a.kind == "communication" and coll is not None and (r, a.start_us) in coll.index:
                wait = float(np.min(coll.loc[(r, a.start_us)]))
                parts = {"sync_wait": min(wait, end - start), "exposed_transfer": max(0.0, end - start - wait)}
            out.append({"rank": r, "name": _short_kernel(a.name), "role": "communication" if a.kind == "communication"
                        else "compute", "start_us": float(start), "end_us": float(end), "label": "measured",
                        "parts": parts})
    return out


def _short_kernel(name: str) -> str:
    base = name.split("(")[0].split("<")[0]
    return base if len(base) <= 40 else base[:37] + "..."


def _main_dtype(an: Analysis) -> str:
    if an.locality.empty:
        return "n/a"
    return str(an.locality["dtype"].mode().iloc[0])


def _frames_for_json(an: Analysis) -> dict:
    def records(frame: pd.DataFrame) -> list[dict]:
        return json.loads(frame.to_json(orient="records", double_precision=15))

    gaps = an.gaps.groupby(["rank", "step", "cause"])["dur_us"].agg(["sum", "count"]).reset_index()
    return {"decomposition": records(an.decomposition), "gaps_by_cause": records(gaps),
            "collectives": records(an.collectives), "locality": records(an.locality),
            "warnings": list(an.warnings)}
