"""Inside a program run by `taxes trace`: find its steps, time some without the profiler, profile others.

Loaded at the program's start (a sitecustomize.py that `taxes trace` puts first on PYTHONPATH) when
TAXES_TRACE_DIR is set. A step ends at every `optimizer.step()` (any torch optimizer), every `taxes.step()`
call, or, with TAXES_TRACE_STEP=nvtx:NAME, at the end of every NVTX range NAME. The schedule, in steps
(schedule()): TAXES_TRACE_SKIP warm-up steps, then TAXES_TRACE_PLAIN steps timed without the profiler (a CUDA
event at each step end: the device time between two step ends) and TAXES_TRACE_STEPS steps profiled, whose
trace is written to TAXES_TRACE_DIR/rank<R>.json.gz with the plain step times in plain_rank<R>.json (and
which program step each plain and each profiled step was). The program itself runs on unchanged to its end;
a program that ends early still writes what it has.

With the full record, the plain steps come first, then the profiled ones (torch.profiler runs one cycle).
With the timing record they alternate in blocks of TAXES_TRACE_BLOCK steps, plain-profiled then
profiled-plain (ABBA): a host whose speed drifts during the run (a shared machine's did by 2x) moves both
kinds alike, so their difference, the measurement cost, is the profiler's and not the drift's. Between
blocks the hook waits for the device and switches CUPTI's records off or on, outside every timed step; it
waits before the first profiled block too (either record), so no step of the plain block runs on the
device unrecorded inside a profiled one. With several ranks the first plain step after a profiled block is
kept apart (`after_switch_step_us`), not timed plain: another rank's switch lands in it.

What the profiler records (TAXES_TRACE_RECORD):
- full: CPU and CUDA activities, shapes, memory and the execution trace, so analyze can name the ops and
  follow tensors (locality). Recording every op costs host time: a program whose host is the bottleneck
  (eager decoding, small batches) runs slower under it, and the measurement cost row says by how much.
- timing: cupti-python's device activity records (kernels, copies and memsets), each eager kernel with the
  time its launch was queued and submitted on the host (CUPTI's latency timestamps), no host calls, and the
  profiled steps stamped on CUPTI's clock, written as a Kineto trace (taxes.run.cupti_kineto). torch.profiler,
  even with CUDA activity only, calls back on every op to correlate it, and any CUPTI record of host calls
  intercepts them all: on a host-bound eager Llama forward the full record cost +312-443%, launch
  calls recorded +14-27%, this record +2-7% (docs/analyze.md). No op names, shapes or tensors (no locality).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

_STATE: dict = {}


def active() -> bool:
    return "cfg" in _STATE


def install() -> None:
    """Read the schedule from the environment and hook the step signals (idempotent)."""
    if active() or not os.environ.get("TAXES_TRACE_DIR"):
        return
    env = os.environ
    _STATE["cfg"] = {"dir": env["TAXES_TRACE_DIR"], "skip": int(env.get("TAXES_TRACE_SKIP", "3")),
                     "plain": int(env.get("TAXES_TRACE_PLAIN", "5")), "steps": int(env.get("TAXES_TRACE_STEPS", "5")),
                     "signal": env.get("TAXES_TRACE_STEP", "auto"), "record": env.get("TAXES_TRACE_RECORD", "full"),
                     "block": int(env.get("TAXES_TRACE_BLOCK", "2")),
                     "rank": int(env.get("RANK", env.get("LOCAL_RANK", "0")))}
    cfg = _STATE["cfg"]
    block = cfg["block"] if cfg["record"] == "timing" else 0
    _STATE.update(count=0, events=[], plain_steps=[], profiled_steps=[], prof=None, done=False,
                  phases=schedule(cfg["plain"], cfg["steps"], block))
    atexit.register(finish)
    signal = _STATE["cfg"]["signal"]
    if signal.startswith("nvtx:"):
        _hook_nvtx(signal[5:])
    elif signal in ("auto", "optimizer"):
        _hook_optimizer()


def schedule(plain: int, steps: int, block: int) -> list[str]:
    """The phase of each timed step, in order ("plain" or "profiled"): `plain` plain and `steps` profiled
    steps, in blocks of `block` steps ordered plain-profiled, profiled-plain, plain-profiled, ... (ABBA; a
    kind whose steps have run out leaves its blocks to the other); block 0: all plain steps, then the rest."""
    if block <= 0:
        return ["plain"] * plain + ["profiled"] * steps
    left = {"plain": plain, "profiled": steps}
    out: list[str] = []
    r = 0
    while left["plain"] or left["profiled"]:
        for kind in (("plain", "profiled") if r % 2 == 0 else ("profiled", "plain")):
            n = min(block, left[kind])
            out += [kind] * n
            left[kind] -= n
        r += 1
    return out


def _phase(k: int) -> str:
    """Program step k's phase: skip (the first skip + 1 steps: the end of step `skip` is the first
    boundary), plain, profiled, or done."""
    j = k - _STATE["cfg"]["skip"] - 1
    phases = _STATE["phases"]
    return "skip" if j < 0 else (phases[j] if j < len(phases) else "done")


def step() -> None:
    """One step has ended (taxes.step() calls this; so do the hooks)."""
    if not active() or _STATE["done"]:
        return
    n = _STATE["count"]
    _STATE["count"] = n + 1
    cur, nxt = _phase(n), _phase(n + 1)
    prof = _STATE["prof"]
    if cur == "profiled":
        prof.step()
        _STATE["profiled_steps"].append(n)
    if cur == "plain":
        _mark(n)
    if nxt != cur and cur == "profiled" and nxt != "done":
        prof.pause()
    if nxt == "plain" and cur != "plain":
        _mark(None)  # the block's first step starts here
    if nxt == "profiled" and cur != "profiled":
        # the plain block's device work ends before the records start: a program that ends its step before
        # it waits for the device (device-bound, taxes.step() before synchronize) would otherwise run it
        # unrecorded inside the first profiled step, where it reads as idle (15 ms of a 16 ms Llama step)
        _device_idle()
        if prof is None:
            _start_profiler()
        else:
            prof.resume()
    if nxt == "done":
        finish()


def _device_idle() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _mark(ended) -> None:
    """A plain block's boundary: a CUDA event (the host's clock without a GPU); `ended`: the program step it
    ends (None: a block's start)."""
    import torch

    if torch.cuda.is_available():  # the device's time between two step ends
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
    else:
        ev = time.perf_counter()
    _STATE["events"].append((ended, ev))


def _start_profiler() -> None:
    """Record mode full: torch.profiler with CPU and CUDA activities, shapes and memory events, and, where
    this PyTorch has it, the execution trace (every op's input and output tensors by storage id: what analyze
    follows to find producer -> consumer pairs) in rank<R>.et.json, beside the trace where `taxes analyze`
    looks. Record mode timing: cupti-python (_CuptiCycle)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cfg = _STATE["cfg"]
    timing = cfg["record"] == "timing" and torch.cuda.is_available()
    if timing:
        _STATE["prof"] = _CuptiCycle()
        return
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(ProfilerActivity.CUDA)
    kwargs = {"record_shapes": True, "profile_memory": True}
    try:
        from torch.profiler import ExecutionTraceObserver

        kwargs["execution_trace_observer"] = ExecutionTraceObserver().register_callback(
            os.path.join(cfg["dir"], f"rank{cfg['rank']}.et.json"))
    except Exception:  # an older PyTorch: shapes only
        pass
    from torch.profiler import schedule

    os.makedirs(cfg["dir"], exist_ok=True)
    path = os.path.join(cfg["dir"], f"rank{cfg['rank']}.json")
    # a schedule is what makes torch.profiler mark its steps (ProfilerStep#N): one cycle of `steps` steps
    prof = profile(activities=acts, schedule=schedule(wait=0, warmup=0, active=cfg["steps"], repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(path), **kwargs)
    prof.__enter__()
    # versions in the trace itself: the analysis names what recorded it
    prof.add_metadata("torch_version", str(torch.__version__))
    triton = sys.modules.get("triton")
    if triton is not None:
        prof.add_metadata("triton_version", str(getattr(triton, "__version__", "")))
    prof.add_metadata("taxes_trace_record", "full")
    _STATE["prof"] = prof


class _CuptiCycle:
    """The profiled steps in timing mode: cupti-python records from here, a stamp at each step boundary;
    pause() and resume() between blocks (taxes.run.cupti.Recorder)."""

    def __init__(self):
        from taxes.run.cupti import Recorder

        self.rec = Recorder(api="queued").start()
        self.windows: list = []
        self.begin = self.rec.now_us()

    def step(self) -> None:
        end = self.rec.now_us()
        self.windows.append((self.begin, end))
        self.begin = end

    def pause(self) -> None:
        import torch

        torch.cuda.synchronize()  # the block's device work recorded before the records stop
        self.rec.pause()

    def resume(self) -> None:
        self.rec.resume()
        self.begin = self.rec.now_us()

    def write(self, path: str, rank: int) -> None:
        import torch

        from taxes.run.cupti_kineto import to_kineto

        torch.cuda.synchronize()  # the last step's device work has its records before the flush
        acts, calls, _ = self.rec.stop()
        triton = sys.modules.get("triton")
        meta = {"pid": os.getpid(), "tid": threading.get_native_id(), "device": torch.cuda.current_device(), "rank": rank,
                "gpu": torch.cuda.get_device_name(), "world_size": int(os.environ.get("WORLD_SIZE", "0") or 0),
                "torch_version": str(torch.__version__),
                "base_ns": round(self.rec.shared_origin_us * 1000) if self.rec.shared_origin_us is not None else None,
                "triton_version": str(getattr(triton, "__version__", "")) if triton else None}
        with open(path, "w") as f:
            json.dump(to_kineto(acts, calls, self.windows, meta), f)


def finish() -> None:
    """Stop the profiler and write the trace and the plain step times (once)."""
    if not active() or _STATE["done"]:
        return
    _STATE["done"] = True
    if _STATE["count"] == 0:
        return  # a process of the program's own that never ran a step (a compile worker): nothing to say
    cfg = _STATE["cfg"]
    rank = cfg["rank"]
    os.makedirs(cfg["dir"], exist_ok=True)
    events = _STATE["events"]
    plain, plain_steps, switched, switched_steps = [], [], [], []
    if events and not isinstance(events[-1][1], float):
        events[-1][1].synchronize()
    # With several ranks, the first plain step after a profiled block is no plain sample: each rank switches
    # its records off between the two (outside its own timed steps), and a rank whose switch (CUPTI's flush
    # of the block) takes long holds the others at their first collective of that step (every plain step
    # over 40 ms of a 20-35 ms DDP step on 2 H100s was one: reports/known_answer/ddp-h100-x2.json)
    several = int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
    profiled = set(_STATE["profiled_steps"])
    for (_, a), (ended, b) in zip(events, events[1:]):
        if ended is None:  # a block's start: no step ended here
            continue
        us = (b - a) * 1e6 if isinstance(a, float) else a.elapsed_time(b) * 1e3
        if several and ended - 1 in profiled:
            switched.append(us)
            switched_steps.append(ended)
            continue
        plain.append(us)
        plain_steps.append(ended)
    with open(os.path.join(cfg["dir"], f"plain_rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "plain_step_us": plain, "plain_steps": plain_steps,
                   "after_switch_step_us": switched, "after_switch_steps": switched_steps,
                   "profiled_steps": _STATE["profiled_steps"], "steps_seen": _STATE["count"],
                   "signal": cfg["signal"], "block": cfg["block"] if cfg["record"] == "timing" else 0}, f)
    prof = _STATE.get("prof")
    if prof is not None:
        tmp = os.path.join(cfg["dir"], f"rank{rank}.json")
        if isinstance(prof, _CuptiCycle):
            prof.write(tmp, rank)
        else:
            prof.__exit__(None, None, None)  # saves the cycle if it was not complete
            if not os.path.exists(tmp):
                prof.export_chrome_trace(tmp)
        import gzip
        import shutil

        for path in (tmp, os.path.join(cfg["dir"], f"rank{rank}.et.json")):
            if os.path.exists(path):
                with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.remove(path)
    print(f"[taxes trace] rank {rank}: {_STATE['count']} steps seen, {len(plain)} timed plain, "
          f"{'a trace written' if prof is not None else 'no profiled steps (the program ended first)'}",
          file=sys.stderr, flush=True)


def _hook_optimizer() -> None:
    """Every optimizer.step() ends a step (a global post-hook, once torch is imported)."""
    def hook():
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(lambda *a, **k: step())

    _after_import("torch.optim.optimizer", hook)


def _hook_nvtx(name: str) -> None:
    """The end of every NVTX range `name` (torch.cuda.nvtx range_push/range_pop or range()) ends a step."""
    def hook():
        import torch.cuda.nvtx as nvtx

        stack: list = []
        push, pop = nvtx.range_push, nvtx.range_pop

        def range_push(msg, *a, **k):
            stack.append(msg)
            return push(msg, *a, **k)

        def range_pop(*a, **k):
            msg = stack.pop() if stack else None
            out = pop(*a, **k)
            if msg == name:
                step()
            return out

        nvtx.range_push, nvtx.range_pop = range_push, range_pop

    _after_import("torch.cuda.nvtx", hook)


def _after_import(module: str, hook) -> None:
    """Run hook once `module` is imported (at once if it already is)."""
    if module in sys.modules:
        hook()
        return
    import importlib.abc
    import importlib.util

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != module:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def run(mod):
                exec_module(mod)
                hook()

            spec.loader.exec_module = run
            return spec

    sys.meta_path.insert(0, Finder())
