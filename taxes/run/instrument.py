"""Instrumented iterations: the plain timing's barrier-aligned iterations with a per-kernel clock on.

Each iteration: the device synchronised and all ranks at a barrier, a host stamp (the step begins), a
start event, the variant (eager: each of its steps inside a host stamp pair, the launching call; graphed:
one replay), an end event. The clock (a recorder) records every device activity and launch call; the
events give the iteration's end-to-end time, exactly as in the plain timing, so the difference between the
two is what measuring cost (`measurement cost`). taxes.traces.records turns the records into a Timeline: each
activity belongs to the iteration whose host span holds its launch, and its window is the event-timed
E2E ending where the iteration's last activity ended.

Recorders: cupti-python (taxes.run.cupti), torch.profiler (taxes.traces.kineto), and on emulated ranks the host
clock itself (each step's call is its own activity: the logic runs, the times mean nothing).
"""

from __future__ import annotations

import math
import time

import pandas as pd

from taxes.traces.timeline import HostStamps, shared_clock_offset_ns

CLOCKS = ("cupti", "torch.profiler")
# a step's role when it is the host's own work (a planted spin, a host gate): "host" runs where it stands
# (before a graph's replay), "host-after" once everything is queued (after the replay); neither is captured
HOST_ROLES = ("host", "host-after")


# The harness's own host call that records an iteration's start event: a host call that launches nothing, so
# the program's host time before its first launching call is counted from its end (taxes.attribution.attribute:
# the host last left a call), not from the step's start, which would file the harness's event record as the
# program being host-bound (10 us before each graph replay on 2 H200s).
HARNESS_START = "(harness) start event"


def launching(steps) -> list:
    """The steps that launch work (what a graph captures)."""
    return [s for s in steps if s[1] not in HOST_ROLES]


def host_work(steps, role: str) -> list:
    """The thunks of the steps of one host role, in order."""
    return [f for _, r, f in steps if r == role]


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
            from taxes.traces.kineto import load_trace
            from taxes.traces.kineto_timeline import to_timeline

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
    activities alone, launches placed from another block's warm-up, see taxes.traces.records.assemble)."""
    if not on_gpu:
        return HostRecorder()
    if clock == "cupti":
        from taxes.run.cupti import Recorder

        return Recorder(api)
    return ProfilerRecorder()


def record_iterations(ctx, runner, input_sets: list, iters: int, warmup: int, recorder, graph: bool,
                      fused: bool, trace_of=None, capture_after_start: bool = False, align=None, ctas_of=None) -> dict:
    """Run warmup + iters instrumented iterations; returns this rank's raw records: {"activities",
    "launches", "host", "iterations": [{"step", "e2e_us", "waits": {phase: us}, "warmup"}], "clock"}.
    trace_of(runner) -> {phase: mean in-kernel wait us} of the last call, for fused kernels' traced builds;
    ctas_of(runner): the last call's CTAs' own stamps (taxes.run.cases.cta_stamps), kept as "ctas" so that any
    rule for the in-kernel wait can be read again (older records kept one other rule's waits as "waits_held").
    align: as in taxes.run.harness.time_iterations (launched before the step begins: its work is no step's)."""
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
            graphs[k] = capture_graph(launching(runner.phases(*inputs, traced=fused)))

    if graph and on_gpu and not capture_after_start:  # a capture's launches run nothing: no records of them
        capture()
    # A fused call's stamps are copied on the device after each iteration and read after the block: reading
    # them between iterations left each device idle 0.3 ms longer before the next, which made it 4-15 us slower
    # on 2 x H200 (benchmarks/fused_trace_cost.py), a measurement cost that was the reading's, not the clock's.
    trace_buffers = list(runner.trace_buffers()) if (fused and (trace_of or ctas_of)
                                                     and hasattr(runner, "trace_buffers")) else []
    kept = [torch.empty((warmup + iters, t.numel()), dtype=t.dtype, device=t.device) for t in trace_buffers] \
        if trace_buffers else None
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
            every = runner.phases(*input_sets[k], traced=fused) if steps is None else []
            host_first, host_after = host_work(every, "host"), host_work(every, "host-after")
            if on_gpu:
                torch.cuda.synchronize()
            ctx.start_barrier()
            if align is not None:
                align()
            if lean:
                h0 = now()
                if on_gpu:
                    start_ev.record()
                    stamps.append(("call", HARNESS_START, h0, now()))
                if steps is None:
                    for thunk in host_first:
                        thunk()
                    a = now()
                    graphs[k].replay()
                    stamps.append(("call", "graph replay", a, now()))
                    for thunk in host_after:
                        thunk()
                else:
                    for name, role, thunk in steps:
                        if role in HOST_ROLES:  # host work that launches nothing (a planted spin)
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
                        with rec.call(HARNESS_START):
                            start_ev.record()
                    if steps is None:
                        for thunk in host_first:
                            thunk()
                        with rec.call("graph replay"):
                            graphs[k].replay()
                        for thunk in host_after:
                            thunk()
                    else:
                        for name, role, thunk in steps:
                            if role in HOST_ROLES:
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
                e2e = math.nan  # the host clock's window: set from the step's span in taxes.traces.records.assemble
            iterations.append({"step": i, "e2e_us": e2e, "waits": {}, "warmup": i < warmup})
            if kept is not None:  # a device copy, read after the block (see above)
                for snap, t in zip(kept, trace_buffers):
                    # an elementwise kernel, not copy_ (a device-to-device memcpy): under the cupti-python
                    # clock, those small memcpys in a recorded block made the CUDA graphs replayed in later
                    # blocks end in "unspecified launch failure" (one H200, flash decode: a fused block, then
                    # bsp-graph; tests/test_instrument_gpu.py)
                    torch.add(t.reshape(-1), 0, out=snap[i])
            elif fused and (trace_of or ctas_of):
                _read_trace(iterations[-1], runner, trace_of, ctas_of)
    finally:
        acts, launches, host = rec.stop()
    if kept is not None:
        for i, it in enumerate(iterations):
            for snap, t in zip(kept, trace_buffers):
                t.reshape(-1).copy_(snap[i])
            _read_trace(it, runner, trace_of, ctas_of)
    return {"activities": acts, "launches": launches, "host": host, "iterations": iterations, "clock": rec.name,
            "shared_origin_us": getattr(rec, "shared_origin_us", None)}


def _read_trace(it: dict, runner, trace_of, ctas_of) -> None:
    """The in-kernel waits (trace_of) and CTA stamps (ctas_of) of the runner's last traced call, into it."""
    if trace_of:
        it["waits"] = trace_of(runner) or {}
    if ctas_of:
        it["ctas"] = ctas_of(runner) or {}


def capture_graph(steps: list):
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
