"""A per-kernel clock that costs little: CUPTI activity records through NVIDIA's cupti-python.

CUPTI timestamps every kernel, copy and memset on the device, and every launch and synchronisation call
on the host, on one clock; the records arrive in buffers after the fact, so nothing is added between
launches but the records themselves. Only the calls the attribution needs are recorded (launches, graph
launches, asynchronous copies and memsets, synchronisations): recording every runtime and driver call
costs several times more.

Optional: `pip install 'taxes[cupti]'`. Without it `taxes profile` falls back to torch.profiler (also
CUPTI, through Kineto) and says so. Only one CUPTI client may exist in a process, so a recorder must be
stopped before torch.profiler runs, and cupti-python is not used again in a process after torch.profiler.
Deliberately imported late: cupti-python loads libcupti, which only a CUDA machine has.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from taxes.traces.timeline import HostStamps, api_kind, api_name, shared_clock_offset_ns

_STATE: dict = {}  # the process's one registration with CUPTI
UNKNOWN = (1 << 64) - 1  # CUPTI_TIMESTAMP_UNKNOWN: a latency timestamp it could not take


def available() -> str | None:
    """None when cupti-python can record here, else why not (one line)."""
    try:
        from cupti import cupti  # noqa: F401
    except Exception as e:  # ImportError, or libcupti missing (OSError, RuntimeError)
        return f"cupti-python is not usable here ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


class Recorder(HostStamps):
    """Record activities between start() and stop(); now_us() stamps the host on the same clock.

    Times are us from the recorder's origin (integer nanoseconds subtracted before conversion, so a float
    keeps sub-nanosecond digits)."""

    name = "cupti"

    def __init__(self, api: str = "warmup"):
        """api: which iterations record launch and synchronisation calls: "all", or "warmup" (until
        api_off(); the timed iterations then record device activities alone, which costs much less on the
        host, and their launches are placed from the host stamps and the warm-up's launch sequence), or
        "queued": no host calls at all (recording any runtime call made CUPTI intercept every one: +12-20%
        of a host-bound eager step, benchmarks/record_cost.py), each eager kernel instead carrying the time
        its launch was queued and submitted on the host (CUPTI's latency timestamps), which stand in for its
        launch call (taxes.run.cupti_kineto), or "none": device activities alone (`taxes profile`'s timed
        iterations; their launches come from a template block recorded after every plain iteration, because
        once any API record was on, CUPTI went on intercepting every runtime call of the process:
        benchmarks/sdpa_host_cost.py)."""
        from cupti import cupti

        super().__init__()
        self.api = api
        self._c = cupti
        self.origin_ns = int(cupti.get_timestamp())
        # where that origin lies on the host's shared clock: every rank's records line up on it
        self.shared_origin_us = (self.origin_ns + shared_clock_offset_ns(cupti.get_timestamp)) / 1e3
        self._acts: list = []
        self._calls: list = []
        self._kinds = [cupti.ActivityKind.CONCURRENT_KERNEL, cupti.ActivityKind.MEMCPY, cupti.ActivityKind.MEMSET,
                       cupti.ActivityKind.MEMCPY2]
        if api in ("all", "warmup"):
            self._kinds += [cupti.ActivityKind.RUNTIME, cupti.ActivityKind.DRIVER]
        self._names: dict = {}
        self.now_raw = cupti.get_timestamp

    def to_us(self, raw: int) -> float:
        return (int(raw) - self.origin_ns) / 1e3

    def start(self) -> "Recorder":
        c = self._c
        if "registered" not in _STATE:
            c.activity_register_callbacks(lambda: (8 << 20, 0), _on_buffer)
            _STATE["registered"] = True
        _STATE["sink"] = self
        if self.api == "queued":
            c.activity_enable_latency_timestamps(1)
        for kind in self._kinds:
            c.activity_enable(kind)
        if self.api in ("all", "warmup"):
            self._select_apis()
        return self

    def _select_apis(self) -> None:
        """Record only the host calls a timeline needs (launch, graph launch, synchronisation): every other
        runtime and driver call off."""
        c = self._c
        for enum, enable in ((c.runtime_api_trace_cbid, c.activity_enable_runtime_api),
                             (c.driver_api_trace_cbid, c.activity_enable_driver_api)):
            for member in enum:
                kind = api_kind(member.name)
                if kind is not None:
                    self._names[(enum.__name__, int(member))] = (api_name(member.name), kind)
                try:
                    enable(int(member), 1 if kind else 0)
                except Exception:  # ids this driver does not know
                    pass

    def pause(self) -> None:
        """No records from here until resume() (what is recorded stays for stop()). Flushed first, with the
        device idle: a graph replay's kernel records still open when their kind was switched off came back
        ending when it was switched on again (kernels of 40 to 92 ms on the H100)."""
        self._c.activity_flush_all(1)
        for kind in self._kinds:
            self._c.activity_disable(kind)

    def resume(self) -> None:
        for kind in self._kinds:
            self._c.activity_enable(kind)

    def api_off(self) -> None:
        """From here on, device activities only (see __init__)."""
        if self.api == "warmup":
            for kind in (self._c.ActivityKind.RUNTIME, self._c.ActivityKind.DRIVER):
                self._c.activity_disable(kind)
                self._kinds.remove(kind)

    def stop(self) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
        """Flush and stop; returns (activities, launches, host) frames in taxes.traces.timeline's columns (us)."""
        c = self._c
        c.activity_flush_all(1)
        for kind in self._kinds:
            c.activity_disable(kind)
        _STATE.pop("sink", None)
        acts, calls = self._frames()
        return acts, calls, self.host_frame()

    def take(self, records: list) -> None:
        """Convert a completed buffer's records at once (they live in CUPTI's buffer)."""
        c = self._c
        o = self.origin_ns
        kernel, memcpy, memset = c.ActivityKind.CONCURRENT_KERNEL, c.ActivityKind.MEMCPY, c.ActivityKind.MEMSET
        p2p, runtime, driver = c.ActivityKind.MEMCPY2, c.ActivityKind.RUNTIME, c.ActivityKind.DRIVER
        for r in records:
            k = r.kind
            if k in (kernel, memcpy, memset, p2p):
                kind = "kernel" if k == kernel else ("memset" if k == memset else "memcpy")
                queued = int(getattr(r, "queued", 0) or 0) if k == kernel else 0
                submitted = int(getattr(r, "submitted", 0) or 0) if k == kernel else 0
                self._acts.append((r.name if k == kernel else kind, kind, int(r.stream_id), (int(r.start) - o) / 1e3,
                                   (int(r.end) - o) / 1e3, int(r.correlation_id), int(getattr(r, "graph_id", 0) or 0),
                                   "p2p-copy" if k == p2p else "", int(getattr(r, "bytes", 0) or 0),
                                   (queued - o) / 1e3 if 0 < queued < UNKNOWN else float("nan"),
                                   (submitted - o) / 1e3 if 0 < submitted < UNKNOWN else float("nan")))
            elif k in (runtime, driver):
                enum = c.runtime_api_trace_cbid if k == runtime else c.driver_api_trace_cbid
                hit = self._names.get((enum.__name__, int(r.cbid)))
                if hit is not None:
                    self._calls.append((hit[0], hit[1], (int(r.start) - o) / 1e3, (int(r.end) - o) / 1e3,
                                        int(r.correlation_id), int(r.thread_id)))

    def _frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        acts = pd.DataFrame(self._acts, columns=["name", "kind", "stream", "start_us", "end_us", "correlation",
                                                 "graph_id", "comm", "bytes", "queued_us", "submitted_us"])
        calls = pd.DataFrame(self._calls, columns=["name", "kind", "start_us", "end_us", "correlation", "tid"])
        self._acts, self._calls = [], []
        return graph_correlations(acts), calls


def graph_correlations(acts: pd.DataFrame) -> pd.DataFrame:
    """CUPTI gives a graph's kernels the correlation of the graph launch that replayed them: keep it as
    `graph` (that replay's key) for kernels with a graph id, -1 for eager ones."""
    if acts.empty:
        return acts
    acts = acts.copy()
    acts["graph"] = np.where(acts["graph_id"].values > 0, acts["correlation"].values, -1)
    return acts.drop(columns=["graph_id"])


def _on_buffer(activities: list) -> None:
    sink = _STATE.get("sink")
    if sink is not None:
        sink.take(activities)
