"""The steps one rank runs per iteration of each workload's variants, as the model prices them: kernels
and collectives, each a sum of labelled parts (taxes.model.predict places them in time and adds them up).
docs/model.md gives every formula."""

from __future__ import annotations

import math
from dataclasses import dataclass

from taxes.model.figures import collective_us, copier_rate_bytes_per_us
from taxes.model.floor import Floor, floor_of
from taxes.model.hardware import HardwareProfile
from taxes.model.tile_queue import run_queue, tile_order
from taxes.variants import modelled
from taxes.workloads import AgGemm, FlashDecode, GemmRs, TpMlp, Workload, fused_tile_n


@dataclass(frozen=True)
class ModelOptions:
    """Schedule assumptions of the fused kernels (not hardware facts; docs/model.md)."""

    chunks_per_peer: int = 8  # flags (pipeline chunks) per peer's shard in fused kernels
    push_producer_sms: int = 0  # SMs a push variant gives to producer CTAs (0: copy engine produces)
    copier_ctas: int = 16  # CTAs that move peers' rows in the fused GEMMs (the kernels' default configuration)
    tile_m: int = 128  # the fused ag-gemm's output tile (its configuration's block_m x block_n)
    tile_n: int | None = None  # None: the kernel's own choice for the shape (taxes.workloads.fused_tile_n)
    chunk_rows: int | None = None  # rows of A per flag in the fused ag-gemm (None: chunks_per_peer per shard)
    group_m: int = 8  # row blocks its tile queue groups (the kernel's _tile_coords)
    copiers_join: bool = True  # its copier CTAs take tiles once their copies are done


def options_from_config(config: dict | None) -> ModelOptions:
    """The schedule a measured variant ran (its configuration as a document keeps it; fused-auto's nests the
    picked variant's) as ModelOptions; what it does not say stays the default. A copy-engine producer moves
    the rows with no CTA (the kernel runs it with copiers=0 whatever the entry says); a static schedule's
    copiers never join."""
    cfg = dict(config or {})
    if "picked" in cfg:
        cfg = dict(cfg.get("config") or {})

    def whole(key):
        v = cfg.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    known = {"copiers": "copier_ctas", "block_m": "tile_m", "block_n": "tile_n", "chunk_rows": "chunk_rows",
             "group_m": "group_m"}
    fields = {field: whole(key) for key, field in known.items() if whole(key) is not None}
    if cfg.get("producer") == "copy-engine":
        fields["copier_ctas"] = 0
    if cfg.get("copiers_join") is False or cfg.get("static") is True:
        fields["copiers_join"] = False
    return ModelOptions(**fields)


MAX_QUEUE_UNITS = 16384  # the fused ag-gemm's tile queue is run over at most this many units (tiles, or blocks of them)
MAX_COPY_ITEMS = 4096  # and its copies over at most this many chunks


def wave_factor(tiles: int, sms: int) -> float:
    """How much longer a persistent GEMM of `tiles` equal output tiles takes on `sms` SMs than its work at
    the full GPU's rate: the last wave runs as long as a full one (64 tiles on 132 SMs: 2.06; 1024: 1.03)."""
    if tiles <= 0 or sms <= 0:
        return 1.0
    return math.ceil(tiles / sms) * sms / tiles


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
    """Split a fused kernel's (finish, wait) into components, by the attribution's rules. wait is its in-kernel
    wait as the attribution reads it: for ag-gemm the longest any CTA waited, at most the kernel's time beyond
    its work floor (the tile queue); for gemm-rs the pipeline's wait.

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
    ctas = hw.sm_count - (opt.push_producer_sms if push else 0)  # persistent: one CTA per SM
    tile_n = opt.tile_n or fused_tile_n(w.M, w.N // p, hw.sm_count, opt.tile_m)
    shard_rows = w.M // p
    tiles_m, tiles_n = math.ceil(shard_rows / opt.tile_m), math.ceil(w.N // p / tile_n)
    # the queue is run over at most MAX_QUEUE_UNITS units: beyond that, neighbouring tiles (rows first) are one
    # unit of their summed time, which moves the last wave by under sm_count / MAX_QUEUE_UNITS of the kernel
    k_m = min(tiles_m, math.ceil(p * tiles_m * tiles_n / MAX_QUEUE_UNITS))
    k_n = math.ceil(p * math.ceil(tiles_m / k_m) * tiles_n / MAX_QUEUE_UNITS)
    m_blocks, n_blocks = math.ceil(tiles_m / k_m), math.ceil(tiles_n / k_n)
    unit_m = opt.tile_m * k_m  # rows of A a unit needs
    # A tile's time on one SM: the GEMM's at the calibrated rate spread over every SM, less the last-wave loss
    # the calibration's own GEMM (8192^3 in 128 x 256 tiles) has inside its efficiency, and never under the
    # work's floor spread likewise (a calibration near peak despite its last wave would put a better-filled
    # shape above peak). The queue then makes this shape's waves: one that does not fill the GPU takes as
    # long as one that does.
    cal_waves = wave_factor((8192 // 128) * (8192 // 256), hw.sm_count)
    per_sm = hw.sm_count / (p * m_blocks * n_blocks)
    tile_us = max(_work_us(w, hw, hw.triton_matmul_efficiency) / cal_waves, fl.work_us) * per_sm
    order = tile_order(p, m_blocks, n_blocks, max(1, opt.group_m // k_m))
    if p == 1:
        run = run_queue([0.0] * len(order), tile_us, ctas)
        return [_fused_step(f"ag_gemm_{variant.replace('-', '_')}", fl, run.finish_us, 0.0, 0.0, 2 * half)]
    chunk_rows = opt.chunk_rows or math.ceil(shard_rows / opt.chunks_per_peer)
    chunk_rows = max(chunk_rows, math.ceil(shard_rows * (p - 1) / MAX_COPY_ITEMS))  # as bounded, likewise
    n_chunks = math.ceil(shard_rows / chunk_rows)
    chunk_bytes = w.link_bytes() / ((p - 1) * n_chunks)
    copiers = min(opt.copier_ctas, ctas - 1)
    done = _copies_done(hw, p, copiers, push, (p - 1) * n_chunks, chunk_bytes)
    signal = hw.link_latency_us + (hw.flag_round_trip_us / 2 if push else 0.0)
    last_chunk = [min(n_chunks - 1, (min((b + 1) * unit_m, shard_rows) - 1) // chunk_rows) for b in range(m_blocks)]

    def run(skew: float):
        # every copy waits for the later peers' start (skew): the rows reach the rank that much later
        ready = [0.0 if pos == 0 else skew + signal + done[(pos - 1) * n_chunks + last_chunk[b]] for pos, b in order]
        busy = [skew + t for t in _copier_ends(done, copiers)] if copiers and opt.copiers_join else []
        return run_queue(ready, tile_us, ctas - (0 if opt.copiers_join else copiers), busy)

    def read_wait(r) -> float:
        # the in-kernel wait as the attribution reads the kernel's stamps: the longest any CTA waited, at most
        # the kernel's time beyond its own floor (taxes.attribution.attribute)
        return min(r.longest_wait_us, max(0.0, r.finish_us - fl.work_us))

    late, on_time = run(skew_us), run(0.0)
    return [_fused_step(f"ag_gemm_{variant.replace('-', '_')}", fl, late.finish_us, read_wait(late), read_wait(on_time),
                        2 * half)]


def _copies_done(hw: HardwareProfile, world: int, copiers: int, push: bool, items: int, item_bytes: float) -> list[float]:
    """When each copy item (a chunk of rows for one peer, in the order the GEMM needs them) is done, us from the
    kernel's start. Copier CTA c moves items c, c + copiers, ... one after another (kernels/ag_gemm_kernel.py), so
    they go in rounds; a round of k items runs at the rate k CTAs reach (copier_rate_bytes_per_us), each
    CTA a k-th of it. copiers 0: the copy engine, one copy after another on one stream."""
    if copiers <= 0:
        rate = copier_rate_bytes_per_us(hw, world, 0, push)
        return [(i + 1) * item_bytes / rate for i in range(items)]
    done, t = [], 0.0
    for first in range(0, items, copiers):
        k = min(copiers, items - first)
        t += item_bytes / (copier_rate_bytes_per_us(hw, world, k, push) / k)
        done += [t] * k
    return done


def _copier_ends(done: list[float], copiers: int) -> list[float]:
    """When each copier CTA's last item is done (items dealt round-robin over the copiers)."""
    ends = [0.0] * copiers
    for i, t in enumerate(done):
        ends[i % copiers] = t
    return ends


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
    if variant == "bsp-sdpa":
        # PyTorch's attention call (its host time is the "sdpa" launcher's), then a kernel that packs its
        # output and log-sum-exp into the partial the all-gather sends
        decode = _compute_step("local_sdpa", fl, _work_us(w, hw, hw.matmul_efficiency), _hbm_us(part, hw),
                               launcher="sdpa")
        pack = [_small_kernel_step("pack", hw, _hbm_us(2 * part, hw))]
    else:
        pack = []
    if bsp:
        return [
            decode, *pack,
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


STEPS = {"ag-gemm": _ag_gemm_steps, "gemm-rs": _gemm_rs_steps, "flash-decode": _flash_decode_steps,
          "tp-mlp": _tp_mlp_steps}
