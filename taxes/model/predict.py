"""The analytical cost model: every variant's E2E and its three taxes, from shapes and hardware figures.

The model predicts one iteration on one rank as a sequence of steps (kernels and collectives) on that
rank's stream. Each step's duration is the sum of labelled parts, the same rows the attribution measures
(taxes.attribution.attribute): ideal, start skew, sync wait, exposed transfer, locality, inefficiency and the signed
remainder the attribution calls unattributed. A simulation of the host's launch queue places the steps in
time and turns the device's idle gaps into the launch tax. The components therefore add up to the
predicted E2E by construction, and the predicted timeline has the same form as a measured one. Every
figure comes from the hardware profile, and where `taxes calibrate` measured the mechanism behind a term
(its readings in the profile's extra), from that measurement. docs/model.md gives every formula, where its
figures come from, and how far it is from measurement.

Every prediction passes the consistency checks (`check`) before it is returned; a violation raises
ModelInconsistency, never a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from taxes.errors import TaxesError
from taxes.model.floor import Floor, floor_of
from taxes.model.hardware import HardwareProfile
from taxes.documents.method import TAXES
from taxes.variants import model_names, modelled
from taxes.workloads import AgGemm, FlashDecode, GemmRs, TpMlp, Workload, replace_dim

# The additive components of E2E, in report order. They add up to E2E; start_skew (the ranks' spread at
# the start of an iteration, a property of how iterations start, not of the program) and unattributed (the
# signed difference between the kernels' own floors and the floor plus locality) are in no tax.
COMPONENTS = ("ideal", "start_skew", "sync_wait", "exposed_transfer", "locality", "launch", "inefficiency",
              "unattributed")
COMMUNICATION = ("start_skew", "sync_wait", "exposed_transfer")  # parts that only a peer can cause
COMPONENT_TITLES = {
    "ideal": "ideal (floor)",
    "start_skew": "ranks' start skew (the harness's barrier)",
    "sync_wait": "bulk-sync: sync wait",
    "exposed_transfer": "bulk-sync: exposed transfer",
    "locality": "data-locality tax",
    "launch": "kernel-launch tax",
    "inefficiency": "kernel inefficiency",
    "unattributed": "unattributed",
}
TOLERANCE_US = 1e-6  # rounding the checks allow, us (and the same share of E2E)


class ModelInconsistency(TaxesError):
    """A prediction broke one of the model's consistency checks (one line naming the check)."""


@dataclass(frozen=True)
class ModelOptions:
    """Schedule assumptions of the fused kernels (not hardware facts; docs/model.md)."""

    chunks_per_peer: int = 8  # flags (pipeline chunks) per peer's shard in fused kernels
    push_producer_sms: int = 0  # SMs a push variant gives to producer CTAs (0: copy engine produces)
    copier_ctas: int = 16  # CTAs that move peers' rows in the fused GEMMs (the kernels' default configuration)


@dataclass
class Step:
    """One kernel or collective as the model predicts it: duration = sum(parts)."""

    name: str
    role: str  # compute | communication
    parts: dict[str, float]
    launcher: str = "torch"  # whose host launch path issues it (taxes.model.hardware.LAUNCHERS)

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


# ---- what the calibration measured (the profile's extra) -------------------------------------------


def _figures(hw: HardwareProfile) -> dict:
    """The figures `taxes calibrate` derived (empty for a datasheet profile)."""
    cal = (hw.extra or {}).get("calibration") or {}
    figs = cal.get("figures") if isinstance(cal, dict) else None
    return figs if isinstance(figs, dict) else {}


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def eager_gap_us(hw: HardwareProfile) -> float:
    """Device time between two eager kernels when the host is ahead: calibrate's pre-filled stream period
    less the kernel floor; never less than a CUDA graph's gap (a graph issues the same kernels without the
    host, so a stream's kernels are never closer together than a graph's)."""
    period = _number(_figures(hw).get("prefilled_period_us"))
    measured = period - hw.kernel_floor_us if period is not None else 0.0
    return max(hw.launch_graph_us, measured)


def _first_launches(hw: HardwareProfile) -> dict:
    firsts = _figures(hw).get("first_launch_us")
    return firsts if isinstance(firsts, dict) else {}


def first_launch_us(hw: HardwareProfile, kind: str) -> float:
    """From an idle device's iteration start to the first kernel's start when launcher `kind` issues it:
    calibrate's idle launch (figures["first_launch_us"][kind]: a start event, one launch, the kernel's start
    on the device); the launcher's host time where the profile lacks the reading."""
    v = _number(_first_launches(hw).get(kind))
    return v if v is not None and v >= 0 else hw.launch_us(kind)


def replay_launch_us(hw: HardwareProfile, first_launcher: str) -> float:
    """From an idle device's iteration start to a CUDA graph's first kernel: the replay's own launch as
    calibrate measured it (first_launch_us "graph", else the replay call's host time); a profile that
    measured neither prices it as the launch of the graph's first kernel (one call starts the same work)."""
    measured = "graph" in _first_launches(hw) or "graph" in hw.launch_host_us
    return first_launch_us(hw, "graph" if measured else first_launcher)


def _points(raw) -> list[tuple[float, float]]:
    """A curve's (bytes_in, us) points, those that are numbers (bytes >= 0, time > 0) only."""
    out = []
    for p in raw if isinstance(raw, list) else []:
        x, y = (_number(p.get("bytes_in")), _number(p.get("us"))) if isinstance(p, dict) else (None, None)
        if x is not None and y is not None and x >= 0 and y > 0:
            out.append((x, y))
    return out


def collective_curve(hw: HardwareProfile, op: str, world: int) -> list[tuple[float, float]] | None:
    """(bytes received per rank, device us) of an NCCL collective as calibrate measured it at this world:
    the op's own curve, else the all-gather's (the same bytes cross the same links); None where the profile
    holds no curve at this world."""
    cal = (hw.extra or {}).get("calibration")
    cal = cal if isinstance(cal, dict) else {}
    curves = [c for c in cal.get("collective_curves") or [] if isinstance(c, dict)]
    for want in (op, "all_gather"):
        for c in curves:
            if c.get("op") == want and c.get("world") == world and len(_points(c.get("points"))) >= 2:
                return _points(c.get("points"))
    if cal.get("world") == world and len(_points(cal.get("nccl_curve"))) >= 2:  # the all-gather every calibration keeps
        return _points(cal.get("nccl_curve"))
    return None


def interpolate_curve(points: list[tuple[float, float]], x: float) -> float:
    """The time at x bytes on a measured curve: linear between the two nearest sizes; below the smallest
    size, the smallest's time (a small message costs its latency); above the largest, the last segment's
    bandwidth carries on."""
    pts = sorted(points)
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts])
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs[-1] > xs[-2] else 0.0
        return float(ys[-1] + max(0.0, slope) * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def collective_us(op: str, nbytes_in: float, world: int, hw: HardwareProfile) -> float:
    """An NCCL collective that delivers nbytes_in to each rank of `world` (2 or more): the calibrated curve
    at this world where there is one, else base latency + bytes / achieved inbound bandwidth."""
    pts = collective_curve(hw, op, world)
    if pts:
        return interpolate_curve(pts, nbytes_in)
    return hw.collective_base_us + nbytes_in / (hw.inbound_bytes_per_us(world) * hw.collective_efficiency)


def copier_rate_bytes_per_us(hw: HardwareProfile, world: int, copier_ctas: int, push: bool) -> float:
    """Bytes per us a fused GEMM's producers deliver to one rank from all its peers: the link's achieved
    rate (p2p efficiency), capped where calibrate measured peer copies by a few CTAs at what copier_ctas
    CTAs move (figures peer_cta_gbps per CTA and peer_cta_max_gbps at most for a push's stores,
    peer_cta_load_* for a pull's loads); copier_ctas 0 is the copy engine (figures peer_copy_gbps, from
    each of the world - 1 peers)."""
    link = hw.inbound_bytes_per_us(world) * hw.p2p_efficiency
    figs = _figures(hw)
    if copier_ctas <= 0:
        engine = _number(figs.get("peer_copy_gbps"))
        return min(link, engine * 1e3 * (world - 1)) if engine else link
    key = "peer_cta" if push else "peer_cta_load"
    per_cta, most = _number(figs.get(f"{key}_gbps")), _number(figs.get(f"{key}_max_gbps"))
    if per_cta is None:
        return link
    return min(link, per_cta * copier_ctas * 1e3, most * 1e3 if most else math.inf)


# ---- building blocks, all in us ------------------------------------------------------------------


def _hbm_us(nbytes: float, hw: HardwareProfile) -> float:
    """Time to move bytes through HBM at the achievable (calibrated) bandwidth."""
    return nbytes / (hw.hbm_bytes_per_us() * hw.hbm_efficiency)


def _work_us(w: Workload, hw: HardwareProfile, efficiency: float, flops: float | None = None) -> float:
    """A compute kernel doing the workload's local work at a fraction of peak, or HBM-bound."""
    flops = w.flops() if flops is None else flops
    return max(flops / (hw.peak_flops(w.dtype) * efficiency) * 1e6, _hbm_us(w.hbm_bytes(), hw))


def _compute_step(name: str, fl: Floor, time_us: float, locality_us: float = 0.0, launcher: str = "torch") -> Step:
    """A kernel doing the rank's work in time_us: the work's floor is ideal, the rest inefficiency; its
    intermediate bytes' round trip (locality_us) is added: the time a fused kernel would not spend."""
    return Step(name, "compute", {"ideal": fl.work_us, "inefficiency": time_us - fl.work_us, "locality": locality_us},
                launcher)


def _small_kernel_step(name: str, hw: HardwareProfile, locality_us: float, launcher: str = "triton",
                       floor_us: float | None = None) -> Step:
    """A combine-like kernel: its bytes are all intermediate; below its floor (the kernel floor, or a
    combine's loop over its partial sets, hw.combine_kernel_us) it idles or waits on memory latency."""
    floor_us = hw.kernel_floor_us if floor_us is None else floor_us
    return Step(name, "compute", {"locality": locality_us, "inefficiency": max(0.0, floor_us - locality_us)}, launcher)


def _collective_step(name: str, op: str, w: Workload, hw: HardwareProfile, fl: Floor, nbytes_in: float,
                     locality_us: float, copy_bytes: float, skew_us: float) -> Step:
    """An NCCL collective. Two or more ranks: it waits for the latest rank's start (skew_us, the start
    skew), then moves nbytes_in at the calibrated curve's pace (collective_us); the link time no schedule
    hides is ideal, the rest exposed transfer; its intermediate bytes' round trip is locality. One rank:
    there is no peer, so no communication at all: NCCL copies copy_bytes into its output, a local copy
    (read and written at the achievable HBM bandwidth, at least a kernel's floor) whose written bytes are
    locality and whose time beyond them is the copy's inefficiency."""
    if w.world == 1:
        busy = max(hw.kernel_floor_us, _hbm_us(2 * copy_bytes, hw))
        return Step(name, "communication", {"locality": locality_us,
                                            "inefficiency": max(0.0, busy - locality_us)}, "nccl")
    transfer = collective_us(op, nbytes_in, w.world, hw)
    unhideable = min(fl.unhideable_link_us, transfer)
    return Step(name, "communication", {"start_skew": skew_us, "locality": locality_us, "ideal": unhideable,
                                        "exposed_transfer": transfer - unhideable}, "nccl")


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
    """Split a fused kernel's (finish, wait) into components, by the attribution's rules.

    Waiting up to the unhideable link time is part of the floor. Beyond it, the share a late peer's start
    causes (the wait with the start skew less the wait without) is start skew, and the rest the kernel's
    own wait on its peers' data: sync wait (the attribution's in-kernel wait). Compute beyond the floor
    that the wait did not hide is kernel inefficiency."""
    excess_wait = max(0.0, wait - fl.unhideable_link_us)
    skew = min(max(0.0, wait - wait_no_skew), excess_wait)
    return Step(name, "compute", {
        "ideal": fl.ideal_us,
        "start_skew": skew,
        "sync_wait": excess_wait - skew,
        "inefficiency": finish - fl.ideal_us - excess_wait,
        "locality": locality_us,
    }, launcher)


# ---- the workloads' steps --------------------------------------------------------------------------
# Each builder gets skew_us: the ranks' start skew still to be absorbed (the first step that waits for a
# peer absorbs it; after it the ranks go in step).


def _ag_gemm_steps(w: AgGemm, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions,
                   skew_us: float) -> list[Step]:
    half = _hbm_us(w.intermediate_bytes(variant) / 2, hw)  # written once, read once
    v = modelled(w.name, variant)
    if v.bulk_synchronous:
        return [
            _collective_step("all_gather", "all_gather", w, hw, fl, w.link_bytes(), half,
                             w.M // w.world * w.K * w.elt, skew_us),
            _compute_step("matmul", fl, _work_us(w, hw, hw.matmul_efficiency), locality_us=half),
        ]
    p = w.world
    push = v.producer == "push"
    sm_share = hw.sm_count / (hw.sm_count - opt.push_producer_sms) if push else 1.0
    compute = _work_us(w, hw, hw.triton_matmul_efficiency) * sm_share
    n = (p - 1) * opt.chunks_per_peer
    rate = copier_rate_bytes_per_us(hw, p, opt.copier_ctas, push) if p > 1 else math.inf
    signal = hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else 0.0)

    def run(skew: float) -> tuple[float, float]:
        # The local shard first (ready at once), then peer chunks in order of arrival.
        chunks = [(0.0, compute / p)]
        chunks += [(skew + signal + (i + 1) * w.link_bytes() / n / rate, compute * (p - 1) / p / n) for i in range(n)]
        return _overlap(chunks)

    finish, wait = run(skew_us)
    _, wait0 = run(0.0)
    return [_fused_step(f"ag_gemm_{variant.replace('-', '_')}", fl, finish, wait, wait0, 2 * half)]


def _gemm_rs_steps(w: GemmRs, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions,
                   skew_us: float) -> list[Step]:
    half = _hbm_us(w.intermediate_bytes(variant) / 2, hw)
    v = modelled(w.name, variant)
    if v.bulk_synchronous:
        return [
            _compute_step("matmul", fl, _work_us(w, hw, hw.matmul_efficiency), locality_us=half),
            _collective_step("reduce_scatter", "reduce_scatter", w, hw, fl, w.link_bytes(), half,
                             w.M * w.N * w.elt, skew_us),
        ]
    p = w.world
    push = v.producer == "push"
    sm_share = hw.sm_count / (hw.sm_count - opt.push_producer_sms) if push else 1.0
    compute = _work_us(w, hw, hw.triton_matmul_efficiency) * sm_share
    n = (p - 1) * opt.chunks_per_peer  # chunks of the peers' row blocks, computed first
    chunk_c, chunk_bytes = compute / p / opt.chunks_per_peer, w.link_bytes() / max(n, 1)
    rate = hw.inbound_bytes_per_us(p) * hw.p2p_efficiency  # every GEMM CTA stores its peers' tiles
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

    finish, wait = run(skew_us)
    _, wait0 = run(0.0)
    return [_fused_step(f"gemm_rs_{variant.replace('-', '_')}", fl, finish, wait, wait0, 2 * half)]


def _flash_decode_steps(w: FlashDecode, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions,
                        skew_us: float) -> list[Step]:
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
            _collective_step("all_gather_partials", "all_gather", w, hw, fl, w.link_bytes(),
                             _hbm_us(part + p * part, hw), part, skew_us),
            _small_kernel_step("global_combine", hw, _hbm_us(p * part, hw), floor_us=hw.combine_kernel_us(p)),
        ]
    push = v.producer == "push"
    locality = _hbm_us(2 * (p - 1) * part, hw)
    combine = Step(f"combine_{variant.replace('-', '_')}", "compute", {
        "locality": locality,
        "inefficiency": max(0.0, hw.combine_kernel_us(p) - locality),  # merges the p partials
    }, "triton")
    if p > 1:  # it waits for the peers: a late peer's start, then their partials' transfer
        rate = hw.inbound_bytes_per_us(p) * hw.p2p_efficiency  # the decode's last programs store to the peers
        transfer = w.link_bytes() / rate + hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else hw.flag_round_trip_us)
        unhideable = min(fl.unhideable_link_us, transfer)
        combine.parts.update(start_skew=skew_us, ideal=unhideable, sync_wait=transfer - unhideable)
    return [decode, combine]


def _tp_mlp_steps(w: TpMlp, variant: str, hw: HardwareProfile, fl: Floor, opt: ModelOptions,
                  skew_us: float) -> list[Step]:
    """The ag-gemm steps for (M, 2F, H), the activation, the gemm-rs steps for (M, H, F).

    The activation is all intermediate traffic (a _small_kernel_step): the SwiGLU kernel reads Y1 and
    writes Z; torch's F.silu(g) * u is modelled as its two kernels, silu (reads the gate half, writes a
    temporary) and mul (reads the temporary and the up half, writes Z). The first GEMM's write of Y1 and
    the second's read of Z are added to those steps as locality too, so the layer's locality is
    TpMlp.intermediate_bytes / HBM bandwidth. The first part absorbs the ranks' start skew; the second
    starts in step. Each part's steps are split against the part's own floor; the layer's floor is lower
    (each part's link time counts as unhideable on its own; Y1 and Z count as the parts' essential bytes),
    so the ideal shares are scaled down to the layer's floor and the rest charged to the same step:
    exposed transfer for a collective, inefficiency for a kernel."""
    part = modelled(w.name, variant).part
    ag_w, rs_w = w.parts()
    ag_steps = _ag_gemm_steps(ag_w, part, hw, floor_of(ag_w, hw), opt, skew_us)
    rs_steps = _gemm_rs_steps(rs_w, part, hw, floor_of(rs_w, hw), opt, 0.0)
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

    Eager: the host issues launch i when launch i-1's call has returned, each call costing its launcher's
    host time (hw.launch_us(step.launcher): a torch op, a Triton kernel, a Triton kernel that builds TMA
    descriptors, an NCCL collective, as calibrate measures them back to back); the call's work reaches an
    idle device first_launch_us - launch_us after the call returns (calibrate's idle launch; 0 unmeasured).
    The device starts a step when its launch has arrived and eager_gap_us after the previous step ended, so
    a launch issued while the previous kernel runs costs nothing. CUDA graph: the replay reaches the idle
    device at replay_launch_us, then each kernel follows the previous one after launch_graph_us."""
    phases, t, idle, host = [], 0.0, 0.0, 0.0
    gap = hw.launch_graph_us if graphed else eager_gap_us(hw)
    for i, step in enumerate(steps):
        if graphed:
            ready = replay_launch_us(hw, step.launcher) if i == 0 else 0.0
        else:
            host += hw.launch_us(step.launcher)
            ready = host + first_launch_us(hw, step.launcher) - hw.launch_us(step.launcher)
        start = max(t + gap if i else 0.0, ready)
        idle += start - t
        t = start + step.duration_us
        phases.append(Phase(step.name, step.role, start, t, dict(step.parts)))
    return phases, idle


# ---- consistency checks ----------------------------------------------------------------------------


def _fail(pred: Prediction, what: str) -> ModelInconsistency:
    return ModelInconsistency(f"model: {what} ({pred.workload.name} {pred.variant}, world {pred.workload.world}, "
                              f"hardware {pred.hardware})")


def check(pred: Prediction, eager_launch_us: float | None = None) -> None:
    """The checks no prediction may fail; the first one failed raises ModelInconsistency:
    - every tax >= 0 (and ideal, start skew, inefficiency: only unattributed has a sign);
    - the floor <= the prediction;
    - one rank: no communication (no start skew, sync wait, exposed transfer, link time);
    - a CUDA graph pays no more launch tax than the same steps launched eagerly (eager_launch_us)."""
    tol = TOLERANCE_US + 1e-9 * abs(pred.e2e_us)
    comp = pred.components
    for c in COMPONENTS:
        if not math.isfinite(comp[c]):
            raise _fail(pred, f"{c} is not a finite number ({comp[c]})")
    for tax, parts in TAXES.items():
        for c in parts:
            if comp[c] < -tol:
                raise _fail(pred, f"the {tax} tax's {c} is negative ({comp[c]:.6g} us)")
    for c in ("ideal", "start_skew", "inefficiency"):
        if comp[c] < -tol:
            raise _fail(pred, f"{c} is negative ({comp[c]:.6g} us)")
    if pred.floor.ideal_us > pred.e2e_us + tol:
        raise _fail(pred, f"the floor {pred.floor.ideal_us:.6g} us exceeds the prediction {pred.e2e_us:.6g} us")
    if pred.workload.world == 1:
        talk = {c: comp[c] for c in COMMUNICATION if comp[c] > tol}
        talk |= {f"{ph.name} {c}": ph.parts[c] for ph in pred.phases for c in COMMUNICATION if ph.parts.get(c, 0.0) > tol}
        if pred.floor.link_us > tol or pred.floor.unhideable_link_us > tol:
            talk["link time"] = pred.floor.link_us
        if pred.exposed_communication_us > tol:
            talk["exposed communication"] = pred.exposed_communication_us
        if talk:
            name, value = next(iter(talk.items()))
            raise _fail(pred, f"communication with no peer: {name} {value:.6g} us at world 1")
    if eager_launch_us is not None and comp["launch"] > eager_launch_us + tol:
        raise _fail(pred, f"the CUDA graph pays {comp['launch']:.6g} us of launch tax, more than the same steps "
                          f"eager ({eager_launch_us:.6g} us): the profile's graph figures (first_launch_us graph, "
                          "launch_graph_us) exceed its eager ones")


# ---- prediction -------------------------------------------------------------------------------------


def steps_of(w: Workload, variant: str, hw: HardwareProfile, options: ModelOptions | None = None) -> list[Step]:
    """The steps one rank runs for one iteration of the variant, unplaced."""
    modelled(w.name, variant)
    if w.dtype not in hw.matrix_tflops:
        raise TaxesError(f"hardware {hw.name} has no matrix peak for dtype {w.dtype}")
    skew = hw.rank_skew_us if w.world > 1 else 0.0
    return _STEPS[w.name](w, variant, hw, floor_of(w, hw), options or ModelOptions(), skew)


def assemble(w: Workload, variant: str, hw: HardwareProfile, steps: list[Step], graphed: bool) -> Prediction:
    """Place the steps and add them up into a prediction (unchecked)."""
    fl = floor_of(w, hw)
    phases, idle = schedule(steps, graphed, hw)
    comp = {c: 0.0 for c in COMPONENTS}
    for s in steps:
        for c, v in s.parts.items():
            comp[c] += v
    comp["launch"] = idle
    e2e = math.fsum(comp[c] for c in COMPONENTS)
    exposed = 0.0
    if w.world > 1:  # the bsp collectives whole, and what fused kernels wait on their peers
        exposed = math.fsum(s.duration_us for s in steps if s.role == "communication") + math.fsum(
            s.parts.get("start_skew", 0.0) + s.parts.get("sync_wait", 0.0) + min(fl.unhideable_link_us, s.parts.get("ideal", 0.0))
            for s in steps if s.role == "compute" and s.parts.get("sync_wait", 0.0) + s.parts.get("start_skew", 0.0) > 0)
    return Prediction(w, variant, hw.name, e2e, comp, fl, exposed, phases)


def predict(w: Workload, variant: str, hw: HardwareProfile, options: ModelOptions | None = None) -> Prediction:
    """One variant's predicted iteration, checked (`check`): a CUDA graph against the same steps eager."""
    kind = modelled(w.name, variant)
    steps = steps_of(w, variant, hw, options)
    pred = assemble(w, variant, hw, steps, kind.graphed)
    eager = schedule(steps, False, hw)[1] if kind.graphed else None
    check(pred, eager)
    return pred


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
