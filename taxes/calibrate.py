"""`taxes calibrate`: measure this machine's hardware figures and save them as a hardware profile.

One function per figure measures on the GPUs and returns raw readings (plain lists of numbers, JSON
ready); pure functions turn readings into figures (medians, a latency + bandwidth fit, a clock offset)
and figures into a HardwareProfile. Only the measuring needs GPUs; everything after it is tested on CPU
with synthetic readings, and the Triton kernels run under the interpreter too.

What is measured (every time in us, every rate per second, medians of repeated readings):
- matmul: torch.matmul 8192^3 in bf16 and fp16, and in bf16 at three more shapes like the workloads'
  per-rank GEMMs (matmul_shapes: a rate can differ by shape, more so at the power limit); our persistent
  Triton GEMM (kernels/ag_gemm.py) at 8192^3, checked against torch first.
- hbm: a 1 GiB device-to-device copy (bytes read + written), and a Triton kernel that only reads 1 GiB
  (hbm_read_kernel, a few grid and block sizes; its sums checked exactly).
- launch: host time of back-to-back eager launches (an empty Triton kernel, a tiny torch op, and from the
  nccl figure a small collective); the device time per empty kernel when the host is ahead (the queue
  pre-filled behind a sleep kernel) and inside a replayed CUDA graph.
- nccl: all_gather_into_tensor from 4 KiB to 256 MiB per rank, n back-to-back calls behind a sleep (so
  the time is the device's, launches hidden) after one call that lines the ranks up.
- peer: one rank writes a peer's symmetric buffer with the copy engine, with a Triton kernel's stores
  (addressed like the fused kernels' through sync.peer_ptr, and directly through the peer tensor), and
  reads it with a Triton kernel's loads; with more than 2 GPUs, rank 0 also writes to all peers at once.
- pingpong: a one-CTA kernel on two ranks bouncing a flag: relaxed stores and volatile polls (the link
  latency is half its round trip) and the fused kernels' own protocol (kernels/sync.py: release signal,
  acquire wait); a stamped run gives each GPU's clock offset from rank 0's (NTP-style).
- combine: flash decode's combine kernel (kernels/flash_decode.py) with 4 programs merging 4 and then 64
  partial sets per row, checked against float32: its device time at few programs is a loop of dependent
  loads, base + sets x per set, which the model charges the combines (not HBM bandwidth).
- skew: after a barrier each rank stamps %globaltimer in a kernel; the spread, clocks corrected by the
  offsets. Also the spread of a tiny all-reduce's duration across ranks (no clocks needed): the fallback.

Peaks (docs/model.md, METHOD.md): by default a calibrated profile's peaks are the highest rate any method
reached on this machine (matrix: max of cuBLAS at every shape measured and our GEMM; HBM: max of the copy
and the read; peer link: max of copy
engine, Triton stores and loads, NCCL at world 2) and each efficiency is its method's rate over that
peak. `peaks="datasheet"` keeps the base profile's peaks and makes the efficiencies fractions of those.
Either way efficiency x peak is the measured rate, which is all the model's times depend on; only the
floor (T_ideal) differs. A figure that could not be measured keeps the base profile's value (for an
efficiency: the base's achieved rate, re-expressed against the new peak) and is listed as kept.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import triton
import triton.language as tl

import taxes
from taxes.errors import TaxesError
from taxes.hardware import BUILTIN, HardwareProfile, profile_dirs, profile_from_dict, profile_to_dict
from taxes.kernels.runtime import interpreting
from taxes.kernels.sync import (
    ERR_WORDS,
    globaltimer_ns,
    peer_ptr,
    raise_if_timed_out,
    record_timeout,
    signal,
    spent_since,
    wait_at_least,
    wait_budget,
)

FIGURES = ("launch", "hbm", "matmul", "nccl", "peer", "pingpong", "skew", "triton_gemm", "combine")
PAIR_FIGURES = ("nccl", "peer", "pingpong", "skew")  # need 2 or more GPUs
NO_GPU = ("calibrate needs CUDA GPUs and this machine has none; `taxes hardware list` shows the built-in "
          "and saved profiles that `taxes model` can use instead")


class CalibrationError(TaxesError):
    """A figure cannot be derived from its readings (one line saying why)."""


@dataclass(frozen=True)
class Plan:
    """How much to measure: counts and sizes of one calibration."""

    reps: int  # timed readings per figure (medians are taken over them)
    warmup: int
    launches: int  # kernels per launch-cost reading
    nccl_sizes: tuple  # bytes per rank
    copy_bytes: int  # HBM copy
    peer_bytes: int  # peer copies
    matmul_n: int
    matmul_reps: int
    rounds: int  # ping-pong round trips per reading
    pingpong_reps: int
    skew_reps: int


FULL = Plan(reps=10, warmup=3, launches=200, nccl_sizes=tuple(4096 << i for i in range(17)), copy_bytes=1 << 30,
            peer_bytes=256 << 20, matmul_n=8192, matmul_reps=20, rounds=1000, pingpong_reps=5, skew_reps=30)
QUICK = Plan(reps=5, warmup=2, launches=100, nccl_sizes=tuple(4096 << i for i in range(0, 17, 2)), copy_bytes=1 << 30,
             peer_bytes=128 << 20, matmul_n=8192, matmul_reps=8, rounds=300, pingpong_reps=3, skew_reps=15)


def heap_bytes_for(world: int, quick: bool) -> int:
    """Symmetric heap a calibration needs: the peer buffer plus flags and stamps."""
    plan = QUICK if quick else FULL
    return (plan.peer_bytes if world > 1 else 0) + (4 << 20)


# ---- pure: statistics and fits --------------------------------------------------------------------


def valid_values(xs) -> list[float]:
    """The finite, positive readings (a timer reading of 0 or less, NaN or inf is a failed reading)."""
    out = []
    for x in xs or []:
        if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0:
            out.append(float(x))
    return out


def median_reading(xs, what: str) -> float:
    vals = valid_values(xs)
    if not vals:
        raise CalibrationError(f"{what}: no valid reading")
    return statistics.median(vals)


def plausible(value: float, lo: float, hi: float, what: str) -> float:
    """Reject a figure outside what any machine could measure (a broken timer, a unit slip)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise CalibrationError(f"{what} = {value:.4g} is outside the plausible range [{lo:g}, {hi:g}]")
    return float(value)


def fit_latency_bandwidth(x_bytes, t_us, what: str = "curve", min_points: int = 3) -> dict:
    """Fit t = base_us + x / bytes_per_us to (x, t) points.

    Least squares on log residuals (log fit - log t): a 4 KiB point's 20 us and a 256 MiB point's 1 ms
    weigh alike, so the small sizes set the latency and the large ones the bandwidth, and a point 5x too
    slow counts as much as one 5x too fast. Solved by Gauss-Newton from the linear fit of relative
    residuals. Then, one at a time, the point with the worst residual is dropped while it lies far beyond
    the others' (more than 4 robust standard deviations of theirs, and more than 5%), at most a quarter
    of the points. Returns base_us, bytes_per_us, rel_rms (of the kept points, log residuals ~ relative),
    used and dropped x values."""
    x = np.asarray(list(x_bytes), dtype=float)
    t = np.asarray(list(t_us), dtype=float)
    if x.shape != t.shape:
        raise CalibrationError(f"{what}: {x.size} sizes but {t.size} times")
    ok = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    distinct = len(set(x[ok].tolist()))
    if distinct < min_points:
        raise CalibrationError(f"{what}: {distinct} usable sizes; a latency and a bandwidth need at least {min_points}")

    def residuals(base, slope, mask):
        f = base + slope * x[mask]
        return np.log(f / t[mask]) if np.all(f > 0) else None

    def solve(mask):
        xs, ts = x[mask], t[mask]
        coef, *_ = np.linalg.lstsq(np.stack([np.ones(xs.size), xs], axis=1) / ts[:, None], np.ones(xs.size), rcond=None)
        base, slope = float(coef[0]), float(coef[1])
        if residuals(base, slope, mask) is None:  # start from a line through the points that stays positive
            base, slope = float(ts.min()) / 2, max(slope, 1e-12)
        for _ in range(100):
            r = residuals(base, slope, mask)
            f = base + slope * xs
            step, *_ = np.linalg.lstsq(np.stack([1 / f, xs / f], axis=1), -r, rcond=None)
            lam = 1.0
            while lam > 1e-8:
                nb, ns = base + lam * float(step[0]), slope + lam * float(step[1])
                nr = residuals(nb, ns, mask)
                if nr is not None and float(nr @ nr) <= float(r @ r):
                    break
                lam /= 2
            else:
                break
            done = abs(nb - base) <= 1e-12 * max(abs(base), 1e-9) and abs(ns - slope) <= 1e-12 * abs(slope)
            base, slope = nb, ns
            if done:
                break
        return base, slope

    keep, drop = ok.copy(), []
    base, slope = solve(keep)
    for _ in range(int(ok.sum()) // 4):
        idx = np.flatnonzero(keep)
        rel = residuals(base, slope, keep)
        if rel is None:
            break
        worst = int(np.argmax(np.abs(rel)))
        others = np.delete(rel, worst)
        spread = 1.4826 * float(np.median(np.abs(others - np.median(others))))
        trial = keep.copy()
        trial[idx[worst]] = False
        if abs(rel[worst]) <= max(4 * spread, 0.05) or len(set(x[trial].tolist())) < min_points:
            break
        keep = trial
        drop.append(float(x[idx[worst]]))
        base, slope = solve(keep)
    if slope <= 0 or slope * float(x[keep].max()) < 0.05 * abs(base):
        raise CalibrationError(f"{what}: times do not grow with size (by 5% or more), so there is no bandwidth to fit")
    if base < 0:
        raise CalibrationError(f"{what}: the fitted latency is negative ({base:.3g} us): the points do not follow "
                               "latency + size / bandwidth")
    resid = residuals(base, slope, keep)
    if resid is None:
        raise CalibrationError(f"{what}: the fit predicts a non-positive time")
    return {"base_us": base, "bytes_per_us": 1.0 / slope, "rel_rms": float(np.sqrt(np.mean(resid ** 2))),
            "used": sorted(set(x[keep].tolist())), "dropped": sorted(drop)}


def clock_offset_ns(t0, t1, t2) -> tuple[float, float]:
    """A follower GPU's clock minus the leader's, from ping-pong stamps (NTP's rule).

    Round i: the leader stamps t0 (its clock) and signals; the follower stamps t1 (its clock) on seeing
    it and signals back; the leader stamps t2 on seeing that. If both directions take equally long,
    offset = t1 - (t0 + t2) / 2; the error is at most half the round trip, so only the rounds with the
    shortest round trips (the fastest tenth) are used. Returns (offset, bound on its error), in ns."""
    rows = [(b - a, c - (a + b) / 2) for a, c, b in zip(t0, t1, t2)
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (a, b, c)) and b > a]
    if not rows:
        raise CalibrationError("clock offset: no ping-pong round with a positive round trip")
    rows.sort()
    best = rows[: max(1, len(rows) // 10)]
    return float(statistics.median(o for _, o in best)), rows[0][0] / 2


def skew_spreads_us(stamps_ns: list[list[float]], offsets_ns: list[float]) -> list[float]:
    """Per reading, the spread (max - min) of the ranks' start stamps with each clock corrected by its
    offset from rank 0's; stamps_ns[r][k] is rank r's stamp of reading k."""
    if len(stamps_ns) != len(offsets_ns) or len(stamps_ns) < 2:
        raise CalibrationError("rank skew: need stamps and a clock offset for every rank (2 or more)")
    n = min(len(s) for s in stamps_ns)
    out = []
    for k in range(n):
        vals = [stamps_ns[r][k] - offsets_ns[r] for r in range(len(stamps_ns))]
        if all(math.isfinite(v) and stamps_ns[r][k] > 0 for r, v in enumerate(vals)):
            out.append((max(vals) - min(vals)) / 1e3)
    if not out:
        raise CalibrationError("rank skew: no reading with a stamp from every rank")
    return out


def launch_figures(prefilled_us, graph_us) -> dict:
    """Kernel floor and per-kernel graph gap from device times per near-empty kernel.

    prefilled: back-to-back eager kernels with the host ahead; graph: the same kernels replayed as a CUDA
    graph. The model runs eager kernels back to back at the floor and graph kernels at floor + gap, so
    floor = the smaller of the two and gap = graph - floor (0 when a graph runs kernels faster than a
    pre-filled stream, which is the usual case)."""
    pre = median_reading(prefilled_us, "device time per kernel, pre-filled stream")
    graph = median_reading(graph_us, "device time per kernel in a CUDA graph")
    floor = min(pre, graph)
    return {"kernel_floor_us": floor, "launch_graph_us": graph - floor, "prefilled_period_us": pre,
            "graph_period_us": graph}


# ---- pure: readings -> figures ---------------------------------------------------------------------


def _readings(ranks: list[dict], figure: str) -> list[dict]:
    """The non-empty readings of one measurement, in rank order (pair figures live on one rank)."""
    return [r["figures"][figure] for r in ranks if isinstance(r.get("figures", {}).get(figure), dict)
            and r["figures"][figure]]


def _first_error(ranks: list[dict], figure: str) -> str | None:
    for r in ranks:
        e = r.get("errors", {}).get(figure)
        if e:
            return f"rank {r.get('rank', '?')}: {e}"
    return None


def _pool(readings: list[dict], key: str) -> list:
    return [x for r in readings for x in (r.get(key) or [])]


def _derive_matmul(rs):
    out = {}
    for dt in ("bf16", "fp16"):
        times = _pool(rs, f"torch_{dt}_us")
        if times:
            flops = rs[0]["flops"]
            out[f"torch_{dt}_tflops"] = plausible(flops / median_reading(times, f"torch.matmul {dt}") / 1e6, 1, 1e5,
                                                  f"torch.matmul {dt} TFLOP/s")
    if "torch_bf16_tflops" not in out:
        raise CalibrationError("matmul: no bf16 reading")
    best, where = out["torch_bf16_tflops"], f"{rs[0].get('n', '?')}^3"
    n_shapes = min(len(r.get("bf16_shapes") or []) for r in rs)
    for j in range(n_shapes):
        sh = rs[0]["bf16_shapes"][j]
        times = [x for r in rs for x in (r["bf16_shapes"][j].get("us") or [])]
        if not times:
            continue
        rate = plausible(sh["flops"] / median_reading(times, f"torch.matmul bf16 {sh['m']}x{sh['n']}x{sh['k']}") / 1e6,
                         1, 1e5, "torch.matmul bf16 TFLOP/s")
        if rate > best:
            best, where = rate, f"{sh['m']}x{sh['n']}x{sh['k']}"
    out["torch_bf16_best_tflops"], out["torch_bf16_best_shape"] = best, where
    return out


def _derive_triton_gemm(rs):
    ok = [r for r in rs if r.get("rel_error") is not None and r["rel_error"] <= r.get("tolerance", 1e-2)]
    if not ok:
        errs = [r.get("rel_error") for r in rs]
        raise CalibrationError(f"our Triton GEMM's result differs from torch.matmul (relative error {errs})")
    flops = ok[0]["flops"]
    return {"triton_bf16_tflops": plausible(flops / median_reading(_pool(ok, "us"), "Triton GEMM") / 1e6, 1, 1e5,
                                            "Triton GEMM TFLOP/s")}


def _derive_combine(rs):
    ok = [r for r in rs if r.get("checked")]
    if len(ok) < len(rs):
        raise CalibrationError("combine: the combine kernel's result differs from float32")
    sets = rs[0]["sets"]
    t = [median_reading([x for r in rs for x in r["us"][j]], f"combine, {n} sets") for j, n in enumerate(sets)]
    per_set = max(0.0, (t[-1] - t[0]) / (sets[-1] - sets[0]))
    return {"combine_per_set_us": plausible(per_set, 0, 1e4, "combine us per set"),
            "combine_base_us": plausible(max(0.0, t[0] - sets[0] * per_set), 0, 1e4, "combine base us")}


def _derive_hbm(rs):
    moved = rs[0]["bytes_moved"]
    out = {"hbm_copy_gbps": plausible(moved / median_reading(_pool(rs, "us"), "HBM copy") / 1e3, 10, 1e5,
                                      "HBM copy GB/s")}
    # the read: the best configuration's median over ranks (older readings have none)
    best = None
    n_cfg = min(len(r.get("read") or []) for r in rs)
    for j in range(n_cfg):
        if not all(r["read"][j].get("checked") for r in rs):
            raise CalibrationError(f"HBM read: the read kernel's sums were wrong ({rs[0]['read'][j].get('config')})")
        times = [x for r in rs for x in (r["read"][j].get("us") or [])]
        if times:
            rate = plausible(rs[0]["read"][j]["bytes"] / median_reading(times, "HBM read") / 1e3, 10, 1e5, "HBM read GB/s")
            if best is None or rate > best[0]:
                best = (rate, rs[0]["read"][j]["config"])
    if best:
        out["hbm_read_gbps"], out["hbm_read_config"] = best
    return out


def _derive_launch(rs, nccl_rs):
    host = {k: statistics.median(v) for k in ("triton_host_us", "torch_host_us")
            if (v := valid_values(_pool(rs, k)))}
    # kinds measured beside the three of launch_eager_us's mean (older readings lack them)
    more = {k: statistics.median(v) for k in ("triton_tma_host_us", "graph_host_us") if (v := valid_values(_pool(rs, k)))}
    nccl_host = valid_values(_pool(nccl_rs, "small_host_us"))
    if nccl_host:
        host["nccl_host_us"] = statistics.median(nccl_host)
    if not host:
        raise CalibrationError("launch: no host-side reading")
    out = {f"launch_{k}": v for k, v in host.items()}
    # the model has one eager launch cost for kernels and collectives alike: the mean of the kinds measured
    out["launch_eager_us"] = plausible(statistics.fmean(host.values()), 0.1, 1e4, "eager launch us")
    out.update({f"launch_{k}": v for k, v in more.items()})
    out["launch_host_us"] = {k.removesuffix("_host_us"): plausible(v, 0.1, 1e4, f"{k} launch us")
                             for k, v in (host | more).items()}
    figs = launch_figures(_pool(rs, "prefilled_device_us"), _pool(rs, "graph_device_us"))
    out.update(figs)
    plausible(figs["kernel_floor_us"], 0.05, 1e3, "kernel floor us")
    eager = valid_values(_pool(rs, "eager_device_us"))
    if eager:  # device time per kernel when the host cannot keep up: its excess over the floor is idle
        out["eager_device_gap_us"] = max(0.0, statistics.median(eager) - figs["kernel_floor_us"])
    return out


def nccl_curve(rs: list[dict]) -> list[dict]:
    """Median device time per all-gather per size (over repetitions and ranks); readings taken while the
    host was not ahead of the device (a launch in the timed window) are used only when no other exists."""
    world = rs[0]["world"]
    rows = []
    for i, size in enumerate(rs[0]["sizes"]):
        times, ahead = [], []
        for r in rs:
            if i < len(r["us"]):
                times += r["us"][i]
                ahead += r["host_ahead"][i]
        good = [t for t, a in zip(times, ahead) if a] or times
        vals = valid_values(good)
        if vals:
            rows.append({"bytes_per_rank": size, "bytes_in": (world - 1) * size, "us": statistics.median(vals),
                         "readings": len(vals), "host_ahead": len(good) < len(times) or all(ahead)})
    return rows


def _derive_nccl(rs):
    curve = nccl_curve(rs)
    fit = fit_latency_bandwidth([c["bytes_in"] for c in curve], [c["us"] for c in curve], "NCCL all-gather curve")
    largest = max(curve, key=lambda c: c["bytes_in"])
    return {"nccl_base_us": plausible(fit["base_us"], 0, 1e4, "NCCL latency us"),
            "nccl_gbps": plausible(fit["bytes_per_us"] / 1e3, 0.1, 1e5, "NCCL bandwidth GB/s"),
            "nccl_largest_gbps": largest["bytes_in"] / largest["us"] / 1e3,
            "nccl_fit_rel_rms": fit["rel_rms"], "nccl_fit_dropped": fit["dropped"], "nccl_curve": curve}


def _derive_peer(rs):
    out, bad = {}, {}
    for method in ("copy", "store", "load", "store_direct"):
        per_pair = []
        for r in rs:
            for p in r.get("pairs", []):
                vals = valid_values(p.get(f"{method}_us"))
                if p.get(f"{method}_error"):
                    bad[method] = p[f"{method}_error"]
                elif not p.get(f"{method}_checked", True):  # the data did not arrive intact: its times do not count
                    bad[method] = "the data did not arrive intact (checked after the copy); its times are not used"
                elif vals:
                    per_pair.append(p["bytes"] / statistics.median(vals) / 1e3)
        if per_pair:
            out[f"peer_{method}_gbps"] = plausible(statistics.median(per_pair), 0.1, 1e5, f"peer {method} GB/s")
    if bad:
        out["peer_failed_methods"] = bad
    inj = [r["injection"] for r in rs if r.get("injection")]
    if inj and valid_values(inj[0].get("us")):
        out["injection_copy_gbps"] = plausible(inj[0]["bytes"] / median_reading(inj[0]["us"], "injection") / 1e3,
                                               0.1, 1e6, "injection GB/s")
    if not out:
        raise CalibrationError("peer: no checked reading")
    return out


def _derive_pingpong(rs):
    pairs = [p for r in rs for p in r.get("pairs", [])]
    out = {}
    relaxed = valid_values([x for p in pairs for x in p.get("relaxed_rtt_us", [])])
    acquire = valid_values([x for p in pairs for x in p.get("acquire_rtt_us", [])])
    if relaxed:
        out["relaxed_round_trip_us"] = plausible(statistics.median(relaxed), 0.01, 1e4, "relaxed round trip us")
        out["link_latency_us"] = out["relaxed_round_trip_us"] / 2
    if acquire:
        out["flag_round_trip_us"] = plausible(statistics.median(acquire), 0.01, 1e4, "flag round trip us")
    offsets = {}
    for p in pairs:
        if p.get("t0") and p.get("t1") and p.get("t2"):
            off, err = clock_offset_ns(p["t0"], p["t1"], p["t2"])
            offsets[str(p["peer"])] = {"offset_ns": off, "error_ns": err}
    if offsets:
        out["clock_offsets"] = offsets
    if not out:
        raise CalibrationError("pingpong: no round trip measured")
    return out


def _derive_skew(rs, offsets: dict | None):
    r = rs[0]
    world = len(r.get("stamps_ns") or [])
    if offsets and world >= 2 and all(str(k) in offsets for k in range(1, world)):
        offs = [0.0] + [offsets[str(k)]["offset_ns"] for k in range(1, world)]
        spreads = skew_spreads_us(r["stamps_ns"], offs)
        method = "globaltimer stamps after a barrier, clocks corrected by ping-pong offsets"
    else:
        spreads = [x for x in r.get("collective_spread_us") or []
                   if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0]
        method = "spread of a tiny all-reduce's duration across ranks (no clock offsets)"
        if not spreads:
            raise CalibrationError("rank skew: neither stamps with clock offsets nor collective durations")
    return {"rank_skew_us": plausible(statistics.median(spreads), 0, 1e5, "rank skew us"), "rank_skew_method": method}


def derive_figures(ranks: list[dict], run_error: str | None = None) -> tuple[dict, dict]:
    """Every figure the readings support: (figures, {measurement: why it gave nothing})."""
    fig, failed = {}, {}
    world = max([int(r.get("world", 1)) for r in ranks] or [1])

    def attempt(name, fn, *needs):
        rs = _readings(ranks, name)
        if not rs and name in PAIR_FIGURES and world < 2:
            return  # nothing to measure on one GPU: not a failure
        if not rs:
            failed[name] = _first_error(ranks, name) or (f"not measured ({run_error})" if run_error else "not measured")
            return
        try:
            fig.update(fn(rs, *needs))
        except (CalibrationError, KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            failed[name] = str(e) if isinstance(e, CalibrationError) else f"readings unusable ({type(e).__name__}: {e})"

    attempt("matmul", _derive_matmul)
    attempt("triton_gemm", _derive_triton_gemm)
    attempt("combine", _derive_combine)
    attempt("hbm", _derive_hbm)
    attempt("launch", lambda rs: _derive_launch(rs, _readings(ranks, "nccl")))
    attempt("nccl", _derive_nccl)
    attempt("peer", _derive_peer)
    attempt("pingpong", _derive_pingpong)
    attempt("skew", lambda rs: _derive_skew(rs, fig.get("clock_offsets")))
    for method, why in fig.pop("peer_failed_methods", {}).items():
        failed[f"peer {method}"] = why
    return fig, failed


# ---- pure: figures -> profile ------------------------------------------------------------------------


def gpu_summary(names: list[str]) -> str:
    """['NVIDIA H200', 'NVIDIA H200'] -> '2 x NVIDIA H200'."""
    if not names:
        return "unknown GPUs"
    return ", ".join(f"{n} x {name}" if n > 1 else name for name, n in Counter(names).items())


def base_for_gpu(name: str) -> HardwareProfile:
    """The built-in profile a GPU's calibration starts from (h200-sxm when the name is not recognised)."""
    n = name.upper()
    for key, prof in (("H100", "h100-sxm"), ("H200", "h200-sxm"), ("MI300", "mi300x")):
        if key in n:
            return BUILTIN[prof]
    return BUILTIN["h200-sxm"]


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_profile_name(name: str) -> str:
    if not _NAME.fullmatch(name or ""):
        raise TaxesError(f"profile name {name!r}: use letters, digits, '.', '_' and '-' (64 at most), starting "
                         "with a letter or digit")
    if name in BUILTIN:
        raise TaxesError(f"profile name {name!r} is a built-in profile's; built-ins win over saved files, so choose "
                         "another (e.g. {name}-calibrated)")
    return name


def _fraction(rate: float, peak: float, field: str, notes: list[str]) -> float:
    """rate / peak as an efficiency in (0, 1]; above 1 (a peak below a measured rate) is clipped, said."""
    f = rate / peak
    if f > 1:
        notes.append(f"{field}: measured {rate:.4g} exceeds the peak {peak:.4g}; clipped to 1")
        return 1.0
    return max(f, 1e-6)


def assemble_profile(ranks: list[dict], base: HardwareProfile, meta: dict, *, name: str, peaks: str = "measured",
                     run_error: str | None = None) -> tuple[HardwareProfile, dict]:
    """The calibrated profile from every rank's readings, and the raw record kept beside it.

    meta: date (ISO), tool_version, git_commit, gpu_names, quick. Each field is measured or kept from
    `base` with the reason (raw["fields"]); see the module docstring for the peaks rule."""
    if peaks not in ("measured", "datasheet"):
        raise TaxesError(f"peaks={peaks!r}: choose measured or datasheet")
    world = max([int(r.get("world", 1)) for r in ranks] or [1])
    fig, failed = derive_figures(ranks, run_error)
    notes: list[str] = []
    how: dict[str, str] = {}
    v: dict = {}

    def kept(field, why):
        v[field] = getattr(base, field)
        how[field] = f"kept from {base.name}: {why}"

    def measured(field, value, what):
        v[field] = value
        how[field] = f"measured: {what}"

    def why(*names):
        for n in names:
            if n in failed:
                return f"{n} {failed[n]}"
        return "not measured" if world > 1 else "one GPU: no link to measure"

    sm = [r.get("device", {}).get("sm_count") for r in ranks]
    sm = [s for s in sm if isinstance(s, int) and s > 0]
    if sm:
        measured("sm_count", min(sm), "device properties")
    else:
        kept("sm_count", "no device properties")

    # -- matrix: peak, vendor GEMM, our GEMM
    b16, f16, tri = (fig.get(k) for k in ("torch_bf16_tflops", "torch_fp16_tflops", "triton_bf16_tflops"))
    base_b16 = base.matrix_tflops.get("bf16")
    if b16 and peaks == "measured":
        best_b16 = max(b16, fig.get("torch_bf16_best_tflops") or 0)
        peak = max(best_b16, tri or 0)
        tf = {}
        for dt, old in base.matrix_tflops.items():
            if dt == "bf16":
                tf[dt] = peak
            elif dt == "fp16" and f16:
                tf[dt] = f16
            else:  # not measured: the base's ratio to bf16
                tf[dt] = old * peak / base_b16 if base_b16 else old
                notes.append(f"matrix_tflops[{dt}]: not measured; scaled from bf16 by the base profile's ratio")
        tf.setdefault("bf16", peak)
        best_at = fig.get("torch_bf16_best_shape", "8192^3")
        measured("matrix_tflops", tf, f"max of torch.matmul over its shapes (best {best_at}) and our Triton GEMM 8192^3"
                 + (", fp16 torch.matmul" if f16 else ""))
    else:
        kept("matrix_tflops", "datasheet peaks requested" if b16 else why("matmul"))
    peak_b16 = v["matrix_tflops"].get("bf16") or base_b16
    if b16:
        measured("matmul_efficiency", _fraction(b16, peak_b16, "matmul_efficiency", notes), f"torch.matmul bf16 {b16:.0f} TFLOP/s")
    else:
        v["matmul_efficiency"] = min(1.0, base.matmul_efficiency * base_b16 / peak_b16)
        how["matmul_efficiency"] = f"kept from {base.name} (its achieved rate): {why('matmul')}"
    if tri:
        measured("triton_matmul_efficiency", _fraction(tri, peak_b16, "triton_matmul_efficiency", notes),
                 f"our Triton GEMM bf16 {tri:.0f} TFLOP/s")
    else:  # our GEMM keeps its ratio to the vendor GEMM
        v["triton_matmul_efficiency"] = min(1.0, base.triton_matmul_efficiency / base.matmul_efficiency * v["matmul_efficiency"])
        how["triton_matmul_efficiency"] = f"kept from {base.name} (its ratio to the vendor GEMM): {why('triton_gemm')}"

    # -- HBM
    hbm = fig.get("hbm_copy_gbps")
    if hbm and peaks == "measured":
        read = fig.get("hbm_read_gbps") or 0
        if read > hbm:
            measured("hbm_gbps", read, f"1 GiB read by a Triton kernel ({fig.get('hbm_read_config')}), above the copy's {hbm:.0f}")
        else:
            measured("hbm_gbps", hbm, "1 GiB device copy, read + write" + (f" (the read reached {read:.0f})" if read else ""))
    else:
        kept("hbm_gbps", "datasheet peaks requested" if hbm else why("hbm"))
    if hbm:
        measured("hbm_efficiency", _fraction(hbm, v["hbm_gbps"], "hbm_efficiency", notes), f"device copy {hbm:.0f} GB/s")
    else:
        v["hbm_efficiency"] = min(1.0, base.hbm_efficiency * base.hbm_gbps / v["hbm_gbps"])
        how["hbm_efficiency"] = f"kept from {base.name} (its achieved rate): {why('hbm')}"

    # -- links
    rates = {k: fig[k] for k in ("peer_copy_gbps", "peer_store_gbps", "peer_load_gbps", "peer_store_direct_gbps")
             if fig.get(k)}
    if world == 2 and fig.get("nccl_largest_gbps"):
        rates["nccl_largest_gbps"] = fig["nccl_largest_gbps"]
    if rates and peaks == "measured":
        best = max(rates, key=rates.get)
        measured("peer_link_gbps", rates[best], f"highest one-peer rate ({best.replace('_gbps', '')})")
        if fig.get("injection_copy_gbps"):
            measured("injection_gbps", max(fig["injection_copy_gbps"], v["peer_link_gbps"]), "copy to all peers at once")
        else:
            v["injection_gbps"] = v["peer_link_gbps"] * max(1.0, base.injection_gbps / base.peer_link_gbps)
            how["injection_gbps"] = (f"kept from {base.name} as a ratio to the peer link: "
                                     + ("2 GPUs, one peer only" if world == 2 else why("peer")))
    else:
        kept("peer_link_gbps", "datasheet peaks requested" if rates else why("peer", "nccl"))
        kept("injection_gbps", "datasheet peaks requested" if rates else why("peer", "nccl"))
    peer_scale = base.peer_link_gbps / v["peer_link_gbps"]
    if fig.get("peer_store_gbps"):
        measured("p2p_efficiency", _fraction(fig["peer_store_gbps"], v["peer_link_gbps"], "p2p_efficiency", notes),
                 f"Triton kernel storing to a peer, {fig['peer_store_gbps']:.0f} GB/s")
    else:
        v["p2p_efficiency"] = min(1.0, base.p2p_efficiency * peer_scale)
        how["p2p_efficiency"] = f"kept from {base.name} (its achieved rate): {why('peer store', 'peer')}"
    inbound = min(v["injection_gbps"], max(world - 1, 1) * v["peer_link_gbps"])
    base_inbound = min(base.injection_gbps, max(world - 1, 1) * base.peer_link_gbps)
    if fig.get("nccl_gbps"):
        measured("collective_efficiency", _fraction(fig["nccl_gbps"], inbound, "collective_efficiency", notes),
                 f"NCCL all-gather fit, {fig['nccl_gbps']:.0f} GB/s received per rank")
        measured("collective_base_us", fig["nccl_base_us"], "NCCL all-gather fit's latency (device time, launch hidden)")
    else:
        v["collective_efficiency"] = min(1.0, base.collective_efficiency * base_inbound / inbound)
        how["collective_efficiency"] = f"kept from {base.name} (its achieved rate): {why('nccl')}"
        kept("collective_base_us", why("nccl"))

    # -- the combine kernel's loop
    if fig.get("combine_per_set_us") is not None:
        v["combine_us"] = {"base": fig["combine_base_us"], "per_set": fig["combine_per_set_us"]}
        how["combine_us"] = "measured: flash decode's combine kernel, 4 programs, 4 and 64 sets per row"
    else:
        v["combine_us"] = dict(base.combine_us)
        how["combine_us"] = f"kept from {base.name}: {why('combine')}"

    # -- latencies and launch costs
    for field, key, what, src in (
        ("link_latency_us", "link_latency_us", "half a relaxed flag ping-pong's round trip", "pingpong"),
        ("flag_round_trip_us", "flag_round_trip_us", "ping-pong with the fused kernels' release/acquire flags", "pingpong"),
        ("launch_eager_us", "launch_eager_us", "host time per eager launch, mean of the kinds measured", "launch"),
        ("launch_graph_us", "launch_graph_us", "device time per kernel in a CUDA graph minus the floor", "launch"),
        ("kernel_floor_us", "kernel_floor_us", "device time per empty kernel back to back (the less of eager, host ahead, and in a graph)",
         "launch"),
        ("rank_skew_us", "rank_skew_us", fig.get("rank_skew_method", ""), "skew"),
    ):
        if fig.get(key) is not None:
            measured(field, fig[key], what)
        else:
            kept(field, why(src))

    for f in failed:
        notes.append(f"{f}: {failed[f]}")
    if fig.get("nccl_fit_rel_rms", 0) > 0.25:
        notes.append(f"the NCCL curve is far from latency + size / bandwidth (rms {fig['nccl_fit_rel_rms']:.0%}); "
                     "see nccl_curve")
    gpus = list(meta.get("gpu_names") or [r.get("device", {}).get("name", "?") for r in ranks])
    commit = (meta.get("git_commit") or "unknown-commit")[:12]
    date = str(meta.get("date") or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    source = f"calibrated on {gpu_summary(gpus)}, {date[:10]}, taxes {meta.get('tool_version', taxes.__version__)} {commit}"
    kept_fields = {f: h for f, h in how.items() if h.startswith("kept")}
    curve = fig.pop("nccl_curve", [])
    raw = {"world": world, "base_profile": base.name, "peaks": peaks, "quick": bool(meta.get("quick")),
           "metadata": _json_clean(meta), "figures": _json_clean(fig), "fields": how, "kept_from_base": kept_fields,
           "failed": failed, "notes": notes, "nccl_curve": _json_clean(curve), "readings": _json_clean(ranks)}
    if run_error:
        raw["run_error"] = run_error
    desc = f"{gpu_summary(gpus)} calibrated by taxes calibrate{' --quick' if raw['quick'] else ''} from {base.name}"
    prof = HardwareProfile(name=name, description=desc[:200], source=source[:200], extra={"calibration": raw},
                           launch_host_us=dict(fig.get("launch_host_us") or {}), **v)
    return profile_from_dict(profile_to_dict(prof), origin=f"calibrated profile {name}"), raw


def _json_clean(x):
    """A JSON-safe copy: non-finite numbers become None, tuples lists, keys strings."""
    if isinstance(x, dict):
        return {str(k): _json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (np.floating, np.integer)):
        return _json_clean(x.item())
    return x


def save_profile(profile: HardwareProfile, path: str | Path | None = None) -> Path:
    """Write the profile as JSON (atomically): to `path`, or as NAME.json in the first saved-profile
    directory (TAXES_PROFILE_DIR, else ~/.config/taxes/profiles), where it then loads by name."""
    from taxes.results import write_atomic

    d = profile_to_dict(profile_from_dict(profile_to_dict(profile), origin=f"profile {profile.name}"))
    target = Path(path) if path else profile_dirs()[0] / f"{profile.name}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, json.dumps(d, indent=1, allow_nan=False) + "\n")
    except OSError as e:
        raise TaxesError(f"{target}: cannot write the profile ({e.strerror or e})") from None
    return target


def read_progress(directory: str | Path, world: int) -> list[dict]:
    """The readings each rank saved as it went (after a run that did not finish)."""
    out = []
    for r in range(world):
        p = Path(directory) / f"rank{r}.json"
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def run_metadata(quick: bool, gpu_names: list[str] | None = None, base_name: str = "") -> dict:
    """Versions, commit and date of this calibration (taxes.results.collect_metadata)."""
    from taxes.results import collect_metadata

    meta = collect_metadata("calibrate", len(gpu_names or []), base_name, quick=quick)
    if gpu_names:
        meta["gpu_names"] = gpu_names
    return meta


# ---- device code: Triton kernels --------------------------------------------------------------------

@triton.jit
def empty_kernel(x_ptr):
    """A near-empty kernel: its one store never runs, so only the launch is measured."""
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


@triton.jit(do_not_specialize=["slot"])
def stamp_kernel(out_ptr, slot, INTERPRET: tl.constexpr):
    """out[slot] = this GPU's %globaltimer (ns) when the kernel runs."""
    tl.store(out_ptr + slot, globaltimer_ns(INTERPRET))


@triton.jit(do_not_specialize=["me", "peer"])
def peer_copy_kernel(sym_ptr, remote_ptr, other_ptr, bases, me, peer, n, PUSH: tl.constexpr, VIA_BASES: tl.constexpr,
                     BLOCK: tl.constexpr, GRID: tl.constexpr):
    """PUSH: peer's copy of sym[0:n] = other[0:n] (stores over the link); else other = peer's sym (loads).

    VIA_BASES: reach the peer as the fused kernels do (sync.peer_ptr: address arithmetic, alignment
    unknown to the compiler); else through remote_ptr, the peer's buffer passed as an argument."""
    if VIA_BASES:
        remote = peer_ptr(sym_ptr, bases, me, peer)
    else:
        remote = remote_ptr
    offs0 = tl.arange(0, BLOCK)
    for start in range(tl.program_id(0) * BLOCK, n, GRID * BLOCK):
        offs = start + offs0
        mask = offs < n
        if PUSH:
            tl.store(remote + offs, tl.load(other_ptr + offs, mask=mask), mask=mask)
        else:
            tl.store(other_ptr + offs, tl.load(remote + offs, mask=mask), mask=mask)


@triton.jit
def _wait_relaxed(flag_ptr, target, err_ptr, budget, index, INTERPRET: tl.constexpr):
    """Spin on volatile loads until *flag_ptr >= target; bounded like sync.wait_at_least."""
    seen = tl.load(flag_ptr, volatile=True)
    if seen < target:
        start = globaltimer_ns(INTERPRET)
        polls = 0
        gave_up = tl.load(err_ptr, volatile=True)
        while (seen < target) & (gave_up == 0):
            seen = tl.load(flag_ptr, volatile=True)
            polls += 1
            if spent_since(start, polls, INTERPRET) > budget:
                if seen < target:
                    record_timeout(err_ptr, 2, index, target, seen)
                    gave_up = 1


@triton.jit
def _ping(theirs, mine, value, err_ptr, budget, peer, SEND_FIRST: tl.constexpr, RELAXED: tl.constexpr,
          INTERPRET: tl.constexpr):
    """One half of a round: the leader sends then waits; the follower waits then sends. Returns the
    stamp taken between the two (the follower's t1) or after both (the leader's t2)."""
    if SEND_FIRST:
        if RELAXED:
            tl.atomic_xchg(theirs, value, sem="relaxed", scope="sys")
            _wait_relaxed(mine, value, err_ptr, budget, peer, INTERPRET)
        else:
            signal(theirs, value, "sys")
            wait_at_least(mine, value, err_ptr, budget, 2, peer, "sys", INTERPRET)
        t = globaltimer_ns(INTERPRET)
    else:
        if RELAXED:
            _wait_relaxed(mine, value, err_ptr, budget, peer, INTERPRET)
        else:
            wait_at_least(mine, value, err_ptr, budget, 2, peer, "sys", INTERPRET)
        t = globaltimer_ns(INTERPRET)
        if RELAXED:
            tl.atomic_xchg(theirs, value, sem="relaxed", scope="sys")
        else:
            signal(theirs, value, "sys")
    return t


@triton.jit(do_not_specialize=["me", "peer", "base", "rounds", "budget"])
def ping_pong_kernel(flags_ptr, bases, stamps_ptr, err_ptr, me, peer, base, rounds, budget, LEADER: tl.constexpr,
                     RELAXED: tl.constexpr, STAMPS: tl.constexpr, INTERPRET: tl.constexpr):
    """`rounds` flag round trips between this rank and `peer` (one CTA on each).

    flags[peer] on this rank is written only by `peer`, and this rank writes only flags[me] on the peer:
    one writer per flag; values base+1, base+2, ... only grow (later runs pass a larger base).
    stamps (int64, ns): with STAMPS the leader writes t0, t2 of round i at [2i], [2i+1] and the follower
    t1 at [i]; always [2*rounds] = the end of round 1 and [2*rounds+1] = the end, so rounds 2..rounds
    time (rounds - 1) round trips with the ranks already lined up by round 1."""
    mine = flags_ptr + peer
    theirs = peer_ptr(flags_ptr + me, bases, me, peer)
    t_first = globaltimer_ns(INTERPRET)
    for i in range(0, rounds):
        t0 = globaltimer_ns(INTERPRET)
        t = _ping(theirs, mine, base + i + 1, err_ptr, budget, peer, LEADER, RELAXED, INTERPRET)
        if STAMPS:
            if LEADER:
                tl.store(stamps_ptr + 2 * i, t0)
                tl.store(stamps_ptr + 2 * i + 1, t)
            else:
                tl.store(stamps_ptr + i, t)
        if i == 0:
            t_first = t
    tl.store(stamps_ptr + 2 * rounds, t_first)
    tl.store(stamps_ptr + 2 * rounds + 1, globaltimer_ns(INTERPRET))


# ---- device code: host-side helpers (work on GPUs, and under the interpreter where noted) ------------


def triton_peer_copy(ctx, buf, other, peer: int, push: bool, via_bases: bool = True, grid: int | None = None,
                     block: int = 4096) -> None:
    """Launch peer_copy_kernel between symmetric buffer `buf` on `peer` and `other` (int32, as many
    elements); GPU or interpreter."""
    n = other.numel()
    if grid is None:
        grid = 2 * torch.cuda.get_device_properties(ctx.device).multi_processor_count if ctx.device.type == "cuda" else 2
    peer_copy_kernel[(grid,)](buf.local, buf.peers[peer], other, ctx.heap.bases, ctx.rank, peer, n, PUSH=push,
                              VIA_BASES=via_bases, BLOCK=block, GRID=grid, num_warps=8 if ctx.device.type == "cuda" else 1)


def ping_pong(ctx, flags, stamps, peer: int, base: int, rounds: int, relaxed: bool, stamped: bool,
              wait_s: float) -> list[int]:
    """One ping-pong run with `peer` (both ranks call it; the lower rank leads); returns this rank's
    stamps (synchronises). Raises FlagTimeout when a wait gave up."""
    if 2 * rounds + 2 > stamps.local.numel():
        raise ValueError(f"{rounds} rounds need {2 * rounds + 2} stamps; the buffer holds {stamps.local.numel()}")
    interp = interpreting()
    err = torch.zeros(ERR_WORDS, dtype=torch.int32, device=ctx.device)
    ping_pong_kernel[(1,)](flags.local, ctx.heap.bases, stamps.local, err, ctx.rank, peer, base, rounds,
                           wait_budget(wait_s, interp), LEADER=ctx.rank < peer, RELAXED=relaxed, STAMPS=stamped,
                           INTERPRET=interp, num_warps=1)
    raise_if_timed_out(err, ctx.rank, "the ping-pong kernel", lambda kind, i: f"round trip with rank {i}")
    return stamps.local[: 2 * rounds + 2].tolist()


def sleep_cycles_per_us(device) -> float:
    """torch.cuda._sleep spins a number of clock cycles; measure how many make a microsecond here."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end) * 1e3, 1.0)


def device_batch_us(fn, calls: int, cycles_per_us: float, spin_us: float | None = None) -> tuple[float, bool]:
    """Device time per call of `calls` back-to-back fn() with the host ahead: a sleep kernel first holds
    the device while the host queues every call, so no launch cost is inside the timed window.
    Returns (us per call, whether the host really finished queueing before the sleep ended)."""
    spin_us = spin_us or 1000 + 60 * calls
    torch.cuda._sleep(int(spin_us * cycles_per_us))
    slept = torch.cuda.Event()
    slept.record()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    ahead = not slept.query()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls, ahead


def device_calls_us(fn, calls: int, cycles_per_us: float) -> tuple[list[float], bool]:
    """Device time of each of `calls` back-to-back fn() (events between them), host ahead as above."""
    torch.cuda._sleep(int((1000 + 200 * calls) * cycles_per_us))
    slept = torch.cuda.Event()
    slept.record()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
    ev[0].record()
    for i in range(calls):
        fn()
        ev[i + 1].record()
    ahead = not slept.query()
    ev[-1].synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(calls)], ahead


# ---- device code: one function per figure --------------------------------------------------------------
# A figure that fails on one rank must fail on all before any rank starts another collective (else one
# rank's barrier meets another's all_max); `_agree` is that meeting point.


def _agree(ctx, fn=None, error: BaseException | None = None):
    """Run fn() here (or take `error`); if it raised on any rank, raise on every rank."""
    out = None
    if fn is not None and error is None:
        try:
            out = fn()
        except Exception as e:
            error = e
    if ctx.world > 1 and ctx.all_max([1.0 if error else 0.0])[0] and error is None:
        raise RuntimeError("failed on another rank")
    if error is not None:
        raise error
    return out



def device_info(device) -> dict:
    p = torch.cuda.get_device_properties(device)
    return {"name": p.name, "sm_count": int(p.multi_processor_count), "memory_bytes": int(p.total_memory),
            "capability": f"{p.major}.{p.minor}"}


def measure_launch(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Host cost of eager launches; device time per empty kernel eager (host ahead or not) and in a graph."""
    x = torch.zeros(16, dtype=torch.int32, device=ctx.device)
    n = plan.launches

    def triton_launch():
        empty_kernel[(1,)](x)

    def torch_launch():
        x.add_(1)

    # our fused GEMMs' launch path (tiny shape): a persistent Triton kernel with three TMA descriptors, bound
    # once to its buffers and then launched directly (kernels/launch.py)
    from taxes.kernels.ag_gemm import Config, PersistentGemm

    gemm = PersistentGemm(ctx.device, Config(num_stages=3))
    ga = torch.zeros(128, 64, dtype=torch.bfloat16, device=ctx.device)
    gw = torch.zeros(64, 256, dtype=torch.bfloat16, device=ctx.device)
    go = torch.empty(128, 256, dtype=torch.bfloat16, device=ctx.device)

    def triton_tma_launch():
        gemm(ga, gw, go)

    one = torch.cuda.CUDAGraph()  # one CUDA graph replay's host call (a one-kernel graph)
    with torch.cuda.graph(one):
        triton_launch()

    for _ in range(20):
        triton_launch()
        torch_launch()
        triton_tma_launch()
        one.replay()
    torch.cuda.synchronize()
    out = {"launches": n, "triton_host_us": [], "torch_host_us": [], "triton_tma_host_us": [], "graph_host_us": [],
           "eager_device_us": [], "prefilled_device_us": [], "prefilled_ahead": [], "graph_device_us": [],
           "graph_ahead": []}
    for _ in range(plan.reps):
        for key, fn in (("triton_host_us", triton_launch), ("torch_host_us", torch_launch),
                        ("triton_tma_host_us", triton_tma_launch), ("graph_host_us", one.replay)):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            end.record()
            end.synchronize()
            out[key].append((t1 - t0) / n * 1e6)
            if fn is triton_launch:
                out["eager_device_us"].append(start.elapsed_time(end) * 1e3 / n)
        us, ahead = device_batch_us(triton_launch, n, cycles_per_us)
        out["prefilled_device_us"].append(us)
        out["prefilled_ahead"].append(ahead)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            triton_launch()
    graph.replay()
    torch.cuda.synchronize()
    for _ in range(plan.reps):
        us, ahead = device_batch_us(graph.replay, 1, cycles_per_us, spin_us=1000)
        out["graph_device_us"].append(us / n)
        out["graph_ahead"].append(ahead)
    return out


def measure_hbm(ctx, plan: Plan, cycles_per_us: float) -> dict:
    src = torch.randint(-2 ** 31, 2 ** 31 - 1, (plan.copy_bytes // 4,), dtype=torch.int32, device=ctx.device)
    dst = torch.empty_like(src)
    for _ in range(plan.warmup):
        dst.copy_(src)
    times, ahead = device_calls_us(lambda: dst.copy_(src), plan.reps, cycles_per_us)
    if not torch.equal(dst, src):
        raise RuntimeError("the device copy did not copy")
    dst = None  # free the copy's 1 GiB before the reads
    src.random_(0, 16)  # small values: the read kernel's int32 sums cannot overflow, so they check exactly
    read = [hbm_read(src, grid_per_sm, block, plan, cycles_per_us) for grid_per_sm, block in READ_CONFIGS]
    return {"bytes_moved": 2 * plan.copy_bytes, "us": times, "host_ahead": ahead, "read": read}


# Grid (programs per SM) and block (int32 per load) of the HBM read: the best one's rate counts.
READ_CONFIGS = ((2, 8192), (4, 4096), (8, 2048))


@triton.jit
def hbm_read_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr):
    """Each program strides over the blocks of x (int32) and stores its sum: every byte read once, one
    word written per program. The sums are what makes the reads real (and checkable)."""
    pid, progs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for b in range(pid, tl.cdiv(n, BLOCK), progs):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0)
    tl.store(sums_ptr + pid, tl.sum(acc, axis=0))


def hbm_read(x, grid_per_sm: int, block: int, plan: Plan, cycles_per_us: float) -> dict:
    """Time hbm_read_kernel over x (int32 values in [0, 16)); its sums checked against torch's."""
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    grid = sms * grid_per_sm
    sums = torch.empty(grid, dtype=torch.int32, device=x.device)

    def run():
        hbm_read_kernel[(grid,)](x, sums, x.numel(), BLOCK=block, num_warps=8)

    run()
    checked = int(sums.sum(dtype=torch.int64)) == int(x.sum(dtype=torch.int64))
    for _ in range(plan.warmup):
        run()
    times = device_calls_us(run, plan.reps, cycles_per_us)[0] if x.is_cuda else []
    return {"config": f"{grid_per_sm} programs per SM, block {block}", "bytes": x.numel() * 4, "us": times,
            "checked": checked}


def _matmul_inputs(n: int, dtype, device, seed: int, m: int | None = None, k: int | None = None):
    """A (m x k), W (k x n) scaled by 1/sqrt(k), and an output (m x n); m and k default to n (square)."""
    m, k = m or n, k or n
    g = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    w = (torch.randn(k, n, generator=g, device=device) / k ** 0.5).to(dtype)
    return a, w, torch.empty(m, n, dtype=dtype, device=device)


def matmul_shapes(n: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of the extra bf16 readings, relative to the plan's n: at 8192 they are the per-rank GEMMs
    of ag-gemm at M = 8192 and 16384 on 2 GPUs (N/p = 4096) and a wide one."""
    return [(n, n // 2, n), (2 * n, n // 2, n), (n // 2, n, n)]


def measure_matmul(ctx, plan: Plan, cycles_per_us: float) -> dict:
    n = plan.matmul_n
    out = {"n": n, "flops": 2 * n ** 3}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        out[f"torch_{name}_us"] = _time_torch_matmul(n, dtype, ctx, plan, cycles_per_us)
    out["bf16_shapes"] = []
    for m, nn, k in matmul_shapes(n):
        a, w, c = _matmul_inputs(nn, torch.bfloat16, ctx.device, 11 + ctx.rank, m=m, k=k)
        for _ in range(plan.warmup):
            torch.matmul(a, w, out=c)
        us = device_calls_us(lambda: torch.matmul(a, w, out=c), plan.matmul_reps, cycles_per_us)[0]
        out["bf16_shapes"].append({"m": m, "n": nn, "k": k, "flops": 2 * m * nn * k, "us": us})
    return out


def _time_torch_matmul(n, dtype, ctx, plan: Plan, cycles_per_us: float) -> list[float]:
    a, w, c = _matmul_inputs(n, dtype, ctx.device, 1 + ctx.rank)
    for _ in range(plan.warmup):
        torch.matmul(a, w, out=c)
    return device_calls_us(lambda: torch.matmul(a, w, out=c), plan.matmul_reps, cycles_per_us)[0]


def measure_triton_gemm(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Our persistent GEMM (kernels/ag_gemm.py) at the matmul shape, checked against float32 first."""
    from taxes.kernels import ag_gemm as ag

    n = plan.matmul_n
    a, w, c = _matmul_inputs(n, torch.bfloat16, ctx.device, 7 + ctx.rank)
    cfg = ag.tuned_config(n, n, n, 1, "fused-pull")
    gemm = ag.PersistentGemm(ctx.device, cfg)
    err = ag.rel_error(gemm(a, w, c.fill_(float("nan"))), a.float() @ w.float())
    out = {"n": n, "flops": 2 * n ** 3, "rel_error": err, "tolerance": 1e-2, "config": str(cfg)}
    if not err <= 1e-2:
        out["us"] = []
        return out
    for _ in range(plan.warmup):
        gemm(a, w, c)
    out["us"], _ = device_calls_us(lambda: gemm(a, w, c), plan.matmul_reps, cycles_per_us)
    return out


COMBINE_SETS = (4, 64)


def measure_combine(ctx, plan: Plan, cycles_per_us: float, rows: int = 64, D: int = 128) -> dict:
    """flash decode's combine kernel at 4 programs of 16 rows (batch 1, 64 query heads), merging each
    of COMBINE_SETS partial sets per row; each run checked against a float32 merge first."""
    from taxes.kernels.flash_decode import combine_kernel

    out = {"rows": rows, "sets": list(COMBINE_SETS), "us": [], "checked": True}
    g = torch.Generator(device=ctx.device).manual_seed(21 + ctx.rank)
    for n in COMBINE_SETS:
        part = torch.randn(rows, n, D + 1, generator=g, device=ctx.device)
        res = torch.full((rows, D + 1), float("nan"), device=ctx.device)

        def run():
            combine_kernel[(triton.cdiv(rows, 16),)](part, res, rows, n, n * (D + 1), D + 1, D=D, BLOCK_R=16,
                                                     PACKED_OUT=True, num_warps=4)

        run()
        w = torch.exp2(part[:, :, D] - part[:, :, D].max(dim=1, keepdim=True).values)  # log2-domain weights
        want = (w[:, :, None] * part[:, :, :D]).sum(1) / w.sum(1, keepdim=True)
        out["checked"] &= bool(torch.allclose(res[:, :D], want, rtol=1e-4, atol=1e-5))
        for _ in range(plan.warmup):
            run()
        out["us"].append(device_calls_us(run, plan.reps, cycles_per_us)[0] if ctx.device.type == "cuda" else [])
    return out


def _nccl_calls(size: int) -> int:
    """Back-to-back all-gathers per reading: about 2 ms of work, 3 to 30 calls."""
    est_us = 20 + size / 2e5
    return max(3, min(30, int(2000 / est_us)))


def measure_nccl(ctx, plan: Plan, cycles_per_us: float) -> dict:
    import torch.distributed as dist

    out = {"world": ctx.world, "sizes": list(plan.nccl_sizes), "calls": [], "us": [], "host_ahead": [], "host_us": [],
           "small_host_us": []}
    for size in plan.nccl_sizes:
        ctx.doing(f"calibrating nccl all-gather of {size} bytes per rank")
        inp, res = _agree(ctx, lambda: (torch.randint(0, 255, (size,), dtype=torch.uint8, device=ctx.device),
                                        torch.empty(ctx.world * size, dtype=torch.uint8, device=ctx.device)))
        calls = _nccl_calls(size)
        for _ in range(2):
            dist.all_gather_into_tensor(res, inp)
        times, ahead, host = [], [], []
        for _ in range(plan.reps):
            ctx.barrier()
            torch.cuda._sleep(int((1000 + 150 * (calls + 1)) * cycles_per_us))
            slept = torch.cuda.Event()
            slept.record()
            dist.all_gather_into_tensor(res, inp)  # lines the ranks up: the timed calls start together
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_gather_into_tensor(res, inp)
            t1 = time.perf_counter()
            end.record()
            ahead.append(not slept.query())
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / calls)
            host.append((t1 - t0) / calls * 1e6)
        if size <= 64 << 10:
            out["small_host_us"] += host
        out["calls"].append(calls)
        out["us"].append(times)
        out["host_ahead"].append(ahead)
        out["host_us"].append(host)
        del inp, res
    return out


def measure_peer(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """Each rank in turn writes the next rank's symmetric buffer (copy engine, then Triton stores) and
    reads it back (Triton loads); every method's data is checked once. Then rank 0 writes to all peers
    at once (more than 2 GPUs)."""
    ctx.heap.reset()
    n = plan.peer_bytes // 4
    buf = ctx.heap.alloc((n,), torch.int32)
    g = torch.Generator(device=ctx.device).manual_seed(11 + ctx.rank)
    src = torch.randint(-2 ** 31, 2 ** 31 - 1, (n,), generator=g, dtype=torch.int32, device=ctx.device)
    back = torch.empty_like(src)
    out = {"pairs": []}
    error = None
    ctx.barrier()
    for sender in range(ctx.world):
        if ctx.rank == sender:
            try:
                out["pairs"].append(_peer_methods(ctx, plan, cycles_per_us, buf, src, back))
            except Exception as e:
                error = e
        ctx.barrier()
    if ctx.world > 2 and ctx.rank == 0 and error is None:
        ctx.doing("calibrating copies to all peers at once")
        try:
            out["injection"] = _injection(ctx, plan, cycles_per_us, buf, src)
        except Exception as e:
            error = e
    _agree(ctx, error=error)
    ctx.barrier()
    return out


def _peer_methods(ctx, plan: Plan, cycles_per_us: float, buf, src, back) -> dict:
    """This rank writes the next rank's buffer (copy engine; Triton stores addressed as the fused kernels
    do, and through the peer tensor), then reads it (Triton loads); each method's data is checked."""
    dst = (ctx.rank + 1) % ctx.world
    ctx.doing(f"calibrating peer copies to rank {dst}")
    pair = {"src": ctx.rank, "dst": dst, "bytes": plan.peer_bytes}
    methods = (("copy", lambda: buf.peers[dst].copy_(src)),
               ("store", lambda: triton_peer_copy(ctx, buf, src, dst, push=True)),
               ("store_direct", lambda: triton_peer_copy(ctx, buf, src, dst, push=True, via_bases=False)),
               ("load", lambda: triton_peer_copy(ctx, buf, back, dst, push=False)))
    for name, fn in methods:
        target = back if name == "load" else buf.peers[dst]
        try:  # one method failing (e.g. a kernel that does not compile) leaves the others standing
            target.fill_(-1)
            fn()  # warm-up (compiles the Triton kernel) and the checked run
            torch.cuda.synchronize()
            pair[f"{name}_checked"] = bool(torch.equal(target, src))
            for _ in range(plan.warmup):
                fn()
            pair[f"{name}_us"], _ = device_calls_us(fn, plan.reps, cycles_per_us)
        except Exception as e:
            pair[f"{name}_error"] = _one_line(e)
            torch.cuda.synchronize()  # a broken context raises here, and the figure fails as a whole
    return pair


def _injection(ctx, plan: Plan, cycles_per_us: float, buf, src) -> dict:
    """Rank 0 writes every peer's buffer at once, one stream per peer."""
    streams = [torch.cuda.Stream(ctx.device) for _ in range(ctx.world - 1)]

    def to_all():
        here = torch.cuda.current_stream()
        for s, peer in zip(streams, range(1, ctx.world)):
            s.wait_stream(here)
            with torch.cuda.stream(s):
                buf.peers[peer].copy_(src)
        for s in streams:
            here.wait_stream(s)

    for _ in range(plan.warmup):
        to_all()
    us, _ = device_calls_us(to_all, plan.reps, cycles_per_us)
    return {"bytes": (ctx.world - 1) * plan.peer_bytes, "us": us}


def measure_pingpong(ctx, plan: Plan, cycles_per_us: float, wait_s: float = 5.0) -> dict:
    """Rank 0 with each other rank in turn: relaxed and release/acquire round trips, then a stamped run
    for the clock offset. Both ranks of a pair track the same growing flag base."""
    if plan.rounds < 2:
        raise ValueError(f"a ping-pong reading needs 2 or more rounds, not {plan.rounds}")
    ctx.heap.reset()
    flags = ctx.heap.zeros((ctx.world,), torch.int32)
    stamps = ctx.heap.zeros((2 * plan.rounds + 2,), torch.int64)
    ctx.barrier()
    out = {"rounds": plan.rounds, "pairs": []}
    base = 0
    for peer in range(1, ctx.world):
        in_pair = ctx.rank in (0, peer)
        other = peer if ctx.rank == 0 else 0
        pair = {"peer": peer, "relaxed_rtt_us": [], "acquire_rtt_us": []}
        for relaxed in (True, False):
            kind = "relaxed_rtt_us" if relaxed else "acquire_rtt_us"
            for rep in range(-1, plan.pingpong_reps):  # rep -1: compiles, with a long budget for the slower peer
                rounds = min(8, plan.rounds) if rep < 0 else plan.rounds
                ctx.barrier()
                ctx.doing(f"calibrating flag ping-pong of ranks 0 and {peer} ({'relaxed' if relaxed else 'acquire'})")
                s = _agree(ctx, lambda: ping_pong(ctx, flags, stamps, other, base, rounds, relaxed, False,
                                                  120.0 if rep < 0 else wait_s) if in_pair else None)
                if rep >= 0 and ctx.rank == 0:  # rank 0 is in every pair
                    pair[kind].append((s[2 * rounds + 1] - s[2 * rounds]) / (rounds - 1) / 1e3)
                base += rounds
        rounds = min(plan.rounds, 200)
        for rep in range(2):  # the first compiles the stamped build
            ctx.barrier()
            s = _agree(ctx, lambda: ping_pong(ctx, flags, stamps, other, base, rounds, True, True,
                                              120.0 if rep == 0 else wait_s) if in_pair else None)
            base += rounds
        ctx.barrier()
        if ctx.rank == 0:
            t1 = stamps.peers[peer][:rounds].tolist()
            pair.update(t0=s[0:2 * rounds:2], t2=s[1:2 * rounds:2], t1=t1)
            out["pairs"].append(pair)
        ctx.barrier()
    return out


def measure_skew(ctx, plan: Plan, cycles_per_us: float) -> dict:
    """After each barrier every rank stamps %globaltimer in a kernel; also the spread of a tiny
    all-reduce's device duration across ranks (the early rank waits for the late one)."""
    import torch.distributed as dist

    interp = interpreting()
    stamps = torch.zeros(plan.skew_reps, dtype=torch.int64, device=ctx.device)
    _agree(ctx, lambda: stamp_kernel[(1,)](stamps, 0, INTERPRET=interp))  # compile before the timed barriers
    tiny = torch.zeros(1, device=ctx.device)
    dist.all_reduce(tiny)
    for k in range(plan.skew_reps):
        ctx.barrier()
        stamp_kernel[(1,)](stamps, k, INTERPRET=interp)
    torch.cuda.synchronize()
    gathered = torch.zeros(ctx.world * plan.skew_reps, dtype=torch.int64, device=ctx.device)
    dist.all_gather_into_tensor(gathered, stamps)
    spreads = []
    for _ in range(plan.skew_reps):
        ctx.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dist.all_reduce(tiny)
        end.record()
        end.synchronize()
        d = start.elapsed_time(end) * 1e3
        hi, neg_lo = ctx.all_max([d, -d])
        spreads.append(hi + neg_lo)
    if ctx.rank != 0:
        return {}
    return {"stamps_ns": gathered.view(ctx.world, plan.skew_reps).tolist(), "collective_spread_us": spreads}


# ---- one calibration --------------------------------------------------------------------------------


def _one_line(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0][:300]


def _save_progress(progress_dir, rank: int, readings: dict) -> None:
    if progress_dir:
        from taxes.results import write_atomic

        try:
            write_atomic(Path(progress_dir) / f"rank{rank}.json", json.dumps(_json_clean(readings), allow_nan=False))
        except (OSError, ValueError):
            pass


def measure(ctx, quick: bool = False, progress_dir: str | None = None, figures=FIGURES) -> dict:
    """Every figure on this rank (all ranks call it together); a figure that fails is recorded as one
    line and the others still run. Readings are saved to progress_dir/rankR.json after each figure."""
    plan = QUICK if quick else FULL
    readings = {"rank": ctx.rank, "world": ctx.world, "quick": quick, "device": device_info(ctx.device),
                "figures": {}, "errors": {}}
    cycles = sleep_cycles_per_us(ctx.device)
    readings["sleep_cycles_per_us"] = cycles
    steps = {"launch": measure_launch, "hbm": measure_hbm, "matmul": measure_matmul, "nccl": measure_nccl,
             "peer": measure_peer, "pingpong": measure_pingpong, "skew": measure_skew, "triton_gemm": measure_triton_gemm,
             "combine": measure_combine}
    for name in figures:
        if name in PAIR_FIGURES and ctx.world < 2:
            continue
        ctx.doing(f"calibrating {name}")
        t0 = time.perf_counter()
        failed = 0.0
        try:
            readings["figures"][name] = steps[name](ctx, plan, cycles)
        except Exception as e:
            readings["errors"][name] = _one_line(e)
            failed = 1.0
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        readings.setdefault("seconds", {})[name] = round(time.perf_counter() - t0, 3)
        _save_progress(progress_dir, ctx.rank, readings)  # before the next collective, which a dead GPU fails
        if ctx.world > 1 and ctx.all_max([failed])[0] and not failed:
            readings["errors"].setdefault(name, "failed on another rank")
            _save_progress(progress_dir, ctx.rank, readings)
        torch.cuda.empty_cache()
    return readings


def gather_readings(ctx, readings: dict) -> list[dict]:
    if ctx.world == 1:
        return [readings]
    import torch.distributed as dist

    out = [None] * ctx.world
    dist.all_gather_object(out, readings)
    return out


def calibrate(ctx, base_profile: HardwareProfile, quick: bool = False, *, name: str | None = None,
              peaks: str = "measured", progress_dir: str | None = None) -> tuple[HardwareProfile, dict]:
    """Measure every figure on all ranks (every rank calls this) and build the profile from them."""
    readings = gather_readings(ctx, measure(ctx, quick, progress_dir))
    meta = run_metadata(quick, [r["device"]["name"] for r in readings], base_profile.name)
    if ctx.rank == 0:  # clocks, power and temperature right after the measuring (nvidia-smi)
        from taxes.harness import gpu_metadata

        meta["clocks"] = gpu_metadata().get("clocks", [])
    return assemble_profile(readings, base_profile, meta, name=name or f"{base_profile.name}-calibrated", peaks=peaks)


def calibrate_job(ctx, base_profile, quick, name, peaks, progress_dir):
    """The per-rank entry point for runtime.launch: rank 0 returns (profile, raw)."""
    result = calibrate(ctx, base_profile, quick, name=name, peaks=peaks, progress_dir=progress_dir)
    return result if ctx.rank == 0 else None


def cuda_gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cuda_gpu_names(count: int) -> list[str]:
    return [torch.cuda.get_device_name(i) for i in range(count)]


def run_calibration(world: int, base: HardwareProfile, quick: bool, name: str, peaks: str = "measured",
                    timeout_s: float = 300.0, job=calibrate_job) -> tuple[HardwareProfile, dict]:
    """Calibrate on `world` GPUs, one process each. If the run dies part-way (a rank fails or overruns
    timeout_s), the profile is built from the readings saved so far and raw["run_error"] says why."""
    import shutil
    import tempfile

    from taxes.kernels.runtime import RankError, launch

    if world < 1 or world > cuda_gpu_count():
        raise TaxesError(f"calibrate on {world} GPUs: this machine has {cuda_gpu_count()}")
    tmp = tempfile.mkdtemp(prefix="taxes-calibrate-")
    try:
        try:
            results = launch(job, world, base, quick, name, peaks, tmp, backend="cuda",
                             heap_bytes=heap_bytes_for(world, quick), timeout_s=timeout_s)
            return results[0]
        except RankError as e:
            readings = read_progress(tmp, world)
            if not any(r.get("figures") for r in readings):
                raise TaxesError(f"calibration failed before any figure was measured: {e}") from None
            gpus = [r["device"]["name"] for r in readings if r.get("device")]
            return assemble_profile(readings, base, run_metadata(quick, gpus, base.name), name=name, peaks=peaks,
                                    run_error=str(e))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- presenting ------------------------------------------------------------------------------------

SHOWN_FIELDS = ("sm_count", "matrix_tflops", "matmul_efficiency", "triton_matmul_efficiency", "hbm_gbps",
                "hbm_efficiency", "peer_link_gbps", "injection_gbps", "p2p_efficiency", "collective_efficiency",
                "collective_base_us", "link_latency_us", "flag_round_trip_us", "launch_eager_us", "launch_graph_us",
                "kernel_floor_us", "rank_skew_us")


def _cell(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {x:,.4g}" for k, x in v.items())
    return f"{v:,.4g}" if isinstance(v, float) else str(v)


def summary_rows(profile: HardwareProfile, base: HardwareProfile) -> list[tuple[str, str, str, str]]:
    """(field, base value, calibrated value, how) for every figure, in a fixed order."""
    how = profile.extra.get("calibration", {}).get("fields", {})
    return [(f, _cell(getattr(base, f)), _cell(getattr(profile, f)), how.get(f, "")) for f in SHOWN_FIELDS]


def failure_lines(raw: dict) -> list[str]:
    """One line per measurement that gave nothing (its fields keep the base profile's values)."""
    lines = [f"{name}: {why}" for name, why in raw.get("failed", {}).items()]
    if raw.get("run_error"):
        lines.insert(0, f"the run stopped early: {raw['run_error']}")
    return [" ".join(line.split()) for line in lines]


