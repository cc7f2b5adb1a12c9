"""A tiny host + device simulator that writes timelines with taxes planted on purpose.

The host runs a list of launches in order on one thread: before each it may do other work (`pre_us`,
Python, a spin), then enters the launching call (`call_us` of dispatch before the launch API), then the
launch API itself (`api_us`). The device starts an activity `latency_us` after its launch returned, and
not before the previous activity on the device ended (one stream) or, for `after`, a given time. What
was planted is known exactly, so the attribution's rows can be checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from taxes.traces.timeline import timeline


@dataclass
class Launch:
    name: str = "k"
    dur_us: float = 1.0  # device time of the activity
    pre_us: float = 0.0  # host work before the launching call (host-bound when the device waits)
    call_us: float = 0.0  # time inside the launching call before the launch API
    api_us: float = 2.0  # the launch API call
    comm: str = ""
    collective: str = ""
    floor_us: float = float("nan")
    wait_us: float = 0.0
    stream: int = 0
    not_before_us: float = 0.0  # device: the activity cannot start before this (a dependency)
    sync_before: bool = False  # the host synchronises with the device before this launch


@dataclass
class Sim:
    latency_us: float = 1.5
    t0: float = 100.0  # the device is idle from t0 (the iteration's start), the host starts at t0
    host: list = field(default_factory=list)


def run(launches: list[Launch], sim: Sim | None = None, rank: int = 0, graph: bool = False, graph_gap_us: float = 1.0,
        graph_api_us: float = 5.0, compile_ranges=(), start_delay_us: float = 0.0, step: int = 0):
    """Simulate one iteration on one rank; returns its Timeline."""
    sim = sim or Sim()
    t = sim.t0 + start_delay_us  # host clock
    dev_free = sim.t0
    acts, calls = [], []
    host = [{"name": f"step {step}", "kind": "step", "start_us": sim.t0, "end_us": sim.t0}]  # the host begins the step at t0
    corr = 1
    if graph:  # one graph launch replays every activity, separated by the graph's own gaps
        ls, le = t, t + graph_api_us
        calls.append({"name": "cudaGraphLaunch", "kind": "graph", "start_us": ls, "end_us": le, "correlation": corr})
        host.append({"name": "replay", "kind": "call", "start_us": ls, "end_us": le})
        start = max(dev_free, le + sim.latency_us)
        for i, k in enumerate(launches):
            if i:
                start = max(start, k.not_before_us)
            acts.append(_act(k, start, corr, graph=corr, step=step))
            start += k.dur_us + graph_gap_us
        end = start - graph_gap_us
        return timeline(rank, acts, calls, host, [{"step": step, "start_us": sim.t0, "end_us": end}])
    for k in launches:
        if k.sync_before:
            ss = t
            se = max(t, dev_free) + 2.0  # returns 2 us after the device drained
            calls.append({"name": "cudaDeviceSynchronize", "kind": "sync", "start_us": ss, "end_us": se,
                          "correlation": -1})
            t = se
        t += k.pre_us
        cs = t
        ls = cs + k.call_us
        le = ls + k.api_us
        calls.append({"name": "cudaLaunchKernel", "kind": "launch", "start_us": ls, "end_us": le, "correlation": corr})
        host.append({"name": k.name, "kind": "call", "start_us": cs, "end_us": le})
        start = max(dev_free, le + sim.latency_us, k.not_before_us)
        acts.append(_act(k, start, corr, step=step))
        dev_free = start + k.dur_us
        t = le
        corr += 1
    for name, a, b in compile_ranges:
        host.append({"name": name, "kind": "compile", "start_us": a, "end_us": b})
    end = max(x["end_us"] for x in acts)
    return timeline(rank, acts, calls, host, [{"step": step, "start_us": sim.t0, "end_us": end}])


def _act(k: Launch, start: float, corr: int, graph: int = -1, step: int = 0) -> dict:
    return {"name": k.name, "start_us": start, "end_us": start + k.dur_us, "correlation": corr, "graph": graph,
            "comm": k.comm, "collective": k.collective, "floor_us": k.floor_us, "wait_us": k.wait_us,
            "stream": k.stream, "step": step}
