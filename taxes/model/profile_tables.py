"""The hardware profiles as tables (`taxes hardware list` and `show`): (header, rows) of text cells."""

from __future__ import annotations

from dataclasses import asdict

from taxes.model.hardware import HardwareProfile

LIST_HEADER = ["name", "source", "file", "bf16 TFLOP/s", "HBM GB/s", "link GB/s (peer / all)", "SMs", "description"]


def list_rows() -> tuple[list[str], list[list[str]]]:
    """Every built-in and saved profile with its headline figures; one that does not load says so."""
    from taxes.model.calibrate.present import origin_line
    from taxes.model.hardware import all_profiles

    rows = []
    for name, (p, origin) in all_profiles().items():
        if p is None:
            rows.append([name, "-", origin, "-", "-", "-", "-", "does not load: taxes hardware show " + name])
            continue
        rows.append([name, origin_line(p), origin, f"{p.matrix_tflops.get('bf16', 0):,.0f}",
                     f"{p.hbm_gbps:,.0f}", f"{p.peer_link_gbps:,.0f} / {p.injection_gbps:,.0f}", str(p.sm_count),
                     p.description])
    return LIST_HEADER, rows


def show_rows(p: HardwareProfile) -> tuple[str, list[str], list[list[str]]]:
    """(title, header, rows): every figure of one profile, after where a calibration measured it."""
    from taxes.model.calibrate.present import calibration_origin

    o = calibration_origin(p)
    rows = [[k, str(o[k])] for k in ("machine", "date", "world", "commit") if o and o[k] is not None]
    rows += [[k, ", ".join(f"{d} {x:g}" for d, x in v.items()) if isinstance(v, dict) else f"{v:g}"]
             for k, v in asdict(p).items() if k not in ("name", "description", "source", "extra")]
    return f"{p.name}: {p.description} ({p.source})", ["figure", "value"], rows
