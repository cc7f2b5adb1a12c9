"""What a torch.profiler (Kineto) trace must hold before its events are attributed: refusals of traces whose
analysis would be empty or silently wrong, each one line naming the file and the event.

`check_events(events, path)` takes the events frame of taxes.kineto.load_trace (one row per kept event:
kind, name, ts, dur, correlation, flow_id, ...) and raises TaxesError for:
- a trace without GPU activity (no kernel, memcpy or memset): `{"traceEvents": []}`, `[]`, metadata only,
  or a CPU-only run; there is nothing to attribute;
- two CUDA runtime or driver calls with one correlation id: every API call gets its own, so a repeated id
  is a merged or tampered trace, and launches joined through it would be doubled;
- one correlation id on several GPU activities when it is not a CUDA graph launch's (a graph replay's
  kernels share their launch's id; anything else is launched once);
- two ac2g flow starts with one id at different places (each launch starts one flow);
- an event listed twice (the same kind, name, thread, stream, start and duration).
Each of these changes E2E when attributed (a step's kernels counted twice stretch its span).
"""

from __future__ import annotations

import pandas as pd

from taxes.errors import TaxesError
from taxes.sanitize import printable
from taxes.sanitize import path as shown

GPU_KINDS = ("kernel", "memcpy", "memset")
HOST_KINDS = ("runtime", "driver")


def _fail(path, what: str) -> None:
    raise TaxesError(printable(f"{shown(path)}: {what}", 600))


def _event(row) -> str:
    name = printable(row["name"], 60)
    return f"{name!r} at ts {row['ts']:.3f} us"


def check_events(events: pd.DataFrame, path) -> None:
    """Refuse a trace whose attribution would be empty or wrong (see the module docstring)."""
    kinds = events["kind"] if "kind" in events else pd.Series([], dtype=object)
    gpu = events[kinds.isin(GPU_KINDS)]
    if gpu.empty:
        what = "no events at all" if events.empty else f"{len(events)} host events and no GPU activity"
        _fail(path, f"{what} (no kernel, memcpy or memset): nothing to attribute; record the trace with "
                    "ProfilerActivity.CUDA on a GPU run")
    host = events[kinds.isin(HOST_KINDS) & events["correlation"].notna()]
    dup = host[host["correlation"].duplicated(keep=False)]
    if not dup.empty:
        first = dup.sort_values("ts").iloc[0]
        _fail(path, f"correlation id {int(first['correlation'])} is on {int((host['correlation'] == first['correlation']).sum())} "
                    f"CUDA API calls (first {_event(first)}); each call has its own: the trace is merged or edited")
    graph_ids = set(host.loc[host["name"].astype(str).str.contains("GraphLaunch"), "correlation"])
    acts = gpu[gpu["correlation"].notna() & ~gpu["correlation"].isin(graph_ids)]
    dup = acts[acts["correlation"].duplicated(keep=False)]
    if not dup.empty:
        first = dup.sort_values("ts").iloc[0]
        n = int((acts["correlation"] == first["correlation"]).sum())
        _fail(path, f"correlation id {int(first['correlation'])} is on {n} GPU activities (first {_event(first)}) "
                    "but on no CUDA graph launch: an activity listed twice would be counted twice")
    starts = events[(kinds == "flow_start") & events["flow_id"].notna()]
    starts = starts.drop_duplicates(["flow_id", "pid", "tid", "ts"])  # one start written once per kernel it launched
    dup = starts[starts["flow_id"].duplicated(keep=False)]
    if not dup.empty:
        first = dup.sort_values("ts").iloc[0]
        _fail(path, f"flow id {int(first['flow_id'])} starts twice (first at ts {first['ts']:.3f} us): each launch "
                    "starts one flow")
    key = [c for c in ("kind", "name", "pid", "tid", "stream", "ts", "dur") if c in events]
    dup = events[events.duplicated(key, keep=False) & ~kinds.isin(("flow_start", "flow_end"))]
    if not dup.empty:
        first = dup.sort_values("ts").iloc[0]
        _fail(path, f"the {first['kind']} event {_event(first)} is listed more than once")
