"""Instrumented iterations: the plain timing's barrier-aligned iterations with a per-kernel clock on.

Each iteration: the device synchronised and all ranks at a barrier, a host stamp (the step begins), a
start event, the variant (eager: each of its steps inside a host stamp pair, the launching call; graphed:
one replay), an end event. The clock (a recorder) records every device activity and launch call; the
events give the iteration's end-to-end time, exactly as in the plain timing, so the difference between the
two is what measuring cost (`measurement cost`). `assemble` turns the records into a Timeline: each
activity belongs to the iteration whose host span holds its launch, and its window is the event-timed
E2E ending where the iteration's last activity ended.

Recorders: cupti-python (taxes.cupti), torch.profiler (taxes.kineto), and on emulated ranks the host
clock itself (each step's call is its own activity: the logic runs, the times mean nothing).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pandas as pd

from taxes.timeline import HostStamps, Timeline, shared_clock_offset_ns, timeline

CLOCKS = ("cupti", "torch.profiler")


class HostRecorder(HostStamps):
    """Emulated ranks: no device clock; every launching call is an activity spanning the call (the logic
    runs; the times mean nothing)."""

    name = "host"

    def __init__(self):
        super().__init__()
        self.t0 = time.perf_counter_ns()
        self.now_raw = time.perf_counter_ns
        self.shared_origin_us = (self.t0 + shared_clock_offset_ns(time.perf_counter_ns)) / 1e3

    def to_us(self, raw: int) -> float:
        return (raw - self.t0) / 1e3

    def start(self) -> "HostRecorder":
        return self

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        host = self.host_frame()
        calls = host[host["kind"] == "call"].to_dict("records")
        acts = [{"name": c["name"], "kind": "kernel", "start_us": c["start_us"], "end_us": c["end_us"], "correlation": i,
                 "graph": -1, "comm": "", "stream": 0} for i, c in enumerate(calls)]
        launches = [{"name": "call", "kind": "launch", "start_us": c["start_us"], "end_us": c["start_us"],
                     "correlation": i, "tid": 0} for i, c in enumerate(calls)]
        return pd.DataFrame(acts), pd.DataFrame(launches), host


class ProfilerRecorder:
    """The clock without cupti-python: torch.profiler (CPU and CUDA activities), read back through
    to_timeline. Our steps and calls are record_function ranges (taxes:step:N, taxes:call:NAME)."""

    name = "torch.profiler"
    shared_origin_us: float | None = None

    def start(self) -> "ProfilerRecorder":
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        self._prof.__enter__()
        return self

    def step(self, i: int):
        from torch.profiler import record_function

        return record_function(f"taxes:step:{i}")

    def call(self, name: str):
        from torch.profiler import record_function

        return record_function(f"taxes:call:{name}")

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        import tempfile
        from pathlib import Path

        self._prof.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "trace.json"
            self._prof.export_chrome_trace(str(path))
            from taxes.kineto import load_trace, to_timeline

            events = load_trace(path)
            tl = to_timeline(events, 0)
        info = events.attrs.get("trace", {})
        absolute_ns = (info.get("base_ns") or 0) + (info.get("origin_us") or 0) * 1000
        # the trace's times are us from an absolute origin on the host's wall clock: that origin on the shared clock
        self.shared_origin_us = ((absolute_ns + shared_clock_offset_ns(time.time_ns)) / 1e3) if absolute_ns else None
        return tl.activities, tl.launches, tl.host


def make_recorder(clock: str, on_gpu: bool, api: str = "warmup"):
    """A fresh recorder: cupti-python or torch.profiler on a GPU; the host clock on emulated ranks. api (cupti):
    record launch calls in every iteration ("all"), in the warm-up only ("warmup"), or never ("none": device
    activities alone, launches placed from another block's warm-up, see assemble)."""
    if not on_gpu:
        return HostRecorder()
    if clock == "cupti":
        from taxes.cupti import Recorder

        return Recorder(api)
    return ProfilerRecorder()


def record_iterations(ctx, runner, input_sets: list, iters: int, warmup: int, recorder, graph: bool,
                      fused: bool, trace_of=None, capture_after_start: bool = False, align=None) -> dict:
    """Run warmup + iters instrumented iterations; returns this rank's raw records: {"activities",
    "launches", "host", "iterations": [{"step", "e2e_us", "waits": {phase: us}, "warmup"}], "clock"}.
    trace_of(runner) -> {phase: mean in-kernel wait us} of the last call, for fused kernels' traced builds.
    align: as in taxes.harness.time_iterations (launched before the step begins: its work is no step's)."""
    import torch

    on_gpu = ctx.device.type == "cuda"
    graphs: dict = {}
    iterations = []
    if on_gpu:
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_ev.record()
        end_ev.record()
        end_ev.synchronize()
    def capture():  # host steps (a planted spin) launch nothing: they run before each replay instead
        for k, inputs in enumerate(input_sets):
            graphs[k] = _capture([s for s in runner.phases(*inputs, traced=fused) if s[1] != "host"])

    if graph and on_gpu and not capture_after_start:  # a capture's launches run nothing: no records of them
        capture()
    rec = recorder.start()
    if graph and on_gpu and capture_after_start:  # instantiated under the clock (cheaper replays, if the clock
        capture()  # instruments a graph once when it is instantiated)
    lean = isinstance(rec, HostStamps)  # raw stamps appended inline: no context managers between launches
    now, stamps = (rec.now_raw, rec.raw) if lean else (None, None)
    # the warm-up iterations teach the launch sequence (API records), the timed ones pay less without them;
    # the first iteration after the switch pays for it (4-50 us more than the next on the H100 at flash decode
    # B=1, S=128K), so with two or more warm-ups the last one already runs as the timed ones will
    api_off_at = warmup - 1 if warmup >= 2 else warmup
    try:
        for i in range(warmup + iters):
            if i == api_off_at and hasattr(rec, "api_off"):
                rec.api_off()
            k = i % len(input_sets)
            steps = None if (graph and on_gpu) else runner.phases(*input_sets[k], traced=fused)
            host_first = [f for _, role, f in runner.phases(*input_sets[k], traced=fused) if role == "host"] \
                if steps is None else []
            if on_gpu:
                torch.cuda.synchronize()
            ctx.barrier()
            if align is not None:
                align()
            if lean:
                h0 = now()
                if on_gpu:
                    start_ev.record()
                if steps is None:
                    for thunk in host_first:
                        thunk()
                    a = now()
                    graphs[k].replay()
                    stamps.append(("call", "graph replay", a, now()))
                else:
                    for name, role, thunk in steps:
                        if role == "host":  # host work that launches nothing (a planted spin)
                            thunk()
                            continue
                        a = now()
                        thunk()
                        stamps.append(("call", name, a, now()))
                if on_gpu:
                    end_ev.record()
                stamps.append(("step", f"step {i}", h0, now()))
            else:
                with rec.step(i):
                    if on_gpu:
                        start_ev.record()
                    if steps is None:
                        for thunk in host_first:
                            thunk()
                        with rec.call("graph replay"):
                            graphs[k].replay()
                    else:
                        for name, role, thunk in steps:
                            if role == "host":
                                thunk()
                                continue
                            with rec.call(name):
                                thunk()
                    if on_gpu:
                        end_ev.record()
            if on_gpu:
                end_ev.synchronize()
                e2e = start_ev.elapsed_time(end_ev) * 1e3
            else:
                e2e = math.nan  # the host clock's window: set from the step's span in assemble
            waits = trace_of(runner) if (fused and trace_of) else {}
            iterations.append({"step": i, "e2e_us": e2e, "waits": waits or {}, "warmup": i < warmup})
    finally:
        acts, launches, host = rec.stop()
    return {"activities": acts, "launches": launches, "host": host, "iterations": iterations, "clock": rec.name,
            "shared_origin_us": getattr(rec, "shared_origin_us", None)}


def _capture(steps: list):
    """One CUDA graph of the steps (run once eagerly first: a real call on every rank, which also warms up)."""
    import torch

    for _, _, thunk in steps:
        thunk()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _, _, thunk in steps:
            thunk()
    return g


def assemble(rank: int, raw: dict, graph_phases: list | None = None, comm_phases: tuple = ()) -> Timeline:
    """Raw records -> a Timeline of the timed (not warm-up) iterations.

    An activity belongs to the iteration whose host span [step start, step end] holds its launch call (a
    graph's kernels: the replay's launch), and without a launch record, to the iteration its start falls
    in (each iteration starts on a synchronised device). Its phase is the launching call it was issued in,
    or, for a graph replay, the phase of the same kernel name at the same occurrence in graph_phases (the
    eager twin's [(name, phase)] in order). Timed iterations recorded without launch records (the cheap
    clock) take their launches from the warm-up: the k-th activity in issue order (correlation ids grow with
    every call) was launched by the same call as in the last warm-up iteration, that call's host stamps
    place it, and the warm-up's offsets of the launch call inside it place the launch. Communication:
    activities of comm_phases, and peer copies. Windows: [last end - e2e, last end] (e2e from events)."""
    acts = raw["activities"].copy()
    launches = raw["launches"].copy()
    host = raw["host"].copy()
    if acts.empty:
        return timeline(rank, acts, launches, host, [])
    for c, d in (("tid", 0), ("correlation", -1)):
        if c not in launches.columns:
            launches[c] = d
    tid = launches["tid"].mode().iloc[0] if len(launches) else 0
    host["tid"] = tid  # our stamps are taken on the launching thread
    its = list(raw["iterations"])
    spans = host[host["kind"] == "step"].set_index("name")
    hs = np.array([spans.at[f"step {it['step']}", "start_us"] for it in its], dtype=float)
    he = np.array([spans.at[f"step {it['step']}", "end_us"] for it in its], dtype=float)
    steps = np.array([it["step"] for it in its])
    la = launches[launches["kind"].isin(("launch", "graph"))].sort_values("start_us").drop_duplicates("correlation")
    ls = la.set_index("correlation")["start_us"].reindex(acts["correlation"].values).values
    i = np.clip(np.searchsorted(hs, ls, side="right") - 1, 0, len(its) - 1)
    by_launch = ~np.isnan(ls) & (ls >= hs[i]) & (ls <= he[i])
    acts["step"] = np.where(by_launch, steps[i], -2)
    calls = host[host["kind"] == "call"].sort_values("start_us")
    acts["phase"] = _call_names(calls, ls)
    synth = _place_from_warmup(acts, la, calls, its, hs, he, tid)
    if len(synth):
        launches = pd.concat([launches, synth], ignore_index=True)
    if graph_phases:
        _phases_by_occurrence(acts, graph_phases)
    if "comm" not in acts.columns:
        acts["comm"] = ""
    acts["comm"] = np.where(acts["phase"].isin(comm_phases) & (acts["comm"] == ""), "nccl", acts["comm"])
    acts["collective"] = np.where(acts["comm"] != "", acts["phase"] + ":" + acts["step"].astype(str), "")
    acts["floor_us"] = np.nan
    acts["wait_us"] = 0.0
    windows = []
    for k, it in enumerate(its):
        mine = acts["step"] == it["step"]
        if it["warmup"] or not mine.any():
            continue
        end = float(acts.loc[mine, "end_us"].max())
        e2e = it["e2e_us"] if not math.isnan(it["e2e_us"]) else end - hs[k]
        start = end - e2e
        if not math.isnan(it["e2e_us"]):
            # the start event cannot precede the host stamp taken just before it was recorded: where the
            # window ending at the last activity would begin earlier, the end event came late (the host
            # recorded it after the last activity ended) and that lateness is the window's tail
            start = min(max(start, float(hs[k])), float(acts.loc[mine, "start_us"].min()))
        windows.append({"step": it["step"], "start_us": start, "end_us": start + e2e, "e2e_us": e2e})
        comp = acts[mine & (acts["comm"] == "")]
        for ph, wait in it["waits"].items():
            sel = comp[comp["phase"] == ph]
            if not sel.empty:
                acts.loc[(sel["end_us"] - sel["start_us"]).idxmax(), "wait_us"] = wait
    keep = acts["step"].isin([w["step"] for w in windows])
    return timeline(rank, acts[keep], launches, host, windows,
                    {"clock": raw.get("clock"), "iterations": len(windows),
                     "launches": "from the warm-up's sequence and host stamps" if len(synth) else "recorded"})


def _call_names(calls: pd.DataFrame, when) -> np.ndarray:
    """The name of the launching call holding each time in `when` ("" outside every call, or NaN)."""
    when = np.asarray(when, dtype=float)
    if calls.empty:
        return np.full(len(when), "", dtype=object)
    cs, ce = calls["start_us"].values, calls["end_us"].values
    j = np.clip(np.searchsorted(cs, when, side="right") - 1, 0, len(cs) - 1)
    inside = ~np.isnan(when) & (when >= cs[j]) & (when <= ce[j])
    return np.where(inside, calls["name"].values[j], "").astype(object)


def _place_from_warmup(acts: pd.DataFrame, la: pd.DataFrame, calls: pd.DataFrame, its: list, hs: np.ndarray,
                       he: np.ndarray, tid) -> pd.DataFrame:
    """For iterations recorded without launch records (see assemble): assign their activities (step,
    phase) from the last warm-up iteration's launch sequence, and return launch records placed for them.

    The candidates of iteration k start between its host start and the next iteration's; in issue order
    (correlation ids), the first ones whose names run as the template's are the iteration's (what a barrier
    launches afterwards is not). A placed launch starts and returns where it did in the template, relative to
    its call's start, but returns no later than its call did or its activity started."""
    la = la.set_index("correlation")
    template, rows = None, []
    for k, it in enumerate(its):  # the template: the last iteration whose activities were placed by their launch
        mine = acts[acts["step"] == it["step"]].sort_values("correlation")
        if len(mine):
            template = _sequence(mine, la, calls, hs[k], he[k])
    if template is None:
        return pd.DataFrame(rows)
    free = acts["step"] == -2
    starts = acts["start_us"].values
    for k, it in enumerate(its):
        if it["warmup"] or (acts["step"] == it["step"]).any():
            continue  # a warm-up (not in the timeline), or its launches were recorded
        hi = hs[k + 1] if k + 1 < len(its) else np.inf
        cand = acts[free & (starts >= hs[k]) & (starts < hi)].sort_values("correlation")
        mycalls = calls[(calls["start_us"] >= hs[k]) & (calls["end_us"] <= he[k])]
        done = set()
        for (idx, row), pos in zip(cand.iterrows(), _match(list(cand["name"]), template)):
            if pos is None:
                continue
            call_k, kind, off_s, off_e = template[pos][1:]
            if call_k >= len(mycalls):
                continue
            cs, ce = float(mycalls["start_us"].iloc[call_k]), float(mycalls["end_us"].iloc[call_k])
            acts.at[idx, "step"] = it["step"]
            acts.at[idx, "phase"] = mycalls["name"].iloc[call_k]
            corr = row["correlation"]
            if corr in done:
                continue
            end = min(cs + off_e, ce, row["start_us"])
            rows.append({"name": "launch (placed)", "kind": kind, "start_us": min(cs + off_s, end), "end_us": end,
                         "correlation": corr, "tid": tid})
            done.add(corr)
    return pd.DataFrame(rows)


def _sequence(mine: pd.DataFrame, la: pd.DataFrame, calls: pd.DataFrame, h0: float, h1: float) -> list:
    """[(activity name, call index in the iteration, launch kind, launch start - call start, launch end -
    call start)] in issue order."""
    mycalls = calls[(calls["start_us"] >= h0) & (calls["end_us"] <= h1)]
    cs = mycalls["start_us"].values
    out = []
    for name, corr in zip(mine["name"], mine["correlation"]):
        rec = la.loc[corr]
        c = int(np.clip(np.searchsorted(cs, rec["start_us"], side="right") - 1, 0, max(0, len(cs) - 1)))
        base = cs[c] if len(cs) else rec["start_us"]
        out.append((name, c, rec["kind"], float(rec["start_us"] - base), float(rec["end_us"] - base)))
    return out


def _match(names: list, template: list) -> list:
    """Position in the template of each name, in order: the template's sequence when the names begin with
    it (what follows is not the iteration's), else the next unused entry of the same name (None: none)."""
    want = [t[0] for t in template]
    if names[:len(want)] == want:
        return list(range(len(want))) + [None] * (len(names) - len(want))
    out, used = [], set()
    for n in names:
        pos = next((p for p, t in enumerate(template) if t[0] == n and p not in used), None)
        if pos is not None:
            used.add(pos)
        out.append(pos)
    return out


def _phases_by_occurrence(acts: pd.DataFrame, eager: list) -> None:
    """Graph replays: the k-th activity named X in a replay gets the phase of the k-th X in the eager
    sequence (the same kernels in the same order)."""
    by_name: dict = {}
    for name, phase in eager:
        by_name.setdefault(name, []).append(phase)
    for step, grp in acts[acts["graph"] >= 0].groupby("step"):
        seen: dict = {}
        for i in grp.sort_values("start_us").index:
            name = acts.at[i, "name"]
            k = seen.get(name, 0)
            seen[name] = k + 1
            phases = by_name.get(name, [])
            if k < len(phases):
                acts.at[i, "phase"] = phases[k]


# ---- one clock for every rank --------------------------------------------------------------------


def shifted(raw: dict, dt: float, dc: int = 0) -> dict:
    """A raw record with its times moved by dt us (its shared origin moved back by as much, so it still
    says where its time 0 lies) and its correlation ids by dc (ids restart per recorder)."""
    out = dict(raw)
    for key in ("activities", "launches", "host"):
        f = raw[key].copy()
        if not f.empty:
            f["start_us"] = f["start_us"] + dt
            f["end_us"] = f["end_us"] + dt
            for c in ("correlation", "graph"):
                if c in f:
                    f[c] = f[c].where(f[c] < 0, f[c] + dc)
        out[key] = f
    if raw.get("shared_origin_us") is not None:
        out["shared_origin_us"] = raw["shared_origin_us"] - dt
    return out


def on_one_clock(raws: list[dict]) -> tuple[list[dict], bool]:
    """Every rank's raw records with their times on one clock: each recorder counts from its own origin,
    which it placed on the host's shared clock when it started (taxes.timeline.shared_clock_offset_ns); the
    records are moved so every rank counts from the earliest origin. Returns (records, aligned): records
    without a known origin (older documents) are left as they are, and `aligned` is False, when there are
    several ranks: their arrivals cannot be compared, and sync wait is not measured."""
    origins = [r.get("shared_origin_us") for r in raws]
    if any(o is None for o in origins):
        return list(raws), len(raws) <= 1
    first = min(origins)
    return [shifted(r, o - first) if o != first else r for r, o in zip(raws, origins)], True


def assemble_ranks(raws: list[dict], graph_phases: list | None = None, comm_phases: tuple = ()) -> list[Timeline]:
    """Every rank's raw records of one variant -> Timelines in rank order, on one clock (on_one_clock);
    each says in meta["clock_aligned"] whether its times can be compared with the other ranks'."""
    raws, aligned = on_one_clock(raws)
    tls = [assemble(r, raw, graph_phases=graph_phases, comm_phases=comm_phases) for r, raw in enumerate(raws)]
    for tl in tls:
        tl.meta["clock_aligned"] = aligned
    return tls


def phase_order(tl: Timeline) -> list:
    """[(activity name, phase)] of the first window, in start order: a graph twin's kernels are named so."""
    if tl.windows.empty:
        return []
    first = tl.windows["step"].iloc[0]
    a = tl.activities[tl.activities["step"] == first].sort_values("start_us")
    return list(zip(a["name"], a["phase"]))



# ---- stored form of the raw records ----------------------------------------------------------------

_RAW_COLUMNS = {"activities": ("name", "kind", "stream", "start_us", "end_us", "correlation", "graph", "comm"),
                "launches": ("name", "kind", "start_us", "end_us", "correlation", "tid"),
                "host": ("name", "kind", "start_us", "end_us")}


def raw_to_columns(raw: dict) -> dict:
    """One rank's raw records as JSON columns (times in us from the first host stamp, to the nanosecond):
    what a document keeps so that assemble and the attribution can be redone later."""
    frames = {k: raw[k] for k in _RAW_COLUMNS}
    starts = [float(f["start_us"].min()) for f in frames.values() if len(f)]
    base = min(starts) if starts else 0.0
    origin = raw.get("shared_origin_us")
    out = {"base_us": base, "clock": raw.get("clock"),
           "shared_origin_us": None if origin is None else round(float(origin) + base, 3), "iterations": [
        {"step": int(it["step"]), "e2e_us": None if it["e2e_us"] != it["e2e_us"] else float(it["e2e_us"]),
         "waits": {k: float(v) for k, v in it["waits"].items()}, "warmup": bool(it["warmup"])}
        for it in raw["iterations"]]}
    for key, cols in _RAW_COLUMNS.items():
        f = frames[key]
        col = {}
        for c in cols:
            if c not in f:
                continue
            v = f[c]
            if c.endswith("_us"):
                col[c] = [round(float(x) - base, 3) for x in v]
            elif c in ("stream", "correlation", "graph", "tid"):
                col[c] = [int(x) for x in v]
            else:
                col[c] = [str(x) for x in v]
        out[key] = col
    return out


def raw_from_columns(d: dict) -> dict:
    """The inverse of raw_to_columns (times stay relative to the first host stamp)."""
    out = {"clock": d.get("clock"), "shared_origin_us": d.get("shared_origin_us"), "iterations": [
        {"step": it["step"], "e2e_us": math.nan if it.get("e2e_us") is None else it["e2e_us"],
         "waits": dict(it.get("waits") or {}), "warmup": bool(it.get("warmup"))} for it in d.get("iterations", [])]}
    for key in _RAW_COLUMNS:
        out[key] = pd.DataFrame(d.get(key) or {})
    return out
