"""How the workloads move with the number of GPUs: measured E2E at 2, 4 and 8 GPUs beside the model's
prediction of the same variant, and the predicted taxes.

    python benchmarks/scaling.py --hardware PROFILE --hardware-for 8=PROFILE_8 \
        --measured DOCUMENT ... --out OUT > OUT/scaling.md

Each GPU count gets a hardware profile: --hardware-for WORLD=PROFILE (repeatable), --hardware for the
rest. Writes OUT/model-wP.json.gz (the model's predictions at every shape below, with that count's
profile) and OUT/scaling.png (per plotted shape and variant: the measured E2E, then the predicted E2E
split into its three taxes and the rest), and prints a Markdown table: per shape, variant and GPU count,
E2E measured (m) and predicted (p) and the predicted taxes. A measured variant is set against the model
variant taxes.variants maps it to; one with none (PyTorch's own fused ops) has no prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from taxes.model.hardware import get_profile  # noqa: E402
from taxes.model.predict import predict_all  # noqa: E402
from taxes.documents.results import load, model_document, save  # noqa: E402
from taxes.reports.markdown_table import md_table  # noqa: E402
from taxes.variants import lookup  # noqa: E402
from taxes.workloads import make_workload, shape_of  # noqa: E402

SHAPES = {"ag-gemm": [{"M": m, "N": 8192, "K": 8192} for m in (1024, 4096, 8192, 16384)]
          + [{"M": m, "N": 28672, "K": 8192} for m in (4096, 16384)],
          "flash-decode": [{"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": s} for s in (8192, 32768, 131072)]
          + [{"B": 16, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, {"B": 64, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}],
          "tp-mlp": [{"M": m, "H": h, "F": f} for h, f in ((4096, 14336), (8192, 28672)) for m in (1024, 4096, 16384)]}
WORLDS = (2, 4, 8)
PLOTTED = [("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}, ("bsp", "fused-push-graph")),
           ("flash-decode", {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, ("bsp", "fused-push-graph")),
           ("tp-mlp", {"M": 4096, "H": 4096, "F": 14336}, ("all-bsp", "all-fused"))]
SHOWN_DIMS = ("M", "N", "H", "F", "B", "S")  # the dimensions the table prints (the others are fixed)
COLORS = {"bulk-synchronous": "#C44E52", "data-locality": "#8172B3", "kernel-launch": "#DA8BC3", "rest": "#BBBBBB"}


def parse_hardware_for(items: list[str], default: str) -> dict[int, str]:
    """['8=path.json', ...] -> {world: profile} for every world in WORLDS (default for the rest)."""
    chosen = {p: default for p in WORLDS}
    for item in items:
        world, sep, profile = item.partition("=")
        if not sep or not world.strip().isdigit() or not profile:
            raise SystemExit(f"--hardware-for {item!r}: expected WORLD=PROFILE (e.g. 8=reports/calibration/h200-x8-calibrated.json)")
        chosen[int(world)] = profile
    return chosen


def _key(workload: str, shape: dict, world: int, variant: str) -> tuple:
    return workload, tuple(sorted(shape.items())), world, variant


def predictions(p: int, hw_path: str, out: Path) -> dict:
    """The model at p GPUs, every shape of SHAPES: written to OUT/model-wP.json.gz, returned as
    {key: {"e2e": us, tax: us, "rest": us}}."""
    hw = get_profile(hw_path)
    preds = [predict_all(make_workload(wl, s, p), hw) for wl, shapes in SHAPES.items() for s in shapes]
    doc = model_document(preds, hw.name, p)
    doc["metadata"]["hardware_file"] = hw_path
    save(doc, out / f"model-w{p}.json.gz")
    rows = {}
    for pred in (x for case in preds for x in case):
        taxes = pred.taxes_us()
        rows[_key(pred.workload.name, shape_of(pred.workload), p, pred.variant)] = (
            {"e2e": pred.e2e_us, **taxes, "rest": pred.e2e_us - sum(taxes.values())})
    return rows


def measured(paths: list[str]) -> dict:
    """{key: E2E (the interquartile mean, us)} of every correct variant in the documents."""
    out = {}
    for path in paths:
        for case in load(path)["cases"]:
            for v in case["variants"]:
                t = v["e2e_us"].get("iqm")
                if t is not None and (v.get("correctness") or {}).get("passed"):
                    out[_key(case["workload"], case["shape"], case["world"], v["variant"])] = t
    return out


def _model_of(variant: str) -> str | None:
    v = lookup(variant)
    return v.model if v else None


def plot(pred: dict, meas: dict, path: Path) -> None:
    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(6.0 * len(PLOTTED), 4.6))
    for ax, (wl, shape, variants) in zip(axes, PLOTTED):
        x, ticks, labels = 0.0, [], []
        for variant in variants:
            first = len(ticks)
            for p in WORLDS:
                m, row = meas.get(_key(wl, shape, p, variant)), pred.get(_key(wl, shape, p, _model_of(variant)))
                if m is not None:
                    ax.bar(x, m, 0.8, color="#4C72B0")
                    ax.text(x, m, f"{m:.0f}", ha="center", va="bottom", fontsize=6)
                    ticks.append(x), labels.append(f"m{p}")
                    x += 1
                if row is not None:
                    bottom = 0.0
                    for part, color in COLORS.items():
                        ax.bar(x, row[part], 0.8, bottom=bottom, color=color, hatch="//", edgecolor="white")
                        bottom += row[part]
                    ax.text(x, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=6)
                    ticks.append(x), labels.append(f"p{p}")
                    x += 1
                x += 0.4
            if len(ticks) > first:
                ax.annotate(variant, ((ticks[first] + ticks[-1]) / 2, 0), xycoords=("data", "axes fraction"),
                            xytext=(0, -16), textcoords="offset points", ha="center", va="top", fontsize=8,
                            fontweight="bold")
            x += 1
        ax.set_xticks(ticks, labels, fontsize=7)
        ax.set_ylabel("E2E per iteration (us)")
        ax.set_title(f"{wl} " + ", ".join(f"{k}={v}" for k, v in shape.items() if k in SHOWN_DIMS), fontsize=9)
    fig.legend(handles=[Patch(facecolor="#4C72B0", label="measured E2E")]
               + [Patch(facecolor=c, hatch="//", edgecolor="white", label=f"predicted: {t}") for t, c in COLORS.items()],
               loc="lower center", ncol=5, fontsize=8, bbox_to_anchor=(0.5, -0.1))
    fig.suptitle("E2E against GPU count (H200): mP = measured on P GPUs, pP = predicted (calibrated model, "
                 "its taxes stacked)", fontsize=10, y=1.03)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def table(pred: dict, meas: dict) -> str:
    """A Markdown table: every measured variant with a model twin at a predicted shape."""
    keys = sorted(k for k in meas if _model_of(k[3]) is not None and _key(k[0], dict(k[1]), k[2], _model_of(k[3])) in pred)
    f = lambda d, k: f"{d[k]:,.1f}" if d and k in d else "-"  # noqa: E731
    header = ["workload", "shape", "variant", "GPUs", "E2E m", "E2E p", "bulk-sync p", "locality p", "launch p"]
    rows = []
    for wl, key, p, variant in keys:
        row = pred[_key(wl, dict(key), p, _model_of(variant))]
        dims = dict(key)
        shape = ",".join(f"{k}={dims[k]}" for k in SHOWN_DIMS if k in dims)
        rows.append([wl, shape, variant, str(p), f"{meas[(wl, key, p, variant)]:,.1f}", f(row, "e2e"),
                     f(row, "bulk-synchronous"), f(row, "data-locality"), f(row, "kernel-launch")])
    return md_table(header, rows, numbers=range(3, len(header)))


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
        pred |= predictions(p, profiles[p], out)
    meas = measured(args.measured)
    plot(pred, meas, out / "scaling.png")
    print(table(pred, meas))
    return 0


if __name__ == "__main__":
    sys.exit(main())
