"""One timeline per rank: what ran on the device and what the host did to launch it, on one clock.

Both `taxes profile` (CUPTI activity records while our variants run) and `taxes analyze` (Kineto traces of
any program) fill the same record, and one attribution (taxes.attribution.attribute) reads it. Times are
microseconds on the rank's clock (CUPTI's timestamps, or the trace's); ranks of one host share it.

    activities  device work, one row each (ACTIVITY_COLUMNS):
                name; kind (kernel | memcpy | memset); stream; start_us, end_us; correlation (of the host
                call that launched it: a launch, or the graph launch that replayed it); graph (that graph
                launch's correlation, -1 when launched eagerly); comm (the rule that made it
                communication, "" for compute); collective (an instance key "group:seq" or "");
                phase (the step of a profiled variant it belongs to, or ""); floor_us (the kernel's own
                floor, NaN when unknown); wait_us (time it spent waiting on peers, measured inside it,
                0 when not traced); step (the window it was launched in; -1: the window its start falls in).
    launches    host API calls (LAUNCH_COLUMNS): name, kind (launch | graph | sync | other), start_us,
                end_us, correlation, tid. A launch's end is when the call returned.
    host        host ranges (HOST_COLUMNS): name, kind, start_us, end_us, tid. kind "call" marks a call
                that launches device work (a profiled step, a top-level CPU op): the time inside it
                before its launch returned is the launch path. Other kinds name what the host was busy
                with instead: compile, data (a data loader), python.
    windows     the analysed intervals (WINDOW_COLUMNS): step, start_us, end_us, and for profiled
                iterations e2e_us (the iteration's end-to-end time from device events, which the window
                spans). Only activities launched inside a window belong to it.
    extra       what a Kineto trace adds per activity, row for row (EXTRA_COLUMNS): device, ext_id (the
                launching op's External id), launch_tid, launch_us, launch_api, pg, seq (the process group
                and sequence number recorded on the kernel); None for records of our own runs.
    key_source  per activity, how its collective key was found (taxes.traces.collectives: seq | group-order
                | graph-order, "" for none); None until the keys are found.

A Timeline is a value: its fields cannot be assigned, and every stage that changes one (steps, keys, a
clock shift, floors) returns a new Timeline with new frames (dataclasses.replace), leaving its input as it was.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

ACTIVITY_COLUMNS = ("name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm", "collective",
                    "phase", "floor_us", "wait_us", "step")
LAUNCH_COLUMNS = ("name", "kind", "start_us", "end_us", "correlation", "tid")
HOST_COLUMNS = ("name", "kind", "start_us", "end_us", "tid")
WINDOW_COLUMNS = ("step", "start_us", "end_us", "e2e_us")
EXTRA_COLUMNS = ("device", "ext_id", "launch_tid", "launch_us", "launch_api", "pg", "seq")
_ACTIVITY_DEFAULTS = {"kind": "kernel", "stream": 0, "correlation": -1, "graph": -1, "comm": "", "collective": "",
                      "phase": "", "floor_us": np.nan, "wait_us": 0.0, "step": -1}


@dataclass(frozen=True, eq=False)  # eq=False: frames have no single truth value; a Timeline is compared by identity
class Timeline:
    """One rank's record (see the module docstring for the fields and their columns)."""

    rank: int
    activities: pd.DataFrame
    launches: pd.DataFrame
    host: pd.DataFrame
    windows: pd.DataFrame
    meta: dict = field(default_factory=dict)  # device name, clock, source ("cupti", "torch.profiler", "trace")
    extra: pd.DataFrame | None = None  # EXTRA_COLUMNS per activity (Kineto traces only)
    key_source: np.ndarray | None = None  # per activity: how its collective key was found


TIME_COLUMNS = {"activities": ("start_us", "end_us"), "launches": ("start_us", "end_us"), "host": ("start_us", "end_us"),
                "windows": ("start_us", "end_us")}


def shifted(tl: Timeline, dt: float) -> Timeline:
    """The timeline with every time moved by dt us (onto another clock); tl itself is left as it was."""
    if not dt:
        return tl
    moved = {key: getattr(tl, key).assign(**{c: getattr(tl, key)[c] + dt for c in cols})
             for key, cols in TIME_COLUMNS.items()}
    extra = tl.extra.assign(launch_us=tl.extra["launch_us"] + dt) if tl.extra is not None else None
    return replace(tl, **moved, extra=extra)


def frame(rows, columns, defaults: dict | None = None) -> pd.DataFrame:
    """A frame with exactly `columns` from dict rows (or a frame); missing columns take their defaults."""
    df = pd.DataFrame(rows if rows is not None else [])
    for c in columns:
        d = (defaults or {}).get(c, np.nan)
        if c not in df.columns:
            df[c] = d
        elif not (isinstance(d, float) and np.isnan(d)):
            df[c] = df[c].fillna(d)
    return df[list(columns)].reset_index(drop=True)


def timeline(rank: int, activities, launches=None, host=None, windows=None, meta: dict | None = None,
             extra=None) -> Timeline:
    """Build a Timeline from rows (lists of dicts or frames), filling unset columns with their defaults.
    extra: EXTRA_COLUMNS row for row with `activities` (which are then sorted by start together)."""
    acts = frame(activities, ACTIVITY_COLUMNS, _ACTIVITY_DEFAULTS)
    acts = acts.astype({"start_us": float, "end_us": float, "floor_us": float, "wait_us": float})
    order = acts.sort_values(["start_us", "end_us"], kind="stable").index.values  # positions: frame() numbered them
    acts = acts.iloc[order].reset_index(drop=True)
    if extra is not None:
        extra = frame(extra, EXTRA_COLUMNS).iloc[order].reset_index(drop=True)
    return Timeline(rank, acts, frame(launches, LAUNCH_COLUMNS, {"kind": "launch", "tid": 0}),
                    frame(host, HOST_COLUMNS, {"tid": 0}), frame(windows, WINDOW_COLUMNS), dict(meta or {}), extra)


class HostStamps:
    """A recorder's host ranges: stamps on its clock around each step (iteration) and each launching call
    (kind "step" named "step N", kind "call" named after the call). Stamps are taken raw (now_raw(), an
    integer clock reading: cheap enough to sit between launches) and converted to us (to_us) at the end."""

    name = "stamps"
    shared_origin_us: float | None = None  # this recorder's time 0 on the host's shared clock (shared_clock_offset_ns)

    def __init__(self):
        self.raw: list = []  # (kind, name, start raw, end raw)

    def now_raw(self) -> int:
        raise NotImplementedError

    def to_us(self, raw: int) -> float:
        raise NotImplementedError

    def now_us(self) -> float:
        return self.to_us(self.now_raw())

    @contextlib.contextmanager
    def step(self, i: int):
        a = self.now_raw()
        try:
            yield
        finally:
            self.raw.append(("step", f"step {i}", a, self.now_raw()))

    @contextlib.contextmanager
    def call(self, name: str):
        a = self.now_raw()
        try:
            yield
        finally:
            self.raw.append(("call", name, a, self.now_raw()))

    def host_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"name": n, "kind": k, "start_us": self.to_us(a), "end_us": self.to_us(b)}
                             for k, n, a, b in self.raw], columns=["name", "kind", "start_us", "end_us"])


def shared_clock_offset_ns(read_ns, tries: int = 9) -> int:
    """ns to add to a reading of the clock `read_ns()` (integer ns) to put it on the host's shared clock,
    CLOCK_MONOTONIC, which every process of the host reads alike: the tightest of `tries` brackets
    monotonic-reading-monotonic (a bracket is about a microsecond wide, so ranks' records line up to about
    that). Recorders of every rank pair their own clock with it when they start, so their records can be
    put on one clock (taxes.traces.records.on_one_clock) whatever each recorder's own origin is."""
    best = None
    for _ in range(tries):
        m0 = time.monotonic_ns()
        r = int(read_ns())
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, (m0 + m1) // 2 - r)
    return best[1]


# ---- host calls ----------------------------------------------------------------------------------

# The CUDA runtime and driver calls a timeline keeps, by what they do (names without version suffixes).
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
                "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cudaMemcpyAsync", "cudaMemcpy2DAsync",
                "cudaMemcpyPeerAsync", "cudaMemsetAsync", "cudaMemset2DAsync", "cuMemcpyAsync", "cuMemcpyDtoDAsync",
                "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync", "cuMemcpyPeerAsync", "cuMemsetD8Async", "cuMemsetD16Async",
                "cuMemsetD32Async",
                # HIP (ROCm traces)
                "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
                "hipLaunchCooperativeKernel", "hipMemcpyAsync", "hipMemcpy2DAsync", "hipMemcpyPeerAsync",
                "hipMemsetAsync", "hipMemsetD32Async", "hipMemsetD8Async"}
GRAPH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"}
SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cudaMemcpy", "cuMemcpy",
              "cuMemcpyDtoH", "cuMemcpyHtoD", "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
              "hipMemcpy", "hipMemcpyWithStream"}


def api_name(cbid_name: str) -> str:
    """cupti-python's callback-id name -> the API's name: cudaLaunchKernel_ptsz_v7000 -> cudaLaunchKernel."""
    name = re.sub(r"^_(runtime|driver)_api_trace_cbid__", "", cbid_name)
    name = re.sub(r"_v\d+$", "", name)
    return re.sub(r"_ptsz$|_ptds$", "", name)


def api_kind(name: str) -> str | None:
    """launch | graph | sync for the host calls a timeline needs (by API name); None for the rest."""
    name = api_name(name)
    if name in GRAPH_CALLS:
        return "graph"
    if name in SYNC_CALLS:
        return "sync"
    if name in LAUNCH_CALLS:
        return "launch"
    return None


# ---- intervals ------------------------------------------------------------------------------------


def merge(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """The union of [start, end) intervals as sorted, disjoint (starts, ends)."""
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def measure(merged: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> float:
    """Length of the union `merged` inside [lo, hi)."""
    s, e = merged
    if s.size == 0 or hi <= lo:
        return 0.0
    return float(np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0.0, None).sum())


def covered(merged: tuple[np.ndarray, np.ndarray], lo, hi) -> np.ndarray:
    """Vectorised measure: for arrays lo, hi, the length of the union inside each [lo_i, hi_i)."""
    s, e = merged
    lo = np.asarray(lo, dtype=float)
    hi = np.asarray(hi, dtype=float)
    if s.size == 0:
        return np.zeros(lo.shape)
    cum = np.concatenate([[0.0], np.cumsum(e - s)])

    def upto(t):  # union length in (-inf, t)
        i = np.searchsorted(s, t, side="right")  # intervals starting at or before t
        j = np.maximum(i - 1, 0)
        part = np.where(i > 0, np.clip(np.minimum(e[j], t) - s[j], 0.0, None), 0.0)
        return cum[j] + part

    return np.clip(upto(np.maximum(hi, lo)) - upto(lo), 0.0, None)


def union(*merged: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return merge(np.concatenate([m[0] for m in merged]), np.concatenate([m[1] for m in merged]))


def gaps(merged: tuple[np.ndarray, np.ndarray], lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """The parts of [lo, hi) not covered by `merged`, as (starts, ends)."""
    s, e = merged
    keep = (e > lo) & (s < hi)
    s, e = np.clip(s[keep], lo, hi), np.clip(e[keep], lo, hi)
    a = np.concatenate([[lo], e])
    b = np.concatenate([s, [hi]])
    ok = b > a
    return a[ok], b[ok]


# ---- stored form ----------------------------------------------------------------------------------

_STORED = {"activities": ("name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm", "collective",
                          "phase", "step"),
           "launches": ("name", "kind", "start_us", "end_us", "correlation", "tid"),
           "host": ("name", "kind", "start_us", "end_us", "tid"),
           "windows": ("step", "start_us", "end_us", "e2e_us")}


def to_columns(tl: Timeline) -> dict:
    """A Timeline as plain JSON columns (times in us from the first window's start, to the nanosecond), so
    a result document can be attributed again later. Launches and host ranges keep only what the rules
    read (launch, graph and sync calls; launching calls, steps, compile and data ranges)."""
    base = float(tl.windows["start_us"].min()) if len(tl.windows) else 0.0
    parts = {"activities": tl.activities, "launches": tl.launches[tl.launches["kind"].isin(("launch", "graph", "sync"))],
             "host": tl.host[tl.host["kind"].isin(("call", "step", "compile", "data"))], "windows": tl.windows}
    out = {"rank": tl.rank, "base_us": base, "meta": {k: v for k, v in tl.meta.items() if isinstance(v, (str, int, float))}}
    for key, cols in _STORED.items():
        f = parts[key]
        col = {}
        for c in cols:
            v = f[c]
            if c.endswith("_us"):
                col[c] = [None if x != x else round(float(x) - (base if c != "e2e_us" else 0.0), 3) for x in v]
            elif c in ("stream", "correlation", "graph", "step"):
                col[c] = [int(x) for x in v]
            else:
                col[c] = [str(x) for x in v]
        out[key] = col
    return out


def from_columns(d: dict) -> Timeline:
    """The inverse of to_columns (times stay relative to the first window's start)."""
    frames = {}
    for key, cols in _STORED.items():
        src = d.get(key) or {}
        frames[key] = pd.DataFrame({c: src.get(c, []) for c in cols})
        for c in cols:
            if c.endswith("_us"):
                frames[key][c] = frames[key][c].astype(float)
    return timeline(int(d.get("rank", 0)), frames["activities"], frames["launches"], frames["host"],
                    frames["windows"], d.get("meta"))
