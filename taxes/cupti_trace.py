"""A cupti-python recording written as a Kineto (torch.profiler) trace, so that `taxes analyze` reads it
like any other: `taxes trace --record timing` records the profiled steps this way.

Kernels, copies and memsets become device events (with their launch's correlation id; a graph replay's
kernels carry the graph launch's), the launch, graph-launch and synchronisation calls runtime or driver
events, and the host's profiled steps (stamped on CUPTI's clock) ProfilerStep#N ranges on the thread that
launched most. A recording whose eager launch calls were not recorded (taxes.cupti.Recorder(api="queued"))
gets one launch call per eager kernel's correlation id instead, from when CUPTI saw the kernel queued to when
it was submitted, on the thread that made the recorded calls (or the stepping thread): a copy's launch is
not seen and stays without one, and a graph replay's kernels keep their recorded graph launch (their own
latency timestamps are not theirs). Times are us from the recording's origin (relative timestamps, as Kineto
writes them)."""

from __future__ import annotations

import pandas as pd

_DEVICE_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}


def to_kineto(acts: pd.DataFrame, calls: pd.DataFrame, windows_us: list[tuple[float, float]], meta: dict) -> dict:
    """acts, calls: taxes.cupti.Recorder.stop()'s frames; windows_us: each profiled step's (start, end), in
    order (steps recorded in blocks leave gaps between them); meta: device (index), gpu (name), pid, rank,
    world_size, and versions (torch_version, ...)."""
    pid, dev = int(meta.get("pid", 1)), int(meta.get("device", 0))
    if "queued_us" in acts:
        tid = int(calls["tid"].mode().iloc[0]) if len(calls) else int(meta.get("tid", 0))
        eager = acts[~acts["correlation"].isin(calls["correlation"])]
        calls = pd.concat([c for c in (calls, launches_from_queued(eager, tid)) if len(c)] or [calls],
                          ignore_index=True)
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    for a in acts.itertuples(index=False):
        events.append({"ph": "X", "cat": _DEVICE_CAT.get(a.kind, "kernel"), "name": str(a.name), "pid": dev,
                       "tid": int(a.stream), "ts": float(a.start_us), "dur": float(a.end_us - a.start_us),
                       "args": {"device": dev, "stream": int(a.stream), "correlation": int(a.correlation)}})
    for c in calls.itertuples(index=False):
        driver = str(c.name).startswith("cu") and not str(c.name).startswith("cuda")
        events.append({"ph": "X", "cat": "cuda_driver" if driver else "cuda_runtime", "name": str(c.name), "pid": pid,
                       "tid": int(c.tid), "ts": float(c.start_us), "dur": float(c.end_us - c.start_us),
                       "args": {"correlation": int(c.correlation)}})
    tid = int(calls["tid"].mode().iloc[0]) if len(calls) else int(meta.get("tid", 0))
    for i, (a, b) in enumerate(windows_us):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": pid, "tid": tid,
                       "ts": float(a), "dur": float(b - a), "args": {}})
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms",
           "deviceProperties": [{"id": dev, "name": str(meta.get("gpu", ""))}],
           "taxes_trace_record": "timing"}
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
