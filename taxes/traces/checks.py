"""What a torch.profiler (Kineto) trace must hold before its events are attributed, and the recorder's quirks
repaired rather than refused.

`repair_events(events, path)` takes the events frame of taxes.traces.kineto.load_trace (one row per kept event:
kind, name, pid, tid, ts, dur, correlation, flow_id, ...) and returns (events, graph ids, note):

- refused, in one line: a trace without GPU activity (no kernel, memcpy or memset): `{"traceEvents": []}`,
  `[]`, metadata only, or a CPU-only run; there is nothing to attribute. Nothing else is refused here: a
  duplicate or dangling record is the recorder's quirk, not the user's fault.
- an event listed twice, identical in every field the analysis keeps (kind, name, pid, tid, ts, dur,
  correlation, External id, stream, device, flow id, record-function id): the copy is dropped. Two calls
  that differ only in their ids (two cudaPeekAtLastError in one microsecond) are two calls, kept.
- CUDA runtime or driver calls sharing one correlation id (every API call has its own): the first (by
  time, then file order) is kept, the others dropped; launches joined through the id would be doubled.
- one correlation id on several GPU activities:
    with a CUDA graph launch of that id: a graph replay, as it should be;
    with no host call of that id at all: a graph replay whose launch the record missed (launched before
      recording began): attached as one replay (its id is returned among the graph ids), launched in no
      step, so charged to none;
    with another host call of that id: the first activity keeps it, the others are dropped (a copy of a
      kernel written again later would stretch its step).
- ac2g flow starts of one id at different places: the first is kept.
The note is one line saying what was dropped or attached and how much device time it held (None when the
trace needed nothing). Each of these would change E2E when attributed (a step's kernels counted twice
stretch its span).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from taxes.errors import TaxesError
from taxes.sanitize import path as shown
from taxes.sanitize import printable

GPU_KINDS = ("kernel", "memcpy", "memset")
HOST_KINDS = ("runtime", "driver")
IDENTITY = ("kind", "name", "pid", "tid", "ts", "dur", "correlation", "ext_id", "stream", "device", "flow_id", "rf_id")


def _fail(path, what: str) -> None:
    raise TaxesError(printable(f"{shown(path)}: {what}", 600))


# Complete events of other recorders that look like device activity but are no timeline of one
NOT_A_TIMELINE = {
    "cuda_profiler_range": "CUPTI's counter ranges, each kernel replayed alone to read its counters, so their "
                           "times are no timeline; record without counter metrics (experimental_config) for one",
}
OTHER_DEVICES = ("mtia",)  # accelerators whose activity taxes does not read (NVIDIA and AMD GPUs only)


def _not_gpu(skipped: dict) -> str:
    """What the trace held instead of GPU activity, for the refusal: '' when nothing says more."""
    for cat, n in skipped.items():
        if cat in NOT_A_TIMELINE:
            return f"; its {n} {cat} events are {NOT_A_TIMELINE[cat]}"
    for cat, n in skipped.items():
        if cat.lower().startswith(OTHER_DEVICES):
            return f"; its {n} {cat} events are another accelerator's, and taxes reads NVIDIA and AMD GPU activity only"
    return ""


def check_events(events: pd.DataFrame, path) -> None:
    """Refuse, in one line, a trace with nothing to attribute (no GPU activity), naming what it held instead
    where a known recorder's events say (events.attrs["trace"]["skipped"], taxes.traces.kineto.load_trace)."""
    kinds = events["kind"] if "kind" in events else pd.Series([], dtype=object)
    if not kinds.isin(GPU_KINDS).any():
        what = "no events at all" if events.empty else f"{len(events)} host events and no GPU activity"
        instead = _not_gpu(events.attrs.get("trace", {}).get("skipped") or {})
        _fail(path, f"{what} (no kernel, memcpy or memset): nothing to attribute{instead or '; record the trace with ProfilerActivity.CUDA on a GPU run'}")


def repair_events(events: pd.DataFrame, path) -> tuple[pd.DataFrame, set, str | None]:
    """(events without the recorder's duplicates, correlation ids of graph replays whose launch is missing,
    one line saying what changed or None); see the module docstring."""
    check_events(events, path)
    kinds = events["kind"].values
    gpu = np.isin(kinds, GPU_KINDS)
    drop = np.zeros(len(events), dtype=bool)
    parts = []
    # 1. exact copies
    key = [c for c in IDENTITY if c in events]
    # Kineto writes a launch's flow start once per activity it launched: those copies are the format's.
    # Only events sharing a start, a duration and a thread can be copies: compare every field on those alone.
    copies = np.zeros(len(events), dtype=bool)
    maybe = events.duplicated(["ts", "dur", "tid"], keep=False).values & ~np.isin(kinds, ("flow_start", "flow_end"))
    if maybe.any():
        copies[maybe] = events[maybe].duplicated(key, keep="first").values
    if copies.any():
        drop |= copies
        parts.append(f"dropped {int(copies.sum())} events listed twice ({_device_us(events, copies & gpu)})")
    # 2. host calls sharing a correlation id: keep the first in time
    host = np.isin(kinds, HOST_KINDS) & events["correlation"].notna().values & ~drop
    if host.any():
        h = events[host].sort_values("ts", kind="stable")
        again = h.index[h["correlation"].duplicated(keep="first").values]
        if len(again):
            drop[events.index.get_indexer(again)] = True
            parts.append(f"dropped {len(again)} CUDA API calls reusing an earlier call's correlation id")
    # 3. GPU activities sharing a correlation id
    kept_host = np.isin(kinds, HOST_KINDS) & events["correlation"].notna().values & ~drop
    names = events["name"].values
    graph_launch = kept_host & pd.Series(names).astype(str).str.contains("GraphLaunch", regex=False).values
    graph_ids = set(events["correlation"].values[graph_launch].tolist())
    host_ids = set(events["correlation"].values[kept_host].tolist())
    acts = gpu & events["correlation"].notna().values & ~drop
    a = events[acts]
    shared = a[a["correlation"].duplicated(keep=False).values & ~a["correlation"].isin(graph_ids).values]
    unlaunched: set = set()
    if not shared.empty:
        dangling = ~shared["correlation"].isin(host_ids).values
        replays = shared[dangling]
        if len(replays):
            unlaunched = set(replays["correlation"].tolist())
            parts.append(f"attached {len(replays)} GPU activities of {len(unlaunched)} CUDA graph replay(s) whose launch "
                         f"was not recorded, as replays launched in no step ({_us(replays['dur'].sum())} of device time)")
        conflict = shared[~dangling].sort_values("ts", kind="stable")
        later = conflict.index[conflict["correlation"].duplicated(keep="first").values]
        if len(later):
            mask = np.zeros(len(events), dtype=bool)
            mask[events.index.get_indexer(later)] = True
            drop |= mask
            parts.append(f"dropped {len(later)} GPU activities reusing a launched activity's correlation id "
                         f"({_device_us(events, mask)})")
    # 4. flow starts of one id at different places: the first stands
    starts = (kinds == "flow_start") & events["flow_id"].notna().values & ~drop
    if starts.any():
        f = events[starts].drop_duplicates(["flow_id", "pid", "tid", "ts"]).sort_values("ts", kind="stable")
        moved = f.index[f["flow_id"].duplicated(keep="first").values]
        if len(moved):
            again = events.index[starts][events.loc[starts, "flow_id"].isin(f.loc[moved, "flow_id"]).values]
            first_at = f.drop_duplicates("flow_id").set_index("flow_id")["ts"]
            bad = again[events.loc[again, "ts"].values != first_at.reindex(events.loc[again, "flow_id"]).values]
            drop[events.index.get_indexer(bad)] = True
            parts.append(f"dropped {len(moved)} launch flows started again elsewhere")
    if not parts:
        return events, set(), None
    out = events[~drop]
    out.attrs = events.attrs
    return out, unlaunched, "repaired the recorder's duplicate or dangling records: " + "; ".join(parts)


def _device_us(events: pd.DataFrame, mask: np.ndarray) -> str:
    return f"{_us(float(events['dur'].values[mask].sum()))} of device time"


def _us(x: float) -> str:
    return f"{x:,.1f} us"
