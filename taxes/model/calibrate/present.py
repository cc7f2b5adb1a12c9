"""What `taxes calibrate` shows: the profile's figures beside the base profile's, and what failed."""

from __future__ import annotations

from taxes.model.hardware import HardwareProfile

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


def calibration_origin(profile: HardwareProfile) -> dict | None:
    """Where and when a calibrated profile was measured: {"machine": "2 x NVIDIA H100 80GB HBM3", "date":
    "2026-11-27", "world": 2, "quick": bool, "commit": "3addaa057434"} from the calibration's own record;
    None for a profile no calibration made (a datasheet profile, a hand-written file)."""
    from taxes.model.calibrate.assemble import gpu_summary

    cal = (profile.extra or {}).get("calibration")
    if not isinstance(cal, dict):
        return None
    meta = cal.get("metadata") if isinstance(cal.get("metadata"), dict) else {}
    gpus = [g for g in meta.get("gpu_names") or [] if isinstance(g, str)]
    date = str(meta.get("date") or "")[:10] or "unknown date"
    world = cal.get("world") if isinstance(cal.get("world"), int) else len(gpus) or None
    return {"machine": gpu_summary(gpus) if gpus else "unknown GPUs", "date": date, "world": world,
            "quick": bool(cal.get("quick")), "commit": str(meta.get("git_commit") or "")[:12] or None}


def origin_line(profile: HardwareProfile) -> str:
    """One line for listings: 'measured on 2 x NVIDIA H100 80GB HBM3, 2026-11-27' or the profile's source."""
    o = calibration_origin(profile)
    return f"measured on {o['machine']}, {o['date']}" if o else profile.source
