"""Report charts stay readable (PNG and SVG): labels that never overlap or clip, rows below the floor, and
sweep lines told apart.
"""

from __future__ import annotations

import copy
import random

import pytest
from _util import assert_valid_png, assert_valid_svg, profile_doc

from taxes.method import TAXES
from taxes.reports import plots
from taxes.reports import verdict as report_verdict


# ---- charts ----------------------------------------------------------------------------------------


def _texts(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(r)) for ax in fig.axes for t in ax.texts if t.get_text()]


def _overlaps(boxes) -> list:
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a[1].overlaps(b[1])]


def test_stacked_bars_label_the_e2e_the_tables_print_and_clip_nothing(emulated_doc):
    import matplotlib.pyplot as plt

    case = emulated_doc["cases"][0]
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    for bar in ax.patches:
        y0, y1 = sorted((bar.get_y(), bar.get_y() + bar.get_height()))
        assert lo <= y0 and y1 <= hi, "a bar reaches past the axes"
    labels = _texts(fig)
    assert not _overlaps(labels)
    assert [lo <= t.get_position()[1] <= hi for t in ax.texts] == [True] * len(ax.texts)
    for (text, _), v in zip(labels, case["variants"]):
        assert text.split("\n")[0] == f"{report_verdict.e2e_of(v):,.0f} us (IQM)"  # the E2E of the tables, not the rows'
    plt.close(fig)
    assert_valid_png(plots.stacked_bars(case))
    assert_valid_svg(plots.stacked_bars(case, "svg"))


def test_negative_rows_hang_below_the_floor(model_doc):
    import matplotlib.pyplot as plt

    case = copy.deepcopy(model_doc["cases"][0])
    for c in case["variants"][0]["components"]:
        if c["name"] == "unattributed":
            c["value_us"] = -50.0
    floor = case["variants"][0]["floor"]["ideal_us"]
    fig = plots.stacked_bars_figure(case)
    ax = fig.axes[0]
    neg = [b for b in ax.patches if b.get_height() < 0]
    assert len(neg) == 1 and neg[0].get_y() == pytest.approx(floor) and ax.get_ylim()[0] <= floor - 50.0
    plt.close(fig)


def test_timeline_names_never_overlap():
    import matplotlib.pyplot as plt

    doc = profile_doc(random.Random(5), n_iter=3)
    case = doc["cases"][0]
    for v in case["variants"]:  # many short phases with long names, as a real trace has
        v["phases"] = [{"rank": r, "name": f"a_rather_long_kernel_name_{i}", "role": "compute", "start_us": 3.0 * i,
                        "end_us": 3.0 * i + 2.5 + (40 if i == 7 else 0), "label": "measured", "parts": {}}
                       for r in (0, 1) for i in range(8)]
    fig = plots.timeline_figure(case)
    labels = _texts(fig)
    assert labels and not _overlaps(labels)
    assert any(t.startswith("a_rather_long") for t, _ in labels)  # the long phase keeps its name
    plt.close(fig)
    assert_valid_png(plots.timeline(case))
    assert_valid_svg(plots.timeline(case, "svg"))


def test_timeline_png_of_model(model_doc):
    assert_valid_png(plots.timeline(model_doc["cases"][2]))


def test_sweep_lines_are_told_apart():
    import matplotlib.pyplot as plt

    from taxes.model.hardware import BUILTIN
    from taxes.model.predict import sweep
    from taxes.workloads import make_workload

    values = [1024, 2048, 4096, 8192]
    names = ["bsp", "bsp-graph", "fused-pull", "fused-push", "fused-push-graph"]
    preds = sweep(make_workload("ag-gemm", {}, 2), "M", values, BUILTIN["h100-sxm"], tuple(names))
    e2e = {v: [ps[i].e2e_us for ps in preds] for i, v in enumerate(names)}
    e2e["copy-of-bsp"] = list(e2e["bsp"])  # a series lying exactly on another
    taxes = {"bsp": {t: [ps[0].taxes_us()[t] for ps in preds] for t in TAXES}}
    ratio = [ps[0].e2e_us / min(ps[2].e2e_us, ps[3].e2e_us) for ps in preds]
    fig = plots.sweep_figure("M", values, e2e, taxes, ratio, "sweep")
    lines = fig.axes[0].get_lines()
    styles = [(ln.get_marker(), ln.get_linestyle()) for ln in lines]
    assert len(set(styles)) == len(styles), "two lines look the same"
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(e.startswith("bsp = ") and "copy-of-bsp" in e.split(" = ") for e in legend)  # named together
    assert all(any(n in entry for entry in legend) for n in e2e)  # every variant is named
    plt.close(fig)
    assert_valid_png(plots.sweep_lines("M", values, e2e, taxes, ratio, "sweep"))
    assert_valid_svg(plots.sweep_lines("M", values, e2e, taxes, None, "no ratio panel", "svg"))
