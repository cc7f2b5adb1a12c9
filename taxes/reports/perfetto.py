"""The analysis as a Chrome / Perfetto trace a user can open (ui.perfetto.dev, chrome://tracing).

One process per rank, on the common clock: a track per stream with the device activities (communication
named with the rule that classified it), and beside them the attribution: the step windows (flagged
warm-up and outlier steps say so), every idle gap's pieces by cause laid end to end from the gap's start,
the sync wait of each matched collective instance at its arrival, and where the host was elsewhere
before a host-bound gap.
"""

from __future__ import annotations

import json
import math

import numpy as np

TRACK_STEPS, TRACK_IDLE, TRACK_SYNC, TRACK_HOST = 1, 2, 3, 4
_CAUSE_TITLE = {"launch": "launch", "host": "host-bound", "sync": "host synchronisation", "compile": "compilation",
                "data": "data loading", "graph": "graph gap", "queued": "queued", "unknown": "unattributed"}
MAX_ACTIVITIES = 2_000_000  # per rank; beyond this the kernels are left out, the attribution stays


def _x(name, pid, tid, ts, dur, args=None, cat="taxes"):
    ev = {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": round(float(ts), 3), "dur": round(max(float(dur), 0.0), 3),
          "cat": cat}
    if args:
        ev["args"] = args
    return ev


def events(an) -> list[dict]:
    """Chrome trace events of an Analysis."""
    out = []
    t0 = min(float(tl.windows["start_us"].min()) for tl in an.timelines.values() if len(tl.windows)) if an.timelines else 0.0
    for rank, tl in sorted(an.timelines.items()):
        pid = int(rank)
        out.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": f"rank {rank}"}})
        for tid, title in ((TRACK_STEPS, "steps (taxes)"), (TRACK_IDLE, "idle by cause (taxes)"),
                           (TRACK_SYNC, "sync wait (taxes)"), (TRACK_HOST, "host elsewhere (taxes)")):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": title}})
        for w in tl.windows.itertuples(index=False):
            flag = an.flags.get(w.step)
            out.append(_x(f"step {w.step}" + (f" ({flag})" if flag else ""), pid, TRACK_STEPS, w.start_us - t0,
                          w.end_us - w.start_us))
        acts = tl.activities
        if len(acts) <= MAX_ACTIVITIES:
            streams = sorted(pd_unique(acts["stream"].values))
            for s in streams:
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 100 + int(s) if s >= 0 else 99,
                            "args": {"name": f"stream {s}"}})
            for a in acts.itertuples(index=False):
                args = {"comm": a.comm} if a.comm else None
                if a.collective:
                    args = {**(args or {}), "collective": a.collective}
                out.append(_x(a.name, pid, 100 + int(a.stream) if a.stream >= 0 else 99, a.start_us - t0,
                              a.end_us - a.start_us, args, cat=a.kind))
        g = an.gaps[an.gaps["rank"] == rank] if not an.gaps.empty else an.gaps
        cursor: dict = {}
        for p in g.itertuples(index=False):
            at = cursor.get(p.start_us, p.start_us)
            out.append(_x(_CAUSE_TITLE.get(p.cause, p.cause), pid, TRACK_IDLE, at - t0, p.dur_us, {"step": int(p.step)}))
            cursor[p.start_us] = at + p.dur_us
            if p.cause == "host" and not math.isnan(p.host_start_us):
                out.append(_x("host elsewhere", pid, TRACK_HOST, p.host_start_us - t0, p.host_end_us - p.host_start_us))
        c = an.collectives[(an.collectives["rank"] == rank) & (an.collectives["wait_us"] > 0)] if not an.collectives.empty \
            else an.collectives
        for r in c.itertuples(index=False):
            out.append(_x("sync wait", pid, TRACK_SYNC, r.arrival_us - t0, r.wait_us, {"collective": r.key}))
    return out


def pd_unique(values) -> list:
    return list(dict.fromkeys(int(v) for v in np.asarray(values)))


def dumps(an) -> str:
    """The Perfetto (Chrome JSON) trace as text: the kernels and the attribution's tracks."""
    doc = {"traceEvents": events(an), "displayTimeUnit": "ms",
           "otherData": {"source": "taxes analyze", "hardware_profile": an.hardware or "none"}}
    return json.dumps(doc, allow_nan=False)
