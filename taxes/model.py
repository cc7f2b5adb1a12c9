"""The analytical cost model: every variant's E2E and its three taxes, from shapes and hardware figures.

The model predicts one iteration on one rank as a sequence of steps (kernels and collectives) on that
rank's stream. Each step's duration is the sum of labelled parts (ideal, sync wait, exposed transfer,
locality, inefficiency); a simulation of the host's launch queue places the steps in time and turns
the device's idle gaps into the launch tax. The components therefore add up to the predicted E2E by
construction, and the predicted timeline has the same form as a measured one. docs/model.md gives
every formula and why it has its form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from taxes.errors import TaxesError
from taxes.floor import Floor, floor_of
from taxes.hardware import HardwareProfile
from taxes.variants import model_names, modelled
from taxes.workloads import AgGemm, FlashDecode, GemmRs, TpMlp, Workload, replace_dim

# The additive components of E2E, in report order. ideal + taxes + inefficiency + unattributed = E2E.
COMPONENTS = ("ideal", "sync_wait", "exposed_transfer", "locality", "launch", "inefficiency", "unattributed")
TAXES = {
    "bulk-synchronous": ("sync_wait", "exposed_transfer"),
    "data-locality": ("locality",),
    "kernel-launch": ("launch",),
}
COMPONENT_TITLES = {
    "ideal": "ideal (floor)",
    "sync_wait": "bulk-sync: sync wait",
    "exposed_transfer": "bulk-sync: exposed transfer",
    "locality": "data-locality tax",
    "launch": "kernel-launch tax",
    "inefficiency": "kernel inefficiency",
    "unattributed": "unattributed",
}


@dataclass(frozen=True)
class ModelOptions:
    """Schedule assumptions of the fused kernels (not hardware facts; docs/model.md)."""

    chunks_per_peer: int = 8  # flags (pipeline chunks) per peer's shard in fused kernels
    push_producer_sms: int = 0  # SMs a push variant gives to producer CTAs (0: copy engine produces)


@dataclass
class Step:
    """One kernel or collective as the model predicts it: duration = sum(parts)."""

    name: str
    role: str  # compute | communication
    parts: dict[str, float]
    launcher: str = "torch"  # whose host launch path issues it (taxes.hardware.LAUNCHERS)

    @property
    def duration_us(self) -> float:
        return math.fsum(self.parts.values())


@dataclass
class Phase:
    """A step placed on the rank's timeline (us from the iteration's start)."""

    name: str
    role: str
    start_us: float
    end_us: float
    parts: dict[str, float] = field(default_factory=dict)


@dataclass
class Prediction:
    workload: Workload
    variant: str
    hardware: str
    e2e_us: float
    components: dict[str, float]
    floor: Floor
    exposed_communication_us: float
    phases: list[Phase]

    def taxes_us(self) -> dict[str, float]:
        return {tax: math.fsum(self.components[c] for c in parts) for tax, parts in TAXES.items()}


# ---- building blocks, all in us ------------------------------------------------------------------


def _hbm_us(nbytes: float, hw: HardwareProfile) -> float:
    """Time to move bytes through HBM at the achievable (calibrated) bandwidth."""
    return nbytes / (hw.hbm_bytes_per_us() * hw.hbm_efficiency)


def _collective_us(nbytes_in: float, w: Workload, hw: HardwareProfile) -> float:
    """An NCCL collective that delivers nbytes_in to each rank: base latency + bytes / achieved bw."""
    if w.world == 1:
        return hw.collective_base_us
    return hw.collective_base_us + nbytes_in / (hw.inbound_bytes_per_us(w.world) * hw.collective_efficiency)


def _work_us(w: Workload, hw: HardwareProfile, efficiency: float, flops: float | None = None) -> float:
    """A compute kernel doing the workload's local work at a fraction of peak, or HBM-bound."""
    flops = w.flops() if flops is None else flops
    return max(flops / (hw.peak_flops(w.dtype) * efficiency) * 1e6, _hbm_us(w.hbm_bytes(), hw))


def _compute_step(name: str, fl: Floor, time_us: float, locality_us: float = 0.0, launcher: str = "torch") -> Step:
    return Step(name, "compute", {"ideal": fl.work_us, "inefficiency": time_us - fl.work_us, "locality": locality_us},
                launcher)


def _collective_step(name: str, w: Workload, hw: HardwareProfile, fl: Floor, nbytes_in: float, locality_us: float) -> Step:
    transfer = _collective_us(nbytes_in, w, hw)
    unhideable = min(fl.unhideable_link_us, transfer)
    skew = hw.rank_skew_us if w.world > 1 else 0.0
    return Step(name, "communication", {
        "sync_wait": skew,
        "locality": locality_us,
        "ideal": unhideable,
        "exposed_transfer": transfer - unhideable,
    }, "nccl")


def _small_kernel_step(name: str, hw: HardwareProfile, locality_us: float, launcher: str = "triton",
                       floor_us: float | None = None) -> Step:
    """A combine-like kernel: its bytes are all intermediate; below its floor (the kernel floor, or a
    combine's loop over its partial sets, hw.combine_kernel_us) it idles or waits on memory latency."""
    floor_us = hw.kernel_floor_us if floor_us is None else floor_us
    return Step(name, "compute", {"locality": locality_us, "inefficiency": max(0.0, floor_us - locality_us)}, launcher)


def _overlap(chunks: list[tuple[float, float]]) -> tuple[float, float]:
    """Consume chunks in order: chunk i is ready at arrive_i and takes compute_i.
    Returns (finish, time spent waiting for arrivals)."""
    t = wait = 0.0
    for arrive, compute in chunks:
        if arrive > t:
            wait += arrive - t
            t = arrive
        t += compute
    return t, wait


def _fused_step(name: str, fl: Floor, finish: float, wait: float, wait_no_skew: float, locality_us: float,
                launcher: str = "triton_tma") -> Step:
    """Split a fused kernel's (finish, wait) into components.

    Waiting up to the unhideable link time is part of the floor; waiting beyond it is the fused
    kernel's bulk-synchronous tax (the share caused by a late peer is sync wait, the rest exposed
    transfer); compute beyond the floor that the wait did not hide is kernel inefficiency."""
    excess_wait = max(0.0, wait - fl.unhideable_link_us)
    sync = min(max(0.0, wait - wait_no_skew), excess_wait)
    return Step(name, "compute", {
        "ideal": fl.ideal_us,
        "sync_wait": sync,
        "exposed_transfer": excess_wait - sync,
        "inefficiency": finish - fl.ideal_us - excess_wait,
        "locality": locality_us,
    }, launcher)


# ---- the workloads' steps --------------------------------------------------------------------------


def _ag_gemm_steps(w: AgGemm, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions) -> list[Step]:
    half = _hbm_us(w.intermediate_bytes(variant) / 2, hw)  # written once, read once
    v = modelled(w.name, variant)
    if v.bulk_synchronous:
        return [
            _collective_step("all_gather", w, hw, fl, w.link_bytes(), locality_us=half),
            _compute_step("matmul", fl, _work_us(w, hw, hw.matmul_efficiency), locality_us=half),
        ]
    p = w.world
    push = v.producer == "push"
    sm_share = hw.sm_count / (hw.sm_count - opt.push_producer_sms) if push else 1.0
    compute = _work_us(w, hw, hw.triton_matmul_efficiency) * sm_share
    n = (p - 1) * opt.chunks_per_peer
    rate = hw.inbound_bytes_per_us(p) * hw.p2p_efficiency
    signal = hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else 0.0)

    def run(skew: float) -> tuple[float, float]:
        # The local shard first (ready at once), then peer chunks in order of arrival.
        chunks = [(0.0, compute / p)]
        chunks += [(skew + signal + (i + 1) * w.link_bytes() / n / rate, compute * (p - 1) / p / n) for i in range(n)]
        return _overlap(chunks)

    finish, wait = run(hw.rank_skew_us if p > 1 else 0.0)
    _, wait0 = run(0.0)
    return [_fused_step(f"ag_gemm_{variant.replace('-', '_')}", fl, finish, wait, wait0, 2 * half)]


def _gemm_rs_steps(w: GemmRs, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions) -> list[Step]:
    half = _hbm_us(w.intermediate_bytes(variant) / 2, hw)
    v = modelled(w.name, variant)
    if v.bulk_synchronous:
        return [
            _compute_step("matmul", fl, _work_us(w, hw, hw.matmul_efficiency), locality_us=half),
            _collective_step("reduce_scatter", w, hw, fl, w.link_bytes(), locality_us=half),
        ]
    p = w.world
    push = v.producer == "push"
    sm_share = hw.sm_count / (hw.sm_count - opt.push_producer_sms) if push else 1.0
    compute = _work_us(w, hw, hw.triton_matmul_efficiency) * sm_share
    n = (p - 1) * opt.chunks_per_peer  # chunks of the peers' row blocks, computed first
    chunk_c, chunk_bytes = compute / p / opt.chunks_per_peer, w.link_bytes() / max(n, 1)
    rate = hw.inbound_bytes_per_us(p) * hw.p2p_efficiency
    signal = hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else 0.0)

    def run(skew: float) -> tuple[float, float]:
        # Compute the peers' blocks chunk by chunk; each goes out over the link as soon as it is done.
        # By symmetry the chunks for this rank's own block arrive when ours arrive at the peers.
        link_free, arrivals = 0.0, []
        for i in range(n):
            done = (i + 1) * chunk_c
            link_free = max(done, link_free) + chunk_bytes / rate
            arrivals.append(skew + link_free + signal)
        # Then this rank's own block, chunk by chunk: compute its partial, wait for the peers' partials
        # of the same rows (the last peer's chunk for those rows), reduce.
        start = n * chunk_c
        own = [(arrivals[min(n - 1, (p - 2) * opt.chunks_per_peer + k)] if n else 0.0, chunk_c) for k in range(opt.chunks_per_peer)]
        t, wait = _overlap([(start, 0.0)] + own)
        return t, wait - start

    finish, wait = run(hw.rank_skew_us if p > 1 else 0.0)
    _, wait0 = run(0.0)
    return [_fused_step(f"gemm_rs_{variant.replace('-', '_')}", fl, finish, wait, wait0, 2 * half)]


def _flash_decode_steps(w: FlashDecode, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions) -> list[Step]:
    """One launch decodes the rank's KV (its splits' partials merged by the last program of each group);
    bsp then all-gathers the packed partials and combines them; fused pushes them from the decode and one
    combine kernel merges the peers' as they arrive."""
    p, part = w.world, w.partial_bytes()
    splits = w.kv_splits(hw.sm_count)
    split_io = splits * part  # the splits' partials, written then read by the group's last program
    v = modelled(w.name, variant)
    bsp = v.bulk_synchronous
    # bsp: the group's last program also writes the rank's packed partial for the all-gather
    decode = _compute_step("local_decode", fl, _work_us(w, hw, hw.matmul_efficiency),
                           _hbm_us(2 * split_io + (part if bsp else 0.0), hw), launcher="triton")
    if bsp:
        return [
            decode,
            _collective_step("all_gather_partials", w, hw, fl, w.link_bytes(), _hbm_us(part + p * part, hw)),
            _small_kernel_step("global_combine", hw, _hbm_us(p * part, hw), floor_us=hw.combine_kernel_us(p)),
        ]
    push = v.producer == "push"
    rate = hw.inbound_bytes_per_us(p) * hw.p2p_efficiency
    transfer = (w.link_bytes() / rate + hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else hw.flag_round_trip_us)) if p > 1 else 0.0
    locality = _hbm_us(2 * (p - 1) * part, hw)
    unhideable = min(fl.unhideable_link_us, transfer)
    combine = Step(f"combine_{variant.replace('-', '_')}", "compute", {
        "locality": locality,
        "inefficiency": max(0.0, hw.combine_kernel_us(p) - locality),  # merges the p partials
        "sync_wait": hw.rank_skew_us if p > 1 else 0.0,
        "ideal": unhideable,
        "exposed_transfer": transfer - unhideable,
    }, "triton")
    return [decode, combine]


def _tp_mlp_steps(w: TpMlp, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions) -> list[Step]:
    """The ag-gemm steps for (M, 2F, H), the activation, the gemm-rs steps for (M, H, F).

    The activation is all intermediate traffic (a _small_kernel_step): the SwiGLU kernel reads Y1 and
    writes Z; torch's F.silu(g) * u is modelled as its two kernels, silu (reads the gate half, writes a
    temporary) and mul (reads the temporary and the up half, writes Z). The first GEMM's write of Y1 and
    the second's read of Z are added to those steps as locality too, so the layer's locality is
    TpMlp.intermediate_bytes / HBM bandwidth. Each part's steps are split against the part's own floor;
    the layer's floor is lower (each part's link time counts as unhideable on its own; Y1 and Z count
    as the parts' essential bytes), so the ideal shares are scaled down to the layer's floor and the
    rest charged to the same step: exposed transfer for a collective, inefficiency for a kernel."""
    part = modelled(w.name, variant).part
    ag_w, rs_w = w.parts()
    ag_steps = _ag_gemm_steps(ag_w, part, hw, floor_of(ag_w, hw), opt)
    rs_steps = _gemm_rs_steps(rs_w, part, hw, floor_of(rs_w, hw), opt)
    y1, z = w.y1_bytes(), w.z_bytes()
    gemm1, gemm2 = ag_steps[-1], rs_steps[0]
    gemm1.parts["locality"] += _hbm_us(y1, hw)
    gemm2.parts["locality"] += _hbm_us(z, hw)
    if modelled(w.name, variant).bulk_synchronous:
        gemm1.name, gemm2.name = "matmul1", "matmul2"
        activation = [_small_kernel_step("silu", hw, _hbm_us(y1 / 2 + z, hw), "torch"),
                      _small_kernel_step("mul", hw, _hbm_us(z + y1 / 2 + z, hw), "torch")]
    else:
        activation = [_small_kernel_step("swiglu", hw, _hbm_us(y1 + z, hw))]
    steps = ag_steps + activation + rs_steps
    _rescale_ideal(steps, fl.ideal_us)
    return steps


def _rescale_ideal(steps: list[Step], ideal_us: float) -> None:
    """Scale the steps' ideal parts down to add up to ideal_us, charging what is taken off to the same
    step (each step keeps its duration). Steps whose ideal adds up to less are left alone."""
    total = math.fsum(s.parts.get("ideal", 0.0) for s in steps)
    if total <= ideal_us:
        return
    keep = ideal_us / total
    for s in steps:
        ideal = s.parts.get("ideal", 0.0)
        moved = ideal * (1.0 - keep)
        s.parts["ideal"] = ideal - moved
        charge = "exposed_transfer" if s.role == "communication" else "inefficiency"
        s.parts[charge] = s.parts.get(charge, 0.0) + moved


_STEPS = {"ag-gemm": _ag_gemm_steps, "gemm-rs": _gemm_rs_steps, "flash-decode": _flash_decode_steps,
          "tp-mlp": _tp_mlp_steps}
# ---- the launch queue ----------------------------------------------------------------------------


def schedule(steps: list[Step], graphed: bool, hw: HardwareProfile) -> tuple[list[Phase], float]:
    """Place steps on the device timeline; return the phases and the total idle (launch tax).

    Eager: the host issues launch i when launch i-1's call returns, each call costing its launcher's
    host time (hw.launch_us(step.launcher): a torch op, a Triton kernel, a Triton kernel that builds TMA
    descriptors, an NCCL collective); the device starts a step when its launch has been issued and the
    previous step has ended. CUDA graph: one replay call (hw.launch_us("graph")), then launch_graph_us
    between its kernels."""
    phases, t, idle, host = [], 0.0, 0.0, 0.0
    for i, step in enumerate(steps):
        if graphed:
            ready = hw.launch_us("graph") if i == 0 else t + hw.launch_graph_us
        else:
            host += hw.launch_us(step.launcher)
            ready = host
        start = max(t, ready)
        idle += start - t
        t = start + step.duration_us
        phases.append(Phase(step.name, step.role, start, t, dict(step.parts)))
    return phases, idle


def predict(w: Workload, variant: str, hw: HardwareProfile, options: ModelOptions | None = None) -> Prediction:
    kind = modelled(w.name, variant)
    if w.dtype not in hw.matrix_tflops:
        raise TaxesError(f"hardware {hw.name} has no matrix peak for dtype {w.dtype}")
    opt = options or ModelOptions()
    fl = floor_of(w, hw)
    steps = _STEPS[w.name](w, variant, hw, fl, opt)
    phases, idle = schedule(steps, kind.graphed, hw)
    comp = {c: 0.0 for c in COMPONENTS}
    for s in steps:
        for c, v in s.parts.items():
            comp[c] += v
    comp["launch"] = idle
    for c, v in comp.items():
        if v < -1e-9:
            raise AssertionError(f"model produced a negative {c} ({v}) for {w} {variant}")
        comp[c] = max(0.0, v)
    e2e = math.fsum(comp[c] for c in COMPONENTS)
    exposed = math.fsum(s.duration_us for s in steps if s.role == "communication") + (
        0.0 if kind.bulk_synchronous else comp["sync_wait"] + comp["exposed_transfer"] + min(fl.unhideable_link_us, comp["ideal"])
    )
    return Prediction(w, variant, hw.name, e2e, comp, fl, exposed, phases)


def predict_all(w: Workload, hw: HardwareProfile, variants=None, options: ModelOptions | None = None) -> list[Prediction]:
    """Every variant's prediction (variants: default, every variant the model knows for the workload)."""
    return [predict(w, v, hw, options) for v in (model_names(w.name) if variants is None else variants)]


def parse_sweep(text: str, workload: Workload) -> tuple[str, list[int]]:
    """'M=1024:16384' -> ('M', [1024, 2048, 4096, 8192, 16384]): one dimension, doubling."""
    from taxes.workloads import parse_int

    if "=" not in text or ":" not in text:
        raise TaxesError(f"sweep: {text!r} is not DIM=START:STOP (e.g. M=1024:16384)")
    dim, rng = (s.strip() for s in text.split("=", 1))
    if dim not in workload.dims:
        raise TaxesError(f"sweep: {workload.name} has no dimension {dim!r} (its dimensions: {', '.join(workload.dims)})")
    lo_text, hi_text = rng.split(":", 1)
    lo, hi = parse_int(lo_text, dim), parse_int(hi_text, dim)
    if lo <= 0 or hi < lo:
        raise TaxesError(f"sweep: {dim} range {lo}:{hi} must be positive and increasing")
    values = []
    v = lo
    while v <= hi and len(values) < 64:
        values.append(v)
        v *= 2
    return dim, values


def sweep(w: Workload, dim: str, values: list[int], hw: HardwareProfile, variants=None,
          options: ModelOptions | None = None) -> list[list[Prediction]]:
    """Predictions for each value of one dimension (each value validated like any shape)."""
    return [predict_all(replace_dim(w, dim, v), hw, variants, options) for v in values]
