"""Waits at collectives, across ranks and on one: which instances match, how long each rank waited at each
(match_collectives, against each rank's own duration where it waited for nobody: own_durations), how much of a
window's wait the harness's start skew made (start_skews, harness_wait),
how much of a wait held the rank's own next kernel (binding_wait), and how much longer the rank's compute ran
beside a collective that waited (wait_stretch). taxes.attribution.attribute turns them
into rows; docs/method.md states each rule with the known answer that checks it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from taxes.traces.timeline import Timeline, covered, gaps, merge


OWN_REFERENCE_MIN = 5  # instances a rank must have arrived last at before its own duration is its reference


def match_collectives(timelines: list[Timeline], tolerance_us: float = 1.0, reference: dict | None = None) -> pd.DataFrame:
    """One row per (collective instance, rank): key, rank, activity (its index in that rank's activities),
    arrival_us, end_us, wait_us (how much longer the rank's collective took than it takes the rank when it
    waits for nobody, at most the latest arrival minus its own), n_ranks, matched, lead_us (the latest arrival
    minus its own), cls (the collective's place in the program: its kernel's name and occurrence in the step,
    None without steps), last (the rank arrived last). An instance is matched when every rank that has it ran
    it at overlapping times (each rank's end no earlier than the latest arrival, within tolerance_us): a
    collective cannot finish before its last rank arrives. Unmatched instances get no wait; they are listed,
    not guessed. reference: {(rank, cls): us} of durations without a wait measured elsewhere in the same run
    (own_durations of another part of it), used where this part has too few of its own."""
    parts = []
    for tl in timelines:
        a = tl.activities
        sel = a[(a["comm"] != "") & (a["collective"] != "")]
        if sel.empty:
            continue
        # a collective on one rank may span several activities (e.g. NCCL's kernel and a copy): its arrival
        # is the first start, its end the last end
        sel = sel.reset_index()
        named = "name" in sel and "step" in sel
        agg = dict(activity=("index", "first"), arrival_us=("start_us", "min"), end_us=("end_us", "max"))
        if named:
            agg |= dict(name=("name", "first"), step=("step", "first"))
        g = sel.groupby("collective").agg(**agg).reset_index().rename(columns={"collective": "key"})
        if named:
            g = g.sort_values("arrival_us", kind="stable")
            occurrence = g.groupby(["step", "name"], dropna=False).cumcount()
            g["cls"] = [None if pd.isna(s) else f"{n}#{k}" for n, s, k in
                        zip(g["name"], g["step"], occurrence)]
            g = g.drop(columns=["name", "step"]).sort_index()
        else:
            g["cls"] = None
        parts.append(g.assign(rank=tl.rank))
    cols = ["key", "rank", "activity", "arrival_us", "end_us", "wait_us", "n_ranks", "matched", "lead_us", "cls",
            "last"]
    if not parts:
        return pd.DataFrame(columns=cols)
    df = pd.concat(parts, ignore_index=True)
    latest = df.groupby("key")["arrival_us"].transform("max")
    earliest_end = df.groupby("key")["end_us"].transform("min")
    df["n_ranks"] = df.groupby("key")["rank"].transform("count")
    df["matched"] = (df["n_ranks"] > 1) & (earliest_end >= latest - tolerance_us)
    last = df.groupby("key")["arrival_us"].idxmax()
    df["last"] = False
    df.loc[last.to_numpy(), "last"] = True
    # A rank's wait is how much longer its collective took than it takes that rank when it waits for nobody
    # (its median duration where it arrived last, at that place in the program), at most its lead over the last
    # arrival: an early rank's kernel does its own set-up while it waits, so the lead alone overstates what
    # waiting cost it (by 12-16 us of a 2-rank NCCL collective: reports/known_answer/, docs/method.md). Ranks
    # differ in their own durations (a 2-rank reduce-scatter on H200s: 89.2 us on rank 0, 90.9 on rank 1, each
    # arriving last), so another rank's duration is a reference only where the rank has too few of its own:
    # then the last arrival's, which waited for nobody (not the quickest rank's: the least of p noisy
    # durations sits below a typical one, and at 4 GPUs that read every wait a late peer made 1-2 us low).
    dur = df["end_us"] - df["arrival_us"]
    ref_last = df["key"].map(pd.Series(dur.loc[last].to_numpy(), index=df.loc[last, "key"].to_numpy()))
    table = dict(reference or {}) | own_durations(df.assign(dur_us=dur))
    own = pd.Series([table.get((r, c), np.nan) if c is not None else np.nan for r, c in zip(df["rank"], df["cls"])],
                    index=df.index, dtype=float)
    ref = own.fillna(ref_last)
    wait = np.minimum(latest - df["arrival_us"], dur - ref)
    df["wait_us"] = np.where(df["matched"], np.clip(wait, 0.0, None), 0.0)
    df["lead_us"] = np.where(df["matched"], np.clip(latest - df["arrival_us"], 0.0, None), 0.0)
    return df[cols]


def own_durations(coll: pd.DataFrame) -> dict:
    """{(rank, cls): median duration, us} of each rank's collectives at one place in the program where it
    arrived last (waited for nobody), matched across ranks, where it did so at least OWN_REFERENCE_MIN times.
    coll: match_collectives' frame (its durations from end_us - arrival_us where no dur_us is given)."""
    if coll.empty or "cls" not in coll:
        return {}
    c = coll[coll["last"].astype(bool) & coll["matched"].astype(bool) & coll["cls"].notna()]
    if c.empty:
        return {}
    dur = c["dur_us"] if "dur_us" in c else c["end_us"] - c["arrival_us"]
    g = dur.groupby([c["rank"], c["cls"]]).agg(["median", "size"])
    g = g[g["size"] >= OWN_REFERENCE_MIN]
    return {(int(r), str(k)): float(v) for (r, k), v in g["median"].items()}


def start_skews(timelines: list[Timeline]) -> dict:
    """{rank: {step: us}}: how much later than this rank the last rank began the step (the latest window
    start of the step, over the ranks that have it, minus this rank's). Windows of profiled iterations
    start at each rank's start event, recorded as soon as the rank left the host barrier."""
    parts = [tl.windows[["step", "start_us"]].assign(rank=tl.rank) for tl in timelines if len(tl.windows)]
    if not parts:
        return {}
    w = pd.concat(parts, ignore_index=True)
    w["skew"] = w.groupby("step")["start_us"].transform("max") - w["start_us"]
    return {int(r): dict(zip(g["step"], g["skew"].astype(float))) for r, g in w.groupby("rank")}



def binding_wait(arrivals: np.ndarray, ends: np.ndarray, waits: np.ndarray, compute: tuple, comp_starts: np.ndarray,
                 comp_cs: np.ndarray, comp_own_gap: np.ndarray | None = None) -> float:
    """Of the time the rank's collectives waited while it ran no compute (compute: the merged compute
    intervals), how much held the rank's next compute kernel, us. Where compute resumed inside a wait, the
    kernel held the idle before it only if it had been launched before that idle began (it waited on a
    dependency, e.g. an earlier collective); launched during it, the idle was the rank's own host's. Of the
    last compute-idle piece before a wait ends, only the part after the launching call of the first compute
    kernel to start at or after the collective's end counts: that
    kernel starts at max(its launch, the collective's end), so a wait moves it only past the start of its
    launching call, min(piece, end - launch call start). A kernel launched long before (queued, waiting on
    the collective) takes the whole piece; one whose launch began after the collective ended takes none. No
    compute after the collective, or no launch time (comp_cs NaN): the whole piece."""
    we = np.minimum(arrivals + waits, ends)
    has = we > arrivals
    if not has.any():
        return 0.0
    order = np.argsort(comp_starts, kind="stable")
    cst, ccs = comp_starts[order], comp_cs[order]
    own = np.zeros(len(cst)) if comp_own_gap is None else np.nan_to_num(comp_own_gap[order])
    total = 0.0
    for wa, wb in zip(*merge(arrivals[has], we[has])):
        ga, gb = gaps(compute, wa, wb)
        for a, b in zip(ga, gb):
            if b < wb:  # compute resumed inside the wait: held only if that kernel was launched before the idle
                i = np.searchsorted(cst, b, side="left")
                launch = ccs[i] if i < len(cst) else np.nan
                # less the idle the device leaves before that kernel of its own (its median where no wait
                # overlapped): a wait covers the device's own dispatch gaps too, which were not the peer's
                gap_own = own[i] if i < len(own) else 0.0
                total += max(0.0, float(b - a) - gap_own) if (np.isnan(launch) or launch <= a) else 0.0
                continue
            inside = has & (arrivals >= wa) & (we <= wb)
            coll_end = float(ends[inside].max())
            i = np.searchsorted(cst, coll_end, side="left")
            launch = ccs[i] if i < len(cst) else np.nan
            total += float(b - a) if np.isnan(launch) else max(0.0, min(float(b - a), coll_end - launch))
    return total


def harness_wait(skew: float, arrivals: np.ndarray, waits: np.ndarray, leads: np.ndarray, in_kernel: float,
                  sync_wait: float) -> float:
    """How much of a window's sync wait the harness's start skew made. At the first collective the rank waited
    at, the program made the lead less the skew; the wait beyond that is the skew's (an early rank's set-up
    done while it waits absorbs the skew first). Without a collective wait (a fused kernel's own): the wait
    up to the skew."""
    if skew <= 0.0 or sync_wait <= 0.0:
        return 0.0
    waited = np.flatnonzero(waits > 0.0)
    if len(waited):
        first = waited[np.argmin(arrivals[waited])]
        made = max(0.0, float(waits[first]) - max(0.0, float(leads[first]) - skew))
    else:
        made = in_kernel
    return min(skew, made, sync_wait)


def wait_stretch(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, compute: np.ndarray, wait_starts: np.ndarray,
                 wait_ends: np.ndarray) -> np.ndarray:
    """Per activity of one rank: how much longer a compute kernel ran because a collective on another of the
    rank's streams was waiting for a peer beside it. A waiting NCCL kernel keeps its SMs, so compute that
    overlaps the wait runs slower: a DDP step whose gradient all-reduce waits 3 ms for a late rank ends 3 ms
    later, of which 2.3 ms is the overlapped backward kernels' own stretch and only 0.7 ms exposed wait
    (reports/known_answer/, docs/method.md). The stretch of a kernel is its duration minus the median duration
    of the same kernel (keys: its identity, e.g. name and occurrence in its step) where it overlapped no
    wait, within plus or minus its overlap with the waits (a wait can slow a kernel by at most the time they
    shared; a kernel quicker than its median beside a wait offsets one slower, so noise cancels in a sum).
    0 for communication, for kernels beside no wait, and where every instance of the kernel overlapped one."""
    out = np.zeros(len(starts))
    if len(starts) == 0 or not np.any(wait_ends > wait_starts):
        return out
    overlap = covered(merge(wait_starts, wait_ends), starts, ends)
    dur = ends - starts
    base = own_median(keys, dur, compute & (overlap <= 0.0))
    hit = compute & (overlap > 0.0) & ~np.isnan(base)
    out[hit] = np.clip(dur[hit] - base[hit], -overlap[hit], overlap[hit])
    return out


def own_gaps(keys: np.ndarray, starts: np.ndarray, ends: np.ndarray, compute: np.ndarray, wait_starts: np.ndarray,
             wait_ends: np.ndarray) -> np.ndarray:
    """Per activity: the idle the rank's device leaves before this compute kernel of its own, the median over
    the same kernel (keys: name and occurrence in its step) of the idle between the end of the compute before
    it and its start, where no wait overlapped that idle; NaN for communication and for kernels with no such
    instance."""
    out = np.full(len(starts), np.nan)
    idx = np.flatnonzero(compute)
    if len(idx) == 0:
        return out
    order = idx[np.argsort(starts[idx], kind="stable")]
    # the end of the device's compute before each kernel: the running maximum of earlier ends
    prev_end = np.maximum.accumulate(np.concatenate([[-np.inf], ends[order][:-1]]))
    gap = np.clip(starts[order] - prev_end, 0.0, None)
    gap[~np.isfinite(gap)] = np.nan
    hit = covered(merge(wait_starts, wait_ends), np.minimum(prev_end, starts[order]), starts[order]) > 0.0
    out[order] = own_median(keys[order], gap, ~hit)
    return out


def own_median(keys: np.ndarray, values: np.ndarray, free: np.ndarray) -> np.ndarray:
    """Per item: the median of `values` over the items of the same key where `free` (no wait overlapped
    them), the kernel's own figure a wait is measured against; NaN where no item of the key was free."""
    df = pd.DataFrame({"key": keys, "value": values, "free": free})
    return df["key"].map(df[df["free"]].groupby("key")["value"].median()).to_numpy(dtype=float)
