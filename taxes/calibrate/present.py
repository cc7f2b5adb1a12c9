"""What `taxes calibrate` shows: the profile's figures beside the base profile's, and what failed."""

from __future__ import annotations

from taxes.hardware import HardwareProfile

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
