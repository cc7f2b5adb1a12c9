"""Kineto (torch.profiler) traces built event by event, for the tests of `taxes analyze`.

Two levels: `new_trace` / `add_*` write single events in the format torch.profiler writes (cpu_op,
user_annotation, python_function, cuda_runtime / cuda_driver, kernel / gpu_memcpy, ac2g flows, [memory]
instants, distributedInfo, deviceProperties, baseTimeNanoseconds); `Program` is a small host + device
simulator on top (as tests/sim.py, but emitting a trace) so that what was planted is known exactly.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

T0 = 4_475_692_692_210.465  # a Kineto-like relative timestamp (us): floats keep ~1 ns here
BASE_NS = 1_790_857_026_000_000_000
GPU = "NVIDIA H100 80GB HBM3"

AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
MM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
TRITON = "silu_kernel"


def new_trace(rank: int = 0, world: int = 2, base_ns: int = BASE_NS, distributed: bool = True, gpu: str = GPU) -> dict:
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": i, "name": gpu, "totalGlobalMem": 85_000_000_000} for i in range(max(world, 1))],
           "record_shapes": 1, "cuda_runtime_version": 12080, "displayTimeUnit": "ms",
           "baseTimeNanoseconds": base_ns, "traceEvents": [
               {"ph": "M", "name": "process_name", "ts": T0, "pid": 4242, "tid": 0, "args": {"name": "python"}}]}
    if distributed:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world, "nccl_version": "2.21.5"}
    return {"doc": doc, "device": rank, "pid": 4242, "tid": 4242, "next_corr": 100 + 1000 * rank, "next_ext": 1,
            "next_rf": 1}


def _ev(tr):
    return tr["doc"]["traceEvents"]


def add_step(tr: dict, n: int, t0: float, t1: float) -> None:
    _ev(tr).append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": tr["pid"],
                    "tid": tr["tid"], "ts": T0 + t0, "dur": t1 - t0, "args": {"External id": n}})


def add_annotation(tr: dict, name: str, t0: float, t1: float, cat: str = "user_annotation", tid=None) -> None:
    _ev(tr).append({"ph": "X", "cat": cat, "name": name, "pid": tr["pid"], "tid": tr["tid"] if tid is None else tid,
                    "ts": T0 + t0, "dur": t1 - t0, "args": {}})


def add_op(tr: dict, name: str, t0: float, t1: float, dims=None, types=None, tid=None, args=None) -> dict:
    """A cpu op; returns its args (External id and record-function id are fresh)."""
    a = {"External id": tr["next_ext"], "Record function id": tr["next_rf"]}
    tr["next_ext"] += 1
    tr["next_rf"] += 1
    if dims is not None:
        a.update({"Input Dims": dims, "Input type": types})
    a.update(args or {})
    _ev(tr).append({"ph": "X", "cat": "cpu_op", "name": name, "pid": tr["pid"], "tid": tr["tid"] if tid is None else tid,
                    "ts": T0 + t0, "dur": t1 - t0, "args": a})
    return a


def add_launch(tr: dict, t: float, kernels, api: str = "cudaLaunchKernel", dur: float = 3.0, correlate: bool = True,
               flows: bool = True, record_call: bool = True, tid=None, kernel_args: dict | None = None) -> int:
    """A host launch call at t and the GPU activities it started: kernels = [(name, stream, start, end)]."""
    corr = tr["next_corr"]
    tr["next_corr"] += 1
    tid = tr["tid"] if tid is None else tid
    ev = _ev(tr)
    cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
    if record_call:
        ev.append({"ph": "X", "cat": cat, "name": api, "pid": tr["pid"], "tid": tid, "ts": T0 + t, "dur": dur,
                   "args": {"cbid": 211, "correlation": corr}})
    for name, stream, start, end in kernels:
        cat_k = "gpu_memcpy" if name.startswith("Memcpy") else "gpu_memset" if name.startswith("Memset") else "kernel"
        args = {"device": tr["device"], "context": 1, "stream": stream}
        if correlate:
            args["correlation"] = corr
        if cat_k == "kernel":
            args.update({"queued": 0, "grid": [1, 1, 1], "block": [128, 1, 1]})
        args.update(kernel_args or {})
        ev.append({"ph": "X", "cat": cat_k, "name": name, "pid": tr["device"], "tid": stream, "ts": T0 + start,
                   "dur": end - start, "args": args})
        if flows and record_call:
            ev.append({"ph": "s", "id": corr, "pid": tr["pid"], "tid": tid, "ts": T0 + t, "cat": "ac2g", "name": "ac2g"})
            ev.append({"ph": "f", "id": corr, "pid": tr["device"], "tid": stream, "ts": T0 + start, "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
    return corr


def add_memory(tr: dict, t: float, addr: int, nbytes: int) -> None:
    _ev(tr).append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": tr["pid"],
                    "tid": tr["tid"], "ts": T0 + t, "args": {"Total Reserved": 0, "Total Allocated": 0, "Bytes": nbytes,
                                                             "Device Id": tr["device"], "Device Type": 1, "Addr": addr}})


def write_trace(tr: dict, path: Path, gz: bool | None = None) -> Path:
    data = json.dumps(tr["doc"]).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz if gz is not None else path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


# ---- a host + device simulator that writes a trace ----------------------------------------------------


@dataclass
class Op:
    """One launching cpu op: the host spends pre_us elsewhere (Python), then enters the op, spends call_us
    in it, calls the launch API for api_us; the device runs `dur_us` after `latency_us` from the API's
    return, not before the previous activity of its stream, nor before not_before_us."""

    name: str = "aten::mm"
    kernel: str = MM
    dur_us: float = 5.0
    pre_us: float = 0.0
    pre_frame: str | None = None  # a python_function event over the pre_us spin
    call_us: float = 2.0
    api_us: float = 2.0
    stream: int = 7
    not_before_us: float = 0.0
    after_end_of: int | None = None  # the device starts it no earlier than this op's activity ended
    kernel_args: dict = field(default_factory=dict)
    op_args: dict = field(default_factory=dict)
    collective: dict | None = None  # record_param_comms args (Collective name, Process Group Name, Seq)
    no_op: bool = False  # launched outside any cpu op (e.g. a Triton kernel)
    api: str = "cudaLaunchKernel"


@dataclass
class Program:
    tr: dict
    t: float = 0.0  # host clock, us from T0
    latency_us: float = 1.5
    dev_free: dict = field(default_factory=dict)  # stream -> when it is free
    ends: list = field(default_factory=list)  # per op: its activity's (start, end)

    def step(self, n: int, ops: list[Op], host_tail_us: float = 0.0) -> tuple[float, float]:
        """Run ops as step n; the host step ends host_tail_us after the last launch returned."""
        s0 = self.t
        for op in ops:
            self.run(op)
        self.t += host_tail_us
        add_step(self.tr, n, s0, self.t)
        return s0, self.t

    def run(self, op: Op) -> tuple[float, float]:
        if op.pre_us:
            if op.pre_frame:
                add_annotation(self.tr, op.pre_frame, self.t, self.t + op.pre_us, cat="python_function")
            self.t += op.pre_us
        cs = self.t
        ls = cs + op.call_us
        le = ls + op.api_us
        if not op.no_op:
            add_op(self.tr, op.name, cs, le + 0.25, args=op.op_args)
            if op.collective is not None:
                add_op(self.tr, "record_param_comms", cs + 0.1, le + 0.2, args=op.collective)
        start = max(self.dev_free.get(op.stream, -1e18), le + self.latency_us, op.not_before_us)
        if op.after_end_of is not None:
            start = max(start, self.ends[op.after_end_of][1])
        end = start + op.dur_us
        add_launch(self.tr, ls, [(op.kernel, op.stream, start, end)], api=op.api, dur=op.api_us,
                   kernel_args=op.kernel_args)
        self.dev_free[op.stream] = end
        self.ends.append((start, end))
        self.t = le + (0.25 if not op.no_op else 0.0)
        return start, end

    def graph(self, n_step: int, kernels: list[tuple[str, float]], gap_us: float, api_us: float = 6.0,
              waits: dict | None = None, stream: int = 7) -> tuple[float, float]:
        """One graph replay as step n_step: kernels [(name, dur)] separated by the graph's gap; waits
        {index: extra us} hold kernel index back (a dependency inside the graph)."""
        s0 = self.t
        add_op(self.tr, "graph replay", self.t, self.t + api_us + 1.0)
        ls = self.t + 0.5
        le = ls + api_us
        start = max(self.dev_free.get(stream, -1e18), le + self.latency_us)
        ks = []
        for i, (name, dur) in enumerate(kernels):
            if i:
                start += gap_us + (waits or {}).get(i, 0.0)
            ks.append((name, stream, start, start + dur))
            start += dur
        add_launch(self.tr, ls, ks, api="cudaGraphLaunch", dur=api_us)
        self.dev_free[stream] = start
        self.t = le + 1.0
        add_step(self.tr, n_step, s0, self.t)
        return ks[0][2], start
