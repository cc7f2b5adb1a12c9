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

from taxes.timeline import HostStamps, Timeline, timeline

CLOCKS = ("cupti", "torch.profiler")


class HostRecorder(HostStamps):
    """Emulated ranks: no device clock; every launching call is an activity spanning the call (the logic
    runs; the times mean nothing)."""

    name = "host"

    def __init__(self):
        super().__init__()
        self.t0 = time.perf_counter()

    def now_us(self) -> float:
        return (time.perf_counter() - self.t0) * 1e6

    def start(self) -> "HostRecorder":
        return self

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        calls = [h for h in self.host if h["kind"] == "call"]
        acts = [{"name": c["name"], "kind": "kernel", "start_us": c["start_us"], "end_us": c["end_us"], "correlation": i,
                 "graph": -1, "comm": "", "stream": 0} for i, c in enumerate(calls)]
        launches = [{"name": "call", "kind": "launch", "start_us": c["start_us"], "end_us": c["start_us"],
                     "correlation": i, "tid": 0} for i, c in enumerate(calls)]
        return pd.DataFrame(acts), pd.DataFrame(launches), pd.DataFrame(self.host)


class ProfilerRecorder:
    """The clock without cupti-python: torch.profiler (CPU and CUDA activities), read back through
    to_timeline. Our steps and calls are record_function ranges (taxes:step:N, taxes:call:NAME)."""

    name = "torch.profiler"

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

            tl = to_timeline(load_trace(path), 0)
        return tl.activities, tl.launches, tl.host


def make_recorder(clock: str, on_gpu: bool):
    """A fresh recorder: cupti-python or torch.profiler on a GPU; the host clock on emulated ranks."""
    if not on_gpu:
        return HostRecorder()
    if clock == "cupti":
        from taxes.cupti import Recorder

        return Recorder()
    return ProfilerRecorder()


def record_iterations(ctx, runner, input_sets: list, iters: int, warmup: int, recorder, graph: bool,
                      fused: bool, trace_of=None) -> dict:
    """Run warmup + iters instrumented iterations; returns this rank's raw records: {"activities",
    "launches", "host", "iterations": [{"step", "e2e_us", "waits": {phase: us}, "warmup"}], "clock"}.
    trace_of(runner) -> {phase: mean in-kernel wait us} of the last call, for fused kernels' traced builds."""
    import torch

    on_gpu = ctx.device.type == "cuda"
    graphs: dict = {}
    iterations = []
    if on_gpu:
        start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_ev.record()
        end_ev.record()
        end_ev.synchronize()
    if graph and on_gpu:  # captured before recording starts: a capture's launches run nothing
        for k, inputs in enumerate(input_sets):
            graphs[k] = _capture(runner.phases(*inputs, traced=fused))
    rec = recorder.start()
    try:
        for i in range(warmup + iters):
            k = i % len(input_sets)
            steps = None if (graph and on_gpu) else runner.phases(*input_sets[k], traced=fused)
            if on_gpu:
                torch.cuda.synchronize()
            ctx.barrier()
            with rec.step(i):
                if on_gpu:
                    start_ev.record()
                if steps is None:
                    with rec.call("graph replay"):
                        graphs[k].replay()
                else:
                    for name, role, thunk in steps:
                        if role == "host":  # host work that launches nothing (a planted spin)
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
    return {"activities": acts, "launches": launches, "host": host, "iterations": iterations, "clock": rec.name}


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


def assemble(rank: int, raw: dict, phase_of_call: bool = True, graph_phases: list | None = None,
             floors: dict | None = None, comm_phases: tuple = ()) -> Timeline:
    """Raw records -> a Timeline of the timed (not warm-up) iterations.

    Each activity belongs to the iteration whose host span [step start, step end] holds its launch call (a
    graph's kernels: the replay's launch); its phase is the launching call it was issued in (eager), or,
    for a graph replay, the phase of the same kernel name at the same occurrence in graph_phases (the
    eager twin's [(name, phase)] in order). Communication: activities of comm_phases, and peer copies.
    floors: {phase: floor us} go to each phase's longest compute activity (its other compute activities
    get 0: their time is the phase's inefficiency). Windows: [last end - e2e, last end]."""
    acts = raw["activities"].copy()
    launches = raw["launches"].copy()
    host = raw["host"].copy()
    if acts.empty:
        return timeline(rank, acts, launches, host, [])
    if "tid" not in launches.columns:
        launches["tid"] = 0
    tid = launches["tid"].mode().iloc[0] if len(launches) else 0
    host["tid"] = tid  # our stamps are taken on the launching thread
    la = launches[launches["kind"].isin(("launch", "graph"))].sort_values("start_us").drop_duplicates("correlation")
    ls = la.set_index("correlation")["start_us"].reindex(acts["correlation"].values).values
    its = list(raw["iterations"])
    spans = host[host["kind"] == "step"].set_index("name")
    hs = np.array([spans.at[f"step {it['step']}", "start_us"] for it in its], dtype=float)
    he = np.array([spans.at[f"step {it['step']}", "end_us"] for it in its], dtype=float)
    idx = np.searchsorted(hs, ls, side="right") - 1
    ok = ~np.isnan(ls) & (idx >= 0) & (ls <= he[np.clip(idx, 0, len(he) - 1)])
    acts["step"] = np.where(ok, np.array([its[i]["step"] for i in np.clip(idx, 0, len(its) - 1)]), -2)
    # the phase: the call that holds the launch
    calls = host[host["kind"] == "call"].sort_values("start_us")
    acts["phase"] = ""
    if phase_of_call and len(calls):
        cs, ce = calls["start_us"].values, calls["end_us"].values
        j = np.searchsorted(cs, ls, side="right") - 1
        inside = ~np.isnan(ls) & (j >= 0) & (ls <= ce[np.clip(j, 0, len(ce) - 1)])
        names = calls["name"].values
        acts["phase"] = np.where(inside, names[np.clip(j, 0, len(names) - 1)], "")
    if graph_phases:
        _phases_by_occurrence(acts, graph_phases)
    if "comm" not in acts.columns:
        acts["comm"] = ""
    acts["comm"] = np.where(acts["phase"].isin(comm_phases) & (acts["comm"] == ""), "nccl", acts["comm"])
    acts["collective"] = np.where(acts["comm"] != "", acts["phase"] + ":" + acts["step"].astype(str), "")
    acts["floor_us"] = np.nan
    acts["wait_us"] = 0.0
    timed = [it for it in its if not it["warmup"]]
    windows = []
    for it in timed:
        mine = acts["step"] == it["step"]
        if not mine.any():
            continue
        end = float(acts.loc[mine, "end_us"].max())
        e2e = it["e2e_us"] if not math.isnan(it["e2e_us"]) else end - hs[its.index(it)]
        windows.append({"step": it["step"], "start_us": end - e2e, "end_us": end, "e2e_us": e2e})
        comp = acts[mine & (acts["comm"] == "")]
        for ph, fl in (floors or {}).items():
            sel = comp[comp["phase"] == ph]
            if sel.empty:
                continue
            longest = (sel["end_us"] - sel["start_us"]).idxmax()
            acts.loc[sel.index, "floor_us"] = 0.0
            acts.loc[longest, "floor_us"] = fl
        for ph, wait in it["waits"].items():
            sel = comp[comp["phase"] == ph]
            if not sel.empty:
                acts.loc[(sel["end_us"] - sel["start_us"]).idxmax(), "wait_us"] = wait
    keep = acts["step"].isin([w["step"] for w in windows])
    return timeline(rank, acts[keep], launches, host, windows, {"clock": raw.get("clock"), "iterations": len(windows)})


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
