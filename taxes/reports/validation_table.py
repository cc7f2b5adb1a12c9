"""The validation table (taxes.documents.validation.table) as text: per row the E2E and each tax's signed
error, then per world the E2E error and the per-tax errors where a tax is at least 5% of E2E."""

from __future__ import annotations

from taxes.model.predict import TAXES


def _cell(r: dict, tax: str) -> str:
    e = r.get(f"{tax}_error_pct")
    return "-" if e is None else f"{e:+.0f}% ({r[f'{tax}_share_pct']:.0f}%)"


def title(table: dict) -> str:
    return f"the model against measurement ({table['hardware']})"


def rows(table: dict) -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per case and variant."""
    header = (["workload", "shape", "world", "variant", "measured us", "predicted us", "error"]
              + [f"{t} error (share)" for t in TAXES])
    return header, [[r["workload"], r["shape"], str(r["world"]), r["variant"], f"{r['measured_e2e_us']:,.1f}",
                     f"{r['predicted_e2e_us']:,.1f}", f"{r['e2e_error_pct']:+.1f}%"] + [_cell(r, t) for t in TAXES]
                    for r in table["rows"]]


def summary_lines(table: dict) -> list[str]:
    """Per world, the E2E error and the taxes' errors where they matter; what was held out; the spread
    over calibrations where it was asked for."""
    lines = []
    for world, s in table["per_world"].items():
        e = s["e2e"]
        lines.append(f"world {world}: E2E mean absolute error {e['mean_absolute_error_pct']:.1f}% over {s['cases']} "
                     f"cases, {e['within_10_pct']} within 10%; worst {e['worst']['variant']} {e['worst']['shape']} "
                     f"({e['worst']['error_pct']:+.1f}%)")
        for tax, d in s["per_tax"].items():
            m = d.get("where_it_matters")
            if m:
                lines.append(f"world {world}: {tax}: mean signed {m['mean_signed_error_pct']:+.0f}%, mean absolute "
                             f"{m['mean_absolute_error_pct']:.0f}% over the {m['cases']} cases where it is at least 5% "
                             f"of E2E ({m['within_25_pct']} within 25%)")
    held = [h for h in table["held_out"] if h["held_out"]]
    lines.append("held out (in no test and no tuning table): "
                 + (", ".join(h["workload"] + " " + h["shape"] for h in held) or "none"))
    for c in table.get("calibrations", {}).get("profiles", []):
        lines.append(f"with {c['profile']}: E2E mean absolute error {c['e2e_mean_absolute_error_pct']:.1f}% over "
                     f"{c['cases']} cases")
    return lines
