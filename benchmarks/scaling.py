"""How the taxes move with the number of GPUs: the model's predictions for 2, 4 and 8 GPUs (result
documents), and a plot of measured (where a run exists) against predicted taxes per GPU count.

    python benchmarks/scaling.py --hardware reports/calibration/h200-x2-calibrated.json \
        --hardware-for 8=reports/calibration/h200-x8-calibrated.json \
        --measured reports/profile/ag_gemm_N8192.json reports/profile/ag_gemm_N28672.json \
                   reports/profile/flash_decode_run3.json reports/tp_mlp/tp_mlp.json \
                   reports/scaling/ag_gemm_w4.json reports/scaling/flash_decode_w4.json reports/scaling/tp_mlp_w4.json \
                   reports/scaling/ag_gemm_w8.json reports/scaling/flash_decode_w8.json reports/scaling/tp_mlp_w8.json \
        --out reports/scaling > reports/scaling/scaling.md

Each GPU count gets a hardware profile: --hardware-for WORLD=PROFILE (repeatable), --hardware for the
rest. The predictions at a GPU count use its profile, and the measured documents of that GPU count are
re-attributed with it (as `taxes validate` does), so both sides share the same floors.

Writes OUT/model_w{2,4,8}.json (predictions at the benchmark shapes; metadata.hardware_file names the
profile used), OUT/scaling.png and prints a Markdown table: per shape, variant and GPU count, E2E and the
three taxes, measured (m) and predicted (p). A measured variant is compared with the model variant
taxes.variants' table maps it to (as in `taxes validate`); one with none (torch-async-tp) is left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _checkout  # noqa: F401

from taxes.variants import lookup  # noqa: E402
from taxes.hardware import get_profile  # noqa: E402
from taxes.model import TAXES, predict_all  # noqa: E402
from taxes.document import reattribute  # noqa: E402
from taxes.results import load, model_document, save  # noqa: E402
from taxes.workloads import make_workload  # noqa: E402

SHAPES = {"ag-gemm": [{"M": m, "N": 8192, "K": 8192} for m in (1024, 4096, 8192, 16384)]
          + [{"M": m, "N": 28672, "K": 8192} for m in (4096, 16384)],
          "flash-decode": [{"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": s} for s in (8192, 32768, 131072)]
          + [{"B": 16, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, {"B": 64, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}],
          "tp-mlp": [{"M": m, "H": h, "F": f} for h, f in ((4096, 14336), (8192, 28672)) for m in (1024, 4096, 16384)]}
WORLDS = (2, 4, 8)
# the plotted shapes, each with its bulk-synchronous variant and its best fused variant
PLOTTED = [("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, ("bsp", "fused-push-graph")),
           ("flash-decode", {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, ("bsp", "fused-push-graph")),
           ("tp-mlp", {"M": 4096, "H": 4096, "F": 14336}, ("all-bsp", "all-fused"))]
SHOWN_DIMS = ("M", "N", "H", "F", "B", "S")  # the dimensions the table prints (the others are fixed)
COLORS = {"bulk-synchronous": "#C44E52", "data-locality": "#8172B3", "kernel-launch": "#DA8BC3"}


def parse_hardware_for(items: list[str], default: str) -> dict[int, str]:
    """['8=path.json', ...] -> {world: profile} for every world in WORLDS (default for the rest)."""
    chosen = {p: default for p in WORLDS}
    for item in items:
        world, sep, profile = item.partition("=")
        if not sep or not world.strip().isdigit() or not profile:
            raise SystemExit(f"--hardware-for {item!r}: expected WORLD=PROFILE (e.g. 8=reports/calibration/h200-x8-calibrated.json)")
        chosen[int(world)] = profile
    return chosen


def measured_taxes(docs: list[dict]) -> dict:
    """(workload, shape items, world, variant) -> {"e2e": median, tax: us} from result documents (the
    taxes only where the variant has overall components: not for torch-async-tp)."""
    out = {}
    for doc in docs:
        for case in doc["cases"]:
            for v in case["variants"]:
                comp = {c["name"]: c["value_us"] for c in v["components"] if c["rank"] is None}
                if v["e2e_us"]["median"] is None:
                    continue
                row = {"e2e": v["e2e_us"]["median"]}
                if comp:
                    row |= {t: sum(comp.get(c, 0.0) for c in parts) for t, parts in TAXES.items()}
                out[(case["workload"], tuple(sorted(case["shape"].items())), case["world"], v["variant"])] = row
    return out


def predict_world(p: int, hw_path: str, out: Path) -> dict:
    """The model document for p GPUs at every shape of SHAPES (written to OUT/model_wP.json), as rows."""
    hw = get_profile(hw_path)
    preds = [predict_all(make_workload(wl, s, p), hw) for wl, shapes in SHAPES.items() for s in shapes]
    doc = model_document(preds, hw.name, p)
    doc["metadata"]["hardware_file"] = hw_path
    doc["metadata"]["hardware_source"] = hw.source
    save(doc, out / f"model_w{p}.json")
    return measured_taxes([doc])


def load_measured(paths: list[str], profiles: dict[int, str]) -> dict:
    """Measured rows from profile documents, each re-attributed with its GPU count's profile."""
    docs = []
    for path in paths:
        doc = load(path)
        world = doc["metadata"]["world_size"]
        docs.append(reattribute(doc, get_profile(profiles[world])) if world in profiles else doc)
    return measured_taxes(docs)


def predicted_for(pred: dict, wl: str, key: tuple, p: int, variant: str) -> dict | None:
    """The prediction a measured variant is compared with (the model variant MODEL_OF maps it to)."""
    return pred.get((wl, key, p, _model_of(variant)))


def stack(ax, x: float, row: dict, hatch: str | None) -> None:
    """One bar: the three taxes stacked, their sum written on top."""
    bottom = 0.0
    for tax, color in COLORS.items():
        ax.bar(x, row[tax], 0.8, bottom=bottom, color=color, hatch=hatch, edgecolor="white")
        bottom += row[tax]
    ax.text(x, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=6)


def plot_panel(ax, wl: str, shape: dict, variants: tuple[str, str], pred: dict, meas: dict) -> None:
    """Per variant and GPU count: the measured bar (m), then the predicted one (p, hatched)."""
    key = tuple(sorted(shape.items()))
    x, ticks, labels = 0, [], []
    below = lambda text, at, dy, **kw: ax.annotate(  # noqa: E731
        text, (at, 0), xycoords=("data", "axes fraction"), xytext=(0, dy), textcoords="offset points",
        ha="center", va="top", **kw)
    for variant in variants:
        first = len(ticks)
        for p in WORLDS:
            pair = len(ticks)
            for kind, row, hatch in (("m", meas.get((wl, key, p, variant)), None),
                                     ("p", predicted_for(pred, wl, key, p, variant), "//")):
                if row is None or "kernel-launch" not in row:
                    continue
                stack(ax, x, row, hatch)
                ticks.append(x)
                labels.append(kind)
                x += 1
            if len(ticks) > pair:
                below(f"{p} GPUs", (ticks[pair] + ticks[-1]) / 2, -14, fontsize=7)
            x += 0.4
        if len(ticks) > first:
            below(variant, (ticks[first] + ticks[-1]) / 2, -26, fontsize=8, fontweight="bold")
        x += 1
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylabel("taxes per iteration (us)")
    model = _model_of(variants[1])
    note = f" (its p bars: the model's {model})" if model != variants[1] else ""
    ax.set_title(f"{wl} " + ", ".join(f"{k}={v}" for k, v in shape.items()) + f"\n{variants[0]} and {variants[1]}{note}",
                 fontsize=9)


def plot(pred: dict, meas: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(6.0 * len(PLOTTED), 4.6))
    for ax, (wl, shape, variants) in zip(axes, PLOTTED):
        plot_panel(ax, wl, shape, variants, pred, meas)
    axes[-1].legend(handles=[Patch(facecolor=c, label=f"{t} tax") for t, c in COLORS.items()]
                    + [Patch(facecolor="white", edgecolor="black", hatch="//", label="predicted")], fontsize=7)
    fig.suptitle("the three taxes against GPU count: m = measured (H200, NVLink/NVSwitch), "
                 "p = predicted (calibrated model, hatched)", fontsize=10, y=1.03)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def table(pred: dict, meas: dict) -> list[str]:
    """Markdown rows: every predicted shape, and each measured variant the model maps at it."""
    shapes = {(wl, key) for wl, key, _, _ in pred}
    keys = set(pred) | {k for k in meas if (k[0], k[1]) in shapes and _model_of(k[3]) is not None}
    f = lambda d, k: f"{d[k]:,.1f}" if d and k in d else "-"  # noqa: E731
    lines = ["| workload | shape | variant | GPUs | E2E m | E2E p | bulk-sync m | bulk-sync p | locality m | "
             "locality p | launch m | launch p |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for wl, key, p, variant in sorted(keys):
        m, row = meas.get((wl, key, p, variant), {}), predicted_for(pred, wl, key, p, variant)
        dims = dict(key)
        shape = ",".join(f"{k}={dims[k]}" for k in SHOWN_DIMS if k in dims)
        lines.append(f"| {wl} | {shape} | {variant} | {p} | {f(m, 'e2e')} | {f(row, 'e2e')} | "
                     f"{f(m, 'bulk-synchronous')} | {f(row, 'bulk-synchronous')} | {f(m, 'data-locality')} | "
                     f"{f(row, 'data-locality')} | {f(m, 'kernel-launch')} | {f(row, 'kernel-launch')} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="reports/calibration/h200-x2-calibrated.json",
                    help="profile for every GPU count not named by --hardware-for")
    ap.add_argument("--hardware-for", action="append", default=[], metavar="WORLD=PROFILE",
                    help="profile for one GPU count, e.g. 8=reports/calibration/h200-x8-calibrated.json (repeatable)")
    ap.add_argument("--measured", nargs="*", default=[])
    ap.add_argument("--out", default="reports/scaling")
    args = ap.parse_args(argv)
    profiles = parse_hardware_for(args.hardware_for, args.hardware)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pred = {}
    for p in WORLDS:
        pred |= predict_world(p, profiles[p], out)
    meas = load_measured(args.measured, profiles)
    plot(pred, meas, out / "scaling.png")
    print("\n".join(table(pred, meas)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _model_of(variant: str) -> str | None:
    v = lookup(variant)
    return v.model if v else None
