"""The figures README.md shows, and the HTML reports, from committed result documents:

    python benchmarks/figures.py        # writes reports/profile/*.png, *.html and session7/**.md
"""

import sys
from pathlib import Path

import _checkout  # noqa: F401

from taxes.reports import plots  # noqa: E402
from taxes.reports.render import render_html, render_markdown  # noqa: E402
from taxes.results import load, write_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "reports" / "profile"
FIGURES = [  # (document, case index, file stem): session 7's documents, with host stamps on eager phases
    ("session7/ag_gemm_N8192.json.gz", 3, "ag_gemm_M8192"),
    ("session7/flash_decode.json.gz", 1, "flash_decode_B1_S32K"),
]


def main() -> int:
    for name, i, stem in FIGURES:
        case = load(OUT / name)["cases"][i]
        write_atomic(OUT / f"{stem}_bars.png", plots.stacked_bars(case))
        write_atomic(OUT / f"{stem}_timeline.png", plots.timeline(case))
        write_atomic(OUT / f"{stem}_ctas.png", plots.cta_waits(case))
        write_atomic(OUT / f"{stem}_predicted.png", plots.predicted_vs_measured(case))
    for doc in ("ag_gemm_N8192.json", "ag_gemm_N28672.json", "flash_decode.json"):
        write_atomic(OUT / doc.replace(".json", ".html"), render_html(load(OUT / doc)))
    # session 7's reports as Markdown: HTML with every case's plots is megabytes per document
    for doc in ("session7/ag_gemm_N8192", "session7/flash_decode", "session7/repeat/ag_gemm_N8192",
                "session7/repeat/flash_decode", "session7/shared/ag_gemm_N8192", "session7/shared/flash_decode",
                "session7/combine/ag_gemm_N8192", "session7/combine/flash_decode"):
        write_atomic(OUT / f"{doc}.md", render_markdown(load(OUT / f"{doc}.json.gz")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
