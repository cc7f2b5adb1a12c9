"""`taxes profile`: plan a run, launch the ranks, and return the result document (the Python API too).

The ranks measure (taxes.run.measure), rank 0 builds the document (taxes.documents.profile_document). `profile(...)` returns the
document wrapped with pandas frames.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from taxes.errors import TaxesError
from taxes.model.hardware import HardwareProfile
from taxes.variants import get, names
from taxes.workloads import make_workload, shape_of

CLOCK_CHOICES = ("auto", "cupti", "torch.profiler", "both")
# How each iteration starts on every rank (taxes.run.harness): "barrier", a host barrier then the start event
# (isolated iterations; the ranks' barrier-exit skew is the row start_skew); "aligned", the devices also
# meet in a one-element all-reduce before the start event (no harness skew; each host launches from there);
# "ahead", a spin kernel first, during which each host queues the whole iteration, then the all-reduce
# (what a model's layer sees with the host ahead: launches hidden behind the device)
STARTS = {"barrier": "a host barrier the ranks leave together (a shared page they spin on), then each rank's start "
                     "event (isolated iterations)",
          "aligned": "a host barrier, then an all-reduce that every rank's device leaves together, then the start "
                     "event",
          "ahead": "a host barrier, a 500 us spin kernel during which each host queues the whole iteration, an "
                   "all-reduce the devices leave together, then the start event (the host ahead)"}
@dataclass
class Job:
    workload: str
    shapes: list[dict]  # one case per shape, all in one launch
    world: int
    dtype: str
    variants: list[str]
    iters: int
    warmup: int
    wait_s: float
    config: dict
    progress: bool
    rounds: int = 5  # timing rounds: every variant's iterations are interleaved in this many blocks
    clock: str = "auto"  # the per-kernel clock: auto (cupti-python, else torch.profiler), cupti, torch.profiler, both
    start: str = "barrier"  # how each iteration starts (STARTS)

    @property
    def start_how(self) -> str:
        return STARTS[self.start]


def run_profile(job: Job, hw: HardwareProfile, emulate: bool = False, timeout_s: float = 600.0) -> dict:
    """Launch the ranks (or join torchrun's), measure, and return rank 0's document (None elsewhere)."""
    from taxes.documents.profile_document import build_document
    from taxes.kernels.runtime import launch
    from taxes.run.measure import rank_job

    heap = max(heap_bytes(make_workload(job.workload, s, job.world, job.dtype)) for s in job.shapes)
    results = launch(rank_job, job.world, job, backend="emulated" if emulate else "cuda", heap_bytes=heap,
                     timeout_s=timeout_s)
    if not results or results[0] is None:
        return None
    if os.environ.get("RANK", "0") != "0" and "LOCAL_RANK" in os.environ:
        return None  # under torchrun every rank gets every result; rank 0 alone writes the document
    return build_document(results, job, hw, emulate)


def heap_bytes(w) -> int:
    """The symmetric heap each rank needs for workload w's case and every variant (bytes)."""
    if w.name == "ag-gemm":
        per_set = w.M * w.K * w.elt
        return 4 * per_set + (64 << 20)  # up to four rotated a_full sets, plus flags
    if w.name == "gemm-rs":  # rotated A sets, and the fused kernel's double-buffered inbox of p-1 slots
        return 4 * w.M * (w.K // w.world) * w.elt + 2 * w.M * w.N * 4 + (64 << 20)
    if w.name == "tp-mlp":  # four rotated X sets; each fused build's gemm-rs inbox (< 2 M H), each bsp
        # build's M x H partial when emulated (two of each, built again for --trace), the reference's W1 and W2
        return ((4 + 4 * 2 + 4) * w.M * w.H + 3 * w.H * (w.F // w.world)) * w.elt + (64 << 20)
    return int(4 * w.partial_bytes() * w.world * 2) + (64 << 20)


@dataclass
class Result:
    """What `taxes.profile(...)` returns: the document, and pandas views of it."""

    document: dict

    @property
    def summary(self):
        from taxes.documents.results import summary_frame

        return summary_frame(self.document)

    @property
    def components(self):
        from taxes.documents.results import components_frame

        return components_frame(self.document)

    @property
    def samples(self):
        from taxes.documents.results import samples_frame

        return samples_frame(self.document)

    @property
    def phases(self):
        from taxes.documents.results import phases_frame

        return phases_frame(self.document)


def plan(workload: str, shape: dict | str | list | None = None, gpus: int = 2, variants: list[str] | None = None,
         dtype: str = "bf16", iters: int = 30, warmup: int = 5, emulate: bool = False, wait_s: float = 5.0,
         progress: bool = False, config: dict | None = None, rounds: int = 5, clock: str = "auto",
         start: str = "barrier") -> Job:
    """Check every input (one-line TaxesError) and return the job, before anything runs. The iterations of
    every variant are timed in `rounds` interleaved blocks (1: one variant after another)."""
    from taxes.variants import TABLE
    from taxes.workloads import DEFAULT_SHAPES, parse_shape

    if workload not in TABLE:
        raise TaxesError(f"profile: no kernels for workload {workload!r} (profiled: {', '.join(TABLE)})")
    if iters < 1 or warmup < 0 or rounds < 1:
        raise TaxesError("profile: --iters and --rounds must be at least 1 and --warmup at least 0")
    if clock not in CLOCK_CHOICES:
        raise TaxesError(f"profile: unknown clock {clock!r} (choose from {', '.join(CLOCK_CHOICES)})")
    if start not in STARTS:
        raise TaxesError(f"profile: unknown iteration start {start!r} (choose from {', '.join(STARTS)})")
    shapes = shape if isinstance(shape, list) else [shape]
    shapes = [parse_shape(s) if isinstance(s, str) else dict(s or {}) for s in shapes]
    ws = [make_workload(workload, dict(DEFAULT_SHAPES[workload]) | s, gpus, dtype) for s in shapes]
    from taxes.run.cases import check_config

    check_config(workload, config or {})
    chosen = list(variants or names(workload))
    for v in chosen:
        get(workload, v)  # an unknown name is one line
    if emulate:
        chosen = [v for v in chosen if not get(workload, v).peer]  # PyTorch's fused ops need CUDA symmetric memory
    else:
        _check_memory(ws, chosen)
    return Job(workload, [shape_of(w) for w in ws], gpus, dtype, chosen, iters, warmup, wait_s, config or {},
               progress, rounds, clock, start)


def profile(workload: str, shape: dict | str | list | None = None, gpus: int = 2, variants: list[str] | None = None,
            dtype: str = "bf16", iters: int = 30, warmup: int = 5, emulate: bool = False,
            hardware: str | HardwareProfile = "h200-sxm", wait_s: float = 5.0, timeout_s: float = 600.0,
            progress: bool = False, config: dict | None = None, rounds: int = 5, clock: str = "auto",
            start: str = "barrier") -> Result:
    """Profile a workload at one shape (or a list of shapes, one case each); returns a Result (document +
    DataFrames). See `taxes profile --help`."""
    from taxes.model.hardware import get_profile

    hw = hardware if isinstance(hardware, HardwareProfile) else get_profile(hardware)
    job = plan(workload, shape, gpus, variants, dtype, iters, warmup, emulate, wait_s, progress, config, rounds, clock,
               start)
    return Result(run_profile(job, hw, emulate, timeout_s))


def bytes_for_case(w, chosen: list[str], sets: int) -> float:
    """Bytes one rank holds while a case is timed: every variant stays built across the interleaved rounds,
    so the largest variant's whole estimate (inputs rotated over `sets`, the reference, its buffers) plus
    every other variant's own buffers (gathered and staging buffers, the estimate's "gathered")."""
    from taxes.run import preflight

    def estimated(name):  # bsp-sdpa holds what bsp does; a fused graph what its eager kernels do; fused-auto
        v = get(w.name, name)  # at most what the fused kernel does (it runs that or the graph)
        if v.rung == "auto":
            return "all-fused-eager" if w.name == "tp-mlp" else "fused-push"
        return v.eager_twin if v.fused and v.graphed else v.model or name

    kinds = [estimated(v) for v in chosen]
    parts = [preflight.memory_breakdown(w, k, sets) for k in kinds]
    largest = max(range(len(parts)), key=lambda i: sum(parts[i].values()))
    return sum(parts[largest].values()) + sum(p.get("gathered", 0.0) for i, p in enumerate(parts) if i != largest)


def _check_memory(ws: list, chosen: list[str]) -> None:
    """Refuse, before anything is allocated, a shape whose variants do not fit this GPU together
    (bytes_for_case)."""
    from taxes.run import preflight
    from taxes.run.cases import L2_BYTES

    try:
        import torch

        if not torch.cuda.is_available():
            return
        device = int(os.environ.get("LOCAL_RANK", "0"))
    except ImportError:
        return
    for w in ws:
        sets = 1 if w.name == "flash-decode" and w.kv_bytes() > 3 * L2_BYTES else 4
        preflight.check_memory(bytes_for_case(w, chosen, sets), device)


def summary_lines(doc: dict) -> list[str]:
    """A short text summary per variant: plain E2E, measurement cost and unattributed (interquartile means)."""
    lines = []
    for case in doc["cases"]:
        for v in case["variants"]:
            plain = v.get("plain_e2e_us")
            att = v.get("attribution") or {}
            if plain is None or not math.isfinite(plain):
                lines.append(f"{v['variant']:>16}: failed ({v['config'].get('error', 'no samples')})")
                continue
            line = f"{v['variant']:>16}: E2E {plain:.1f} us"
            if v.get("measurement_cost_us") is not None:
                line += f", measuring +{v['measurement_cost_us']:.1f} us" + (" (perturbed)" if v.get("perturbed") else "")
            if att.get("unattributed_share") is not None:
                line += f", unattributed {100 * att['unattributed_share']:+.1f}%"
            lines.append(line)
    return lines


def parse_config(text: str) -> dict:
    """'block_n=128,producer=ctas' -> {"block_n": 128, "producer": "ctas"} (whole numbers become ints, other
    numbers floats, true and false bools; taxes.run.cases.check_config then checks them against the fields)."""
    out = {}
    for item in (x for x in text.split(",") if x.strip()):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TaxesError(f"--config: {item!r} is not key=value")
        out[key.strip()] = _config_value(value.strip())
    return out


def _config_value(text: str):
    if text.lstrip("-").isdigit():
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    try:
        x = float(text)
    except ValueError:
        return text
    return x if math.isfinite(x) else text
