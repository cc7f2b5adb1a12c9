"""Plots of result documents, each returned as PNG or SVG bytes (matplotlib's Agg backend, no display).

Every plot function takes fmt="png" (default) or "svg"; the HTML report embeds SVG. What keeps them
readable: the rows take at most 8 colours, one per group (ROW_GROUPS: each tax, the host, waiting, ...), the
rows of one group told apart by hatching; the bars of a case whose variants share a floor stand on it (a
line across the chart, the axis starting just below it), so what the variants differ by fills the height;
the axes leave room for every bar and its label (negative rows hang below the floor instead of overlapping
the stack); titles are whole, wrapped, never cut; a phase's name is drawn only where it fits inside its bar
(shortened, else left out), and the lines of the sweep plot differ in marker and dash as well as colour,
with series that lie on top of each other named together in the legend.
"""

from __future__ import annotations

import io

from typing import TYPE_CHECKING

from taxes.attribution.rows import ROWS as COMPONENTS
from taxes.sanitize import printable

if TYPE_CHECKING:
    from matplotlib.patches import Patch


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported at the first chart (it takes a good part of a
    second: commands that draw nothing never load it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _patch(**kw):
    from matplotlib.patches import Patch

    return Patch(**kw)


COMPONENT_TITLES = {
    "ideal": "ideal (floor)", "compute": "compute (no floor known)", "launch": "kernel-launch tax",
    "host_bound": "host-bound (host elsewhere)", "sync": "host synchronisation", "compile": "compilation",
    "data_loading": "data loading", "graph_gaps": "gaps inside graph replays", "queued": "queued (waited on a dependency)",
    "start_skew": "ranks' start skew (the harness's barrier)", "sync_wait": "bulk-sync: sync wait", "exposed_transfer": "bulk-sync: exposed transfer",
    "locality": "data-locality tax", "inefficiency": "kernel inefficiency", "unattributed": "unattributed",
}
# The rows in at most 8 colours: (group, colour, rows); the rows of a group share its colour, each its hatch.
ROW_GROUPS = (
    ("work", "#4C72B0", ("ideal", "compute")),
    ("kernel-launch tax", "#DA8BC3", ("launch",)),
    ("bulk-synchronous tax", "#C44E52", ("sync_wait", "exposed_transfer")),
    ("data-locality tax", "#8172B3", ("locality",)),
    ("host", "#DD8452", ("host_bound", "sync", "compile", "data_loading")),
    ("waiting", "#CCB974", ("queued", "graph_gaps", "start_skew")),
    ("kernel inefficiency", "#8C8C8C", ("inefficiency",)),
    ("unattributed", "#D9D9D9", ("unattributed",)),
)
HATCHES = ("", "////", "....", "xxxx")
COLORS = {row: colour for _, colour, rows in ROW_GROUPS for row in rows}
HATCH = {row: HATCHES[i] for _, _, rows in ROW_GROUPS for i, row in enumerate(rows)}
assert set(COLORS) == set(COMPONENTS) and len(ROW_GROUPS) <= 8


def row_patch(row: str, **kw) -> Patch:
    """A legend entry for a row: its group's colour and its own hatch."""
    return _patch(facecolor=COLORS[row], hatch=HATCH[row], edgecolor="white", label=COMPONENT_TITLES[row], **kw)


ROLE_EDGE = {"compute": "#1f3b63", "communication": "#7a2e0e", "synchronisation": "#444444"}


FORMATS = ("png", "svg")


def _png(fig, fmt: str = "png") -> bytes:
    """The figure as PNG or SVG bytes (every artist kept: the saved area grows to hold the legend)."""
    if fmt not in FORMATS:
        raise ValueError(f"plot format {fmt!r}: png or svg")
    buf = io.BytesIO()
    # svg.hashsalt: the same figure gives the same bytes; metadata Date None: no timestamp in the file
    with _pyplot().rc_context({"svg.hashsalt": "taxes", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=110, bbox_inches="tight",
                    metadata={"Date": None} if fmt == "svg" else None)
    _pyplot().close(fig)
    return buf.getvalue()


def fmt_of(path: str) -> str:
    """The plot format a file name asks for (its extension), or a ValueError naming the choices."""
    ext = str(path).lower().rsplit(".", 1)[-1] if "." in str(path) else ""
    if ext not in FORMATS:
        raise ValueError(f"name the plot *.png or *.svg, not {path!r}")
    return ext


def case_title(case: dict) -> str:
    shape = ", ".join(f"{k}={v}" for k, v in case["shape"].items())
    return printable(f"{case['workload']} ({shape}; world {case['world']}, {case['dtype']})")


def _name(text) -> str:
    """A name from a document as chart text: printable, never a control character, and a '$' shown as
    itself (matplotlib reads $...$ as math, which a hostile name could make fail)."""
    return printable(text, 80).replace("$", r"\$")


def _title(text, width: int = 72) -> str:
    """A chart title whole (a document's names bounded only by taxes.sanitize's limit), wrapped onto lines of
    at most `width` characters: never cut."""
    import textwrap

    return "\n".join(textwrap.wrap(printable(text, 1000).replace("$", r"\$"), width, break_on_hyphens=False)) or " "


def overall_components(var: dict) -> dict[str, float]:
    return {c["name"]: c["value_us"] for c in var["components"] if c["rank"] is None}


def stacked_bars(case: dict, fmt: str = "png") -> bytes:
    return _png(stacked_bars_figure(case), fmt)


def e2e_label(v: dict) -> tuple[float | None, str]:
    """The E2E a variant's bar is labelled with, and its statistic: the plain interquartile mean of a
    measured variant (what every table prints), or the model's prediction."""
    if v.get("plain_e2e_us") is not None:
        return v["plain_e2e_us"], "IQM"
    e = v.get("e2e_us") or {}
    val = e.get("iqm", e.get("median"))
    return val, ("predicted" if e.get("label") == "predicted" else "IQM" if e.get("iqm") is not None else "median")


def common_floor(variants: list[dict]) -> float | None:
    """The floor (the ideal row) every variant shares, when it is positive; None otherwise."""
    ideals = [overall_components(v).get("ideal", 0.0) for v in variants]
    if not ideals or min(ideals) <= 0 or max(ideals) - min(ideals) > 1e-6 * max(ideals):
        return None
    return ideals[0]


def stacked_bars_figure(case: dict):
    """One bar per variant: its rows stacked (negative rows, such as a negative unattributed, hang below),
    labelled with the variant's E2E as every table prints it; a measured variant's rows add up to its
    instrumented E2E, marked on the bar when it differs from the plain one. Where the variants share a
    floor, the bars stand on it: the floor is a line and the axis starts just below it, so the height shows
    what the variants differ by."""
    variants = [v for v in case["variants"] if overall_components(v)]
    fig, ax = _pyplot().subplots(figsize=(1.8 + 1.6 * max(1, len(variants)), 4.6))
    x = list(range(len(variants)))
    floor = common_floor(variants)
    base0 = floor or 0.0
    up, down = [base0] * len(variants), [base0] * len(variants)
    drawn = []
    for comp in COMPONENTS:
        if comp == "ideal" and floor:
            continue  # the line below
        vals = [overall_components(v).get(comp, 0.0) for v in variants]
        if any(vals):
            base = [u if val >= 0 else d for u, d, val in zip(up, down, vals)]
            ax.bar(x, vals, bottom=base, color=COLORS[comp], hatch=HATCH[comp], edgecolor="white", linewidth=0.4,
                   width=0.6)
            drawn.append(comp)
            up = [u + max(val, 0.0) for u, val in zip(up, vals)]
            down = [d + min(val, 0.0) for d, val in zip(down, vals)]
    for i, v in enumerate(variants):
        e2e, stat = e2e_label(v)
        text = f"{e2e:,.0f} us ({stat})" if e2e is not None else "no E2E"
        if v.get("attributed_e2e_us") is not None and e2e and abs(v["attributed_e2e_us"] - e2e) > 0.005 * e2e:
            ax.plot([i - 0.3, i + 0.3], [e2e, e2e], color="black", linewidth=1.5)
            text += f"\nrows {v['attributed_e2e_us']:,.0f}"
        ax.text(i, max(up[i], e2e or 0.0), text, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [_name(v["variant"]) for v in variants], fontsize=8, rotation=20 if len(variants) > 3 else 0,
                  ha="right" if len(variants) > 3 else "center")
    ax.set_title(_title(case_title(case), 60), fontsize=9)
    handles = [row_patch(c) for c in drawn]
    top = max(up + [e2e_label(v)[0] or 0.0 for v in variants] + [1.0])
    if floor:
        lowest = min(down)
        lo = lowest - 0.08 * (top - lowest)
        lo = max(0.0, lo) if lowest >= 0 else lo  # zero is the natural start, unless a negative row reaches below
        ax.axhline(floor, color="black", linewidth=1.2, linestyle="--")
        from matplotlib.lines import Line2D

        handles.insert(0, Line2D([], [], color="black", linewidth=1.2, linestyle="--",
                                 label=f"floor (T_ideal) {floor:,.1f} us:\nthe bars stand on it"))
        ax.set_ylim(lo, top + 0.25 * (top - lo))  # room above the tallest bar for its two-line label
        ax.set_ylabel(f"time per iteration (us); the axis starts at {lo:,.0f}" if lo > 0 else "time per iteration (us)")
    else:
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_ylim(min(down + [0.0]) * 1.1, top * 1.25)
        ax.set_ylabel("time per iteration (us)")
    if any(v.get("attributed_e2e_us") is not None for v in variants):
        from matplotlib.lines import Line2D

        handles.append(Line2D([], [], color="black", linewidth=1.5,
                              label="E2E (plain iterations); the bar: rows\n(instrumented iterations)"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def timeline(case: dict, fmt: str = "png") -> bytes:
    return _png(timeline_figure(case), fmt)


def _fit_label(name: str, width_px: float, fontsize: float, dpi: float) -> str | None:
    """The phase name as it fits in width_px (shortened with '...'), or None when not even 3 characters do."""
    per_char = 0.62 * fontsize * dpi / 72.0  # the width of an average character of the default font
    room = int((width_px - 4) / per_char)
    if room >= len(name):
        return name
    return name[:room - 3] + "..." if room >= 6 else None


def timeline_figure(case: dict):
    """Per variant and rank, the phases of one iteration; each phase is split into its component parts
    (the taxes shaded), device idle between phases hatched: its causes (launch, host-bound, sync wait, ...)
    are the rows of the case's table, which this drawing does not split. A phase's name is written inside its bar only
    where it fits, so names never overlap."""
    rows = []  # (label, phases)
    labels = []
    for var in case["variants"]:
        ranks = sorted({ph["rank"] for ph in var["phases"]})
        for r in ranks:
            rows.append((f"{_name(var['variant'])} r{r}", [ph for ph in var["phases"] if ph["rank"] == r]))
    fig, ax = _pyplot().subplots(figsize=(10, 0.9 + 0.45 * max(1, len(rows))))
    for y, (label, phases) in enumerate(rows):
        t = 0.0
        for ph in sorted(phases, key=lambda p: p["start_us"]):
            if ph["start_us"] > t:
                ax.broken_barh([(t, ph["start_us"] - t)], (y - 0.35, 0.7), facecolors="white",
                               edgecolors="#888888", hatch="////", linewidth=0.5)
            x = ph["start_us"]
            parts = ph.get("parts") or {}
            order = ["launch", "sync_wait", "locality", "ideal", "exposed_transfer", "inefficiency", "unattributed"]
            for comp in order:
                width = min(parts.get(comp, 0.0), ph["end_us"] - x)  # parts beyond the phase (a floor above
                if width > 0:  # what ran: negative unattributed) are not drawn past its end
                    ax.broken_barh([(x, width)], (y - 0.35, 0.7), facecolors=COLORS[comp], hatch=HATCH[comp],
                                   edgecolor="white", linewidth=0)
                    x += width
            ax.broken_barh([(ph["start_us"], ph["end_us"] - ph["start_us"])], (y - 0.35, 0.7), facecolors="none",
                           edgecolors=ROLE_EDGE.get(ph["role"], "black"), linewidth=0.8)
            t = max(t, ph["end_us"])
        labels.append((y, phases))
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time from iteration start (us)")
    ax.set_title(_title(f"timeline: {case_title(case)}", 100), fontsize=9)
    ax.autoscale_view()
    lo, hi = ax.get_xlim()
    px_per_us = ax.get_window_extent().width / max(hi - lo, 1e-9)
    for y, phases in labels:
        for ph in phases:
            name = _fit_label(_name(ph["name"]), (ph["end_us"] - ph["start_us"]) * px_per_us, 6, fig.dpi)
            if name:
                ax.text((ph["start_us"] + ph["end_us"]) / 2, y, name, ha="center", va="center", fontsize=6,
                        color="white", clip_on=True)
    drawn = ("sync_wait", "locality", "ideal", "exposed_transfer", "inefficiency", "unattributed")
    handles = [row_patch(c) for c in COMPONENTS if c in drawn]
    handles.append(_patch(facecolor="white", edgecolor="#888888", hatch="////",
                         label="device idle between phases (its causes: the table's rows)"))
    handles.append(row_patch("launch"))
    handles[-1].set_label("launch inside a phase (host-bound, or traced)")
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def predicted_vs_measured(case: dict, fmt: str = "png") -> bytes:
    return _png(predicted_vs_measured_figure(case), fmt)


def predicted_vs_measured_figure(case: dict):
    """Per variant, two bars: the measured rows (stacked; their sum is the instrumented E2E, labelled
    'rows') and the model's prediction (stacked, lighter, labelled 'model')."""
    variants = [v for v in case["variants"] if v.get("prediction") and overall_components(v)]
    fig, ax = _pyplot().subplots(figsize=(1.6 + 1.6 * max(1, len(variants)), 4.2))
    tops, drawn = [], set()
    for i, v in enumerate(variants):
        for x, comps, alpha, what in ((i - 0.2, overall_components(v), 1.0, "rows"),
                                      (i + 0.2, v["prediction"]["components"], 0.5, "model")):
            bottom = 0.0
            for comp in COMPONENTS:
                val = comps.get(comp, 0.0)
                if val > 0:
                    ax.bar(x, val, 0.38, bottom=bottom, color=COLORS[comp], hatch=HATCH[comp], alpha=alpha,
                           edgecolor="white", linewidth=0.3)
                    bottom += val
                    drawn.add(comp)
            ax.text(x, bottom, f"{what}\n{bottom:,.0f}", ha="center", va="bottom", fontsize=6)
            tops.append(bottom)
    ax.set_ylim(0, max(tops + [1.0]) * 1.15)
    ax.set_xticks(range(len(variants)), [f"{_name(v['variant'])}\nmeasured | predicted" for v in variants], fontsize=7)
    ax.set_ylabel("time per iteration (us)")
    ax.set_title(_title(f"measured (left) and predicted (right, lighter): {case_title(case)}", 60), fontsize=9)
    ax.legend(handles=[row_patch(c) for c in COMPONENTS if c in drawn], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    return fig


def cta_waits(case: dict, fmt: str = "png") -> bytes:
    return _png(cta_waits_figure(case), fmt)


def cta_waits_figure(case: dict):
    """Fused variants' traced kernels, rank 0's last traced iteration: each CTA's active span (from the
    earliest CTA start) with the share of it spent waiting on flags shaded red."""
    panels = [(v["variant"], name, rows) for v in case["variants"] for name, rows in (v.get("cta_timeline") or {}).items()
              if rows]
    fig, axes = _pyplot().subplots(1, len(panels), figsize=(4.2 * max(1, len(panels)), 3.8), squeeze=False)
    for ax, (variant, name, rows) in zip(axes[0], panels):
        t0 = min(r[0] for r in rows)
        for i, (start, end, wait) in enumerate(rows):
            s, e = (start - t0) / 1e3, (end - t0) / 1e3
            w = min(max(wait, 0) / 1e3, max(e - s, 0))
            ax.broken_barh([(s, e - s)], (i - 0.4, 0.8), facecolors="#4C72B0", linewidth=0)
            if w > 0:
                ax.broken_barh([(s, w)], (i - 0.4, 0.8), facecolors=COLORS["sync_wait"], linewidth=0)
        ax.set_title(_title(f"{variant}: {name} ({len(rows)} CTAs)", 50), fontsize=8)
        ax.set_xlabel("us from the first CTA's start", fontsize=8)
        ax.set_ylabel("CTA", fontsize=8)
        ax.invert_yaxis()
    handles = [_patch(facecolor="#4C72B0", label="active"),
               _patch(facecolor=COLORS["sync_wait"], label="waiting on flags (total, drawn first)")]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(_title(case_title(case), 100), fontsize=9)
    return fig


TAX_COLORS = {"bulk-synchronous": "#C44E52", "data-locality": "#8172B3", "kernel-launch": "#DA8BC3"}


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")
DASHES = ("-", "--", "-.", ":")


def same_series(series: dict[str, list[float]], rel: float = 1e-3) -> dict[str, str]:
    """{name: the first earlier name whose values it repeats (within rel)}: lines drawn on top of each other."""
    out: dict[str, str] = {}
    names = list(series)
    for i, a in enumerate(names):
        for b in names[:i]:
            if b not in out and len(series[a]) == len(series[b]) and all(
                    abs(x - y) <= rel * max(abs(x), abs(y), 1e-12) for x, y in zip(series[a], series[b])):
                out[a] = b
                break
    return out


def sweep_lines(dim: str, values: list[int], e2e: dict[str, list[float]],
                taxes: dict[str, dict[str, list[float]]], ratio: list[float] | None, title: str,
                fmt: str = "png", of_floor: list[float] | None = None) -> bytes:
    return _png(sweep_figure(dim, values, e2e, taxes, ratio, title, of_floor), fmt)


def sweep_figure(dim: str, values: list[int], e2e: dict[str, list[float]],
                 taxes: dict[str, dict[str, list[float]]], ratio: list[float] | None, title: str,
                 of_floor: list[float] | None = None):
    """Three panels against one dimension: E2E per variant; the three taxes of bsp (solid) and of the
    best fused variant (dashed); the bsp / best-fused E2E ratio and the best fused variant's fraction of
    the floor (T_ideal / E2E, 1.0 at the floor). Each variant's line has its own colour,
    marker and dash; a line that repeats another's values is drawn with a larger hollow marker beneath and
    named with it in the legend ("fused-push = fused-pull")."""
    panels = 3 if ratio is not None or of_floor is not None else 2
    fig, axes = _pyplot().subplots(1, panels, figsize=(5.4 * panels, 4.4))
    ax = axes[0]
    twins = same_series(e2e)
    names = list(e2e)
    for i, name in enumerate(names):
        label = name + "".join(f" = {other}" for other, first in twins.items() if first == name)
        if name in twins:
            continue  # drawn as part of the line it repeats
        n_twins = sum(1 for first in twins.values() if first == name)
        ax.plot(values, e2e[name], marker=MARKERS[i % len(MARKERS)], linestyle=DASHES[i % len(DASHES)],
                markersize=4 + 3 * n_twins, markerfacecolor="none" if n_twins else None, label=label)
    ax.set_ylabel("E2E, us per iteration")
    ax.set_title("E2E", fontsize=9)
    ax = axes[1]
    for who, series in taxes.items():
        for tax, ys in series.items():
            eager = who != "best fused"  # the eager bulk-synchronous variant: bsp (all-bsp for tp-mlp)
            ax.plot(values, [y if y > 0 else float("nan") for y in ys], "-" if eager else "--",
                    marker="o" if eager else "s", markersize=4 if eager else 3,
                    markerfacecolor="none" if eager else None, color=TAX_COLORS[tax], label=f"{who}: {tax}")
    ax.set_ylabel("tax, us per iteration")
    ax.set_title("taxes (zero values not drawn)", fontsize=9)
    if panels == 3:
        ax = axes[2]
        if ratio is not None:
            ax.plot(values, ratio, color="black", marker="s", markersize=3, label="eager bulk-synchronous / best fused")
        if of_floor is not None:
            ax.plot(values, of_floor, color="tab:green", marker="o", markersize=3, linestyle="--",
                    label="best fused: of the floor (T_ideal / E2E)")
        ax.axhline(1.0, color="black", linewidth=0.5, linestyle=":")
        ax.set_ylabel("ratio")
        ax.set_title("speed-up of the best fused variant, and how near the floor it is", fontsize=9)
        ax.legend(fontsize=7)
    for i, ax in enumerate(axes):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(dim)
        if i < 2:
            ax.set_yscale("log")
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(_title(title, 120), fontsize=10)
    fig.tight_layout()
    return fig
