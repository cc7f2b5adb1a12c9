"""Plots of result documents, each returned as PNG bytes (matplotlib's Agg backend, no display)."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from taxes.attribute import ROWS as COMPONENTS  # noqa: E402

COMPONENT_TITLES = {
    "ideal": "ideal (floor)", "compute": "compute (no floor known)", "launch": "kernel-launch tax",
    "host_bound": "host-bound (host elsewhere)", "sync": "host synchronisation", "compile": "compilation",
    "data_loading": "data loading", "graph_gaps": "gaps inside graph replays", "queued": "queued (waited on a dependency)",
    "sync_wait": "bulk-sync: sync wait", "exposed_transfer": "bulk-sync: exposed transfer",
    "locality": "data-locality tax", "inefficiency": "kernel inefficiency", "unattributed": "unattributed",
}
COLORS = {
    "ideal": "#4C72B0", "compute": "#64B5CD", "launch": "#DA8BC3", "host_bound": "#F2B5D4", "sync": "#B07AA1",
    "compile": "#9D755D", "data_loading": "#BAB0AC", "graph_gaps": "#FF9DA7", "queued": "#EDC948",
    "sync_wait": "#C44E52", "exposed_transfer": "#DD8452", "locality": "#8172B3", "inefficiency": "#8C8C8C",
    "unattributed": "#CCB974",
}
ROLE_EDGE = {"compute": "#1f3b63", "communication": "#7a2e0e", "synchronisation": "#444444"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def case_title(case: dict) -> str:
    shape = ", ".join(f"{k}={v}" for k, v in case["shape"].items())
    return f"{case['workload']} ({shape}; world {case['world']}, {case['dtype']})"


def overall_components(var: dict) -> dict[str, float]:
    return {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}


def stacked_bars(case: dict) -> bytes:
    """One bar per variant: E2E stacked by component."""
    variants = [v for v in case["variants"] if overall_components(v)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * max(1, len(variants)), 4.2))
    names = [v["variant"] for v in variants]
    bottoms = [0.0] * len(variants)
    for comp in COMPONENTS:
        vals = [overall_components(v).get(comp, 0.0) for v in variants]
        if any(vals):
            ax.bar(names, vals, bottom=bottoms, color=COLORS[comp], label=COMPONENT_TITLES[comp], width=0.6)
            bottoms = [b + x for b, x in zip(bottoms, vals)]
    for i, v in enumerate(variants):
        label = v["e2e_us"]["label"][0]
        ax.text(i, bottoms[i], f"{bottoms[i]:.0f} us ({label})", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("time per iteration (us)")
    ax.set_title(case_title(case), fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_ylim(0, max(bottoms + [1.0]) * 1.12)
    return _png(fig)


def timeline(case: dict) -> bytes:
    """Per variant and rank, the phases of one iteration; each phase is split into its component parts
    (the taxes shaded), device idle (launch tax) hatched."""
    rows = []  # (label, phases)
    for var in case["variants"]:
        ranks = sorted({ph["rank"] for ph in var["phases"]})
        for r in ranks:
            rows.append((f"{var['variant']} r{r}", [ph for ph in var["phases"] if ph["rank"] == r]))
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.45 * max(1, len(rows))))
    for y, (label, phases) in enumerate(rows):
        t = 0.0
        for ph in sorted(phases, key=lambda p: p["start_us"]):
            if ph["start_us"] > t:
                ax.broken_barh([(t, ph["start_us"] - t)], (y - 0.35, 0.7), facecolors="white",
                               edgecolors=COLORS["launch"], hatch="////", linewidth=0.5)
            x = ph["start_us"]
            parts = ph.get("parts") or {}
            order = ["launch", "sync_wait", "locality", "ideal", "exposed_transfer", "inefficiency", "unattributed"]
            for comp in order:
                width = min(parts.get(comp, 0.0), ph["end_us"] - x)  # parts beyond the phase (a floor above
                if width > 0:  # what ran: negative unattributed) are not drawn past its end
                    ax.broken_barh([(x, width)], (y - 0.35, 0.7), facecolors=COLORS[comp], linewidth=0)
                    x += width
            ax.broken_barh([(ph["start_us"], ph["end_us"] - ph["start_us"])], (y - 0.35, 0.7), facecolors="none",
                           edgecolors=ROLE_EDGE.get(ph["role"], "black"), linewidth=0.8)
            if ph["end_us"] - ph["start_us"] > 0:
                ax.text((ph["start_us"] + ph["end_us"]) / 2, y, ph["name"], ha="center", va="center", fontsize=6, color="white",
                        clip_on=True)
            t = max(t, ph["end_us"])
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time from iteration start (us)")
    ax.set_title(f"timeline: {case_title(case)}", fontsize=9)
    handles = [Patch(facecolor=COLORS[c], label=COMPONENT_TITLES[c]) for c in COMPONENTS if c not in ("launch",)]
    handles.append(Patch(facecolor="white", edgecolor=COLORS["launch"], hatch="////", label="idle: kernel-launch tax"))
    handles.append(Patch(facecolor=COLORS["launch"], label="launch inside a phase (host-bound, or traced)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def predicted_vs_measured(case: dict) -> bytes:
    """Per variant, two bars: measured (stacked by component) and the model's prediction (stacked)."""
    variants = [v for v in case["variants"] if v.get("prediction") and overall_components(v)]
    fig, ax = plt.subplots(figsize=(1.6 + 1.6 * max(1, len(variants)), 4.2))
    for i, v in enumerate(variants):
        for x, comps, hatch in ((i - 0.2, overall_components(v), None), (i + 0.2, v["prediction"]["components"], "//")):
            bottom = 0.0
            for comp in COMPONENTS:
                val = comps.get(comp, 0.0)
                if val > 0:
                    ax.bar(x, val, 0.38, bottom=bottom, color=COLORS[comp], hatch=hatch, edgecolor="white", linewidth=0.3)
                    bottom += val
            ax.text(x, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(variants)), [f"{v['variant']}\nmeasured | predicted" for v in variants], fontsize=7)
    ax.set_ylabel("time per iteration (us)")
    ax.set_title(f"measured (left) and predicted (right, hatched): {case_title(case)}", fontsize=9)
    handles = [Patch(facecolor=COLORS[c], label=COMPONENT_TITLES[c]) for c in COMPONENTS]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def cta_waits(case: dict) -> bytes:
    """Fused variants' traced kernels, rank 0's last traced iteration: each CTA's active span (from the
    earliest CTA start) with the share of it spent waiting on flags shaded red."""
    panels = [(v["variant"], name, rows) for v in case["variants"] for name, rows in (v.get("cta_timeline") or {}).items()
              if rows]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * max(1, len(panels)), 3.8), squeeze=False)
    for ax, (variant, name, rows) in zip(axes[0], panels):
        t0 = min(r[0] for r in rows)
        for i, (start, end, wait) in enumerate(rows):
            s, e = (start - t0) / 1e3, (end - t0) / 1e3
            w = min(max(wait, 0) / 1e3, max(e - s, 0))
            ax.broken_barh([(s, e - s)], (i - 0.4, 0.8), facecolors="#4C72B0", linewidth=0)
            if w > 0:
                ax.broken_barh([(s, w)], (i - 0.4, 0.8), facecolors=COLORS["sync_wait"], linewidth=0)
        ax.set_title(f"{variant}: {name} ({len(rows)} CTAs)", fontsize=8)
        ax.set_xlabel("us from the first CTA's start", fontsize=8)
        ax.set_ylabel("CTA", fontsize=8)
        ax.invert_yaxis()
    handles = [Patch(facecolor="#4C72B0", label="active"),
               Patch(facecolor=COLORS["sync_wait"], label="waiting on flags (total, drawn first)")]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(case_title(case), fontsize=9)
    return _png(fig)


TAX_COLORS = {"bulk-synchronous": "#C44E52", "data-locality": "#8172B3", "kernel-launch": "#DA8BC3"}


def sweep_lines(dim: str, values: list[int], e2e: dict[str, list[float]],
                taxes: dict[str, dict[str, list[float]]], ratio: list[float] | None, title: str) -> bytes:
    """Three panels against one dimension: E2E per variant; the three taxes of bsp (solid) and of the
    best fused variant (dashed); the bsp / best-fused E2E ratio."""
    panels = 3 if ratio is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2))
    ax = axes[0]
    for name, ys in e2e.items():
        ax.plot(values, ys, marker="o", markersize=3, label=name)
    ax.set_ylabel("E2E, us per iteration")
    ax.set_title("E2E", fontsize=9)
    ax = axes[1]
    for who, series in taxes.items():
        for tax, ys in series.items():
            ax.plot(values, [y if y > 0 else float("nan") for y in ys], "--" if who != "bsp" else "-", marker="o",
                    markersize=3, color=TAX_COLORS[tax], label=f"{who}: {tax}")
    ax.set_ylabel("tax, us per iteration")
    ax.set_title("taxes (zero values not drawn)", fontsize=9)
    if ratio is not None:
        ax = axes[2]
        ax.plot(values, ratio, color="black", marker="s", markersize=3)
        ax.axhline(1.0, color="black", linewidth=0.5, linestyle=":")
        ax.set_ylabel("bsp E2E / best fused E2E")
        ax.set_title("speed-up of the best fused variant", fontsize=9)
    for i, ax in enumerate(axes):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(dim)
        if i < 2:
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _png(fig)
