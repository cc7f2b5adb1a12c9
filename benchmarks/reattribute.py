"""Redo the attribution of the committed result documents with the current rules (taxes/attribution.py),
each with the calibration it was attributed with, and re-render their reports. Measured times stay;
components, phase shading, floors, predictions and the ladder's timeline entries are recomputed.

    python benchmarks/reattribute.py
"""

import sys
from pathlib import Path

import _checkout  # noqa: F401

from taxes.hardware import load_profile_file  # noqa: E402
from taxes.document import reattribute  # noqa: E402
from taxes.reports.render import render_html, render_markdown  # noqa: E402
from taxes.results import load, save, write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CAL = ROOT / "reports" / "calibration"
DOCUMENTS = {  # calibration -> documents (tests/test_profile.py checks the same pairs redo exactly)
    "h200-x2-calibrated-session4.json": sorted((ROOT / "reports" / "profile").glob("*.json")),
    "h200-x2-calibrated.json": [*sorted((ROOT / "reports" / "ag_gemm").glob("profile_*.json")),
                                ROOT / "reports" / "gemm_rs" / "gemm_rs_interleaved.json",
                                ROOT / "reports" / "tp_mlp" / "tp_mlp_interleaved.json"],
    "h200-x2-calibrated-session7.json": sorted((ROOT / "reports" / "profile" / "session7").glob("*.json.gz")),
    "h200-x2-calibrated-session7-repeat.json": sorted((ROOT / "reports" / "profile" / "session7" / "repeat").glob("*.json.gz")),
    "h200-x2-calibrated-session7-shared.json": sorted((ROOT / "reports" / "profile" / "session7" / "shared").glob("*.json.gz")),
    "h200-x2-calibrated-session7-combine.json": sorted((ROOT / "reports" / "profile" / "session7" / "combine").glob("*.json.gz")),
}


def main() -> int:
    for cal, docs in DOCUMENTS.items():
        hw = load_profile_file(CAL / cal)
        for path in docs:
            doc = reattribute(load(path), hw)
            save(doc, path)
            stem = path.name.split(".")[0]  # x.json or x.json.gz
            for ext, render in ((".md", render_markdown), (".html", render_html)):
                if (path.parent / f"{stem}{ext}").exists():
                    write_atomic(path.parent / f"{stem}{ext}", render(doc))
            print(f"{path.relative_to(ROOT)}: attributed with {cal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
