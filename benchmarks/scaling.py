"""How the taxes move with the number of GPUs: the model's predictions for 2, 4 and 8 GPUs (result
documents), and a plot of measured (where a run exists) against predicted taxes per GPU count.

    python benchmarks/scaling.py --hardware reports/calibration/h200-x2-calibrated.json \
        --measured reports/profile/ag_gemm_N8192.json reports/profile/flash_decode.json \
                   reports/scaling/ag_gemm_w4.json reports/scaling/flash_decode_w4.json --out reports/scaling

Writes OUT/model_w{2,4,8}.json (predictions at the benchmark shapes), OUT/scaling.png and prints a
Markdown table: per shape, variant and GPU count, E2E and the three taxes, measured and predicted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import _checkout  # noqa: F401

from taxes.hardware import get_profile  # noqa: E402
from taxes.model import TAXES, predict_all  # noqa: E402
from taxes.results import load, model_document, save  # noqa: E402
from taxes.workloads import make_workload  # noqa: E402

SHAPES = {"ag-gemm": [{"M": m, "N": 8192, "K": 8192} for m in (1024, 4096, 8192, 16384)],
          "flash-decode": [{"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": s} for s in (8192, 32768, 131072)]
          + [{"B": 16, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}, {"B": 64, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768}]}
WORLDS = (2, 4, 8)
PLOTTED = [("ag-gemm", {"M": 8192, "N": 8192, "K": 8192}), ("flash-decode", {"B": 1, "Hq": 64, "Hkv": 8, "D": 128, "S": 32768})]


def measured_taxes(docs: list[dict]) -> dict:
    """(workload, shape items, world, variant) -> {"e2e": median, tax: us} from profile documents."""
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


def plot(pred: dict, meas: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(6.5 * len(PLOTTED), 4.2))
    colors = {"bulk-synchronous": "#C44E52", "data-locality": "#8172B3", "kernel-launch": "#DA8BC3"}
    for ax, (wl, shape) in zip(axes, PLOTTED):
        key = tuple(sorted(shape.items()))
        x = 0
        ticks, labels = [], []
        for variant in ("bsp", "fused-push"):
            for p in WORLDS:
                for kind, src, hatch in (("measured", meas, None), ("predicted", pred, "//")):
                    row = src.get((wl, key, p, variant))
                    if row is None or "kernel-launch" not in row:
                        continue
                    bottom = 0.0
                    for tax, color in colors.items():
                        ax.bar(x, row[tax], 0.8, bottom=bottom, color=color, hatch=hatch, edgecolor="white")
                        bottom += row[tax]
                    ax.text(x, bottom, f"{bottom:.0f}", ha="center", va="bottom", fontsize=6)
                    ticks.append(x)
                    labels.append(f"{variant}\n{p} GPUs\n{kind[0]}")
                    x += 1
            x += 1
        ax.set_xticks(ticks, labels, fontsize=6)
        ax.set_ylabel("taxes per iteration (us)")
        ax.set_title(f"{wl} " + ", ".join(f"{k}={v}" for k, v in shape.items()), fontsize=9)
    from matplotlib.patches import Patch

    axes[-1].legend(handles=[Patch(facecolor=c, label=f"{t} tax") for t, c in colors.items()]
                    + [Patch(facecolor="white", edgecolor="black", hatch="//", label="predicted")], fontsize=7)
    fig.suptitle("the three taxes against GPU count: m = measured (H200, NVLink), p = predicted (calibrated model)",
                 fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="reports/calibration/h200-x2-calibrated.json")
    ap.add_argument("--measured", nargs="*", default=[])
    ap.add_argument("--out", default="reports/scaling")
    args = ap.parse_args(argv)
    hw = get_profile(args.hardware)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pred = {}
    for p in WORLDS:
        preds = [predict_all(make_workload(wl, s, p), hw) for wl, shapes in SHAPES.items() for s in shapes]
        doc = model_document(preds, hw.name, p)
        save(doc, out / f"model_w{p}.json")
        pred |= measured_taxes([doc])
    meas = measured_taxes([load(m) for m in args.measured])
    plot(pred, meas, out / "scaling.png")
    print("| workload | shape | variant | GPUs | E2E m | E2E p | bulk-sync m | bulk-sync p | locality m | locality p | launch m | launch p |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (wl, key, p, variant), row in sorted(pred.items()):
        m = meas.get((wl, key, p, variant), {})
        f = lambda d, k: f"{d[k]:,.1f}" if k in d else "-"  # noqa: E731
        shape = ",".join(f"{k}={v}" for k, v in key if k in ("M", "B", "S"))
        print(f"| {wl} | {shape} | {variant} | {p} | {f(m, 'e2e')} | {f(row, 'e2e')} | {f(m, 'bulk-synchronous')} | "
              f"{f(row, 'bulk-synchronous')} | {f(m, 'data-locality')} | {f(row, 'data-locality')} | "
              f"{f(m, 'kernel-launch')} | {f(row, 'kernel-launch')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
