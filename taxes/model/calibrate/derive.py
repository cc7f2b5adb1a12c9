"""Readings -> figures: every rank's raw readings turned into the machine's figures (medians, fits,
checks), each measurement on its own so that one that failed leaves the others standing.

`derive_figures(ranks)` returns (figures, {measurement: why it gave nothing}). Pair figures (nccl, peer,
pingpong, skew) live on one rank's readings; the others are pooled over ranks.
"""

from __future__ import annotations

import math
import statistics

from taxes.model.calibrate.fits import (
    CalibrationError,
    clock_offset_ns,
    first_launch_figures,
    fit_latency_bandwidth,
    fit_saturating_rate,
    launch_figures,
    median_reading,
    plausible,
    skew_spreads_us,
    valid_values,
)
from taxes.model.calibrate.plan import PAIR_FIGURES


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
    more = {k: statistics.median(v) for k in ("triton_tma_host_us", "graph_host_us", "sdpa_host_us")
            if (v := valid_values(_pool(rs, k)))}
    # the all-gather's host call: measure_nccl's small sizes, else (one GPU: no collective figures) the launch
    # figure's back-to-back one-rank all-gather
    nccl_host = valid_values(_pool(nccl_rs, "small_host_us")) or valid_values(_pool(rs, "nccl_host_us"))
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
    first = {}  # every rank's idle-launch readings pooled per kind (older readings have none)
    for r in rs:
        for kind, reading in (r.get("first_launch") or {}).items():
            pooled = first.setdefault(kind, {"idle_us": [], "device_us": [], "host_us": []})
            for key in pooled:
                pooled[key] += list(reading.get(key) or [])
    if first_launch_figures(first):
        out["first_launch_us"] = first_launch_figures(first)
    # one call's host time right after a drained device, per kind (the model takes the back-to-back figure;
    # this one is kept beside it: an iteration's calls are each one call, not one of a hundred)
    cold = {kind: statistics.median(v) for kind, r in first.items() if (v := valid_values(r["host_us"]))}
    if cold:
        out["launch_cold_host_us"] = cold
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
            "nccl_fit_rel_rms": fit["rel_rms"], "nccl_fit_dropped": fit["dropped"], "nccl_curve": curve,
            "collective_curves": collective_curves(rs, curve)}


def collective_curves(rs: list[dict], all_gather: list[dict]) -> list[dict]:
    """[{op, world, points}] the model reads by collective and world: the all-gather at the calibration's
    world (its curve, all_gather) and every further curve the readings hold (rs[r]["curves"], the same
    order on every rank; a rank outside a smaller world's group has no times in it)."""
    world = rs[0]["world"]
    out = [{"op": "all_gather", "world": world, "points": all_gather}]
    for j in range(min(len(r.get("curves") or []) for r in rs)):
        per_rank = [r["curves"][j] for r in rs]
        points = nccl_curve(per_rank)
        if len(points) >= 2:
            out.append({"op": per_rank[0]["op"], "world": per_rank[0]["world"], "points": points})
    return out


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
    for method in ("store", "load"):  # what a few copier CTAs deliver (older readings have none)
        rate = _peer_by_ctas(rs, method)
        if rate:
            key = "peer_cta" if method == "store" else "peer_cta_load"
            out[f"{key}_gbps"], out[f"{key}_max_gbps"] = rate["per_cta_gbps"], rate["max_gbps"]
    inj = [r["injection"] for r in rs if r.get("injection")]
    if inj and valid_values(inj[0].get("us")):
        out["injection_copy_gbps"] = plausible(inj[0]["bytes"] / median_reading(inj[0]["us"], "injection") / 1e3,
                                               0.1, 1e6, "injection GB/s")
    if not out:
        raise CalibrationError("peer: no checked reading")
    return out


def _peer_by_ctas(rs: list[dict], method: str) -> dict | None:
    """The saturating fit of one method's peer copies by CTA count, over every checked pair's readings."""
    ctas, gbps = [], []
    for r in rs:
        for p in r.get("pairs", []):
            c = p.get("ctas")
            if not c or not c.get("checked"):
                continue
            for n, times in zip(c["ctas"], c.get(f"{method}_us") or []):
                vals = valid_values(times)
                if vals:
                    ctas.append(n)
                    gbps.append(c["bytes"] / statistics.median(vals) / 1e3)
    if len(set(ctas)) < 2:
        return None
    fit = fit_saturating_rate(ctas, gbps, f"peer {method} by CTA count")
    plausible(fit["per_cta_gbps"], 0.01, 1e5, f"peer {method} GB/s per CTA")
    return fit


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
        method = "globaltimer stamps after the iterations' start barrier, clocks corrected by ping-pong offsets"
    else:
        spreads = [x for x in r.get("collective_spread_us") or []
                   if isinstance(x, (int, float)) and math.isfinite(x) and x >= 0]
        method = "spread of a tiny all-reduce's duration across ranks (no clock offsets)"
        if not spreads:
            raise CalibrationError("rank skew: neither stamps with clock offsets nor collective durations")
    return {"rank_skew_us": plausible(statistics.median(spreads), 0, 1e5, "rank skew us"), "rank_skew_method": method}


def _derive_copiers(rs):
    """What the fused ag-gemm's copier CTAs push out of a rank beside its own GEMM (measure_copiers): over the
    ranks, the median of bytes / the median call's copy time, and how many copier CTAs did it."""
    rates, ctas = [], []
    for r in rs:
        if not r.get("checked"):
            raise CalibrationError("copiers: the fused kernel's output did not match float32 (rel. error "
                                   f"{r.get('rel_error')}); its times are not used")
        vals = valid_values(r.get("us"))
        if vals and r.get("copiers"):
            rates.append(r["bytes"] / statistics.median(vals) / 1e3)
            ctas.append(int(r["copiers"]))
    if not rates:
        raise CalibrationError("copiers: no call with the copiers' stamps")
    return {"copier_gemm_gbps": plausible(statistics.median(rates), 0.1, 1e5, "copiers beside the GEMM GB/s"),
            "copier_gemm_ctas": max(ctas)}


def derive_figures(ranks: list[dict], run_error: str | None = None) -> tuple[dict, dict]:
    """Every figure the readings support: (figures, {measurement: why it gave nothing})."""
    fig, failed = {}, {}
    world = max([int(r.get("world", 1)) for r in ranks] or [1])

    def attempt(name, fn, *needs, newer: bool = False):
        rs = _readings(ranks, name)
        if not rs and name in PAIR_FIGURES and world < 2:
            return  # nothing to measure on one GPU: not a failure
        if not rs and newer and not _first_error(ranks, name):
            return  # a figure older readings do not have: absent, not failed
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
    attempt("copiers", _derive_copiers, newer=True)
    for method, why in fig.pop("peer_failed_methods", {}).items():
        failed[f"peer {method}"] = why
    return fig, failed
