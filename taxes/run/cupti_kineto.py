"""A cupti-python recording written as a Kineto (torch.profiler) trace, so that `taxes analyze` reads it
like any other: `taxes trace --record timing` records the profiled steps this way.

Kernels, copies and memsets become device events (with their launch's correlation id; a graph replay's
kernels carry the graph launch's), recorded host calls runtime or driver events, and the host's profiled
steps (stamped on CUPTI's clock) ProfilerStep#N ranges on the thread that launched most.

A timing record holds no host calls (taxes.run.cupti.Recorder(api="queued"): recording any runtime call made
CUPTI intercept every one, +12-20% of a host-bound step on top of the kernels' own records; see
benchmarks/record_cost.py). Each eager kernel's launch is then [queued, submitted], the times CUPTI saw it
queued and submitted on the host (latency timestamps; launches_from_queued). Copies, memsets and graph
replays carry no latency timestamps of their own (a replay's kernels carry the last eager launch's), so
their launch is placed (inferred_launches): one median launch latency before the activity started, kept
after the launch before it in issue order (correlation ids) and before the one after it, and marked
`inferred` in its args. The idle before such an activity is then split between host_bound and launch by
an estimate; its total is measured. Times are us from the recording's origin (relative timestamps, as
Kineto writes them)."""

from __future__ import annotations

import numpy as np
import pandas as pd

_DEVICE_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def to_kineto(acts: pd.DataFrame, calls: pd.DataFrame, windows_us: list[tuple[float, float]], meta: dict) -> dict:
    """acts, calls: taxes.run.cupti.Recorder.stop()'s frames; windows_us: each profiled step's (start, end), in
    order (steps recorded in blocks leave gaps between them); meta: device (index), gpu (name), pid, rank,
    world_size, base_ns (the recorder's origin on the host's shared clock, ns: every rank's trace counts
    from its own origin, and analysis moves them onto one clock by it), and versions (torch_version, ...)."""
    pid, dev = int(meta.get("pid", 1)), int(meta.get("device", 0))
    tid = int(calls["tid"].mode().iloc[0]) if len(calls) else int(meta.get("tid", 0))  # the launching thread
    inferred = 0
    if "queued_us" in acts:
        eager = acts[~acts["correlation"].isin(calls["correlation"])]
        calls = _concat(calls, launches_from_queued(eager, tid))
        unseen = acts[~acts["correlation"].isin(calls["correlation"])]
        placed = inferred_launches(unseen, calls, tid, queued_latency_us(acts))
        inferred = len(placed)
        calls = _concat(calls, placed)
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    for a in acts.itertuples(index=False):
        events.append({"ph": "X", "cat": _DEVICE_CAT.get(a.kind, "kernel"), "name": str(a.name), "pid": dev,
                       "tid": int(a.stream), "ts": float(a.start_us), "dur": float(a.end_us - a.start_us),
                       "args": {"device": dev, "stream": int(a.stream), "correlation": int(a.correlation)}})
    marked = calls["inferred"].fillna(False).values if "inferred" in calls else [False] * len(calls)
    for c, guess in zip(calls.itertuples(index=False), marked):
        driver = str(c.name).startswith("cu") and not str(c.name).startswith("cuda")
        args = {"correlation": int(c.correlation)}
        if guess:
            args["inferred"] = "placed one launch latency before its activity (no launch time recorded)"
        events.append({"ph": "X", "cat": "cuda_driver" if driver else "cuda_runtime", "name": str(c.name), "pid": pid,
                       "tid": int(c.tid), "ts": float(c.start_us), "dur": float(c.end_us - c.start_us), "args": args})
    for i, (a, b) in enumerate(windows_us):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": pid, "tid": tid,
                       "ts": float(a), "dur": float(b - a), "args": {}})
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms",
           "deviceProperties": [{"id": dev, "name": str(meta.get("gpu", ""))}],
           "taxes_trace_record": "timing", "taxes_inferred_launches": inferred}
    if meta.get("base_ns") is not None:  # the recording's origin on the host's shared clock: the ranks line up
        doc["baseTimeNanoseconds"] = int(meta["base_ns"])
    if meta.get("world_size"):
        doc["distributedInfo"] = {"rank": int(meta.get("rank", 0)), "world_size": int(meta["world_size"]),
                                  "backend": str(meta.get("backend", "nccl"))}
    for key in ("torch_version", "triton_version", "cuda_runtime_version"):
        if meta.get(key) is not None:
            doc[key] = meta[key]
    return doc


def launches_from_queued(acts: pd.DataFrame, tid: int) -> pd.DataFrame:
    """One cudaLaunchKernel per correlation id of eager kernels that carry a queued time: [queued, submitted]
    of its first kernel (submitted before queued, which CUPTI can report, reads as queued)."""
    k = acts[acts["queued_us"].notna()]
    if "graph" in k:
        k = k[k["graph"] < 0]
    first = k.sort_values("queued_us").drop_duplicates("correlation")
    end = first["submitted_us"].where(first["submitted_us"] >= first["queued_us"], first["queued_us"])
    return pd.DataFrame({"name": "cudaLaunchKernel", "kind": "launch", "start_us": first["queued_us"].values,
                         "end_us": end.values, "correlation": first["correlation"].values, "tid": tid},
                        index=range(len(first)))


def queued_latency_us(acts: pd.DataFrame) -> float:
    """The median time from an eager kernel's submission to its start, over kernels that started on an idle
    device (nothing that started before them was still running); 0 without any."""
    if "submitted_us" not in acts or acts.empty:
        return 0.0
    a = acts.sort_values("start_us")
    busy_until = a["end_us"].cummax().shift(1).fillna(-float("inf")).values
    eager = (a["submitted_us"].notna() & (a.get("graph", -1) < 0)).values
    idle = eager & (a["start_us"].values >= busy_until)
    lat = (a["start_us"] - a["submitted_us"]).values[idle]
    return float(pd.Series(lat).median()) if len(lat) else 0.0


def inferred_launches(unseen: pd.DataFrame, known: pd.DataFrame, tid: int, latency_us: float) -> pd.DataFrame:
    """A launch call for each correlation id of `unseen` (activities whose launch was not recorded): [t, t]
    with t = its first activity's start - latency_us, kept at or after the end of the known launch before it
    in correlation order and at or before the start of the one after it; cudaGraphLaunch for a graph
    replay, cudaMemcpyAsync / cudaMemsetAsync for copies and memsets, cudaLaunchKernel otherwise."""
    if unseen.empty:
        return pd.DataFrame(columns=["name", "kind", "start_us", "end_us", "correlation", "tid", "inferred"])
    first = unseen.sort_values("start_us").drop_duplicates("correlation").sort_values("correlation")
    k = known.sort_values("correlation")
    kc = k["correlation"].values
    i = np.searchsorted(kc, first["correlation"].values)
    lo = np.where(i > 0, k["end_us"].values[np.maximum(i - 1, 0)] if len(k) else -np.inf, -np.inf)
    hi = np.where(i < len(kc), k["start_us"].values[np.minimum(i, len(kc) - 1)] if len(k) else np.inf, np.inf)
    t = np.minimum(np.maximum(first["start_us"].values - latency_us, lo), np.maximum(hi, lo))
    t = np.minimum(t, first["start_us"].values)  # never after the activity it launched
    graph = (first["graph"].values >= 0) if "graph" in first else np.zeros(len(first), dtype=bool)
    kind = first["kind"].values
    name = np.where(graph, "cudaGraphLaunch", np.where(kind == "memcpy", "cudaMemcpyAsync",
                                                       np.where(kind == "memset", "cudaMemsetAsync", "cudaLaunchKernel")))
    return pd.DataFrame({"name": name, "kind": np.where(graph, "graph", "launch"), "start_us": t, "end_us": t,
                         "correlation": first["correlation"].values, "tid": tid, "inferred": True})


def _concat(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    parts = [x for x in (a, b) if len(x)]
    return pd.concat(parts, ignore_index=True) if parts else a
