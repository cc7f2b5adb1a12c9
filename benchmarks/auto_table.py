"""The table fused-auto picks from (kernels/auto_tuned.json): per case of the given result documents, every
correct graph and fused variant's plain E2E and the fastest of them, keyed by workload, GPU kind, world and
shape (taxes.run.auto).

    python benchmarks/auto_table.py reports/profile/*-h100-x[124].json.gz \
        reports/profile/flash_decode-h100-x1-B1-S32768.json.gz reports/profile/flash_decode-h100-x1-B1-S131072.json.gz \
        reports/sweep/sweep-{ag_gemm-small,ag_gemm-large,flash_decode,gemm_rs}-h200-x{2,4}.json.gz \
        reports/profile/gemm_rs-h200-x{2,4}.json.gz -o kernels/auto_tuned.json

(one document per shape and machine: the repeated runs of a shape stay out of the table)
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> int:
    from taxes.run.auto import table_entries
    from taxes.model.hardware import gpu_kind
    from taxes.documents.results import load

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("documents", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    a = ap.parse_args()
    entries = []
    for path in a.documents:
        doc = load(path)
        names = doc["metadata"].get("gpu_names") or []
        if doc["metadata"].get("emulated") or not names:
            continue
        entries += table_entries(doc, path, gpu_kind(names[0]))
    entries.sort(key=lambda e: (e["workload"], e["gpu"], e["world"], sorted(e["shape"].items())))
    with open(a.output, "w") as f:
        json.dump({"made_by": "benchmarks/auto_table.py", "statistic": "interquartile mean of plain E2E, us",
                   "entries": entries}, f, indent=1)
        f.write("\n")
    for e in entries:
        print(f"{e['workload']:13s} {e['world']} x {e['gpu']} {e['shape']}: {e['pick']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
