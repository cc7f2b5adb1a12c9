"""Collective instances across ranks: which communication activity is which collective, identified, not guessed.

Every rank issues the collectives of one process group in the same order, and torch numbers them: the
instance key of a communication activity is taken, first that applies, from

    seq          the process group and sequence number the trace records (args `Process Group Name`
                 / `Process Group ID` / `pg`, and `Seq` / `seq`), on the kernel or on the
                 record_param_comms cpu op that launched it (joined by External id, else by the launch
                 lying inside the op on the same thread): "pg:seq"
    group-order  without a sequence number, the op's position among the record_param_comms ops of its
                 process group within its step on this rank (a process group's collectives run in one
                 order on every rank): "pg:step:k:collective name"
    graph-order  a communication kernel replayed from a CUDA graph (no op launched it): its position in
                 the step's replays and in its replay, and its name: a graph replays one recorded sequence
    kernel-order without any of these (a timing record keeps no cpu ops: cupti-python's, or torch.profiler's
                 without CPU activity), for NCCL kernels only: the kernel's position among the NCCL kernels
                 of the same name within its step on this rank, and its name: "order:step:k:name". It rests on the
                 same rule as group-order (one order on every rank), with the process group unknown: jobs
                 whose process groups issue collectives of one name in different orders on different ranks
                 can pair the wrong kernels; match_collectives' overlap test refuses most such pairs
none otherwise ("" key, e.g. outside every step): such activities are listed, never matched, and get no sync
wait.

taxes.attribution.attribute.match_collectives then matches instances only if they overlap in time on every rank (a
collective cannot finish before its last rank arrives); unmatched instances are reported, never turned
into sync wait. Per instance: arrival skew (latest arrival - earliest), each rank's wait (latest arrival
- its own), the slowest rank (the last to arrive); per rank, taxes.attribution.stragglers sums them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from taxes.errors import TaxesError
from taxes.traces.steps import assign_steps


def instance_keys(events: pd.DataFrame, acts: pd.DataFrame, extra: pd.DataFrame, steps: pd.DataFrame,
                  step_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, source) per activity (module docstring). acts: the timeline's activities (comm column set);
    extra: its extra columns (ext_id, launch_tid, launch_us, pg, seq); steps: host steps (may be empty);
    step_of: each activity's step."""
    n = len(acts)
    key = np.full(n, "", dtype=object)
    source = np.full(n, "", dtype=object)
    comm = (acts["comm"] != "").values
    if not comm.any():
        return key, source
    # 1. on the kernel itself
    pg, seq = extra["pg"].values, extra["seq"].values
    own = comm & pd.notna(pg) & ~np.isnan(seq.astype(float))
    key[own] = [f"{p}:{int(s)}" for p, s in zip(pg[own], seq[own])]
    source[own] = "seq"
    # 2. through the record_param_comms op that launched it
    ops = events[(events["kind"].values == "cpu_op") & (events["name"].values == "record_param_comms")]
    todo = comm & (key == "")
    if todo.any() and not ops.empty:
        ops = ops.sort_values("ts").reset_index(drop=True)
        op_step = assign_steps(ops["ts"].values, steps) if not steps.empty else np.zeros(len(ops), dtype=np.int64)
        op_pg = ops["pg"].fillna("?").astype(str).values
        order = pd.DataFrame({"pg": op_pg, "step": op_step}).groupby(["pg", "step"]).cumcount().values
        op_key = np.where(~np.isnan(ops["seq"].values.astype(float)),
                          [f"{p}:{int(s)}" if s == s else "" for p, s in zip(op_pg, ops["seq"].values)],
                          [f"{p}:{st}:{k}:{c or ''}" for p, st, k, c in zip(op_pg, op_step, order, ops["coll"].values)])
        op_src = np.where(~np.isnan(ops["seq"].values.astype(float)), "seq", "group-order")
        outside = op_step < -1  # an op outside every step has no position to match by
        op_key = np.where(outside & (op_src == "group-order"), "", op_key)
        which = _op_of(extra, ops, todo)
        hit = which >= 0
        key[hit] = op_key[which[hit]]
        source[hit] = np.where(key[hit] != "", op_src[which[hit]], "")
    # 3. replayed from a CUDA graph
    todo = comm & (key == "") & (acts["graph"].values >= 0) & (step_of >= -1)
    if todo.any():
        g = pd.DataFrame({"i": np.flatnonzero(todo), "graph": acts["graph"].values[todo], "step": step_of[todo],
                          "start": acts["start_us"].values[todo], "name": acts["name"].values[todo]})
        g = g.sort_values(["start", "i"], kind="stable")
        first = g.groupby("graph", sort=False)["start"].transform("min")
        g["replay"] = g.assign(first=first).groupby("step")["first"].rank(method="dense").astype(int) - 1
        g["pos"] = g.groupby("graph", sort=False).cumcount()
        key[g["i"].values] = [f"graph:{s}:{r}:{p}:{nm}" for s, r, p, nm in
                              zip(g["step"].values, g["replay"].values, g["pos"].values, g["name"].values)]
        source[g["i"].values] = "graph-order"
    # 4. by order on this rank: nothing names the collective; only NCCL's, whose collectives must run in one
    # order on every rank of a communicator (one-sided kernels, e.g. symmetric memory's, promise no such order)
    todo = comm & (key == "") & (step_of >= 0) & (acts["comm"].values == "nccl")
    if todo.any():
        g = pd.DataFrame({"i": np.flatnonzero(todo), "step": step_of[todo], "start": acts["start_us"].values[todo],
                          "name": acts["name"].values[todo]}).sort_values(["start", "i"], kind="stable")
        g["k"] = g.groupby(["step", "name"], sort=False).cumcount()
        key[g["i"].values] = [f"order:{s}:{k}:{nm}" for s, k, nm in zip(g["step"].values, g["k"].values, g["name"].values)]
        source[g["i"].values] = "kernel-order"
    return key, source


def _op_of(extra: pd.DataFrame, ops: pd.DataFrame, todo: np.ndarray) -> np.ndarray:
    """Per activity: the row of the record_param_comms op that launched it (External id, else the launch
    inside the op's span on its thread), -1 for none."""
    out = np.full(len(extra), -1, dtype=np.int64)
    by_ext = pd.Series(np.arange(len(ops)), index=ops["ext_id"].values)
    by_ext = by_ext[~by_ext.index.isna() & ~by_ext.index.duplicated()]
    ext = extra["ext_id"].values.astype(float)
    found = by_ext.reindex(ext).values
    ok = todo & ~np.isnan(found)
    out[ok] = found[ok].astype(np.int64)
    rest = todo & (out < 0) & ~np.isnan(extra["launch_us"].values.astype(float))
    if rest.any():
        lt, ltid = extra["launch_us"].values.astype(float), extra["launch_tid"].values
        for tid in pd.unique(ltid[rest]):
            mine = np.flatnonzero(ops["tid"].values == tid)
            if not len(mine):
                continue
            s, e = ops["ts"].values[mine], ops["end"].values[mine]
            on = np.flatnonzero(rest & (ltid == tid))
            k = np.searchsorted(s, lt[on], side="right") - 1
            inside = (k >= 0) & (lt[on] <= e[np.maximum(k, 0)])
            out[on[inside]] = mine[k[inside]]
    return out


def instances(matched: pd.DataFrame, comm: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From attribute's collectives frame (key, rank, activity, arrival_us, end_us, wait_us, n_ranks,
    matched) and each rank's keyed communication ({rank: frame indexed by activity, with name, step and
    source}): (per (instance, rank) rows with name, step and source added; per instance: key, name, step,
    n_ranks, matched, skew_us, slowest_rank, max_wait_us). taxes.attribution.stragglers sums them per rank."""
    cols = ["key", "name", "step", "source", "n_ranks", "matched", "skew_us", "slowest_rank", "max_wait_us"]
    if matched.empty:
        return matched.assign(name=[], step=[], source=[]), pd.DataFrame(columns=cols)
    m = matched.copy()
    parts = []
    for r, g in m.groupby("rank", sort=False):
        c = comm[r].reindex(g["activity"].values)
        parts.append(pd.DataFrame({"name": c["name"].values, "step": c["step"].values.astype(np.int64),
                                   "source": c["source"].values}, index=g.index))
    m = m.join(pd.concat(parts))
    g = m.groupby("key", sort=False)
    per = g.agg(name=("name", "first"), step=("step", "first"), source=("source", "first"), n_ranks=("rank", "size"),
                matched=("matched", "all"), first=("arrival_us", "min"), last=("arrival_us", "max"),
                max_wait_us=("wait_us", "max")).reset_index()
    per["skew_us"] = np.where(per["matched"], per["last"] - per["first"], np.nan)
    slowest = m.loc[m.groupby("key", sort=False)["arrival_us"].idxmax(), ["key", "rank"]].set_index("key")["rank"]
    per["slowest_rank"] = np.where(per["matched"], slowest.reindex(per["key"]).values, -1)
    return m, per[cols]


def check_one_job(infos: dict, devices: dict, spans: dict) -> list[str]:
    """Refuse traces that cannot be ranks of one job, in one line: different world sizes, different GPU
    kinds, or no time that every rank's activity overlaps. infos: rank -> trace info; devices: rank ->
    GPU name; spans: rank -> (first start, last end) on the common clock, or None when the trace gives no
    way to put it on one (then a note is returned instead of a check)."""
    notes = []
    worlds = {r: i.get("world_size") for r, i in infos.items() if i.get("world_size")}
    if len(set(worlds.values())) > 1:
        raise TaxesError("the traces are not ranks of one job: different world sizes ("
                         + ", ".join(f"rank {r}: {w}" for r, w in sorted(worlds.items())) + ")")
    kinds = {r: d for r, d in devices.items() if d}
    if len(set(kinds.values())) > 1:
        raise TaxesError("the traces are not ranks of one job: different GPUs ("
                         + ", ".join(f"rank {r}: {d}" for r, d in sorted(kinds.items())) + ")")
    known = {r: s for r, s in spans.items() if s is not None}
    if len(known) < len(spans):
        notes.append("some traces carry no base time (baseTimeNanoseconds) nor absolute timestamps: their "
                     "overlap with the other ranks is not checked, and arrival skew compares raw clocks")
    if len(known) > 1:
        lo = max(s[0] for s in known.values())
        hi = min(s[1] for s in known.values())
        if lo >= hi:
            raise TaxesError("the traces are not ranks of one job: their activity never overlaps in time ("
                             + ", ".join(f"rank {r}: {s[0] / 1e6:.3f}-{s[1] / 1e6:.3f} s" for r, s in sorted(known.items()))
                             + ")")
    return notes
