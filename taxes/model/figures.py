"""What `taxes calibrate` measured, as the model reads it from a hardware profile (its extra): the launch
path's figures, NCCL's measured curves, the peer copies' rates. A datasheet profile has none of them, and
each reader falls back to the profile's own figures."""

from __future__ import annotations

import math
import statistics

from taxes.model.hardware import HardwareProfile


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
    on the device). A kind calibrate did not time (an NCCL collective) pays its own host time plus what
    starting from idle added to the eager kinds it did time (the median of their idle launch less their host
    time): the same path from the call to an idle device, so an eager collective never starts sooner than a
    graph replay would. The launcher's host time where the profile has no idle reading at all."""
    firsts = _first_launches(hw)
    v = _number(firsts.get(kind))
    if v is not None and v >= 0:
        return v
    extra = [f - hw.launch_us(k) for k, f in ((k, _number(firsts.get(k))) for k in firsts if k != "graph")
             if f is not None and f >= 0]
    return hw.launch_us(kind) + (max(0.0, statistics.median(extra)) if extra else 0.0)


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
    import numpy as np

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
    peer_cta_load_* for a pull's loads); for a push, where calibrate measured the fused kernel's own copiers
    beside its GEMM (copier_gemm_gbps by copier_gemm_ctas CTAs), that rate per CTA instead; copier_ctas 0 is
    the copy engine (figures peer_copy_gbps, from each of the world - 1 peers)."""
    link = hw.inbound_bytes_per_us(world) * hw.p2p_efficiency
    figs = _figures(hw)
    if copier_ctas <= 0:
        engine = _number(figs.get("peer_copy_gbps"))
        return min(link, engine * 1e3 * (world - 1)) if engine else link
    key = "peer_cta" if push else "peer_cta_load"
    per_cta, most = _number(figs.get(f"{key}_gbps")), _number(figs.get(f"{key}_max_gbps"))
    beside, beside_ctas = _number(figs.get("copier_gemm_gbps")), _number(figs.get("copier_gemm_ctas"))
    if push and beside and beside_ctas:
        # measured as the kernel runs them (measure_copiers: every rank pushing to every peer beside its GEMM):
        # per CTA at that count, scaled to copier_ctas, never above what CTAs alone reach
        return min(link, beside / beside_ctas * copier_ctas * 1e3, most * 1e3 if most else math.inf)
    if per_cta is None:
        return link
    return min(link, per_cta * copier_ctas * 1e3, most * 1e3 if most else math.inf)
